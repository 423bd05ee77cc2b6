/* A CPU without kernels of its own: only the portable C table runs. */
#include "cpu/features.h"

void ql_cpu_detect(ql_cpu_features *f) { (void)f; }
