/* softmax_variants.cl: candidate replacements for cl/softmax.cl's softmax_rows,
 * for the measurements in bench/results/pocl-2core.md (experiment only; the
 * library is not changed). No dropout, no masks except CAUSAL; same results as
 * softmax_rows: a row whose keys are all masked gets 0, a NaN score makes the
 * row NaN. s holds `rows` rows of Tk scores (already scaled), updated in place. */
#ifndef WG
#define WG 64
#endif
#ifndef CAUSAL
#define CAUSAL 0
#endif

/* A: a work-group per row, as softmax_rows, but three plain passes (max, sum of
 * exp, write) instead of the online (max, sum) pair with two exp per element. */
__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void wg3(__global float *s, uint Tq, uint Tk)
{
    __local float red[WG];
    const ulong row = get_group_id(0);
    const uint lid = get_local_id(0);
    const uint i = (uint)(row % Tq);
    __global float *r = s + row * Tk;
    const uint n = CAUSAL ? min(i + 1, Tk) : Tk;    /* keys 0 .. n-1 are visible */
    float m = -INFINITY;
    int bad = 0;
    for (uint j = lid; j < n; j += WG) {
        float v = r[j];
        bad |= isnan(v);
        m = fmax(m, v);
    }
    red[lid] = bad ? NAN : m;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (uint st = WG / 2; st > 0; st >>= 1) {
        if (lid < st) red[lid] = (isnan(red[lid]) || isnan(red[lid + st])) ? NAN : fmax(red[lid], red[lid + st]);
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float rm = red[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    float sum = 0.0f;
    if (rm != -INFINITY)
        for (uint j = lid; j < n; j += WG) sum += exp(r[j] - rm);
    red[lid] = sum;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (uint st = WG / 2; st > 0; st >>= 1) {
        if (lid < st) red[lid] += red[lid + st];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float inv = rm == -INFINITY ? 0.0f : 1.0f / red[0];
    for (uint j = lid; j < Tk; j += WG) r[j] = j < n && rm != -INFINITY ? exp(r[j] - rm) * inv : 0.0f;
}

/* B: one work-item per row (CPU style): contiguous float8 loads, three passes,
 * exp once per element (stored in pass 2, scaled in pass 3). With CAUSAL only
 * the visible prefix is read; the masked tail is written 0. */
__kernel void item(__global float *s, uint Tq, uint Tk, uint rows)
{
    const uint g = get_global_id(0);
    if (g >= rows) return;
    __global float *r = s + (ulong)g * Tk;
    const uint i = g % Tq;
    const uint n = CAUSAL ? min(i + 1, Tk) : Tk;
    const uint n8 = n & ~7u;
    float8 m8 = (float8)(-INFINITY);
    int8 bad8 = (int8)(0);
    for (uint j = 0; j < n8; j += 8) {
        float8 v = vload8(0, r + j);
        bad8 |= isnan(v);
        m8 = fmax(m8, v);
    }
    float m = fmax(fmax(fmax(m8.s0, m8.s1), fmax(m8.s2, m8.s3)), fmax(fmax(m8.s4, m8.s5), fmax(m8.s6, m8.s7)));
    int bad = any(bad8);
    for (uint j = n8; j < n; j++) {
        bad |= isnan(r[j]);
        m = fmax(m, r[j]);
    }
    if (bad || m == -INFINITY) {   /* NaN anywhere: NaN row; nothing visible: zeros */
        const float f = bad ? NAN : 0.0f;
        for (uint j = 0; j < Tk; j++) r[j] = f;
        return;
    }
    float8 s8 = (float8)(0.0f);
    for (uint j = 0; j < n8; j += 8) {
        float8 e = exp(vload8(0, r + j) - m);
        s8 += e;
        vstore8(e, 0, r + j);
    }
    float sum = ((s8.s0 + s8.s1) + (s8.s2 + s8.s3)) + ((s8.s4 + s8.s5) + (s8.s6 + s8.s7));
    for (uint j = n8; j < n; j++) {
        float e = exp(r[j] - m);
        sum += e;
        r[j] = e;
    }
    const float inv = 1.0f / sum;
    for (uint j = 0; j < n8; j += 8) vstore8(vload8(0, r + j) * inv, 0, r + j);
    for (uint j = n8; j < n; j++) r[j] *= inv;
    for (uint j = n; j < Tk; j++) r[j] = 0.0f;
}
