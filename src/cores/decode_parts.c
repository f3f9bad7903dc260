/* decode_parts.c: what the decode cores share (core.h, "the decode family"): the split-K partial buffers,
 * the choice of a step's part count, and decode_combine (cl/cores/decode_common.cl), which merges the parts. */
#include "core.h"

#define PART_ROWS 4 /* the partial buffers hold split-K parts for steps of up to 4 new tokens */

static size_t part_slots(const clattn_attention_desc *d)
{
    return d->batch * (d->seq_q < PART_ROWS ? d->seq_q : PART_ROWS) * d->heads * CLATTN_DECODE_MAX_PARTS;
}

size_t clattn_decode_parts_floats(const clattn_attention_desc *d) { return part_slots(d) * (2 + d->head_dim_v); }

clattn_status clattn_decode_parts_alloc(const clattn_device *dev, const clattn_attention_desc *d,
                                        clattn_decode_parts *pp)
{
    pp->slots = part_slots(d);
    TRY(clattn_buffer_new(dev, pp->slots * 2, 4, NULL, "the split-K partial sums", &pp->ml));
    return clattn_buffer_new(dev, pp->slots * d->head_dim_v, 4, NULL, "the split-K partial outputs", &pp->acc);
}

void clattn_decode_parts_release(clattn_decode_parts *pp)
{
    clattn_kernel_release(&pp->k_combine);
    clattn_mem_release(&pp->ml);
    clattn_mem_release(&pp->acc);
}

size_t clattn_decode_parts_bytes(const clattn_decode_parts *pp)
{
    return clattn_mem_bytes(pp->ml) + clattn_mem_bytes(pp->acc);
}

size_t clattn_decode_parts_choose(const clattn_decode_parts *pp, const clattn_attention_desc *d,
                                  const clattn_decode_io *io, size_t units, size_t target, size_t min_keys)
{
    const size_t rows = d->batch * io->n * d->heads;
    size_t cap = pp->slots / (rows ? rows : 1);
    if (cap > CLATTN_DECODE_MAX_PARTS) cap = CLATTN_DECODE_MAX_PARTS;
    if (io->max_parts) {
        const size_t forced = io->max_parts < cap ? io->max_parts : cap;
        return forced ? forced : 1;
    }
    size_t parts = (target + units - 1) / (units ? units : 1);
    const size_t by_len = (io->max_len + min_keys - 1) / min_keys;
    if (parts > by_len) parts = by_len;
    if (parts > cap) parts = cap;
    return parts ? parts : 1;
}

clattn_status clattn_decode_mark(const clattn_decode_io *io, clattn_decode_stage stage)
{
    return io->mark ? io->mark(io->mark_ctx, stage) : CLATTN_STATUS_SUCCESS;
}

clattn_status clattn_decode_parts_combine(const clattn_device *dev, const clattn_decode_parts *pp,
                                          const clattn_attention_desc *d, const clattn_decode_io *io, size_t parts)
{
    const size_t H = d->heads, dv = d->head_dim_v;
    const size_t total = io->warm ? 0 : d->batch * io->n * H * dv;
    clattn_args a;
    clattn_args_begin(&a, pp->k_combine, "decode_combine");
    clattn_arg_mem(&a, pp->ml);
    clattn_arg_mem(&a, pp->acc);
    clattn_arg_mem(&a, io->valid);
    clattn_core_arg_rows(&a, io->out, H * dv);
    clattn_arg_u32(&a, (cl_uint)io->n);
    clattn_arg_u32(&a, (cl_uint)H);
    clattn_arg_u32(&a, (cl_uint)parts);
    clattn_arg_u64(&a, total);
    TRY(clattn_args_end(&a));
    TRY(clattn_enqueue_1d(dev, pp->k_combine, total, "enqueue decode_combine"));
    return clattn_decode_mark(io, CLATTN_DECODE_STAGE_COMBINE);
}
