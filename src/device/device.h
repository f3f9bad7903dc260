/* device.h: the device layer (src/device/): opening a device (device.c: its OpenCL objects, its
 * capabilities and its tuning file, once) and the tuning file itself (tune_file.c). */
#ifndef CLATTN_DEVICE_H
#define CLATTN_DEVICE_H

#include "cores/core.h"

/* ---- the device's tuning file (tune_file.c): parameters per core and head-size class, and AUTO's core
 * per head-size class, as clattn_tune measured them on this device. Read when the device opens; plans
 * read it (attention/select.c) through clattn_tune_active. */
#define CLATTN_TUNE_MAX_ENTRIES 64
#define CLATTN_CORE_KINDS 4

typedef struct clattn_tune_entry {
    const clattn_core *core;
    int cls;                   /* head-size class (clattn_head_class) */
    clattn_core_params params; /* every parameter of the core, each one of its values */
} clattn_tune_entry;

typedef struct clattn_tune_table {
    clattn_tune_entry entries[CLATTN_TUNE_MAX_ENTRIES]; /* "core NAME CLASS P=V,..." */
    int nentries;
    const clattn_core *auto_core[CLATTN_CORE_KINDS][CLATTN_HEAD_CLASSES]; /* "auto CLASS NAME" (NULL: none) */
    const clattn_core *force[CLATTN_CORE_KINDS]; /* the self-test's core of each kind (never from a file): that core
                                                    or a refusal, as CLATTN_CORE (NULL: none) */
    int selftest;              /* the self-test's table: the environment (CLATTN_CORE) is not read, the kinds it does
                                  not force are AUTO's */
    /* "clblast xgemm P=V,..." and "clblast xgemmdirect P=V,...": CLBlast's parameters of its two GEMM kernels
     * (indexed by clattn_blas_kernel), set on the device when it opens */
    int has_blas[2];
    size_t blas[2][CLATTN_BLAS_MAX_PARAMS];
    int blas_applied[2];       /* the device made them CLBlast's at open */
    char path[1024];           /* where it was read from ("" = none) */
    char notice[1024];         /* what was ignored and why ("" = nothing) */
} clattn_tune_table;

void clattn_tune_table_init(clattn_tune_table *t); /* empty: no entries */
/* Read the device's tuning file (at device open); never fails: a bad file is ignored, with a notice. */
void clattn_tune_load(clattn_device *dev);
/* The entries that apply now: clattn_tune's candidate while it searches, else the file's (NULL: none). */
const clattn_tune_table *clattn_tune_active(const clattn_device *dev);
/* The file's parameters for `core` on head-size class cls (NULL: none). */
const clattn_core_params *clattn_tune_params(const clattn_tune_table *t, const clattn_core *core, int cls);
/* Set (or replace) an entry; 0 when the table is full. */
int clattn_tune_set_params(clattn_tune_table *t, const clattn_core *core, int cls, const clattn_core_params *p);
/* Write t as this device's tuning file (atomically), its path into path. */
clattn_status clattn_tune_write(const clattn_device *dev, const clattn_tune_table *t, char *path, size_t len);

#endif
