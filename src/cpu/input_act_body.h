/* The body of a vector twin of ql_input_act_row (quant/input_act.c), for
 * one vector width (x86/input_act_avx512.c, x86/input_act_avx2.c,
 * arm/input_act_neon.c): the including file defines QV (a vector of QW fp32
 * lanes), QVI (its int32 lanes) and the operations below, then includes
 * this. The rows run whole vectors and finish with the scalar functions of
 * act_math.h, element by element: every lane repeats the scalar's
 * operations in its order, so any width gives the reference's bits.
 * bf16 and fp16 rows of gelu_tanh and swiglu look their values up in the
 * tables of the same scalar functions (act_table.h) instead: QV_LOOKUP16(dt,
 * table, indices) gathers QW entries as fp32 values where the ISA can
 * gather, else scalar loads. */
#include "quant/act_math.h"
#include "quant/act_table.h"
#include "quant/input_act.h"

#define QV_C(c) QV_SET1((float)(c))

static inline QV qv_em(QV r) /* ql_act_em */
{
    QV p = QV_C(QL_ACT_P6);
    p = QV_FMA(p, r, QV_C(QL_ACT_P5));
    p = QV_FMA(p, r, QV_C(QL_ACT_P4));
    p = QV_FMA(p, r, QV_C(QL_ACT_P3));
    p = QV_FMA(p, r, QV_C(QL_ACT_P2));
    p = QV_FMA(p, r, QV_C(QL_ACT_P1));
    p = QV_FMA(p, r, QV_C(QL_ACT_P0));
    return QV_FMA(QV_MUL(r, r), p, r);
}

static inline QV qv_reduce(QV x, QVI *n) /* ql_act_reduce, n as int32 (exact: an integer already) */
{
    const QV k = QV_RINT(QV_MUL(x, QV_C(QL_ACT_LOG2E)));
    *n = QV_CVT_I32(k);
    return QV_FMA(k, QV_C(-QL_ACT_LN2LO), QV_FMA(k, QV_C(-QL_ACT_LN2HI), x));
}

static inline QV qv_pow2i(QVI n) { return QV_FROM_BITS(QVI_SLLI(QVI_ADD(n, QVI_SET1(127)), 23)); }

static inline QV qv_exp(QV x) /* ql_act_exp; max/min give their second operand for NaN, as fmaxf/fminf the number */
{
    const QV xc = QV_MIN(QV_MAX(x, QV_C(QL_ACT_EXP_LO)), QV_C(QL_ACT_EXP_HI));
    QVI n;
    const QV r = qv_reduce(xc, &n);
    const QV p = QV_ADD(qv_em(r), QV_C(1.0f));
    const QVI n1 = QVI_SRAI(n, 1), n2 = QVI_SUB(n, n1);
    return QV_IF_NAN(x, QV_MUL(QV_MUL(p, qv_pow2i(n1)), qv_pow2i(n2)));
}

static inline QV qv_tanh(QV x) /* ql_act_tanh */
{
    const QV a = QV_MIN(QV_ABS(x), QV_C(QL_ACT_TANH_MAX));
    QVI n;
    const QV r = qv_reduce(QV_ADD(a, a), &n);
    const QV s = qv_pow2i(n);
    const QV e = QV_FMA(s, qv_em(r), QV_ADD(s, QV_C(-1.0f)));
    const QV t = QV_DIV(e, QV_ADD(e, QV_C(2.0f)));
    const QV x2 = QV_MUL(x, x);
    QV q = QV_C(QL_ACT_Q5);
    q = QV_FMA(q, x2, QV_C(QL_ACT_Q4));
    q = QV_FMA(q, x2, QV_C(QL_ACT_Q3));
    q = QV_FMA(q, x2, QV_C(QL_ACT_Q2));
    q = QV_FMA(q, x2, QV_C(QL_ACT_Q1));
    q = QV_FMA(q, x2, QV_C(QL_ACT_Q0));
    const QV small = QV_FMA(QV_MUL(x, x2), q, x);
    return QV_IF_NAN(x, QV_COPYSIGN(QV_SELECT_LT(a, QV_C(QL_ACT_TANH_SMALL), small, t), x));
}

static void qv_gelu_tanh_row(ql_dtype dt, const void *src, int64_t k, void *dst)
{
    const uint16_t *t = ql_act_table16(QL_INPUT_ACT_GELU_TANH, dt);
    if (t) {
        const uint16_t *x = src;
        uint16_t *y = dst;
        int64_t j = 0;
#ifdef QV_LOOKUP16
        for (; j + QW <= k; j += QW) QV_STORE(dt, dst, j, QV_LOOKUP16(dt, t, x + j)); /* exact values: stored as they are */
#endif
        for (; j < k; j++) y[j] = t[x[j]];
        return;
    }
    int64_t j = 0;
    for (; j + QW <= k; j += QW) {
        const QV x = QV_LOAD(dt, src, j);
        const QV cube = QV_MUL(QV_MUL(x, x), x);
        const QV inner = QV_MUL(QV_C(QL_ACT_BETA), QV_ADD(x, QV_MUL(QV_C(QL_ACT_KAPPA), cube)));
        QV_STORE(dt, dst, j, QV_MUL(QV_MUL(QV_C(0.5f), x), QV_ADD(QV_C(1.0f), qv_tanh(inner))));
    }
    for (; j < k; j++) ql_store_f(dt, dst, j, ql_act_gelu_tanh(ql_load_f(dt, src, j)));
}

static void qv_swiglu_row(ql_dtype dt, const void *src, int64_t k, void *dst)
{
    const void *up = ql_row_cptr(dt, src, 1, k);
    int64_t j = 0;
    const uint16_t *t = ql_act_table16(QL_INPUT_ACT_SWIGLU, dt);
    if (t) { /* silu(gate) rounded, looked up; the product as below */
        const uint16_t *g = src;
#ifdef QV_LOOKUP16
        for (; j + QW <= k; j += QW) QV_STORE(dt, dst, j, QV_MUL(QV_LOOKUP16(dt, t, g + j), QV_LOAD(dt, up, j)));
#else
        for (; j + QW <= k; j += QW) {
            uint16_t s[2 * QW]; /* QW values; sized for QV_LOAD's fp32 branch, which dt never takes */
            for (int l = 0; l < QW; l++) s[l] = t[g[j + l]];
            QV_STORE(dt, dst, j, QV_MUL(QV_LOAD(dt, s, 0), QV_LOAD(dt, up, j)));
        }
#endif
        for (; j < k; j++) ql_store_f(dt, dst, j, ql_load_f(dt, &t[g[j]], 0) * ql_load_f(dt, up, j));
        return;
    }
    for (; j + QW <= k; j += QW) {
        const QV g = QV_LOAD(dt, src, j);
        const QV s = QV_ROUND_TO(dt, QV_DIV(g, QV_ADD(QV_C(1.0f), qv_exp(QV_NEG(g)))));
        QV_STORE(dt, dst, j, QV_MUL(s, QV_LOAD(dt, up, j)));
    }
    for (; j < k; j++)
        ql_store_f(dt, dst, j, ql_round_to(dt, ql_act_silu(ql_load_f(dt, src, j))) * ql_load_f(dt, up, j));
}

/* input_act.c's cascade of 32 slots, 32/QW vectors a level */
static void qv_cascade32(ql_dtype dt, const void *x, int64_t units, float tot[32])
{
    enum { V = 32 / QW };
    QV lv[4][V];
    for (int l = 0; l < 4; l++)
        for (int h = 0; h < V; h++) lv[l][h] = QV_C(0.0f);
    int64_t u = 0;
    while (units - u >= 16) {
        for (const int64_t end = u + 16; u < end; u++)
            for (int h = 0; h < V; h++) {
                const QV v = QV_LOAD(dt, x, u * 32 + QW * h);
                lv[0][h] = QV_ADD(lv[0][h], QV_MUL(v, v));
            }
        for (int l = 1; l < 4; l++) {
            for (int h = 0; h < V; h++) {
                lv[l][h] = QV_ADD(lv[l][h], lv[l - 1][h]);
                lv[l - 1][h] = QV_C(0.0f);
            }
            if (u % ((int64_t)1 << (4 * (l + 1))) != 0) break; /* 256, 4096 blocks: fold further up */
        }
    }
    for (; u < units; u++)
        for (int h = 0; h < V; h++) {
            const QV v = QV_LOAD(dt, x, u * 32 + QW * h);
            lv[0][h] = QV_ADD(lv[0][h], QV_MUL(v, v));
        }
    for (int h = 0; h < V; h++) QV_STOREU_F32(tot + QW * h, QV_ADD(QV_ADD(QV_ADD(lv[0][h], lv[1][h]), lv[2][h]), lv[3][h]));
}

static void qv_rms_norm_row(const ql_input_act_plan *p, const void *src, int64_t k, void *dst)
{
    const ql_dtype dt = p->dt;
    float tot[32];
    qv_cascade32(dt, src, k / 32, tot);
    const float ms = ql_rms_sum_squares_finish(dt, src, k, tot) / (float)k;
    const float r = 1.0f / sqrtf(ms + p->eps);
    int64_t j = 0;
    for (; j + QW <= k; j += QW) {
        const QV w = QV_ROUND_TO(dt, QV_LOAD(p->w_dtype, p->w, j));
        QV_STORE(dt, dst, j, QV_MUL(QV_MUL(QV_LOAD(dt, src, j), QV_SET1(r)), w));
    }
    for (; j < k; j++) ql_store_f(dt, dst, j, ql_load_f(dt, src, j) * r * ql_round_to(dt, ql_load_f(p->w_dtype, p->w, j)));
}

/* ql_input_act_row's vector twin: the including file names it */
static void qv_input_act_row(const ql_input_act_plan *p, const void *src, int64_t k, void *dst)
{
    switch (p->code) {
    case QL_INPUT_ACT_GELU_TANH: qv_gelu_tanh_row(p->dt, src, k, dst); break;
    case QL_INPUT_ACT_SWIGLU: qv_swiglu_row(p->dt, src, k, dst); break;
    case QL_INPUT_ACT_RMS_NORM:
        if (k >= 8) qv_rms_norm_row(p, src, k, dst);
        else ql_input_act_row(p, src, k, dst); /* four scalar slots: nothing to vectorize */
        break;
    default: ql_input_act_row(p, src, k, dst); break;
    }
}
