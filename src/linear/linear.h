/* The public layer's internal pieces: the backend of each device. */
#ifndef QL_LINEAR_H
#define QL_LINEAR_H

#include "backend/backend.h"

/* The backend that runs a context's work on `device` (never NULL for the
 * devices of ql_device; ql_context_set_device admits only those). */
const ql_backend *ql_backend_for(ql_device device);

#endif
