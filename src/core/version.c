#include "qlinear.h"

#ifndef QL_VERSION_STRING
#error "QL_VERSION_STRING comes from the build (cmake/install.cmake)"
#endif

const char *ql_version(void) { return QL_VERSION_STRING; }
