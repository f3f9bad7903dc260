/* decode_bench.h: `clattn-bench --decode` (decode_bench.c). */
#ifndef CLATTN_DECODE_BENCH_H
#define CLATTN_DECODE_BENCH_H

#include "clattn.h"

#include <stdio.h>

/* The whole --decode mode: parses argv (every option of that mode), measures, prints; exit status. */
int clattn_bench_decode(int argc, char **argv);
void clattn_bench_decode_usage(FILE *f);

#endif
