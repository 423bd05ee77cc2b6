/* Checkpoint commands: inspect, quantize, forward (issue #3: not built yet). */
#include <stdio.h>

#include "commands.h"

static int not_yet(const char *what)
{
    fprintf(stderr, "qlinear %s: checkpoint support is not implemented yet\n", what);
    return 2;
}
int ql_cmd_inspect(int argc, char **argv) { (void)argc; (void)argv; return not_yet("inspect"); }
int ql_cmd_quantize(int argc, char **argv) { (void)argc; (void)argv; return not_yet("quantize"); }
int ql_cmd_forward(int argc, char **argv) { (void)argc; (void)argv; return not_yet("forward"); }
