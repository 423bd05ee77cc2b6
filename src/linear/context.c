/* The public context API: threads, ISA, device; defaults and overrides
 * from the environment. */
#include "cpu/registry.h"
#include "linear/linear.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int default_threads(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)(n > 1024 ? 1024 : n) : 1;
}

static ql_status parse_isa(const char *s, ql_isa *out)
{
    if (ql_isa_from_name(s, out)) return QL_OK;
    return ql_fail(QL_ERR_INVALID_ARGUMENT, "QLINEAR_ISA=%s is not one of %s", s, ql_isa_names());
}

const ql_backend *ql_backend_for(ql_device device)
{
    return device == QL_DEVICE_CUDA ? &ql_backend_cuda : &ql_backend_cpu;
}

ql_status ql_context_create(ql_context **out)
{
    QL_CHECK_PTR("ql_context_create", out);
    *out = NULL;
    ql_context c = {default_threads(), ql_isa_best(), NULL, 0, 0, QL_DEVICE_CPU, 0, NULL, NULL, NULL, -1, -1, false};
    const char *sm = getenv("QLINEAR_SMALL_M");
    if (sm && *sm) {
        char *end;
        long v = strtol(sm, &end, 10);
        if (*end != '\0' || v < 0 || v > 1 << 20)
            return ql_fail(QL_ERR_INVALID_ARGUMENT, "QLINEAR_SMALL_M=%s is not an integer in 0..1048576", sm);
        c.small_m = v;
    }
    const char *sw = getenv("QLINEAR_SERIAL_WORK");
    if (sw && *sw) {
        char *end;
        long long v = strtoll(sw, &end, 10);
        if (*end != '\0' || v < 0 || v > (1LL << 40))
            return ql_fail(QL_ERR_INVALID_ARGUMENT, "QLINEAR_SERIAL_WORK=%s is not an integer in 0..2^40", sw);
        c.serial_work = v;
    }
    const char *ps = getenv("QLINEAR_PROLOGUE_SYNC");
    if (ps && *ps) {
        if (strcmp(ps, "barrier") && strcmp(ps, "panels"))
            return ql_fail(QL_ERR_INVALID_ARGUMENT, "QLINEAR_PROLOGUE_SYNC=%s: want barrier or panels", ps);
        c.prologue_barrier = !strcmp(ps, "barrier");
    }
    const char *t = getenv("QLINEAR_THREADS");
    if (t && *t) {
        char *end;
        long v = strtol(t, &end, 10);
        if (*end != '\0' || v < 1 || v > 1024)
            return ql_fail(QL_ERR_INVALID_ARGUMENT, "QLINEAR_THREADS=%s is not an integer in 1..1024", t);
        c.threads = (int)v;
    }
    const char *isa = getenv("QLINEAR_ISA");
    if (isa && *isa) {
        ql_isa want = QL_ISA_AUTO;
        QL_TRY(parse_isa(isa, &want));
        if (want != QL_ISA_AUTO) {
            if (!ql_isa_supported(want))
                return ql_fail(QL_ERR_UNSUPPORTED, "QLINEAR_ISA=%s: this CPU does not support %s (%s)", isa, isa,
                               ql_isa_refusal(want));
            c.isa = want;
        }
    }
    ql_context *ctx = malloc(sizeof *ctx);
    if (!ctx) return ql_fail(QL_ERR_OUT_OF_MEMORY, "ql_context_create: out of memory");
    *ctx = c;
    *out = ctx;
    return QL_OK;
}

void ql_context_destroy(ql_context *ctx)
{
    if (ctx) {
        ql_aligned_free(ctx->arena);
        if (ctx->device_state_free) ctx->device_state_free(ctx->device_state);
    }
    free(ctx);
}

ql_status ql_context_set_threads(ql_context *ctx, int threads)
{
    QL_CHECK_PTR("ql_context_set_threads", ctx);
    if (threads < 1 || threads > 1024)
        return ql_fail(QL_ERR_INVALID_ARGUMENT, "ql_context_set_threads: threads = %d is not in 1..1024", threads);
    ctx->threads = threads;
    return QL_OK;
}

int ql_context_threads(const ql_context *ctx) { return ctx ? ctx->threads : 1; }

ql_status ql_context_set_isa(ql_context *ctx, ql_isa isa)
{
    QL_CHECK_PTR("ql_context_set_isa", ctx);
    if (isa == QL_ISA_AUTO) isa = ql_isa_best();
    if (!strcmp(ql_isa_name(isa), "unknown"))
        return ql_fail(QL_ERR_INVALID_ARGUMENT, "ql_context_set_isa: unknown isa %d", (int)isa);
    if (!ql_isa_supported(isa))
        return ql_fail(QL_ERR_UNSUPPORTED, "ql_context_set_isa: this CPU does not support %s (%s)", ql_isa_name(isa),
                       ql_isa_refusal(isa));
    ctx->isa = isa;
    return QL_OK;
}

ql_isa ql_context_isa(const ql_context *ctx) { return ctx ? ctx->isa : QL_ISA_GENERIC; }

ql_status ql_context_set_device(ql_context *ctx, ql_device device, int index)
{
    const char *fn = "ql_context_set_device";
    QL_CHECK_PTR(fn, ctx);
    if (device == QL_DEVICE_CPU) {
        ctx->device = QL_DEVICE_CPU;
        return QL_OK;
    }
    if (device != QL_DEVICE_CUDA) return ql_fail(QL_ERR_INVALID_ARGUMENT, "%s: unknown device %d", fn, (int)device);
    const ql_backend *be = ql_backend_for(device);
    if (be->check_device) QL_TRY(be->check_device(fn, index));
    if (ctx->device_state && index != ctx->device_index) { /* the state lives on the old device */
        ctx->device_state_free(ctx->device_state);
        ctx->device_state = NULL;
    }
    ctx->device = QL_DEVICE_CUDA;
    ctx->device_index = index;
    return QL_OK;
}

ql_device ql_context_device(const ql_context *ctx) { return ctx ? ctx->device : QL_DEVICE_CPU; }

ql_status ql_context_set_cuda_stream(ql_context *ctx, void *stream)
{
    QL_CHECK_PTR("ql_context_set_cuda_stream", ctx);
    ctx->device_stream = stream;
    return QL_OK;
}
