/* Writes a small seed corpus for fuzz_checkpoint into a folder: valid files
 * from the qlinear writer (float tensors, a quantized int8 layer, a ConvRot
 * layer with a bias, __metadata__, _quantization_metadata, odd dtypes) and a
 * few near-misses. Usage: fuzz_make_seeds DIR */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "qlinear.h"

static int put(const char *dir, const char *name, const ql_tensor_spec *sp, const void *const *data, int n,
               const char *const *mk, const char *const *mv, int nm)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    ql_st_writer *w;
    if (ql_st_writer_open(path, sp, n, mk, mv, nm, NULL, &w) != QL_OK) goto fail;
    for (int i = 0; i < n; i++)
        if (ql_st_writer_write(w, i, 0, data[i], (size_t)ql_st_writer_tensor_bytes(w, i)) != QL_OK) {
            ql_st_writer_abort(w);
            goto fail;
        }
    if (ql_st_writer_finish(w) != QL_OK) goto fail;
    return 0;
fail:
    fprintf(stderr, "fuzz_make_seeds: %s\n", ql_last_error());
    return 1;
}

static int put_raw(const char *dir, const char *name, const char *header, size_t data_len)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) return 1;
    uint64_t n = strlen(header);
    for (int i = 0; i < 8; i++) fputc((int)((n >> (8 * i)) & 0xff), f);
    fputs(header, f);
    for (size_t i = 0; i < data_len; i++) fputc((int)(i * 37 + 11) & 0xff, f);
    return fclose(f) != 0;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: fuzz_make_seeds DIR\n");
        return 2;
    }
    const char *dir = argv[1];
    mkdir(dir, 0755);
    int rc = 0;
    float f[64];
    int8_t q[4 * 16];
    float s[4] = {0.01f, 0.02f, 0.5f, 1.0f};
    uint16_t b[4] = {0x3f80, 0x4000, 0xc000, 0};
    for (int i = 0; i < 64; i++) {
        f[i] = (float)(i - 32) / 7.0f;
        q[i] = (int8_t)(i * 5 - 100);
    }
    int64_t s2[] = {2}, s44[] = {4, 16}, s41[] = {4, 1}, s4[] = {4}, s0[] = {0};
    const char *mk[] = {"format"}, *mv[] = {"pt"};
    /* floats + metadata */
    rc |= put(dir, "float.safetensors",
              (ql_tensor_spec[]){{"a.weight", QL_ST_F32, 2, s44}, {"a.bias", QL_ST_BF16, 1, s4}, {"e", QL_ST_F16, 1, s0}},
              (const void *[]){f, b, f}, 3, mk, mv, 1);
    /* plain int8 layer */
    const char *cq = "{\"format\": \"int8_tensorwise\"}";
    int64_t scq[] = {(int64_t)strlen(cq)};
    rc |= put(dir, "int8.safetensors",
              (ql_tensor_spec[]){{"l.weight", QL_ST_I8, 2, s44}, {"l.weight_scale", QL_ST_F32, 2, s41},
                                 {"l.comfy_quant", QL_ST_U8, 1, scq}},
              (const void *[]){q, s, cq}, 3, NULL, NULL, 0);
    /* ConvRot layer (group 16) with a bias, params-nested */
    const char *cq2 = "{\"format\": \"int8_tensorwise\", \"params\": {\"convrot\": true, \"convrot_groupsize\": 16}}";
    int64_t scq2[] = {(int64_t)strlen(cq2)};
    rc |= put(dir, "convrot.safetensors",
              (ql_tensor_spec[]){{"m.l.weight", QL_ST_I8, 2, s44}, {"m.l.weight_scale", QL_ST_F32, 1, s4},
                                 {"m.l.bias", QL_ST_BF16, 1, s4}, {"m.l.comfy_quant", QL_ST_U8, 1, scq2}},
              (const void *[]){q, s, b, cq2}, 4, NULL, NULL, 0);
    /* _quantization_metadata declaration */
    const char *qk[] = {"_quantization_metadata"};
    const char *qv[] = {"{\"format_version\": \"1.0\", \"layers\": {\"l\": {\"format\": \"int8_tensorwise\", "
                        "\"convrot\": true, \"convrot_groupsize\": 16}}}"};
    rc |= put(dir, "qmeta.safetensors",
              (ql_tensor_spec[]){{"l.weight", QL_ST_I8, 2, s44}, {"l.weight_scale", QL_ST_F32, 0, NULL}},
              (const void *[]){q, s}, 2, qk, qv, 1);
    /* other formats and dtypes */
    const char *cq3 = "{\"format\": \"asym_w4a8_int8\", \"group_size\": 16, \"convrot_groupsize\": 256}";
    int64_t scq3[] = {(int64_t)strlen(cq3)}, s8[] = {2, 2};
    rc |= put(dir, "others.safetensors",
              (ql_tensor_spec[]){{"w.weight", QL_ST_I8, 2, s44}, {"w.comfy_quant", QL_ST_U8, 1, scq3},
                                 {"x", QL_ST_F8_E4M3, 1, s2}, {"y", QL_ST_F4, 1, s2}, {"z", QL_ST_C64, 2, s8},
                                 {"u", QL_ST_U64, 1, s2}},
              (const void *[]){q, cq3, q, q, f, f}, 6, NULL, NULL, 0);
    /* W4A8 (codebook) and W6A8 layers, K = 32, group 16, ConvRot 16 */
    const char *cq4 = "{\"format\": \"asym_w4a8_int8\", \"group_size\": 16, \"convrot_groupsize\": 16}";
    const char *cq6 = "{\"format\": \"w6a8_int8\", \"group_size\": 16, \"convrot_groupsize\": 16}";
    uint8_t srel[8] = {0x38, 0x01, 0x7E, 0x40, 0x30, 0x07, 0x50, 0x20}, wq[96];
    for (int i = 0; i < 96; i++) wq[i] = (uint8_t)(i * 29 + 7);
    int64_t scq4[] = {(int64_t)strlen(cq4)}, scq6[] = {(int64_t)strlen(cq6)}, sw4[] = {4, 16}, sw6[] = {4, 24},
            sr[] = {4, 2}, s16[] = {16};
    rc |= put(dir, "w4a8.safetensors",
              (ql_tensor_spec[]){{"w.weight", QL_ST_I8, 2, sw4}, {"w.weight_s_rel", QL_ST_F8_E4M3, 2, sr},
                                 {"w.weight_s_channel", QL_ST_F32, 1, s4}, {"w.weight_codebook", QL_ST_F32, 1, s16},
                                 {"w.comfy_quant", QL_ST_U8, 1, scq4}},
              (const void *[]){wq, srel, s, f, cq4}, 5, NULL, NULL, 0);
    rc |= put(dir, "w6a8.safetensors",
              (ql_tensor_spec[]){{"w.weight", QL_ST_I8, 2, sw6}, {"w.weight_s_rel", QL_ST_U8, 2, sr},
                                 {"w.weight_s_channel", QL_ST_F32, 1, s4}, {"w.bias", QL_ST_BF16, 1, s4},
                                 {"w.comfy_quant", QL_ST_U8, 1, scq6}},
              (const void *[]){wq, srel, s, b, cq6}, 5, NULL, NULL, 0);
    /* near-misses */
    rc |= put_raw(dir, "hole.safetensors",
                  "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                  "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[16,24]}}",
                  24);
    rc |= put_raw(dir, "meta.safetensors", "{\"__metadata__\":{\"k\":\"v\",\"n\":1}}", 0);
    rc |= put_raw(dir, "empty.safetensors", "{}", 0);
    return rc;
}
