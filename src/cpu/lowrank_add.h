/* The body of a ql_lowrank_add_fn, compiled once per vector width (generic/,
 * x86/): a multiply then an add per step, lane by lane (no FMA: the build's
 * -ffp-contract=off), so every width gives the same bits. Columns in blocks
 * of 512 keep the partial sums in L1. */
#ifndef QL_CPU_LOWRANK_ADD_H
#define QL_CPU_LOWRANK_ADD_H

#define QL_DEFINE_LOWRANK_ADD(name)                                                                              \
    void name(float *restrict w, int64_t rows, int64_t k, int64_t ld, const float *restrict up, int64_t rank,    \
              const float *restrict down, float c)                                                               \
    {                                                                                                            \
        float acc[512];                                                                                          \
        for (int64_t i = 0; i < rows; i++)                                                                       \
            for (int64_t j0 = 0; j0 < k; j0 += 512) {                                                            \
                const int64_t jn = k - j0 < 512 ? k - j0 : 512;                                                  \
                _Pragma("omp simd") for (int64_t j = 0; j < jn; j++) acc[j] = 0.0f;                              \
                for (int64_t r = 0; r < rank; r++) {                                                             \
                    const float u = up[i * rank + r];                                                            \
                    const float *restrict d = down + r * k + j0;                                                 \
                    _Pragma("omp simd") for (int64_t j = 0; j < jn; j++) acc[j] = acc[j] + u * d[j];             \
                }                                                                                                \
                float *restrict wr = w + i * ld + j0;                                                            \
                _Pragma("omp simd") for (int64_t j = 0; j < jn; j++) wr[j] = wr[j] + c * acc[j];                 \
            }                                                                                                    \
    }

#endif
