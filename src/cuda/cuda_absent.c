/* The CUDA backend's entry points in a build without nvcc: every device
 * call is refused with a message that says why. */
#include "cuda_backend.h"
#include "core/core.h"

static ql_status absent(const char *fn)
{
    return ql_fail(QL_ERR_UNSUPPORTED, "%s: this qlinear was built without CUDA (nvcc was not found at configure time)",
                   fn);
}

ql_status ql_cuda_check_device(const char *fn, int index)
{
    (void)index;
    return absent(fn);
}
void ql_cuda_workspace_free(ql_cuda_workspace *ws) { (void)ws; }
ql_status ql_cuda_linear_create(int device, const ql_int8_weight *w, const float *bias_f32, ql_cuda_linear **out)
{
    (void)device, (void)w, (void)bias_f32;
    *out = NULL;
    return absent("ql_linear_create");
}
ql_status ql_cuda_linear_create_packed(int device, const ql_cuda_packed_desc *d, const float *bias_f32,
                                       ql_cuda_linear **out)
{
    (void)device, (void)d, (void)bias_f32;
    *out = NULL;
    return absent("ql_linear_create");
}
ql_status ql_cuda_linear_set_correction(ql_cuda_linear *l, const float *corr, int64_t group)
{
    (void)l, (void)corr, (void)group;
    return absent("ql_linear_create");
}
ql_status ql_cuda_linear_lora_ok(const ql_cuda_linear *l)
{
    (void)l;
    return absent("ql_linear_add_lora");
}
ql_status ql_cuda_linear_set_lora(ql_cuda_linear *l, int64_t rtot, const int8_t *dq, const int8_t *uq, const float *su,
                                  double e2)
{
    (void)l, (void)rtot, (void)dq, (void)uq, (void)su, (void)e2;
    return absent("ql_linear_add_lora");
}
int64_t ql_cuda_linear_n(const ql_cuda_linear *l)
{
    (void)l;
    return 0;
}
void **ql_cuda_linear_lora_slot(ql_cuda_linear *l)
{
    (void)l;
    return NULL; /* no layer is ever made here */
}
ql_status ql_cuda_linear_decoded_weight(const ql_cuda_linear *l, int8_t *out, int64_t ldo)
{
    (void)l, (void)out, (void)ldo;
    return absent("ql_cuda_linear_decoded_weight");
}
int ql_cuda_codes_permuted(int64_t k, int64_t group)
{
    (void)k, (void)group;
    return 0;
}
void ql_cuda_linear_destroy(ql_cuda_linear *l) { (void)l; }
size_t ql_cuda_linear_weight_bytes(const ql_cuda_linear *l)
{
    (void)l;
    return 0;
}
ql_status ql_cuda_linear_forward(ql_cuda_linear *const *ls, int count, ql_cuda_workspace **ws, void *stream, const void *x,
                                 ql_dtype xdt, int64_t m, int64_t ldx, void *const *ys, ql_dtype ydt, const int64_t *ldys,
                                 const ql_epilogue *const *epis, uint64_t *token)
{
    (void)ls, (void)count, (void)ws, (void)stream, (void)x, (void)xdt, (void)m, (void)ldx, (void)ys, (void)ydt, (void)ldys,
        (void)epis, (void)token;
    return absent("ql_linear_forward");
}
void ql_cuda_linear_dims(const ql_cuda_linear *l, int64_t *k, int64_t *group)
{
    (void)l;
    *k = 0, *group = 0;
}
const char *ql_cuda_linear_kernel(const ql_cuda_linear *l)
{
    (void)l;
    return "";
}
ql_status ql_cuda_gemm_s8s8s32(int device, void *stream, int64_t m, int64_t n, int64_t k, const int8_t *a, int64_t lda,
                               const int8_t *b, int64_t ldb, int32_t *c, int64_t ldc)
{
    (void)device, (void)stream, (void)m, (void)n, (void)k, (void)a, (void)lda, (void)b, (void)ldb, (void)c, (void)ldc;
    return absent("ql_gemm_s8s8s32");
}
ql_status ql_cuda_quantize_rows(ql_cuda_workspace **ws, int device, void *stream, const void *x, ql_dtype xdt,
                                int64_t m, int64_t k, int64_t ldx, int64_t group, int8_t *q, int64_t ldq, float *sx,
                                const ql_epilogue *epi)
{
    (void)ws, (void)device, (void)stream, (void)x, (void)xdt, (void)m, (void)k, (void)ldx, (void)group, (void)q, (void)ldq, (void)sx,
        (void)epi;
    return absent("ql_cuda_quantize_rows");
}
int ql_cuda_sm90_tile_count(void) { return 0; }
int ql_cuda_device_count(void) { return 0; }
ql_status ql_cuda_device_name(int index, char *buf, size_t len)
{
    (void)index;
    if (buf && len) buf[0] = '\0';
    return absent("ql_cuda_device_name");
}
