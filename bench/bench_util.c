/* bench_util.c: what clattn-bench's two modes share. */
#include "bench_util.h"

#include <stdlib.h>
#include <time.h>

void bench_vsay(const char *fmt, va_list ap)
{
    fprintf(stderr, "clattn-bench: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
}

void bench_die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    bench_vsay(fmt, ap);
    va_end(ap);
    exit(1);
}

void bench_usage_die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    bench_vsay(fmt, ap);
    va_end(ap);
    exit(2);
}

void bench_check(clattn_status st, const char *what)
{
    if (st != CLATTN_STATUS_SUCCESS)
        bench_die("%s: %s (%d): %s", what, clattn_status_string(st), (int)st, clattn_last_error());
}

void bench_plan_check(clattn_status st, const char *what)
{
    bench_check(st, what);
    const char *note = clattn_last_notice();
    if (note[0]) fprintf(stderr, "clattn-bench: note: %s\n", note);
}

double bench_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

void bench_json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        const unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}
