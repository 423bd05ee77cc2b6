/* The registry of CPU kernel tables: the one place that knows which ISAs
 * exist, in which order they are preferred and which this CPU runs. */
#ifndef QL_CPU_REGISTRY_H
#define QL_CPU_REGISTRY_H

#include "cpu/kernels.h"

/* The table of an ISA built into this library, with every NULL entry
 * resolved to the generic twin; NULL for an ISA of another architecture.
 * (A lookup, not a support check: see ql_isa_supported.) */
const ql_cpu_kernels *ql_cpu_kernels_for(ql_isa isa);

/* The table for work that has no context (weight quantizers, stochastic
 * rounding, merge-lora): QLINEAR_ISA's when it names an ISA this CPU runs,
 * else the best this CPU runs. */
const ql_cpu_kernels *ql_cpu_kernels_default(void);

/* The built-in tables, best first (the generic one last): for walking. */
int ql_cpu_kernels_count(void);
const ql_cpu_kernels *ql_cpu_kernels_at(int i);

/* The ISA a name stands for (QLINEAR_ISA's values: "auto", "generic", ...). */
bool ql_isa_from_name(const char *name, ql_isa *out);
/* The names of every ISA, comma-separated, for messages. */
const char *ql_isa_names(void);

#endif
