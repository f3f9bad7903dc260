/* flash_tiled.cl: the flash core for GPUs (src/cores/flash_tiled.c). A work-group per BQ query rows, NS
 * work-items per row sharing the row's value columns; K and V tiles of BKT keys staged in local memory.
 * flash_common.cl goes first.
 *   BQ, BKT, NS      query rows per work-group, keys per tile, work-items per row
 */
#ifndef BQ
#define BQ 16
#endif
#ifndef BKT
#define BKT 32
#endif
#ifndef NS
#define NS 4
#endif

#define DVS ((DV + NS - 1) / NS) /* value columns per work-item */
#define KVW (DK > DV ? DK : DV)  /* width of a staged K or V row */

/* One work-group of BQ*NS work-items: query rows i0 .. i0+BQ-1 of (b, h), work-group id =
 * ((b*H + h) * nblk + block) + extent. Work-item (r, sp) owns row r and value columns
 * sp, sp+NS, ... Every barrier is reached by the whole work-group: the loop bounds depend
 * only on the group. */
__kernel __attribute__((reqd_work_group_size(BQ * NS, 1, 1)))
void flash_tiled(FLASH_ARGS)
{
    __local float qs[BQ][DK];
    __local float kvs[BKT][KVW + 1]; /* +1: rows fall in different banks */
    __local float ss[BQ][BKT + 1];
    const uint lid = get_local_id(0);
    const uint r = lid / NS, sp = lid % NS;
    const ulong g = extent + get_group_id(0);
    const uint nblk = (Tq + BQ - 1) / BQ;
    const uint blk = (uint)(g % nblk);
    const ulong bh = g / nblk;
    const uint h = (uint)(bh % H);
    const ulong b = bh / H;
    const uint i0 = blk * BQ, i = i0 + r;
    if (KPM) kpm += kpm_off;
    if (MASK_KIND) mask += mask_off + CLATTN_MASK_AT(b, h, H, Tq, Tk);

    for (uint x = lid; x < BQ * DK; x += BQ * NS) {
        const uint rr = x / DK, c = x % DK;
        const uint ii = min(i0 + rr, Tq - 1);
        qs[rr][c] = IO_LOAD(q_off + (b * Tq + ii) * q_ld + (ulong)h * DK + c, q);
    }
    float acc[DVS];
    for (uint t = 0; t < DVS; t++) acc[t] = 0.0f;
    float m = -FLT_MAX, l = 0.0f;
    uint jbeg = 0, jend = Tk;
#if CAUSAL
    jend = min(Tk, min(i0 + BQ, Tq));
#endif
#if WINDOW
    jbeg = i0 >= WINDOW ? i0 - WINDOW + 1 : 0;
#endif
    __global const io_t *kb = k + k_off + b * Tk * k_ld + (ulong)(h / GROUP) * DK;
    __global const io_t *vb = v + v_off + b * Tk * v_ld + (ulong)(h / GROUP) * DV;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (uint j0 = jbeg; j0 < jend; j0 += BKT) {
        /* K tile */
        for (uint x = lid; x < BKT * DK; x += BQ * NS) {
            const uint jj = x / DK, c = x % DK;
            kvs[jj][c] = j0 + jj < jend ? KVR(IO_LOAD((ulong)(j0 + jj) * k_ld + c, kb)) : 0.0f;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        /* scores of row r for keys sp, sp+NS, ... */
        for (uint jj = sp; jj < BKT; jj += NS) {
            float dot = 0.0f;
            for (uint c = 0; c < DK; c++) dot = fma(qs[r][c], kvs[jj][c], dot);
            const uint j = j0 + jj;
            ss[r][jj] = j < jend ? clattn_mask_score(dot * scale, min(i, Tq - 1), j, b, Tk, kpm, mask) : -INFINITY;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        /* V tile over the K tile */
        for (uint x = lid; x < BKT * DV; x += BQ * NS) {
            const uint jj = x / DV, c = x % DV;
            kvs[jj][c] = j0 + jj < jend ? KVR(IO_LOAD((ulong)(j0 + jj) * v_ld + c, vb)) : 0.0f;
        }
        /* this row's statistics (each of its NS work-items computes the same) */
        float mb = m;
        for (uint jj = 0; jj < BKT; jj++) mb = fmax(mb, ss[r][jj]);
        const float corr = exp(m - mb);
        m = mb;
        for (uint t = 0; t < DVS; t++) acc[t] *= corr;
        barrier(CLK_LOCAL_MEM_FENCE);
        float sum = 0.0f;
        for (uint jj = 0; jj < BKT; jj++) {
            const float p = exp(ss[r][jj] - mb);
            sum += p;
            const float pd = flash_drop(p, seed_lo, seed_hi, (uint)b + drop_b0, h, i, j0 + jj, threshold, keep_scale);
            for (uint t = 0; t < DVS; t++) {
                const uint c = sp + t * NS;
                if (c < DV) acc[t] = fma(pd, kvs[jj][c], acc[t]);
            }
        }
        l = l * corr + sum;
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (i < Tq) {
        if (sp == 0) flash_lse(lse, lse_off, b, h, H, i, Tq, m, l, 0);
        __global io_t *op = out + out_off + (b * Tq + i) * out_ld + (ulong)h * DV;
        for (uint t = 0; t < DVS; t++) {
            const uint c = sp + t * NS;
            if (c < DV) IO_STORE(flash_out(acc[t], l), c, op); /* (a half plan's type: rounded once) */
        }
    }
}
