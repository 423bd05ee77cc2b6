int ql_cmd_bench(int argc, char **argv);
