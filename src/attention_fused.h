/* attention_fused.h: the fused attention core (cl/flash.cl), used by the OpenCL pass. */
#ifndef CLATTN_ATTENTION_FUSED_H
#define CLATTN_ATTENTION_FUSED_H

#include "internal.h"

#define CLATTN_FLASH_MAX_HEAD 256 /* dk and dv the fused kernel takes */

typedef enum clattn_flash_kind { CLATTN_FLASH_ROWS = 0, CLATTN_FLASH_TILED = 1 } clattn_flash_kind;

/* The -D tile parameters of cl/flash.cl (0 = unused by the variant). */
typedef struct clattn_flash_params {
    size_t rows, bk;  /* flash_rows: query rows per work-item; keys per block (also BKT for flash_tiled) */
    size_t vw;        /* flash_rows: vector width along the head dimension (8, 4 or 1) */
    size_t bq, ns;    /* flash_tiled: query rows per work-group, work-items per row */
} clattn_flash_params;

typedef struct clattn_fused {
    cl_program prog;
    cl_kernel k;
    clattn_flash_kind kind;
    clattn_flash_params t;
    size_t wg;        /* flash_tiled's work-group size (BQ*NS); 0 for flash_rows */
    int tuned;        /* built with the device's tuning file's parameters */
} clattn_fused;

/* Where the core reads and writes: token-major rows (ld = row stride), head h at column h*d. */
typedef struct clattn_fused_io {
    clattn_view q, k, v, out, kpm, mask; /* q/k/v/out at column 0 of head 0; kpm/mask as given (mem NULL = none) */
    size_t q_ld, k_ld, v_ld, out_ld;
} clattn_fused_io;

/* The mask arguments every attention kernel takes (mask.cl): key padding mask and offset, attention
 * mask and offset, then Tq, Tk and H. */
void clattn_arg_masks(clattn_args *a, clattn_view kpm, clattn_view mask, const clattn_attention_desc *d);
/* The four dropout arguments every attention kernel ends with: seed (low, high word), the drop
 * threshold and the keep scale (reference.c's definitions). */
void clattn_arg_dropout(clattn_args *a, const clattn_attention_desc *d);

/* Can the fused core compute this description on this device? If not, why (for the error). */
int clattn_fused_supports(const clattn_device *dev, const clattn_attention_desc *d, char *why, size_t len);
/* Build the variant the device class prefers (or CLATTN_FLASH's) for a resolved description. */
clattn_status clattn_fused_init(const clattn_device *dev, const clattn_attention_desc *d, clattn_fused *f);
void clattn_fused_release(clattn_fused *f);
/* Enqueue the core for every (batch, head, query) of d. */
clattn_status clattn_fused_run(const clattn_device *dev, const clattn_attention_desc *d, clattn_fused *f,
                               const clattn_fused_io *io);

#endif
