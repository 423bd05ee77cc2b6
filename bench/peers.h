/* Peers measured beside qlinear in `qlinear bench`: what a user would call
 * instead. Each adapter is compiled only when its library was found at build
 * time; the library itself never depends on them. */
#ifndef QL_PEERS_H
#define QL_PEERS_H

#include <stddef.h>
#include <stdint.h>

typedef enum { PEER_OPENBLAS_F32, PEER_ONEDNN_F32, PEER_ONEDNN_BF16, PEER_ONEDNN_INT8 } peer_kind;

typedef struct peer peer;

/* NULL name: not built in. info: version / core type line for the report. */
int peer_available(peer_kind kind);
const char *peer_info(peer_kind kind);
/* The instruction set the peer runs with (oneDNN: its effective CPU ISA,
 * which ONEDNN_MAX_CPU_ISA caps; OpenBLAS: its core type). */
const char *peer_isa(peer_kind kind);
void peer_set_threads(int threads);

/* Prepare Y[M,N] = X[M,K]·W[N,K]ᵀ. W is given as fp32 (F32/BF16 kinds, which
 * convert and prepack it) or int8 (INT8 kind: u8 activations × s8 weights ->
 * s32, weights prepacked). Returns NULL with a message in err on failure. */
peer *peer_create(peer_kind kind, int64_t m, int64_t n, int64_t k, const float *w_f32, const int8_t *w_s8,
                  char *err, size_t errlen);
/* x: fp32 [M,K] for F32; bf16 bits for BF16; uint8 for INT8. y likewise
 * (fp32, bf16, int32). Returns 0 on success. */
int peer_run(peer *p, const void *x, void *y);
size_t peer_weight_bytes(const peer *p);
void peer_destroy(peer *p);

#endif
