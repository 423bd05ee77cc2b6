/* Text helpers shared by the reader, the writer, comfy_quant parsing and
 * layer discovery: UTF-8 checks, printable renderings of untrusted names,
 * "PATH: message" failures and JSON kinds for messages. */
#include "format.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>

/* ----------------------------------------------------------------- strings */

size_t ql_utf8_check(const unsigned char *s, size_t len)
{
    size_t i = 0;
    while (i < len) {
        unsigned c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t n;
        unsigned min;
        if (c >= 0xc2 && c <= 0xdf) n = 1, min = 0x80;
        else if (c >= 0xe0 && c <= 0xef) n = 2, min = 0x800;
        else if (c >= 0xf0 && c <= 0xf4) n = 3, min = 0x10000;
        else return i;
        if (len - i <= n) return i;
        unsigned cp = c & (0x3fu >> n);
        for (size_t j = 1; j <= n; j++) {
            unsigned d = s[i + j];
            if ((d & 0xc0) != 0x80) return i;
            cp = (cp << 6) | (d & 0x3f);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return i;
        i += n + 1;
    }
    return len;
}

const char *ql_show(ql_name_buf *b, const char *s)
{
    const size_t cap = sizeof b->s;
    const size_t keep = cap - 8; /* room for an escape and "..." */
    size_t o = 0;
    if (!s) s = "(null)";
    const unsigned char *p = (const unsigned char *)s;
    size_t len = strlen(s);
    size_t valid = ql_utf8_check(p, len);
    size_t i = 0;
    while (i < len) {
        if (o >= keep) {
            memcpy(b->s + o, "...", 4);
            return b->s;
        }
        unsigned c = p[i];
        if (c < 0x20 || c == 0x7f || (c >= 0x80 && i >= valid)) {
            snprintf(b->s + o, cap - o, "\\x%02x", c);
            o += 4;
            i++;
        } else if (c >= 0x80) {
            size_t n = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : 2;
            if (o + n >= keep) {
                memcpy(b->s + o, "...", 4);
                return b->s;
            }
            memcpy(b->s + o, p + i, n);
            o += n;
            i += n;
        } else {
            b->s[o++] = (char)c;
            i++;
        }
    }
    b->s[o] = 0;
    return b->s;
}

/* ---------------------------------------------------------------- messages */

static ql_status vfail_path(const char *path, ql_status st, const char *fmt, va_list ap)
{
    char msg[400];
    vsnprintf(msg, sizeof msg, fmt, ap);
    ql_name_buf nb;
    return ql_fail(st, "%s: %s", ql_show(&nb, path), msg);
}

ql_status ql_fail_path(const char *path, ql_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ql_status r = vfail_path(path, st, fmt, ap);
    va_end(ap);
    return r;
}

ql_status ql_fail_file(const ql_checkpoint *c, ql_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ql_status r = vfail_path(c->path, st, fmt, ap);
    va_end(ap);
    return r;
}

const char *ql_json_kind(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a fractional number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "a value";
}
