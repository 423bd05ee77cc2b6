/* Hostile checkpoint files for the reader tests (see test_format_cases.h). */
#include "test_format_cases.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "testutil.h"

static const hostile_case cases[] = {
    /* container (docs/FORMATS.md §1) */
    {"empty", QL_ERR_FORMAT, "file is empty"},
    {"short", QL_ERR_FORMAT, "shorter than the 8-byte header length"},
    {"header_past_eof", QL_ERR_FORMAT, "runs past the end of the file"},
    {"header_2p63", QL_ERR_FORMAT, "header length 9223372036854775808 exceeds the 100000000-byte limit"},
    {"header_over_100mb", QL_ERR_FORMAT, "header length 100000001 exceeds the 100000000-byte limit"},
    {"header_not_json", QL_ERR_FORMAT, "header is not valid JSON"},
    {"header_not_object", QL_ERR_FORMAT, "header is not a JSON object: it must start with '{'"},
    {"header_empty", QL_ERR_FORMAT, "header is not a JSON object: it must start with '{'"},
    {"header_not_utf8", QL_ERR_FORMAT, "header is not valid UTF-8"},
    {"header_trailing_garbage", QL_ERR_FORMAT, "header is not valid JSON"},
    {"header_deep_nesting", QL_ERR_FORMAT, "header is not valid JSON"},
    {"header_nul_in_name", QL_ERR_FORMAT, "header is not valid JSON"},
    {"entry_not_object", QL_ERR_FORMAT, "tensor 'a': entry is an integer, not an object"},
    {"missing_dtype", QL_ERR_FORMAT, "tensor 'a': no \"dtype\""},
    {"unknown_dtype", QL_ERR_FORMAT, "tensor 'a': unknown dtype 'F17'"},
    {"missing_shape", QL_ERR_FORMAT, "tensor 'a': no \"shape\""},
    {"negative_dim", QL_ERR_FORMAT, "tensor 'a': shape[1] = -4 is negative"},
    {"fractional_dim", QL_ERR_FORMAT, "tensor 'a': shape[0] = 2.5 is not an integer"},
    {"string_dim", QL_ERR_FORMAT, "tensor 'a': shape[0] is a string, not an integer"},
    {"dim_beyond_int64", QL_ERR_FORMAT, "header is not valid JSON"},
    {"dims_overflow_u64", QL_ERR_FORMAT, "tensor 'a': shape [4294967296, 4294967296, 2] has more elements than fit in 64 bits"},
    {"bytes_overflow_u64", QL_ERR_FORMAT, "tensor 'a': F64 [2305843009213693952, 2] takes more bits than fit in 64 bits"},
    {"subbyte_odd", QL_ERR_FORMAT, "tensor 'a': F4 [3] is 12 bits, not a whole number of bytes"},
    {"missing_offsets", QL_ERR_FORMAT, "tensor 'a': no \"data_offsets\""},
    {"offsets_one_value", QL_ERR_FORMAT, "tensor 'a': \"data_offsets\" must be an array [begin, end]"},
    {"offsets_negative", QL_ERR_FORMAT, "tensor 'a': data_offsets[0] = -8 is negative"},
    {"offsets_beyond_eof", QL_ERR_FORMAT, "tensor 'a': data_offsets [0, 100] run past the end of the data buffer (16 bytes)"},
    {"offsets_reversed", QL_ERR_FORMAT, "tensor 'a': data_offsets [10, 5] are reversed"},
    {"offsets_size_mismatch", QL_ERR_FORMAT, "tensor 'a': data_offsets [0, 8] hold 8 bytes but F32 [3] needs 12"},
    {"offsets_overlap", QL_ERR_FORMAT, "tensor 'b': data_offsets [8, 24] overlap tensor 'a' [0, 16]"},
    {"offsets_hole", QL_ERR_FORMAT, "tensor 'b': data buffer bytes [8, 16) before it belong to no tensor (a hole)"},
    {"offsets_trailing_bytes", QL_ERR_FORMAT, "data buffer bytes [8, 16) at the end of the file belong to no tensor"},
    {"zero_size_inside", QL_ERR_FORMAT, "tensor 'z': data_offsets [4, 4] overlap tensor 'a' [0, 8]"},
    {"duplicate_names", QL_ERR_FORMAT, "header has a duplicate key"},
    {"metadata_nonstring", QL_ERR_FORMAT, "__metadata__ key 'step' has an integer value; only strings are allowed"},
    {"metadata_not_object", QL_ERR_FORMAT, "__metadata__ is a string; it must be an object of strings"},
    /* quantized layers (§2) */
    {"cq_invalid_json", QL_ERR_FORMAT, "tensor 'l.comfy_quant': configuration is not valid JSON"},
    {"cq_not_object", QL_ERR_FORMAT, "tensor 'l.comfy_quant': configuration is an array, not a JSON object"},
    {"cq_not_utf8", QL_ERR_FORMAT, "tensor 'l.comfy_quant': configuration is not valid UTF-8"},
    {"cq_unknown_format", QL_ERR_FORMAT, "tensor 'l.comfy_quant': unknown format 'int3_magic'"},
    {"cq_no_format", QL_ERR_FORMAT, "tensor 'l.comfy_quant': no \"format\" key"},
    {"cq_wrong_dtype", QL_ERR_FORMAT, "tensor 'l.comfy_quant': comfy_quant must be a 1-D U8 tensor of JSON bytes (it is I8, 1-D)"},
    {"cq_convrot_not_bool", QL_ERR_FORMAT, "tensor 'l.comfy_quant': \"convrot\" is a string, not true or false"},
    {"cq_bad_group", QL_ERR_FORMAT, "tensor 'l.comfy_quant': convrot_groupsize 100 is not a power of 4"},
    {"scale_wrong_size", QL_ERR_FORMAT, "tensor 'l.weight_scale': weight_scale has shape [3] (3 elements); int8_tensorwise needs 1 or N = 4"},
    {"scale_wrong_shape", QL_ERR_FORMAT, "tensor 'l.weight_scale': weight_scale has shape [1, 4] (4 elements)"},
    {"scale_wrong_dtype", QL_ERR_FORMAT, "tensor 'l.weight_scale': int8_tensorwise weight_scale has dtype BF16; it must be F32"},
    {"scale_missing", QL_ERR_FORMAT, "layer 'l': int8_tensorwise needs tensor 'l.weight_scale', which is missing"},
    {"weight_float_dtype", QL_ERR_FORMAT, "tensor 'l.weight': int8_tensorwise weight has dtype F32; it must be I8"},
    {"weight_missing", QL_ERR_FORMAT, "layer 'l': int8_tensorwise needs tensor 'l.weight', which is missing"},
    {"weight_not_2d", QL_ERR_FORMAT, "tensor 'l.weight': int8_tensorwise weight has 3 dimensions; it must be [N, K]"},
    {"k_not_multiple_of_group", QL_ERR_FORMAT, "tensor 'l.weight': K = 100 is not a multiple of the ConvRot group 256"},
    {"bias_wrong_shape", QL_ERR_FORMAT, "tensor 'l.bias': bias must have shape [N] = [4]"},
    {"qmeta_invalid_json", QL_ERR_FORMAT, "__metadata__ '_quantization_metadata' is not valid JSON"},
    {"qmeta_no_layers", QL_ERR_FORMAT, "__metadata__ '_quantization_metadata' must be a JSON object with a \"layers\" object"},
    {"qmeta_unknown_format", QL_ERR_FORMAT, "__metadata__ '_quantization_metadata' layer 'l': unknown format 'fp3'"},
    {"qmeta_conflict", QL_ERR_FORMAT, "layer 'l': tensor 'l.comfy_quant' and __metadata__ '_quantization_metadata' declare different configurations"},
    {"qmeta_weight_float", QL_ERR_FORMAT, "tensor 'l.weight': int8_tensorwise weight has dtype BF16; it must be I8"},
    /* W4A8 / W6A8 layers (§5, §5.6) */
    {"w4_srel_missing", QL_ERR_FORMAT, "layer 'l': asym_w4a8_int8 needs tensor 'l.weight_s_rel', which is missing"},
    {"w4_schannel_missing", QL_ERR_FORMAT, "layer 'l': asym_w4a8_int8 needs tensor 'l.weight_s_channel', which is missing"},
    {"w4_srel_wrong_dtype", QL_ERR_FORMAT, "tensor 'l.weight_s_rel': s_rel has dtype BF16; it must be F8_E4M3, F32 or U8"},
    {"w4_srel_wrong_rows", QL_ERR_FORMAT, "tensor 'l.weight_s_rel': s_rel must be [N, K/group_size] with N = 4"},
    {"w4_srel_wrong_cols", QL_ERR_FORMAT, "tensor 'l.weight': row width 16 is neither K/2 nor 3K/4 for K = 48"},
    {"w4_row_width", QL_ERR_FORMAT, "tensor 'l.weight': row width 20 is neither K/2 nor 3K/4 for K = 32"},
    {"w4_codebook_length", QL_ERR_FORMAT, "tensor 'l.weight_codebook': the codebook must be F32 [16] (it is F32 with 15 elements)"},
    {"w6_codebook", QL_ERR_FORMAT, "tensor 'l.weight_codebook': a 6-bit layer has no codebook"},
    {"w6_correction", QL_ERR_FORMAT, "tensor 'l.weight_correction': a 6-bit layer has no correction"},
    {"w6_width_4bit", QL_ERR_FORMAT, "tensor 'l.weight': a w6a8_int8 weight must be [N, 3K/4] = [4, 24]"},
    {"w4_k_not_16", QL_ERR_FORMAT, "layer 'l': K = 8 is not a multiple of 16 (4-bit codes)"},
    {"w6_k_not_32", QL_ERR_FORMAT, "layer 'l': K = 16 is not a multiple of 32 (6-bit codes)"},
    {"w4_k_not_convrot", QL_ERR_FORMAT, "layer 'l': K = 32 is not a multiple of the ConvRot group 64"},
    {"w4_bad_group", QL_ERR_FORMAT, "layer 'l': group_size 12 neither divides 16 nor is a multiple of it"},
    {"w6_bad_group", QL_ERR_FORMAT, "layer 'l': group_size 8 must be a multiple of 16 for 6-bit codes"},
    {"w4_srel_nan", QL_ERR_FORMAT, "tensor 'l.weight_s_rel': s_rel[1, 0] is NaN"},
    {"w4_schannel_nan", QL_ERR_FORMAT, "tensor 'l.weight_s_channel': s_channel[2] is NaN"},
    {"w4_schannel_wrong_dtype", QL_ERR_FORMAT, "tensor 'l.weight_s_channel': s_channel must be F32 [N] = [4] (it is F16, 1-D)"},
    {"w4_correction_shape", QL_ERR_FORMAT, "tensor 'l.weight_correction': the correction must be F32/F16/BF16 [K/group_size, N] = [2, 4]"},
    /* found by fuzz_layers: opened, then refused by ql_wxa8_check without the file's name */
    {"w4_correction_nan", QL_ERR_FORMAT, "tensor 'l.weight_correction': correction[1, 1] is NaN"},
    /* found reading layers.c for fuzz_layers: N = 0 leaves the row width unbounded (2·width
     * overflowed); an int8 layer [N, 0] with N > 2^48 opened, and ql_linear_create refused it */
    {"w4_width_overflow", QL_ERR_FORMAT, "tensor 'l.weight': row width 9223372036854775807 is neither K/2 nor 3K/4 for K = 32"},
    {"int8_rows_absurd", QL_ERR_FORMAT, "tensor 'l.weight': N = 4611686018427387904 rows is absurdly large (> 2^48)"},
};

int hc_count(void) { return (int)(sizeof cases / sizeof cases[0]); }
const hostile_case *hc_get(int i) { return &cases[i]; }

static void fill_random(unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)tu_next();
}

/* 8-byte length n, then `hlen` header bytes, then `dlen` random bytes. */
static unsigned char *raw(uint64_t n, const char *header, size_t hlen, size_t dlen, size_t *size)
{
    *size = 8 + hlen + dlen;
    unsigned char *b = malloc(*size ? *size : 1);
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(n >> (8 * i));
    memcpy(b + 8, header, hlen);
    fill_random(b + 8 + hlen, dlen);
    return b;
}

static unsigned char *rawh(const char *header, size_t dlen, size_t *size)
{
    return raw(strlen(header), header, strlen(header), dlen, size);
}

unsigned char *raw_file(const raw_tensor *t, int n, const char *meta_json, size_t *size)
{
    size_t cap = 4096, len = 0;
    char *h = malloc(cap);
    len += (size_t)snprintf(h + len, cap - len, "{");
    if (meta_json) len += (size_t)snprintf(h + len, cap - len, "\"__metadata__\":%s%s", meta_json, n ? "," : "");
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        len += (size_t)snprintf(h + len, cap - len, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":%s,\"data_offsets\":[%llu,%llu]}",
                                i ? "," : "", t[i].name, t[i].dtype, t[i].shape, (unsigned long long)off,
                                (unsigned long long)(off + t[i].bytes));
        off += t[i].bytes;
    }
    len += (size_t)snprintf(h + len, cap - len, "}");
    while (len % 8) h[len++] = ' ';
    unsigned char *b = raw(len, h, len, (size_t)off, size);
    off = 0;
    for (int i = 0; i < n; i++) {
        if (t[i].data) memcpy(b + 8 + len + off, t[i].data, (size_t)t[i].bytes);
        off += t[i].bytes;
    }
    free(h);
    return b;
}

/* A plain int8 layer 'l' [4, 8] with a chosen configuration / twist. */
static unsigned char *int8_layer(const char *cq, const char *cq_dtype, const char *w_dtype, const char *w_shape,
                                 uint64_t w_bytes, const char *s_dtype, const char *s_shape, uint64_t s_bytes,
                                 int with_scale, const char *b_shape, uint64_t b_bytes, const char *meta, size_t *size)
{
    float scale[64];
    for (int i = 0; i < 64; i++) scale[i] = 0.01f + 0.001f * (float)i;
    raw_tensor t[5];
    int n = 0;
    if (cq) t[n++] = (raw_tensor){"l.comfy_quant", cq_dtype, NULL, strlen(cq), cq};
    char cqshape[32];
    if (cq) {
        snprintf(cqshape, sizeof cqshape, "[%zu]", strlen(cq));
        t[0].shape = cqshape;
    }
    if (w_dtype) t[n++] = (raw_tensor){"l.weight", w_dtype, w_shape, w_bytes, NULL};
    if (with_scale) t[n++] = (raw_tensor){"l.weight_scale", s_dtype, s_shape, s_bytes, s_bytes <= sizeof scale ? scale : NULL};
    if (b_shape) t[n++] = (raw_tensor){"l.bias", "F32", b_shape, b_bytes, NULL};
    return raw_file(t, n, meta, size);
}

#define CQ_INT8 "{\"format\": \"int8_tensorwise\"}"
#define LAYER(cq, ...) int8_layer(cq, "U8", __VA_ARGS__)

/* A W4A8/W6A8 layer 'l' with N = 4: weight I8 [4, width], s_rel [4, ng]
 * (valid e4m3 bytes unless nan_srel), s_channel F32 [4], optional codebook
 * of cb_len floats and correction of the given shape. */
typedef struct wx_spec {
    const char *cq;
    int64_t width, ng;
    const char *srel_dtype, *srel_shape;
    int srel, sch, nan_srel, nan_sch, nan_corr, cb_len;
    const char *sch_dtype, *corr_shape;
    int64_t corr_elems;
} wx_spec;

static unsigned char *wxa8_layer(const wx_spec *w, size_t *size)
{
    static unsigned char wbuf[4 * 64], srel[4 * 64];
    static float sch[4], cb[16], corr[64];
    for (int i = 0; i < 4 * 64; i++) wbuf[i] = (unsigned char)tu_next(), srel[i] = (unsigned char)(0x30 + tu_next() % 16);
    for (int i = 0; i < 4; i++) sch[i] = 0.001f * (float)(i + 1);
    for (int i = 0; i < 16; i++) cb[i] = -1.0f + (float)i / 8.0f;
    for (int i = 0; i < 64; i++) corr[i] = 0.01f;
    if (w->nan_srel) srel[w->ng] = 0x7F;
    if (w->nan_sch) sch[2] = NAN;
    if (w->nan_corr) corr[5] = NAN;
    raw_tensor t[6];
    int n = 0;
    static char cqshape[32], wshape[32], srshape[32], cbshape[32];
    snprintf(cqshape, sizeof cqshape, "[%zu]", strlen(w->cq));
    t[n++] = (raw_tensor){"l.comfy_quant", "U8", cqshape, strlen(w->cq), w->cq};
    snprintf(wshape, sizeof wshape, "[4,%lld]", (long long)w->width);
    t[n++] = (raw_tensor){"l.weight", "I8", wshape, (uint64_t)(4 * w->width), wbuf};
    if (w->srel) {
        snprintf(srshape, sizeof srshape, "[4,%lld]", (long long)w->ng);
        const char *dt = w->srel_dtype ? w->srel_dtype : "F8_E4M3";
        uint64_t es = !strcmp(dt, "BF16") ? 2 : 1;
        t[n++] = (raw_tensor){"l.weight_s_rel", dt, w->srel_shape ? w->srel_shape : srshape, es * (uint64_t)(4 * w->ng), srel};
        if (w->srel_shape) t[n - 1].bytes = es * (uint64_t)(3 * w->ng);
    }
    if (w->sch) {
        const char *dt = w->sch_dtype ? w->sch_dtype : "F32";
        t[n++] = (raw_tensor){"l.weight_s_channel", dt, "[4]", !strcmp(dt, "F32") ? 16u : 8u, sch};
    }
    if (w->cb_len) {
        snprintf(cbshape, sizeof cbshape, "[%d]", w->cb_len);
        t[n++] = (raw_tensor){"l.weight_codebook", "F32", cbshape, (uint64_t)(4 * w->cb_len), cb};
    }
    if (w->corr_shape) t[n++] = (raw_tensor){"l.weight_correction", "F32", w->corr_shape, (uint64_t)(4 * w->corr_elems), corr};
    return raw_file(t, n, NULL, size);
}
#define CQ_W4 "{\"format\": \"asym_w4a8_int8\", \"group_size\": 16, \"convrot_groupsize\": 16}"
#define CQ_W6 "{\"format\": \"w6a8_int8\", \"group_size\": 16, \"convrot_groupsize\": 16}"
#define WX(...) wxa8_layer(&(wx_spec){__VA_ARGS__}, size)

unsigned char *hc_build(int i, size_t *size)
{
    const char *id = cases[i].id;
    static char deep[20000];
#define IS(x) (!strcmp(id, x))
    if (IS("empty")) {
        *size = 0;
        return malloc(1);
    }
    if (IS("short")) {
        unsigned char *b = raw(5, "", 0, 0, size);
        *size = 5;
        return b;
    }
    if (IS("header_past_eof")) return raw(1000, "{}", 2, 8, size);
    if (IS("header_2p63")) return raw((uint64_t)1 << 63, "{}", 2, 0, size);
    if (IS("header_over_100mb")) return raw(100000001, "{}", 2, 0, size);
    if (IS("header_not_json")) return rawh("{not json}", 0, size);
    if (IS("header_not_object")) return rawh("[1, 2, 3]", 0, size);
    if (IS("header_empty")) return rawh("", 0, size);
    if (IS("header_not_utf8")) return rawh("{\"a\xff\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}", 0, size);
    if (IS("header_trailing_garbage")) return rawh("{} {}", 0, size);
    if (IS("header_deep_nesting")) {
        size_t o = (size_t)sprintf(deep, "{\"a\":");
        for (int d = 0; d < 5000; d++) deep[o++] = '[';
        deep[o] = 0;
        return rawh(deep, 0, size);
    }
    if (IS("header_nul_in_name")) return rawh("{\"a\\u0000b\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}", 0, size);
    if (IS("entry_not_object")) return rawh("{\"a\":5}", 0, size);
    if (IS("missing_dtype")) return rawh("{\"a\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8, size);
    if (IS("unknown_dtype")) return rawh("{\"a\":{\"dtype\":\"F17\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, size);
    if (IS("missing_shape")) return rawh("{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", 8, size);
    if (IS("negative_dim")) return rawh("{\"a\":{\"dtype\":\"F32\",\"shape\":[2,-4],\"data_offsets\":[0,8]}}", 8, size);
    if (IS("fractional_dim")) return rawh("{\"a\":{\"dtype\":\"F32\",\"shape\":[2.5],\"data_offsets\":[0,8]}}", 8, size);
    if (IS("string_dim")) return rawh("{\"a\":{\"dtype\":\"F32\",\"shape\":[\"2\"],\"data_offsets\":[0,8]}}", 8, size);
    if (IS("dim_beyond_int64"))
        return rawh("{\"a\":{\"dtype\":\"F32\",\"shape\":[99999999999999999999],\"data_offsets\":[0,8]}}", 8, size);
    if (IS("dims_overflow_u64"))
        return rawh("{\"a\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296,2],\"data_offsets\":[0,8]}}", 8, size);
    if (IS("bytes_overflow_u64"))
        return rawh("{\"a\":{\"dtype\":\"F64\",\"shape\":[2305843009213693952,2],\"data_offsets\":[0,8]}}", 8, size);
    if (IS("subbyte_odd")) return rawh("{\"a\":{\"dtype\":\"F4\",\"shape\":[3],\"data_offsets\":[0,2]}}", 2, size);
    if (IS("missing_offsets")) return rawh("{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, size);
    if (IS("offsets_one_value")) return rawh("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", 8, size);
    if (IS("offsets_negative")) return rawh("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[-8,0]}}", 8, size);
    if (IS("offsets_beyond_eof"))
        return rawh("{\"a\":{\"dtype\":\"U8\",\"shape\":[100],\"data_offsets\":[0,100]}}", 16, size);
    if (IS("offsets_reversed")) return rawh("{\"a\":{\"dtype\":\"U8\",\"shape\":[5],\"data_offsets\":[10,5]}}", 16, size);
    if (IS("offsets_size_mismatch")) return rawh("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, size);
    if (IS("offsets_overlap"))
        return rawh("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
                    "\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}",
                    24, size);
    if (IS("offsets_hole"))
        return rawh("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                    "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[16,24]}}",
                    24, size);
    if (IS("offsets_trailing_bytes")) return rawh("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 16, size);
    if (IS("zero_size_inside"))
        return rawh("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                    "\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]}}",
                    8, size);
    if (IS("duplicate_names"))
        return rawh("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                    "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                    8, size);
    if (IS("metadata_nonstring"))
        return rawh("{\"__metadata__\":{\"format\":\"pt\",\"step\":1000},"
                    "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
                    4, size);
    if (IS("metadata_not_object"))
        return rawh("{\"__metadata__\":\"pt\",\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, size);

    /* Layer 'l': N = 4, K = 8 unless the case says otherwise. */
    if (IS("cq_invalid_json")) return LAYER("{\"format\": ", "I8", "[4,8]", 32, "F32", "[4,1]", 16, 1, NULL, 0, NULL, size);
    if (IS("cq_not_object")) return LAYER("[\"int8_tensorwise\"]", "I8", "[4,8]", 32, "F32", "[4,1]", 16, 1, NULL, 0, NULL, size);
    if (IS("cq_not_utf8")) return LAYER("{\"format\": \"int8\xc0\xaf\"}", "I8", "[4,8]", 32, "F32", "[4,1]", 16, 1, NULL, 0, NULL, size);
    if (IS("cq_unknown_format"))
        return LAYER("{\"format\": \"int3_magic\"}", "I8", "[4,8]", 32, "F32", "[4,1]", 16, 1, NULL, 0, NULL, size);
    if (IS("cq_no_format")) return LAYER("{\"convrot\": true}", "I8", "[4,8]", 32, "F32", "[4,1]", 16, 1, NULL, 0, NULL, size);
    if (IS("cq_wrong_dtype"))
        return int8_layer(CQ_INT8, "I8", "I8", "[4,8]", 32, "F32", "[4,1]", 16, 1, NULL, 0, NULL, size);
    if (IS("cq_convrot_not_bool"))
        return LAYER("{\"format\": \"int8_tensorwise\", \"convrot\": \"yes\"}", "I8", "[4,256]", 1024, "F32", "[4,1]", 16, 1,
                     NULL, 0, NULL, size);
    if (IS("cq_bad_group"))
        return LAYER("{\"format\": \"int8_tensorwise\", \"params\": {\"convrot\": true, \"convrot_groupsize\": 100}}", "I8",
                     "[4,200]", 800, "F32", "[4,1]", 16, 1, NULL, 0, NULL, size);
    if (IS("scale_wrong_size")) return LAYER(CQ_INT8, "I8", "[4,8]", 32, "F32", "[3]", 12, 1, NULL, 0, NULL, size);
    if (IS("scale_wrong_shape")) return LAYER(CQ_INT8, "I8", "[4,8]", 32, "F32", "[1,4]", 16, 1, NULL, 0, NULL, size);
    if (IS("scale_wrong_dtype")) return LAYER(CQ_INT8, "I8", "[4,8]", 32, "BF16", "[4,1]", 8, 1, NULL, 0, NULL, size);
    if (IS("scale_missing")) return LAYER(CQ_INT8, "I8", "[4,8]", 32, NULL, NULL, 0, 0, NULL, 0, NULL, size);
    if (IS("weight_float_dtype")) return LAYER(CQ_INT8, "F32", "[4,8]", 128, "F32", "[4,1]", 16, 1, NULL, 0, NULL, size);
    if (IS("weight_missing")) return LAYER(CQ_INT8, NULL, NULL, 0, "F32", "[4,1]", 16, 1, NULL, 0, NULL, size);
    if (IS("weight_not_2d")) return LAYER(CQ_INT8, "I8", "[4,2,4]", 32, "F32", "[4,1]", 16, 1, NULL, 0, NULL, size);
    if (IS("k_not_multiple_of_group"))
        return LAYER("{\"format\": \"int8_tensorwise\", \"convrot\": true, \"convrot_groupsize\": 256}", "I8", "[4,100]", 400,
                     "F32", "[4,1]", 16, 1, NULL, 0, NULL, size);
    if (IS("bias_wrong_shape")) return LAYER(CQ_INT8, "I8", "[4,8]", 32, "F32", "[4,1]", 16, 1, "[5]", 20, NULL, size);
    if (IS("qmeta_invalid_json"))
        return int8_layer(NULL, NULL, "I8", "[4,8]", 32, "F32", "[4,1]", 16, 1, NULL, 0,
                          "{\"_quantization_metadata\":\"{\\\"layers\\\": \"}", size);
    if (IS("qmeta_no_layers"))
        return int8_layer(NULL, NULL, "I8", "[4,8]", 32, "F32", "[4,1]", 16, 1, NULL, 0,
                          "{\"_quantization_metadata\":\"{\\\"format_version\\\": \\\"1.0\\\"}\"}", size);
    if (IS("qmeta_unknown_format"))
        return int8_layer(NULL, NULL, "I8", "[4,8]", 32, "F32", "[4,1]", 16, 1, NULL, 0,
                          "{\"_quantization_metadata\":\"{\\\"layers\\\": {\\\"l\\\": {\\\"format\\\": \\\"fp3\\\"}}}\"}",
                          size);
    if (IS("qmeta_conflict"))
        return LAYER(CQ_INT8, "I8", "[4,256]", 1024, "F32", "[4,1]", 16, 1, NULL, 0,
                     "{\"_quantization_metadata\":\"{\\\"layers\\\": {\\\"l\\\": {\\\"format\\\": \\\"int8_tensorwise\\\", "
                     "\\\"convrot\\\": true}}}\"}",
                     size);
    if (IS("qmeta_weight_float"))
        return int8_layer(NULL, NULL, "BF16", "[4,8]", 64, "F32", "[4,1]", 16, 1, NULL, 0,
                          "{\"_quantization_metadata\":\"{\\\"format_version\\\": \\\"1.0\\\", \\\"layers\\\": "
                          "{\\\"l\\\": {\\\"format\\\": \\\"int8_tensorwise\\\"}}}\"}",
                          size);
    if (IS("w4_srel_missing")) return WX(CQ_W4, 16, 2, .sch = 1);
    if (IS("w4_schannel_missing")) return WX(CQ_W4, 16, 2, .srel = 1);
    if (IS("w4_srel_wrong_dtype")) return WX(CQ_W4, 16, 2, "BF16", .srel = 1, .sch = 1);
    if (IS("w4_srel_wrong_rows")) return WX(CQ_W4, 16, 2, NULL, "[3,2]", .srel = 1, .sch = 1);
    if (IS("w4_srel_wrong_cols")) return WX(CQ_W4, 16, 3, .srel = 1, .sch = 1);
    if (IS("w4_row_width")) return WX(CQ_W4, 20, 2, .srel = 1, .sch = 1);
    if (IS("w4_codebook_length")) return WX(CQ_W4, 16, 2, .srel = 1, .sch = 1, .cb_len = 15);
    if (IS("w6_codebook")) return WX(CQ_W4, 24, 2, .srel = 1, .sch = 1, .cb_len = 16);
    if (IS("w6_correction")) return WX(CQ_W6, 24, 2, .srel = 1, .sch = 1, .corr_shape = "[2,4]", .corr_elems = 8);
    if (IS("w6_width_4bit")) return WX(CQ_W6, 16, 2, .srel = 1, .sch = 1);
    if (IS("w4_k_not_16"))
        return WX("{\"format\": \"asym_w4a8_int8\", \"group_size\": 4, \"convrot_groupsize\": 4}", 4, 2, .srel = 1, .sch = 1);
    if (IS("w6_k_not_32")) return WX(CQ_W6, 12, 1, .srel = 1, .sch = 1);
    if (IS("w4_k_not_convrot"))
        return WX("{\"format\": \"asym_w4a8_int8\", \"group_size\": 16, \"convrot_groupsize\": 64}", 16, 2, .srel = 1, .sch = 1);
    if (IS("w4_bad_group"))
        return WX("{\"format\": \"asym_w4a8_int8\", \"params\": {\"group_size\": 12}, \"convrot_groupsize\": 16}", 24, 4,
                  .srel = 1, .sch = 1);
    if (IS("w6_bad_group"))
        return WX("{\"format\": \"w6a8_int8\", \"group_size\": 8, \"convrot_groupsize\": 16}", 24, 4, .srel = 1, .sch = 1);
    if (IS("w4_srel_nan")) return WX(CQ_W4, 16, 2, .srel = 1, .sch = 1, .nan_srel = 1);
    if (IS("w4_schannel_nan")) return WX(CQ_W4, 16, 2, .srel = 1, .sch = 1, .nan_sch = 1);
    if (IS("w4_schannel_wrong_dtype")) return WX(CQ_W4, 16, 2, .srel = 1, .sch = 1, .sch_dtype = "F16");
    if (IS("w4_correction_shape")) return WX(CQ_W4, 16, 2, .srel = 1, .sch = 1, .corr_shape = "[4,2]", .corr_elems = 8);
    if (IS("w4_width_overflow"))
        return raw_file((raw_tensor[]){{"l.comfy_quant", "U8", "[71]", 71, CQ_W4},
                                       {"l.weight", "I8", "[0,9223372036854775807]", 0, NULL},
                                       {"l.weight_s_rel", "F8_E4M3", "[0,2]", 0, NULL},
                                       {"l.weight_s_channel", "F32", "[0]", 0, NULL}},
                        4, NULL, size);
    if (IS("int8_rows_absurd"))
        return LAYER(CQ_INT8, "I8", "[4611686018427387904,0]", 0, "F32", "[]", 4, 1, NULL, 0, NULL, size);
    if (IS("w4_correction_nan"))
        return WX(CQ_W4, 16, 2, .srel = 1, .sch = 1, .corr_shape = "[2,4]", .corr_elems = 8, .nan_corr = 1);
#undef IS
    *size = 0;
    return NULL;
}

int write_file(const char *path, const void *data, size_t size)
{
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = size ? fwrite(data, 1, size, f) : 0;
    int rc = fclose(f);
    return (w == size && rc == 0) ? 0 : -1;
}

unsigned char *read_file(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(n > 0 ? (size_t)n : 1);
    if (b && n > 0 && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    fclose(f);
    *size = n > 0 ? (size_t)n : 0;
    return b;
}

char *make_temp_dir(const char *tag)
{
    const char *base = getenv("TMPDIR");
    char *p = malloc(512);
    snprintf(p, 512, "%s/%s.XXXXXX", base && *base ? base : "/tmp", tag);
    if (!mkdtemp(p)) {
        free(p);
        return NULL;
    }
    return p;
}

void rm_tree(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char path[1024];
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        struct stat sb;
        if (lstat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) rm_tree(path);
        else unlink(path);
    }
    closedir(d);
    rmdir(dir);
}

char *fc_path(const char *dir, const char *name)
{
    static char buf[64][600];
    static int k;
    char *p = buf[k++ % 64];
    snprintf(p, 600, "%s/%s", dir, name);
    return p;
}
