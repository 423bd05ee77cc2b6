/* The base checkpoint fuzz_lora matches LoRA files against (and that
 * fuzz_make_seeds writes LoRA seeds for): linear layers of every kind the
 * plan knows, under each of the prefixes the names may carry, plus layers
 * and tensors that are no linear, and two layers one kohya name answers to
 * (a.b_c, a_b.c). */
#ifndef QL_FUZZ_LORA_BASE_H
#define QL_FUZZ_LORA_BASE_H

#include "fuzz_st.h"

enum { FZ_INT8, FZ_INT8_CONVROT, FZ_BF16, FZ_F32_BIAS, FZ_W4A8, FZ_W6A8, FZ_FP8, FZ_NOT_LINEAR };

typedef struct fz_base_layer {
    const char *prefix; /* as the base names it */
    const char *path;   /* without the base's prefix: what LoRA names carry */
    int kind;
    int64_t n, k;
} fz_base_layer;

static const fz_base_layer fz_base_layers[] = {
    {"model.diffusion_model.blocks.0.attn.q", "blocks.0.attn.q", FZ_INT8, 8, 16},
    {"diffusion_model.blocks.0.mlp.fc1", "blocks.0.mlp.fc1", FZ_INT8_CONVROT, 4, 16},
    {"transformer.blocks.1.proj", "blocks.1.proj", FZ_BF16, 6, 8},
    {"unet.final.linear", "final.linear", FZ_F32_BIAS, 4, 4},
    {"blocks.2.w4", "blocks.2.w4", FZ_W4A8, 4, 32},
    {"blocks.2.w6", "blocks.2.w6", FZ_W6A8, 4, 32},
    {"blocks.3.fp8", "blocks.3.fp8", FZ_FP8, 4, 8},
    {"a.b_c", "a.b_c", FZ_INT8, 4, 4},
    {"a_b.c", "a_b.c", FZ_INT8, 4, 4},
    {"norm", "norm", FZ_NOT_LINEAR, 4, 0},
};
#define FZ_N_BASE ((int)(sizeof fz_base_layers / sizeof fz_base_layers[0]))

/* The base as a safetensors image (malloc'd). */
static unsigned char *fz_lora_base(size_t *size)
{
    static char names[FZ_N_BASE][6][96];
    static uint8_t bytes[1024], srel[64];
    static float ones[64];
    static const char *cq_int8 = "{\"format\": \"int8_tensorwise\"}",
                      *cq_conv = "{\"format\": \"int8_tensorwise\", \"convrot\": true, \"convrot_groupsize\": 16}",
                      *cq_w4 = "{\"format\": \"asym_w4a8_int8\", \"group_size\": 16, \"convrot_groupsize\": 16}",
                      *cq_w6 = "{\"format\": \"w6a8_int8\", \"group_size\": 16, \"convrot_groupsize\": 16}",
                      *cq_fp8 = "{\"format\": \"float8_e4m3fn\"}";
    for (int i = 0; i < 1024; i++) bytes[i] = (uint8_t)(i * 73 + 19);
    for (int i = 0; i < 64; i++) srel[i] = 0x30, ones[i] = 0.01f * (float)(i + 1);
    fz_tensor t[64];
    int n = 0;
    for (int l = 0; l < FZ_N_BASE; l++) {
        const fz_base_layer *b = &fz_base_layers[l];
        static const char *sfx[6] = {".weight", ".weight_scale", ".comfy_quant", ".bias", ".weight_s_rel",
                                     ".weight_s_channel"};
        for (int s = 0; s < 6; s++) snprintf(names[l][s], sizeof names[l][s], "%s%s", b->prefix, sfx[s]);
        const char *cq = NULL;
        switch (b->kind) {
        case FZ_INT8:
        case FZ_INT8_CONVROT:
            cq = b->kind == FZ_INT8 ? cq_int8 : cq_conv;
            t[n++] = (fz_tensor){names[l][0], QL_ST_I8, 2, {b->n, b->k}, bytes};
            t[n++] = b->kind == FZ_INT8 ? (fz_tensor){names[l][1], QL_ST_F32, 2, {b->n, 1}, ones}
                                        : (fz_tensor){names[l][1], QL_ST_F32, 0, {0}, ones};
            break;
        case FZ_BF16: t[n++] = (fz_tensor){names[l][0], QL_ST_BF16, 2, {b->n, b->k}, bytes}; break;
        case FZ_F32_BIAS:
            t[n++] = (fz_tensor){names[l][0], QL_ST_F32, 2, {b->n, b->k}, ones};
            t[n++] = (fz_tensor){names[l][3], QL_ST_F32, 1, {b->n}, ones};
            break;
        case FZ_W4A8:
        case FZ_W6A8:
            cq = b->kind == FZ_W4A8 ? cq_w4 : cq_w6;
            t[n++] = (fz_tensor){names[l][0], QL_ST_I8, 2, {b->n, b->kind == FZ_W4A8 ? b->k / 2 : 3 * b->k / 4}, bytes};
            t[n++] = (fz_tensor){names[l][4], QL_ST_F8_E4M3, 2, {b->n, b->k / 16}, srel};
            t[n++] = (fz_tensor){names[l][5], QL_ST_F32, 1, {b->n}, ones};
            break;
        case FZ_FP8:
            cq = cq_fp8;
            t[n++] = (fz_tensor){names[l][0], QL_ST_F8_E4M3, 2, {b->n, b->k}, bytes};
            break;
        default: t[n++] = (fz_tensor){names[l][0], QL_ST_F32, 1, {b->n}, ones}; break;
        }
        if (cq) t[n++] = (fz_tensor){names[l][2], QL_ST_U8, 1, {(int64_t)strlen(cq)}, cq};
    }
    t[n++] = (fz_tensor){"emb.weight", QL_ST_I8, 2, {4, 4}, bytes}; /* 2-D but not float: no linear */
    return fz_build(t, n, size);
}

#endif
