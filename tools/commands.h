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
/* x, y on the host; the linear on its CUDA device (tools/cuda_io.c). */
ql_status ql_tool_device_forward(ql_linear *lin, const void *x, ql_dtype xdt, int64_t m, int64_t k, void *y,
                                 ql_dtype ydt, int64_t n);
#endif
