/* args.c: "--opt=value" as "--opt value", for every parser of the command-line tools. */
#include "args.h"

#include <stdlib.h>
#include <string.h>

static char **kept;  /* the split vector lives as long as the process (reachable from here: not a leak) */

static int splits(const char *a) { return a[0] == '-' && a[1] == '-' && a[2] && a[2] != '=' && strchr(a, '='); }

char **clattn_args_split_equals(int *argc, char **argv)
{
    int n = 0, end = *argc;
    size_t chars = 0;
    for (int i = 0; i < *argc; i++) {
        if (strcmp(argv[i], "--") == 0) {
            end = i;
            break;
        }
        if (splits(argv[i])) n++, chars += strlen(argv[i]) + 1;
    }
    if (n == 0) return argv;
    /* one allocation: the vector, then the copies of the split arguments ('=' turned into '\0') */
    const size_t slots = (size_t)*argc + (size_t)n + 1;
    char **out = malloc(slots * sizeof *out + chars);
    if (!out) return NULL;
    char *text = (char *)(out + slots);
    int k = 0;
    for (int i = 0; i < *argc; i++) {
        if (i < end && splits(argv[i])) {
            const size_t len = strlen(argv[i]);
            memcpy(text, argv[i], len + 1);
            char *eq = strchr(text, '=');
            *eq = '\0';
            out[k++] = text;    /* "--opt" */
            out[k++] = eq + 1;  /* "value" */
            text += len + 1;
        } else {
            out[k++] = argv[i];
        }
    }
    out[k] = NULL;
    free(kept);
    kept = out;
    *argc = k;
    return out;
}
