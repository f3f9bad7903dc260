/* args.h: what the command-line tools (clattn and clattn-bench) share in reading their arguments. */
#ifndef CLATTN_CLI_ARGS_H
#define CLATTN_CLI_ARGS_H

/* Every "--opt=value" argument becomes the two arguments "--opt" "value" (split at the first '=', so a value may
 * hold '=' itself: --device=name=Tesla), so that each parser sees one form. Returns the new argument vector (NULL
 * terminated, kept for the life of the process) and sets *argc, or argv itself when nothing needed splitting;
 * NULL when out of memory. Arguments after a lone "--" are left as they are. */
char **clattn_args_split_equals(int *argc, char **argv);

#endif
