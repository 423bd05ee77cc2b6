/* The input activations of 16-bit inputs by lookup: a bf16 or fp16 row
 * takes at most 65 536 distinct values, so gelu_tanh(x) rounded to x's
 * dtype, and silu(gate) rounded (swiglu's first factor), are tables of the
 * scalar functions (act_math.h) over every bit pattern — bit-identical to
 * them by construction, and a load a value where the functions cost ~40
 * vector operations per vector. */
#ifndef QL_ACT_TABLE_H
#define QL_ACT_TABLE_H

#include <stdint.h>

#include "core/core.h"

/* The table of code (QL_INPUT_ACT_GELU_TANH: gelu_tanh; QL_INPUT_ACT_SWIGLU:
 * silu of the gate) for dtype dt (QL_BF16 or QL_F16): entry v is the result's
 * bits for the input of bits v. Built on first use (65 536 evaluations,
 * 128 KiB, thread-safe) and kept for the process; NULL for another code or
 * dtype, or without memory (callers then compute the functions). Two zero
 * entries follow the 65 536, so a 4-byte gather at 2·v stays inside. */
const uint16_t *ql_act_table16(int code, ql_dtype dt);

#endif
