/* The LoRA merge's low-rank add at zmm width (the body in cpu/lowrank_add.h). */
#include "cpu/lowrank_add.h"
#include "cpu/x86/x86.h"

QL_DEFINE_LOWRANK_ADD(ql_lowrank_add_avx512)
