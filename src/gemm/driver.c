#include "gemm.h"

#include <omp.h>

const ql_s8_kernel *ql_s8_kernel_for(ql_isa isa)
{
    switch (isa) {
#if QL_X86
    case QL_ISA_AVX512VNNI: return &ql_s8_gemm_12x32c4__avx512vnni;
    case QL_ISA_AVXVNNI: return &ql_s8_gemm_6x16c4__avxvnni;
    case QL_ISA_AVX2: return &ql_s8_gemm_4x8c4__avx2;
#endif
#if QL_ARM64
    case QL_ISA_I8MM: return &ql_s8_gemm_8x12c8__i8mm;
    case QL_ISA_NEONDOT: return &ql_s8_gemm_8x12c4__neondot;
    case QL_ISA_NEON: return &ql_s8_gemm_4x8c4__neon;
#endif
    default: return &ql_s8_gemm_4x8c4__generic;
    }
}

ql_status ql_pack_b_s8(const ql_s8_kernel *kern, const int8_t *w, int64_t n, int64_t k, int64_t ldw, ql_packed_b *out)
{
    const int nr = kern->nr;
    ql_packed_b b = {n, k, ql_kpad(kern, k) / 4, ql_panels(n, nr), nr, kern->b_offset128, NULL, NULL, NULL};
    size_t bytes = (size_t)(b.panels * b.k4 * nr * 4);
    b.data = ql_aligned_alloc(bytes);
    if (!b.data) return ql_fail(QL_ERR_OUT_OF_MEMORY, "pack weight: cannot allocate %zu bytes", bytes);
    const uint8_t off = kern->b_offset128 ? 128 : 0;
    const int bb = kern->kb == 8 ? 8 : 4; /* k per column group: 8 for SMMLA (gemm.h) */
    for (int64_t p = 0; p < b.panels; p++) {
        uint8_t *dst = b.data + (size_t)(p * b.k4 * nr * 4);
        for (int64_t pos = 0; pos < b.k4 * 4; pos++) {
            const int64_t kk = ql_a_element(kern->kb, pos); /* the same k order as A */
            for (int j = 0; j < nr; j++) {
                const int64_t col = p * nr + j;
                const int8_t v = (col < n && kk < k) ? w[col * ldw + kk] : 0;
                dst[((pos / bb) * nr + j) * bb + pos % bb] = (uint8_t)((uint8_t)v + off);
            }
        }
    }
    *out = b;
    return QL_OK;
}

void ql_packed_b_free(ql_packed_b *b)
{
    if (b) ql_aligned_free(b->data);
    if (b) b->data = NULL;
}

void ql_pack_a_s8(const ql_s8_kernel *kern, const int8_t *a, int64_t m, int64_t k, int64_t lda, int8_t *packed,
                  int32_t *rowsum)
{
    const int mr = kern->mr, kb = kern->kb;
    const int64_t kp = ql_kpad(kern, k), panels = ql_panels(m, mr);
    for (int64_t p = 0; p < panels; p++) {
        int8_t *dst = packed + (size_t)(p * kp * mr);
        for (int r = 0; r < mr; r++) {
            const int64_t row = p * mr + r;
            int32_t sum = 0;
            for (int64_t pos = 0; pos < kp; pos++) {
                const int64_t kk = ql_a_element(kb, pos);
                const int8_t v = (row < m && kk < k) ? a[row * lda + kk] : 0;
                dst[ql_a_offset(kb, mr, r, pos)] = v;
                sum += v;
            }
            if (row < m) rowsum[row] = sum;
        }
    }
}

/* Work is split into blocks of MC rows × NC columns, ordered
 * column-block-major so a thread's consecutive blocks share weight panels.
 * Inside a block, K is walked in slices of KC; for the VNNI kernels each
 * activation panel slice (KC·MR, 24 KiB for 12 rows) stays in L1 while the
 * block's weight micro-panel slices (KC·NR, 64 KiB for 32 columns) stream
 * past it from L2 — 3-13 % faster than the reverse in paired cold-cache
 * runs (AVX-VNNI: 7 %) — and the AVX2 kernel, whose 16 KiB weight slice
 * fits L1, keeps that instead (3-5 %): ql_s8_kernel.a_outer. Partial int32
 * tiles of K > KC wait in a per-thread buffer (MC·NC·4 bytes). KC = 2048
 * beat 512 by 2-5 %. */
#define QL_MC 96
#define QL_NC 256
#define QL_KC 2048

ql_status ql_gemm_s8_run(int threads, const ql_s8_kernel *kern, const int8_t *packed_a, int64_t m,
                         const ql_packed_b *b, ql_tile_epilogue_fn epi, void *arg)
{
    const int mr = kern->mr, nr = kern->nr;
    const int64_t k4 = b->k4, kc4 = QL_KC / 4;
    const int64_t a_panel = k4 * mr * 4, b_panel = k4 * nr * 4;
    const int64_t mpanels = ql_panels(m, mr), npanels = b->panels;
    int64_t mc = (QL_MC + mr - 1) / mr, nc = (QL_NC + nr - 1) / nr;
    int64_t mblocks, nblocks;
    ql_block_grid(mpanels, npanels, threads, &mc, &nc, &mblocks, &nblocks);
    const int64_t blocks = mblocks * nblocks;
    if (threads > blocks) threads = (int)(blocks > 0 ? blocks : 1);
    const size_t cbytes = (size_t)(mc * nc * mr * nr) * sizeof(int32_t);
    const size_t dbytes = b->decode ? (size_t)(nc * (k4 < kc4 ? k4 : kc4) * nr * 4) : 0;
    int failed = 0;
#pragma omp parallel num_threads(threads)
    {
        int32_t *cbuf = ql_aligned_alloc(cbytes + dbytes);
        uint8_t *dbuf = cbuf ? (uint8_t *)cbuf + cbytes : NULL;
        if (!cbuf) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int64_t blk = 0; blk < blocks; blk++) {
            if (!cbuf) continue;
            const ql_block bk = ql_block_at(blk, mblocks, mc, nc, mpanels, npanels);
            for (int64_t pc = 0; pc < k4; pc += kc4) {
                const int64_t kc = k4 - pc < kc4 ? k4 - pc : kc4;
                const int last = pc + kc >= k4;
                const int64_t ni = bk.ip1 - bk.ip0, nj = bk.jp1 - bk.jp0;
                if (b->decode) b->decode(b->src, bk.jp0, bk.jp1, pc, kc, dbuf);
                for (int64_t t = 0; t < ni * nj; t++) {
                    const int64_t ip = bk.ip0 + (kern->a_outer ? t / nj : t % ni);
                    const int64_t jp = bk.jp0 + (kern->a_outer ? t % nj : t / ni);
                    int32_t *c = cbuf + ((jp - bk.jp0) * mc + (ip - bk.ip0)) * mr * nr;
                    const uint8_t *bp = b->decode ? dbuf + (jp - bk.jp0) * kc * nr * 4 : b->data + jp * b_panel + pc * nr * 4;
                    kern->tile(kc, packed_a + ip * a_panel + pc * mr * 4, bp, c, pc > 0);
                    if (!last) continue;
                    const int64_t m0 = ip * mr, n0 = jp * nr;
                    const int mr_eff = (int)(m - m0 < mr ? m - m0 : mr);
                    const int nr_eff = (int)(b->n - n0 < nr ? b->n - n0 : nr);
                    epi(arg, c, nr, m0, n0, mr_eff, nr_eff);
                }
            }
        }
        ql_aligned_free(cbuf);
    }
    if (failed) return ql_fail(QL_ERR_OUT_OF_MEMORY, "int8 gemm: cannot allocate %zu bytes of tile buffer", cbytes + dbytes);
    return QL_OK;
}
