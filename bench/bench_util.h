/* bench_util.h: what clattn-bench's two modes share (bench_util.c). */
#ifndef CLATTN_BENCH_UTIL_H
#define CLATTN_BENCH_UTIL_H

#include "clattn.h"

#include <stdarg.h>
#include <stdio.h>

/* "clattn-bench: <message>" on stderr, then exit(1). */
void bench_die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
/* "clattn-bench: <message>" on stderr, then exit(2): a usage error (a bad option or value), as clattn's. */
void bench_usage_die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
/* "clattn-bench: <message>" on stderr, from a va_list; no exit. */
void bench_vsay(const char *fmt, va_list ap);
/* bench_die with the status and clattn's detail when st is not success. */
void bench_check(clattn_status st, const char *what);
/* bench_check for a plan's creation, then the plan's notice (clattn_last_notice) on stderr when it has one. */
void bench_plan_check(clattn_status st, const char *what);
/* Monotonic wall time in milliseconds. */
double bench_now_ms(void);
/* s as a JSON string (quoted, escaped). */
void bench_json_string(FILE *f, const char *s);

#endif
