/* Subcommands of the qlinear tool. Each returns the process exit code and
 * prints errors as one line on stderr. */
#ifndef QL_COMMANDS_H
#define QL_COMMANDS_H
int ql_cmd_bench(int argc, char **argv);
int ql_cmd_bench_cuda(int argc, char **argv); /* --device cuda */
int ql_cmd_inspect(int argc, char **argv);
int ql_cmd_quantize(int argc, char **argv);
int ql_cmd_forward(int argc, char **argv);
#endif
