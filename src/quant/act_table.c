/* Tables of the 16-bit input activations (act_table.h). */
#include "quant/act_table.h"

#include <pthread.h>
#include <stdlib.h>

#include "quant/act_math.h"
#include "quant/input_act.h"

enum { GELU_BF16, GELU_F16, SILU_BF16, SILU_F16, TABLES };
static uint16_t *tables[TABLES];
static pthread_once_t once[TABLES] = {PTHREAD_ONCE_INIT, PTHREAD_ONCE_INIT, PTHREAD_ONCE_INIT, PTHREAD_ONCE_INIT};

static void build(int t)
{
    const ql_dtype dt = t == GELU_BF16 || t == SILU_BF16 ? QL_BF16 : QL_F16;
    const int gelu = t == GELU_BF16 || t == GELU_F16;
    uint16_t *tab = malloc((size_t)(65536 + 2) * sizeof *tab); /* a pad: gathers read 4 bytes at 2·v */
    if (!tab) return;
    tab[65536] = tab[65537] = 0;
    for (uint32_t v = 0; v < 65536; v++) {
        const uint16_t in = (uint16_t)v;
        const float x = ql_load_f(dt, &in, 0);
        ql_store_f(dt, &tab[v], 0, gelu ? ql_act_gelu_tanh(x) : ql_act_silu(x));
    }
    tables[t] = tab;
}
static void build_gelu_bf16(void) { build(GELU_BF16); }
static void build_gelu_f16(void) { build(GELU_F16); }
static void build_silu_bf16(void) { build(SILU_BF16); }
static void build_silu_f16(void) { build(SILU_F16); }
static void (*const builders[TABLES])(void) = {build_gelu_bf16, build_gelu_f16, build_silu_bf16, build_silu_f16};

const uint16_t *ql_act_table16(int code, ql_dtype dt)
{
    if ((code != QL_INPUT_ACT_GELU_TANH && code != QL_INPUT_ACT_SWIGLU) || (dt != QL_BF16 && dt != QL_F16)) return NULL;
    const int t = (code == QL_INPUT_ACT_GELU_TANH ? GELU_BF16 : SILU_BF16) + (dt == QL_F16);
    pthread_once(&once[t], builders[t]);
    return tables[t];
}
