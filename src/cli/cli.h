/* cli.h: the `clattn` command-line tool's subcommands. */
#ifndef CLATTN_CLI_H
#define CLATTN_CLI_H

#include "clattn.h"

/* Each returns the process exit status: 0 success, 1 runtime failure, 2 usage error. */
int clattn_cli_devices(int argc, char **argv);
int clattn_cli_demo(int argc, char **argv);
int clattn_cli_run(int argc, char **argv);
int clattn_cli_encoder(int argc, char **argv);

/* Open the device named by --device (NULL = default), printing the fallback
 * notice or the error on stderr. Returns NULL on failure. */
clattn_device *clattn_cli_open_device(const char *spec);

#endif
