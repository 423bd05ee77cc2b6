/* The qlinear command: inspect, quantize, forward, bench. */
#include "commands.h"

#include <stdio.h>
#include <string.h>

#include "qlinear.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: qlinear <command> [options]\n"
            "  bench    [--device cpu] [--profile anima|qwen3-te|large | --shape NxK] [--m N[,N...]] [--threads N]\n"
            "           [--paths LIST] [--reps N] [--json FILE]\n"
            "  bench    --device cuda[:N] [--profile anima | --shape NxK] [--m N[,N...]] [--reps N] [--graphs] [--no-peak]\n"
            "           [--json FILE]\n"
            "  inspect  FILE [--json]\n"
            "  quantize IN OUT --format int8|int8-convrot|w4a8|w4a8-uniform|w6a8 [--group 256] [--group-size 16]\n"
            "           [--include REGEX] [--exclude REGEX] [--threads N]\n"
            "  forward  CKPT LAYER IN.safetensors OUT.safetensors [--input NAME] [--out-dtype fp32|bf16|fp16] [--bias|--no-bias]\n"
            "           [--device cpu|cuda[:N]] [--lora FILE[:STRENGTH]]... [--packed]\n"
            "  merge-lora BASE LORA... OUT [--strength S] [--stochastic|--nearest] [--threads N] [--seed-prefix P]\n"
            "  merge-lora BASE OUT --lora FILE[:S] [--lora FILE[:S]]... [options]\n"
            "  version\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "bench")) return ql_cmd_bench(argc - 1, argv + 1);
    if (!strcmp(cmd, "inspect")) return ql_cmd_inspect(argc - 1, argv + 1);
    if (!strcmp(cmd, "quantize")) return ql_cmd_quantize(argc - 1, argv + 1);
    if (!strcmp(cmd, "forward")) return ql_cmd_forward(argc - 1, argv + 1);
    if (!strcmp(cmd, "merge-lora")) return ql_cmd_merge_lora(argc - 1, argv + 1);
    if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) {
        printf("qlinear %s (best ISA: %s)\n", ql_version(), ql_isa_name(ql_isa_best()));
        return 0;
    }
    if (!strcmp(cmd, "help") || !strcmp(cmd, "--help") || !strcmp(cmd, "-h")) {
        usage(stdout);
        return 0;
    }
    fprintf(stderr, "qlinear: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
}
