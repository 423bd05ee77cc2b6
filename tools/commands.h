/* Subcommands of the qlinear tool. Each returns the process exit code and
 * prints errors as one line on stderr. */
#ifndef QL_COMMANDS_H
#define QL_COMMANDS_H
int ql_cmd_bench(int argc, char **argv);
int ql_cmd_bench_cuda(int argc, char **argv); /* --device cuda */
int ql_cmd_inspect(int argc, char **argv);
int ql_cmd_quantize(int argc, char **argv);
int ql_cmd_forward(int argc, char **argv);
#include "qlinear.h"
int ql_cmd_merge_lora(int argc, char **argv);

/* LoRA arguments (tools/cmd_lora.c). "FILE[:STRENGTH]": *path is owned by
 * the caller; without a numeric suffix the strength is def. 0: no memory. */
int ql_cli_lora_arg(const char *arg, double def, char **path, double *strength);
typedef struct ql_cli_lora {
    char *path;
    double strength, scale; /* scale = strength·alpha/rank */
    ql_checkpoint *ck;
    ql_lora_plan *plan;
    const ql_lora_module *m; /* the module for the layer */
    float *down, *up;        /* [rank, k], [n, rank] */
} ql_cli_lora;
/* Open the LoRA files of `args`, find each one's module for `layer` of
 * `base`, load it. Prints the error and returns 1 on failure; *out is to be
 * freed with ql_cli_loras_free either way. */
int ql_cli_loras_load(const char *cmd, const ql_checkpoint *base, const char *layer, char *const *args, int n,
                      ql_cli_lora **out);
void ql_cli_loras_free(ql_cli_lora *l, int n);
/* x, y on the host; the linear on its CUDA device (tools/cuda_io.c). */
ql_status ql_tool_device_forward(ql_linear *lin, const void *x, ql_dtype xdt, int64_t m, int64_t k, void *y,
                                 ql_dtype ydt, int64_t n);
#endif
