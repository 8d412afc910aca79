/*
 * What the command-line tools share: the standard options every one of
 * them answers, and the behaviour of a tool whose engine has not arrived.
 */
#ifndef DFCCL_TOOL_H
#define DFCCL_TOOL_H

/* Exit status of a tool that cannot run with this build. */
#define TOOL_EXIT_UNAVAILABLE 3

/*
 * The whole main() of a tool that documents its interface but cannot run
 * yet: --help prints `usage` (exit 0), --version the library version
 * (exit 0); anything else says why it cannot run and exits with
 * TOOL_EXIT_UNAVAILABLE.
 */
int tool_unavailable_main(int argc, char **argv, const char *name, const char *usage, const char *why);

#endif /* DFCCL_TOOL_H */
