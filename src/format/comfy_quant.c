/* comfy_quant configurations (docs/FORMATS.md §2.2): parse what ComfyUI reads,
 * write exactly what ComfyUI writes. */
#include "format.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "quant/quant.h"

/* The formats ComfyUI's QUANT_ALGOS knows (plus W6A8, newer); qlinear runs
 * int8_tensorwise, asym_w4a8_int8 and w6a8_int8. */
static const struct {
    const char *name;
    int supported;
    int64_t group_size; /* default group_size, 0 if the format has none */
} known_formats[] = {
    {"int8_tensorwise", 1, 0}, {"float8_e4m3fn", 0, 0}, {"float8_e5m2", 0, 0},
    {"nvfp4", 0, 16},          {"mxfp8", 0, 32},        {"convrot_w4a4", 0, 0},
    {"asym_w4a8_int8", 1, 16}, {"awq_w4a16", 0, 64},    {"w6a8_int8", 1, 16},
};
#define N_KNOWN ((int)(sizeof known_formats / sizeof known_formats[0]))

/* A key at the top level, else under "params" (ComfyUI's fallback). */
static json_t *lookup(json_t *obj, json_t *params, const char *key)
{
    json_t *v = json_object_get(obj, key);
    if (!v && params) v = json_object_get(params, key);
    return v;
}

static ql_status parse_obj(const char *file, const char *where, json_t *o, ql_cq *out)
{
    memset(out, 0, sizeof *out);
    out->convrot_group = 256;
    if (!json_is_object(o)) return ql_fail_path(file, QL_ERR_FORMAT, "%s: configuration is %s, not a JSON object", where, ql_json_kind(o));
    json_t *params = json_object_get(o, "params");
    if (params && !json_is_object(params))
        return ql_fail_path(file, QL_ERR_FORMAT, "%s: \"params\" is %s, not an object", where, ql_json_kind(params));
    json_t *f = json_object_get(o, "format");
    if (!f) return ql_fail_path(file, QL_ERR_FORMAT, "%s: no \"format\" key", where);
    if (!json_is_string(f)) return ql_fail_path(file, QL_ERR_FORMAT, "%s: \"format\" is %s, not a string", where, ql_json_kind(f));
    const char *fs = json_string_value(f);
    int fi = -1;
    for (int i = 0; i < N_KNOWN; i++)
        if (!strcmp(fs, known_formats[i].name)) fi = i;
    if (fi < 0) {
        ql_name_buf nb;
        return ql_fail_path(file, QL_ERR_FORMAT,
                     "%s: unknown format '%s' (known: int8_tensorwise, float8_e4m3fn, float8_e5m2, nvfp4, mxfp8, "
                     "convrot_w4a4, asym_w4a8_int8, awq_w4a16, w6a8_int8)",
                     where, ql_show(&nb, fs));
    }
    out->format = known_formats[fi].name;
    out->known_supported = known_formats[fi].supported;
    out->group_size = known_formats[fi].group_size;
    snprintf(out->linear_dtype, sizeof out->linear_dtype, "int4");

    json_t *v;
    if ((v = lookup(o, params, "convrot"))) {
        if (!json_is_boolean(v))
            return ql_fail_path(file, QL_ERR_FORMAT, "%s: \"convrot\" is %s, not true or false", where, ql_json_kind(v));
        out->convrot = json_is_true(v);
    }
    if ((v = lookup(o, params, "full_precision_matrix_mult"))) {
        if (!json_is_boolean(v))
            return ql_fail_path(file, QL_ERR_FORMAT, "%s: \"full_precision_matrix_mult\" is %s, not true or false", where,
                         ql_json_kind(v));
        out->full_precision_matrix_mult = json_is_true(v);
    }
    if ((v = lookup(o, params, "convrot_groupsize"))) {
        if (!json_is_integer(v))
            return ql_fail_path(file, QL_ERR_FORMAT, "%s: \"convrot_groupsize\" is %s, not an integer", where, ql_json_kind(v));
        out->convrot_group = (int64_t)json_integer_value(v);
    }
    if ((v = lookup(o, params, "group_size"))) {
        if (!json_is_integer(v) || json_integer_value(v) <= 0)
            return ql_fail_path(file, QL_ERR_FORMAT, "%s: \"group_size\" must be a positive integer", where);
        out->group_size = (int64_t)json_integer_value(v);
    }
    if ((v = lookup(o, params, "linear_dtype"))) {
        if (!json_is_string(v))
            return ql_fail_path(file, QL_ERR_FORMAT, "%s: \"linear_dtype\" is %s, not a string", where, ql_json_kind(v));
        ql_name_buf nb;
        snprintf(out->linear_dtype, sizeof out->linear_dtype, "%s", ql_show(&nb, json_string_value(v)));
    }
    /* The rotation group matters wherever a rotation is applied. */
    int rotated = (fi == 0 && out->convrot) || !strcmp(out->format, "convrot_w4a4") ||
                  !strcmp(out->format, "asym_w4a8_int8") || !strcmp(out->format, "w6a8_int8");
    if (rotated && !ql_group_valid(out->convrot_group))
        return ql_fail_path(file, QL_ERR_FORMAT, "%s: convrot_groupsize %lld is not a power of 4 between 4 and 65536", where,
                     (long long)out->convrot_group);
    if (!rotated) out->convrot = 0;
    return QL_OK;
}

ql_status ql_cq_parse_text(const char *file, const char *where, const char *text, size_t len, ql_cq *out)
{
    while (len > 0 && text[len - 1] == '\0') len--; /* zero padding after the text */
    const char *nul = memchr(text, '\0', len); /* the layer keeps its configuration as a C string */
    if (nul) return ql_fail_path(file, QL_ERR_FORMAT, "%s: configuration holds a NUL byte (byte %zu)", where, (size_t)(nul - text));
    size_t bad = ql_utf8_check((const unsigned char *)text, len);
    if (bad != len) return ql_fail_path(file, QL_ERR_FORMAT, "%s: configuration is not valid UTF-8 (byte %zu)", where, bad);
    json_error_t err;
    json_t *o = json_loadb(text, len, JSON_REJECT_DUPLICATES, &err);
    if (!o) {
        ql_name_buf nb;
        return ql_fail_path(file, QL_ERR_FORMAT, "%s: configuration is not valid JSON (column %d): %s", where, err.column,
                     ql_show(&nb, err.text));
    }
    ql_status st = parse_obj(file, where, o, out);
    json_decref(o);
    return st;
}

ql_status ql_cq_parse_json(const char *file, const char *where, void *json_obj, ql_cq *out)
{
    return parse_obj(file, where, (json_t *)json_obj, out);
}

size_t ql_comfy_quant_json(ql_quant_target target, int64_t group, char *buf, size_t cap)
{
    int n;
    if (target == QL_QUANT_INT8_CONVROT)
        n = snprintf(buf, cap, "{\"format\": \"int8_tensorwise\", \"convrot\": true, \"convrot_groupsize\": %" PRId64 "}",
                     group > 0 ? group : (int64_t)256);
    else
        n = snprintf(buf, cap, "{\"format\": \"int8_tensorwise\"}");
    return n < 0 ? 0 : (size_t)n;
}

size_t ql_comfy_quant_json_wxa8(ql_quant_target target, int64_t group_size, int64_t convrot_group, char *buf, size_t cap)
{
    int n = snprintf(buf, cap, "{\"format\": \"%s\", \"group_size\": %" PRId64 ", \"convrot_groupsize\": %" PRId64 "}",
                     target == QL_QUANT_W6A8 ? "w6a8_int8" : "asym_w4a8_int8", group_size > 0 ? group_size : (int64_t)16,
                     convrot_group > 0 ? convrot_group : (int64_t)256);
    return n < 0 ? 0 : (size_t)n;
}
