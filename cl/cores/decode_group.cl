/* decode_group.cl: the decode core for GPUs (src/cores/decode_group.c): attention over a KV cache for
 * decode plans, one work-group per (sequence b, KV head g, block of R query rows, part of the keys).
 * combine.cl and decode_common.cl (the cache layout, loads, visibility, the block of a work-group) go first.
 *
 * The WG work-items form NT = WG / LANES teams of LANES lanes. A team reads one key at a time, each lane a
 * slice of it: lane l holds the vectors l, l + LANES, l + 2L, ... of the head dimension, so that the LANES
 * lanes of a team read consecutive addresses, and the teams consecutive keys: a work-group streams
 * NT*KT whole keys (and values) per step, coalesced. The rows of a block run over (token, head in the
 * group) as in decode_attend: one read of a key serves every query head that shares it.
 *
 * Per step, each lane loads its slices of its team's KT keys and values (the values before the scores
 * are known, so that both reads are in flight together), reduces its partial dot products into local
 * memory, and after one barrier every lane of the team sums the LANES partials of each of its KT x R
 * scores (double-buffered, so one barrier per step suffices). On NVIDIA (SHFL_PTX = 1) the lanes sum them by
 * warp shuffles instead: no local memory and no barrier in the loop. Each team keeps its own online softmax
 * (natural base, the score scaled after the dot product: the differences to the running max are then exact
 * wherever the scores are, as the decode tests' large-score cases require) and its lanes their slices of
 * the R output rows; at
 * the end the NT teams are merged in local memory. A part writes the normalised output rows (parts = 1)
 * or its max, sum and unnormalised output for split_combine (combine.cl).
 *
 * Specialised by -D (beyond decode_common.cl's): WG (work-items per group), LANES (lanes per key; where
 * it does not divide DK/VW or DV/VW, the last lanes hold one vector fewer), KT (keys per team per step),
 * R (query rows per work-group).
 */
#ifndef WG
#define WG 128
#endif
#ifndef LANES
#define LANES 8
#endif
#ifndef KT
#define KT 2
#endif
#ifndef R
#define R 4
#endif
#ifndef SHFL_PTX
#define SHFL_PTX 0 /* 1: a team's partial dot products summed by warp shuffles (inline PTX, NVIDIA) */
#endif
#define NT (WG / LANES)           /* teams */
#define NSK ((DNKW + LANES - 1) / LANES) /* key vectors per lane (the last lanes may hold one fewer) */
#define NSV ((DNVW + LANES - 1) / LANES) /* value vectors per lane */
/* Does lane own vector s of a key (value)? Always, when LANES divides the head's vectors. */
#define OWNK(s) (DNKW % LANES == 0 || lane + (s) * LANES < DNKW)
#define OWNV(s) (DNVW % LANES == 0 || lane + (s) * LANES < DNVW)
/* A team's partials of one (key, row): its lanes write consecutive words (no bank conflict, no padding
 * needed) and every lane reads them back, as float4 where LANES allows (a quarter of the local loads). */
#define RED (SHFL_PTX ? 0 : NT * KT * R * LANES) /* one buffer of partial dot products (none with shuffles) */
#define MRG (NT * (DV + 1) + 2 * NT * R) /* the teams' merge: one row's outputs, every row's max and sum */
#define LOCAL_FLOATS (2 * RED > MRG ? 2 * RED : MRG)

/* A lane's part of the dot product of a query row's slices and a key's. */
static inline float lane_dot(const vw_t *qs, const vw_t *ks)
{
    vw_t dot = qs[0] * ks[0];
    #pragma unroll
    for (uint s = 1; s < NSK; s++) dot = fma(qs[s], ks[s], dot);
    return dhsum(dot);
}

#if SHFL_PTX
/* The sum of x over the LANES lanes of a team, in each of them: a team's lanes are consecutive work-items of one warp
 * (LANES a power of two up to 32, WG a multiple of 32), and every lane of the warp takes part (no branch around). */
static inline float team_sum(float x)
{
    #pragma unroll
    for (uint m = 1; m < LANES; m <<= 1) {
        float y;
        asm volatile("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, 0xffffffff;" : "=f"(y) : "f"(x), "r"(m));
        x += y;
    }
    return x;
}
#endif

__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void decode_group(__global const float *q, ulong q_off, uint q_ld,
                  __global const kv_t *kc, __global const kv_t *vc,
                  __global const float *ks, __global const float *vs,
                  __global const uint *pages, uint npage,
                  __global const uint *lens, __global const uint *valid,
                  __global const uint *first_rows, uint packed,
                  __global const uchar *tree, uint tree_on,
                  __global float *out, ulong out_off, uint out_ld,
                  __global float *part_ml, __global float *part_acc,
                  uint n, uint H, uint HK, uint Tmax, uint parts, float scale, ulong first, ulong groups)
{
    __local float sh[LOCAL_FLOATS];
    const ulong grp = first + get_group_id(0);
    if (grp >= groups) return; /* the whole work-group together */
    const uint lid = get_local_id(0), lane = lid % LANES, team = lid / LANES;
    const dec_block blk = dec_block_of(grp, R, n, HK, parts, lens, valid, first_rows, packed);
    if (blk.q0 >= blk.nrows) return; /* a packed step's sequence with fewer tokens (the whole group) */
    const ulong b = blk.b;
    const uint r0 = blk.r0; /* (a decode plan has at most 2^32 - 1 rows) */
    const uint g = blk.g, part = blk.part, nrows = blk.nrows, len = blk.len, nv = blk.nv, q0 = blk.q0;

    vw_t qr[R][NSK], acc[R][NSV];
    float m[R], l[R];
    uint pos[R];
    #pragma unroll
    for (uint r = 0; r < R; r++) {
        const uint qq = min(q0 + r, nrows - 1); /* rows past the end repeat the last one, never written */
        const uint t = qq / GROUP, h = g * GROUP + qq % GROUP;
        pos[r] = len + t;
        __global const float *qp = q + q_off + (ulong)(r0 + t) * q_ld + (ulong)h * DK;
        #pragma unroll
        for (uint s = 0; s < NSK; s++) qr[r][s] = OWNK(s) ? QLOADW(lane + s * LANES, qp) : (vw_t)(0.0f);
        #pragma unroll
        for (uint s = 0; s < NSV; s++) acc[r][s] = (vw_t)(0.0f);
        m[r] = -FLT_MAX;
        l[r] = 0.0f;
    }
    const uint js = blk.js, je = blk.je;
    const uint step = NT * KT;
    const uint steps = (je - js + step - 1) / step;

    __global const kv_t *kb = kc + DEC_BASE(b, g) * DK; /* position j's row: kb + DEC_POS(b, g, j) * DK */
    __global const kv_t *vb = vc + DEC_BASE(b, g) * DV;
    __global const float *ksb = ks + DEC_BASE(b, g), *vsb = vs + DEC_BASE(b, g); /* INT8 */
    for (uint it = 0; it < steps; it++) {
        const uint j0 = js + it * step;
        vw_t kv[KT][NSK], vv[KT][NSV];
        #pragma unroll
        for (uint kk = 0; kk < KT; kk++) {
            const uint j = min(j0 + kk * NT + team, je - 1); /* keys past je: a valid key, masked below */
            const ulong row = DEC_POS(b, g, j);
            __global const kv_t *kp = kb + row * DK, *vp = vb + row * DV;
            #pragma unroll
            for (uint s = 0; s < NSK; s++) kv[kk][s] = OWNK(s) ? KLOADW(lane + s * LANES, kp) : (vw_t)(0.0f);
            #pragma unroll
            for (uint s = 0; s < NSV; s++) vv[kk][s] = OWNV(s) ? KLOADW(lane + s * LANES, vp) : (vw_t)(0.0f);
        }
        /* the (key, row) dot products, each summed over the team's lanes */
        float dots[KT][R];
#if SHFL_PTX
        #pragma unroll
        for (uint kk = 0; kk < KT; kk++) {
            #pragma unroll
            for (uint r = 0; r < R; r++) dots[kk][r] = team_sum(lane_dot(qr[r], kv[kk]));
        }
#else
        __local float *red = sh + (it & 1) * RED + team * (KT * R * LANES);
        #pragma unroll
        for (uint kk = 0; kk < KT; kk++) {
            #pragma unroll
            for (uint r = 0; r < R; r++) red[(kk * R + r) * LANES + lane] = lane_dot(qr[r], kv[kk]);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        #pragma unroll
        for (uint kk = 0; kk < KT; kk++) {
            #pragma unroll
            for (uint r = 0; r < R; r++) {
                __local const float *pr = red + (kk * R + r) * LANES;
#if LANES % 4 == 0
                float4 s4 = vload4(0, pr);
                for (uint i = 1; i < LANES / 4; i++) s4 += vload4(i, pr);
                dots[kk][r] = (s4.x + s4.y) + (s4.z + s4.w);
#else
                float sum = 0.0f;
                for (uint i = 0; i < LANES; i++) sum += pr[i];
                dots[kk][r] = sum;
#endif
            }
        }
#endif
        float sc[KT][R], vsk[KT];
        #pragma unroll
        for (uint kk = 0; kk < KT; kk++) {
            const uint j = j0 + kk * NT + team;
            const float sk = scale * KSCALE(ksb, DEC_POS(b, g, min(j, je - 1))); /* an INT8 key's scale */
            vsk[kk] = KSCALE(vsb, DEC_POS(b, g, min(j, je - 1)));               /* an INT8 value's, on its weight */
            #pragma unroll
            for (uint r = 0; r < R; r++)
                sc[kk][r] = j < je && dec_visible(j, pos[r]) && dec_tree(tree, tree_on, b, n, len, pos[r], j)
                            ? dots[kk][r] * sk : -INFINITY;
        }
        #pragma unroll
        for (uint r = 0; r < R; r++) {
            float mb = m[r];
            #pragma unroll
            for (uint kk = 0; kk < KT; kk++) mb = fmax(mb, sc[kk][r]);
            const float corr = exp(m[r] - mb);
            m[r] = mb;
            float p[KT], ps = 0.0f;
            #pragma unroll
            for (uint kk = 0; kk < KT; kk++) p[kk] = exp(sc[kk][r] - mb), ps += p[kk];
            l[r] = l[r] * corr + ps;
            #pragma unroll
            for (uint s = 0; s < NSV; s++) {
                vw_t a = acc[r][s] * corr;
                #pragma unroll
                for (uint kk = 0; kk < KT; kk++) a = fma((vw_t)(p[kk] * vsk[kk]), vv[kk][s], a);
                acc[r][s] = a;
            }
        }
    }

    /* merge the teams: every row's max and sum first, then row by row the outputs */
    barrier(CLK_LOCAL_MEM_FENCE); /* the last step's partials are read */
    __local float *tm = sh + NT * (DV + 1), *tl = tm + NT * R;
    if (lane == 0) {
        #pragma unroll
        for (uint r = 0; r < R; r++) tm[team * R + r] = m[r], tl[team * R + r] = l[r];
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    #pragma unroll
    for (uint r = 0; r < R; r++) {
        float M = -FLT_MAX;
        for (uint t = 0; t < NT; t++) M = fmax(M, tm[t * R + r]);
        float Ls = 0.0f;
        for (uint t = 0; t < NT; t++) Ls += tl[t * R + r] * exp(tm[t * R + r] - M);
        const float f = exp(m[r] - M);
        #pragma unroll
        for (uint s = 0; s < NSV; s++) {
            const vw_t a = acc[r][s] * f;
            if (OWNV(s)) OSTOREW(a, lane + s * LANES, sh + team * (DV + 1));
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        const uint qq = q0 + r;
        if (qq < nrows) {
            const uint t = qq / GROUP, h = g * GROUP + qq % GROUP;
            const int zero = t >= nv || Ls == 0.0f; /* padding token, or no visible key */
            for (uint c = lid; c < DV; c += WG) {
                float a = 0.0f;
                for (uint tt = 0; tt < NT; tt++) a += sh[tt * (DV + 1) + c];
                if (parts == 1) {
                    out[out_off + (ulong)(r0 + t) * out_ld + (ulong)h * DV + c] = zero ? 0.0f : a / Ls;
                } else {
                    const ulong slot = ((ulong)(r0 + t) * H + h) * parts + part;
                    part_acc[slot * DV + c] = a;
                    if (c == 0) part_ml[slot * 2] = M, part_ml[slot * 2 + 1] = Ls;
                }
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
}
