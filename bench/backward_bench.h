/* backward_bench.h: `clattn-bench --backward` (backward_bench.c). */
#ifndef CLATTN_BACKWARD_BENCH_H
#define CLATTN_BACKWARD_BENCH_H

#include <stdio.h>

/* The whole --backward mode: parses argv (every option of that mode), measures, prints; exit status. */
int clattn_bench_backward(int argc, char **argv);
void clattn_bench_backward_usage(FILE *f);

#endif
