/*
 * Shared behaviour of the command-line tools; see tool.h.
 */
#include "tool.h"

#include <stdio.h>
#include <string.h>

#include "dfccl.h"

int tool_unavailable_main(int argc, char **argv, const char *name, const char *usage, const char *why)
{
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
			fputs(usage, stdout);
			return 0;
		}
		if (!strcmp(argv[i], "-V") || !strcmp(argv[i], "--version")) {
			printf("%s %d.%d.%d\n", name, DFCCL_MAJOR, DFCCL_MINOR, DFCCL_PATCH);
			return 0;
		}
	}
	fprintf(stderr, "%s: not yet implemented: %s\n", name, why);
	return TOOL_EXIT_UNAVAILABLE;
}
