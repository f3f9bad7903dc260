/*
 * clattn.h: transformer attention on any OpenCL device, with a plain-C
 * reference ("ref") that computes the same functions on the CPU.
 *
 * Life cycle (FFTW style):
 *   clattn_device_open("opencl", &dev);          pick a device (or wrap yours)
 *   clattn_plan_create(dev, &desc, &w, &plan);   validate, upload weights, build kernels
 *   clattn_plan_execute(plan, &args);            as often as you like
 *   clattn_plan_free(plan); clattn_device_free(dev);
 *
 * Threads: a plan (attention, decode, encoder) and a KV cache may be used from several threads; each
 * takes its calls one at a time (a lock per object), so a plan shared by threads computes every call
 * right, one after the other; different plans run concurrently, on one device or several. Free an object
 * only when no call on it is running, and do not use a device while clattn_tune searches on it.
 *
 * Every call returns a clattn_status. OpenCL codes pass through by value
 * (-1 .. -1006), CLBlast codes too (-1007 .. -2050), clattn's own codes live
 * in -3000 .. -3099. clattn_status_string() names any of them;
 * clattn_last_error() gives the detail of the last failing call in this
 * thread (which argument, which limit), clattn_last_build_log() the OpenCL
 * build log of the last failed kernel build.
 *
 * Shapes are row-major (C order). x is (B, Tq, E); kv is (B, Tk, Ekv).
 *
 * Memory: in every call, its host-pointer form and its buffer form alike, an output may not share memory with an
 * input or with another output (out == x, a gradient inside another, context == out): such a call is refused
 * (CLATTN_STATUS_INVALID_ARGUMENT, naming the two arrays) before anything is read or written. There is no in-place
 * form. Inputs may share memory with each other (x given again as kv). On buffers, sub-buffers are seen through.
 */
#ifndef CLATTN_H
#define CLATTN_H

#ifndef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 120
#endif
#include <CL/cl.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define CLATTN_API __declspec(dllexport)
#else
#define CLATTN_API __attribute__((visibility("default")))
#endif

#define CLATTN_VERSION_MAJOR 0
#define CLATTN_VERSION_MINOR 7
#define CLATTN_VERSION_PATCH 0

/* The version of the library linked at run time, "MAJOR.MINOR.PATCH" (static storage); compare with
 * the CLATTN_VERSION_* macros of the header compiled against. */
CLATTN_API const char *clattn_version(void);

/* ---------------------------------------------------------------- status */

typedef enum clattn_status {
    CLATTN_STATUS_SUCCESS = 0,
    /* -1 .. -1006: OpenCL error codes (and -1001, no platform), passed through unchanged. */
    /* -1007 .. -2050: CLBlast status codes, passed through unchanged. */
    CLATTN_STATUS_INVALID_ARGUMENT = -3001,   /* NULL pointer, bad value (p, scale, flag) */
    CLATTN_STATUS_SHAPE_MISMATCH = -3002,     /* dimensions that do not fit together */
    CLATTN_STATUS_SIZE_OVERFLOW = -3003,      /* a size does not fit size_t / the kernels' index range */
    CLATTN_STATUS_TOO_LARGE_FOR_DEVICE = -3004, /* exceeds max allocation or global memory */
    CLATTN_STATUS_OUT_OF_HOST_MEMORY = -3005,
    CLATTN_STATUS_DEVICE_ALLOCATION = -3006,  /* clCreateBuffer failed */
    CLATTN_STATUS_BUILD_FAILURE = -3007,      /* kernel build failed: see clattn_last_build_log() */
    CLATTN_STATUS_UNSUPPORTED = -3008,        /* feature not available on this device / backend */
    CLATTN_STATUS_NO_DEVICE = -3009,          /* a device spec that matches no device */
    CLATTN_STATUS_INVALID_DEVICE_SPEC = -3010 /* a device spec that cannot be parsed */
} clattn_status;

/* A short, static, human-readable name for any status (ours, OpenCL's, CLBlast's). */
CLATTN_API const char *clattn_status_string(int status);

/* Detail of the last failing clattn call in the calling thread ("" if none). */
CLATTN_API const char *clattn_last_error(void);

/* What the last plan (attention, decode or encoder) created in the calling thread was asked for and does not do
 * ("" if nothing): today, CLATTN_CORE set but naming none of the cores the plan runs (a decode core on a prefill
 * plan, a prefill core a plan with need_weights cannot use), or set for a plan on the ref device. The plan is made
 * with its usual cores; a program may show the notice (the CLI does, and Python logs it). clattn 0.5. */
CLATTN_API const char *clattn_last_notice(void);

/* OpenCL build log of the last failed kernel build in the calling thread ("" if none). */
CLATTN_API const char *clattn_last_build_log(void);

/* ---------------------------------------------------------------- compiled kernels */

/* clattn compiles its OpenCL kernels at plan creation (seconds on some drivers, the first time) and keeps
 * the compiled programs on disk, keyed by clattn's version, the device, its vendor and driver, the build
 * options and the sources: in $CLATTN_CACHE_DIR, else $XDG_CACHE_HOME/clattn/kernels, else
 * ~/.cache/clattn/kernels. CLATTN_PROGRAM_CACHE=0 turns it off. A missing, truncated, corrupted or foreign
 * file is ignored (the kernels are compiled again and the file rewritten); an unwritable directory only
 * means no cache. The cache holds native code, so it is trusted only when it is private: a directory or a
 * file that is not the user's, or that group or others may write, a symbolic link or anything but a
 * regular file in an entry's place, is not used, and clattn_kernel_cache_notice says why. CLBlast's GEMM
 * kernels are CLBlast's own (compiled at first use in a process).
 *
 * A notice for programs that are about to be compiled from source (not loaded from that cache): the
 * library itself never prints; a program can, e.g. "compiling kernels; later runs use the cache".
 * `fn` is called with the device's name, from the thread creating the plan; NULL turns it off.
 * Process-wide; set it before creating plans. */
typedef void (*clattn_build_notice_fn)(const char *device_name, void *user);
CLATTN_API void clattn_set_build_notice(clattn_build_notice_fn fn, void *user);
/* The last thing the kernel cache refused to use in this process, and why ("" = nothing): a directory or
 * file not private to the user, a link or a special file in an entry's place. */
CLATTN_API const char *clattn_kernel_cache_notice(void);

/* ---------------------------------------------------------------- devices */

typedef struct clattn_device clattn_device;

typedef enum clattn_backend {
    CLATTN_BACKEND_REF = 0,   /* the plain-C CPU reference */
    CLATTN_BACKEND_OPENCL = 1
} clattn_backend;

typedef struct clattn_device_info {
    char selector[32];          /* "opencl:P:D" */
    char platform[128];
    char name[128];
    char type[16];              /* "gpu", "cpu", "accelerator", "other" */
    unsigned compute_units;
    uint64_t global_mem_bytes;
    uint64_t max_alloc_bytes;
    char opencl_c_version[64];
    int fp16;                   /* cl_khr_fp16 */
    int fp64;                   /* cl_khr_fp64 */
} clattn_device_info;

/* Enumerate every OpenCL device of every platform. Writes at most `capacity`
 * entries to `infos` (may be NULL when capacity is 0) and the total count to
 * `*count`. No OpenCL platform at all is not an error: *count = 0. */
CLATTN_API clattn_status clattn_device_list(clattn_device_info *infos, size_t capacity,
                                            size_t *count);

/* Open a device by spec:
 *   "ref"                 the CPU reference backend
 *   "opencl"              the first GPU if there is one, else the first OpenCL device
 *   "opencl:P:D"          platform P, device D (as `clattn devices` lists them)
 *   "gpu", "cpu", "accelerator"   the first device of that type
 *   "name=TEXT"           the first device whose name contains TEXT (case-insensitive)
 * NULL or "" means the default: $CLATTN_DEVICE if set, else "opencl", else
 * "ref" with a notice (clattn_device_notice) saying why. A spec that matches
 * nothing is an error (CLATTN_STATUS_NO_DEVICE), never a silent fallback. */
CLATTN_API clattn_status clattn_device_open(const char *spec, clattn_device **device);

/* Use a command queue (and its context and device) that the caller owns.
 * clattn retains them and releases its references in clattn_device_free.
 * The queue must be in-order (an out-of-order queue: CLATTN_STATUS_INVALID_ARGUMENT);
 * with CL_QUEUE_PROFILING_ENABLE, plans on it can report stage times. */
CLATTN_API clattn_status clattn_device_from_queue(cl_command_queue queue, clattn_device **device);

CLATTN_API void clattn_device_free(clattn_device *device);

CLATTN_API clattn_backend clattn_device_backend(const clattn_device *device);
/* "ref (CPU reference)" or "<device name> [<platform name>]". */
CLATTN_API const char *clattn_device_name(const clattn_device *device);
/* Why the default fell back to ref; NULL when there was no fallback. */
CLATTN_API const char *clattn_device_notice(const clattn_device *device);
/* What clattn knows of the device, one "name: value" line each: its class and driver, the capabilities read
 * when it opened, and the facts its probes measured (the longest loop a work-item completes, whether NaN and
 * Inf propagate, whether profiling timestamps are real), with what the probes found wrong. "" for ref. */
CLATTN_API const char *clattn_device_facts(const clattn_device *device);
/* The OpenCL objects (NULL for ref). */
CLATTN_API cl_context clattn_device_context(const clattn_device *device);
CLATTN_API cl_command_queue clattn_device_queue(const clattn_device *device);

/* The OpenCL programs a device builds, written out, for reading the code a driver compiles or reporting a vendor
 * compiler's bug (README, "What the kernels are"; `clattn emit`). From this call on, every program `device` builds
 * for a plan is also written to the existing directory dir: STEM.cl, the embedded sources concatenated in the order
 * the builder passes them to clCreateProgramWithSource, and STEM.opts, its build options on one line. STEM names the
 * program's main source (flash_mma.cl holds kernel flash_mma, linear.cl the projections' helpers); another program of
 * the same stem is STEM-2, STEM-3... index.txt gets a line per program: its file and its sources under cl/ (lines
 * are appended, and files of the same name replaced: give each call an empty directory). A program is written once,
 * when it is first built (or found in a cache), before it is compiled; a file that cannot be written fails the build
 * and leaves none of that program's files. dir NULL: stop writing.
 * target NULL or "host": the device as it is. "sm_90": the device also takes the capabilities NVIDIA's OpenCL
 * reports for an H100 (compute capability 9.0 with tensor-core mma.sync, 132 compute units, 48 KiB of local memory,
 * warps of 32, 1024 work-items a work-group), so that plans created on it choose the cores, parameters and build
 * options they would there. The host compiles what it can of those programs (the tensor cores' inline PTX as its
 * emulation), its compiler's limits are not applied to them, and nothing runs on the device any more: every
 * execution on it is refused (CLATTN_STATUS_UNSUPPORTED). It stays so until freed.
 * Like clattn_tune, call it while no other thread uses the device.
 * ref: CLATTN_STATUS_UNSUPPORTED; another target: CLATTN_STATUS_INVALID_ARGUMENT naming the targets. */
CLATTN_API clattn_status clattn_device_emit(clattn_device *device, const char *dir, const char *target);

/* ---------------------------------------------------------------- attention plan */

typedef enum clattn_layout {
    CLATTN_LAYOUT_LINEAR = 0, /* torch.nn.Linear: weight is [out, in], y = x W^T + b */
    CLATTN_LAYOUT_RAW = 1     /* the tutorials' raw matrices: weight is [in, out], y = x W */
} clattn_layout;

typedef enum clattn_mask_kind {
    CLATTN_MASK_NONE = 0,
    CLATTN_MASK_BOOL = 1,     /* uint8 (Tq, Tk): nonzero = not allowed */
    CLATTN_MASK_FLOAT = 2     /* float (Tq, Tk): added to the scaled scores */
} clattn_mask_kind;

/* The precision of the attention core's two products (Q K^T and P V), like PyTorch's
 * torch.backends.cuda.matmul.allow_tf32. */
typedef enum clattn_precision {
    CLATTN_PRECISION_FP32 = 0, /* fp32 accuracy (default): every core, the ref device */
    CLATTN_PRECISION_TF32 = 1  /* TF32 products (10-bit mantissa operands, fp32 sums): only cores with TF32 products
                                  (flash_mma) take it; every other core, and the ref device, refuse it */
} clattn_precision;

/* The element type of a plan's activations and weights (clattn 0.7): desc.dtype. Host arrays and cl_mem buffers of
 * x, kv, value, out, attn and of the weights and biases hold this type; element counts and buffer offsets stay
 * counts of elements. The masks keep theirs (uint8, float), lse stays float. Products accumulate and the softmax's
 * statistics are kept in fp32 always (README, "Precision"). */
typedef enum clattn_dtype {
    CLATTN_DTYPE_F32 = 0,  /* float (default) */
    CLATTN_DTYPE_F16 = 1,  /* IEEE binary16 (cl_half, numpy float16, torch.float16) */
    CLATTN_DTYPE_BF16 = 2  /* bfloat16: the upper 16 bits of an fp32, as uint16_t (torch.bfloat16) */
} clattn_dtype;

/* n elements from src (of type `from`) into dst (of type `to`): widening is exact, narrowing rounds to nearest even
 * (the plans' own rounding; above half's range, inf; NaN stays NaN). src and dst may not overlap unless they are
 * the same array of one type. For callers that hold float data and run a half plan. clattn 0.7. */
CLATTN_API clattn_status clattn_dtype_convert(const void *src, clattn_dtype from, void *dst, clattn_dtype to, size_t n);

/* How an OpenCL plan computes the attention core (softmax(Q K^T * scale + masks) V). Each algorithm has
 * one or more cores (kernel families; see "cores" below and `clattn cores`):
 *   FUSED    streams K and V per block of queries with an online softmax: no Tq x Tk matrix in memory,
 *            causal work halved; no attention weights. Cores flash_rows (CPUs) and flash_tiled (GPUs).
 *   UNFUSED  CLBlast GEMMs for Q K^T and weights V around a softmax kernel, through a Tq x Tk score
 *            matrix (in chunks); the path that can return the weights. Core unfused.
 *   AUTO     the device's preferred core that can take the plan: a fused one, unless need_weights is
 *            set or none takes the plan (head sizes above 256); the device's tuning file may name another.
 * The ref device computes the same function whatever the algorithm says. */
typedef enum clattn_algorithm {
    CLATTN_ALGORITHM_AUTO = 0,
    CLATTN_ALGORITHM_FUSED = 1,
    CLATTN_ALGORITHM_UNFUSED = 2
} clattn_algorithm;

/* Rotary position embeddings (RoFormer; clattn 0.8): desc.rope. Query and key heads are rotated, after the
 * projections and their biases, by their token's position: the first `dims` (r) values of each head as r/2 pairs,
 * pair i of a token at position p turned by the angle p * f_i (f_i = theta^(-2i/r), changed by `scaling`):
 *   (a, b) -> (a cos - b sin, b cos + a sin)
 * the rest of the head as it is. Positions count from 0 in each batch entry (each sequence of a varlen batch):
 * query row i at position i, key row j at position j (cross-attention too), unless the execution gives each row's
 * position (args.rope_positions, as transformers' position_ids: packed documents, a chunk after its context); in
 * a decode step (clattn 0.8) new token t of a sequence whose cache holds L positions is at L + t, unless the step
 * gives each new token's position (clattn_decode_args.rope_positions), its key rotated before it is cached (a verify
 * step's draft tree needs them: its tokens sit at their depths). cos and sin are computed in double (at plan
 * creation, and again for longer positions when an execution or a decode step reaches them) and used as floats.
 * Values are never rotated. */
typedef enum clattn_rope_kind {
    CLATTN_ROPE_NONE = 0,        /* off (default) */
    CLATTN_ROPE_HALF = 1,        /* pair i = (i, i + r/2): GPT-NeoX, Llama, Mistral, Qwen as transformers writes them
                                    (rotate_half) */
    CLATTN_ROPE_INTERLEAVED = 2  /* pair i = (2i, 2i + 1): GPT-J, RoFormer, Meta's Llama reference code */
} clattn_rope_kind;

typedef enum clattn_rope_scaling {
    CLATTN_ROPE_SCALING_NONE = 0,   /* f_i = theta^(-2i/r) */
    CLATTN_ROPE_SCALING_LINEAR = 1, /* position interpolation: f_i / factor */
    CLATTN_ROPE_SCALING_NTK = 2,    /* NTK-aware: theta * factor^(r/(r-2)) in place of theta (r > 2) */
    CLATTN_ROPE_SCALING_YARN = 3    /* YaRN (transformers' "yarn", beta_fast 32, beta_slow 1): f_i between f_i and
                                       f_i / factor by a ramp over the dimensions whose wavelength fits
                                       original_max_position, cos and sin times 0.1 ln(factor) + 1 */
} clattn_rope_scaling;

typedef struct clattn_rope {
    clattn_rope_kind kind;
    size_t dims;                 /* r: rotated values per head, even, <= head_dim_qk; 0 = head_dim_qk (then even) */
    double theta;                /* the base; 0 = 10000 */
    clattn_rope_scaling scaling;
    double factor;               /* LINEAR, NTK, YARN: > 1 stretches the positions (0 = 1; NONE takes 0 or 1 only) */
    size_t original_max_position;/* YARN: the model's context length before scaling (required); else 0 */
} clattn_rope;

/* What the plan computes. Zero-initialise, then fill in. */
typedef struct clattn_attention_desc {
    size_t batch;        /* B >= 1 */
    size_t seq_q;        /* Tq >= 1: query length */
    size_t seq_kv;       /* Tk: key/value length; cross-attention only (self: Tk = Tq) */
    size_t embed;        /* E: width of x */
    size_t kv_embed;     /* Ekv: width of kv; cross-attention only (0 = E) */
    size_t heads;        /* H >= 1 */
    size_t head_dim_qk;  /* dk: query/key head size (0 = E/H, only without Q/K/V weights) */
    size_t head_dim_v;   /* dv: value head size (0 = dk) */
    size_t out_dim;      /* Eo: rows of w_out; required when w_out is given, else 0 */
    int cross;           /* 1: keys and values come from a second input kv */
    int causal;          /* 1: query i sees keys j <= i (top-left aligned) */
    clattn_mask_kind attn_mask;   /* (Tq, Tk) mask passed at execution */
    int key_padding_mask;         /* 1: a (B, Tk) uint8 mask is passed at execution, nonzero = ignore key */
    float scale;         /* 0 = 1/sqrt(dk) */
    float dropout;       /* p in [0, 1): training-mode dropout on the attention weights; 0 = eval */
    uint64_t seed;       /* dropout seed (Philox4x32-10 key) */
    clattn_layout layout;/* layout of every weight matrix below */
    clattn_algorithm algorithm; /* AUTO (default), FUSED or UNFUSED */
    int need_weights;    /* 1: executions may ask for the attention weights (args.attn / buffers.attn);
                            AUTO then picks UNFUSED, and FUSED is refused */
    /* clattn 0.3: */
    size_t kv_heads;     /* HK: key/value heads, dividing H (0 = H). Query head h uses key/value head
                            h / (H / HK) (grouped-query attention; HK = 1: multi-query). Needs Q/K/V weights
                            when HK != H: w_key (HK*dk, Ekv), w_value (HK*dv, Ekv) */
    size_t window;       /* W: sliding window, with causal only: query i sees key j when j <= i and
                            i - j < W; 0 = unlimited */
    int kv_half;         /* the KV cache's element type (a clattn_kv_type): 1 (CLATTN_KV_HALF): keys and values
                            are rounded to IEEE half (round to nearest even, as vstore_half_rte) after the
                            projection and its bias, then used in fp32: the values a half-precision KV cache
                            holds; 2 (CLATTN_KV_BF16, clattn 0.7): rounded to bfloat16 the same way; 0: float;
                            3 (CLATTN_KV_INT8, clattn 0.8): decode plans only, each appended row quantised as
                            the int8 cache stores it (clattn_kv_type) */
    clattn_precision precision; /* the core's products: FP32 (default) or TF32, opt in; the projections stay fp32.
                            TF32 agrees with fp32 to about 2^-10 of the scores and of the weighted values
                            (README, "Precision") */
    /* clattn 0.5: */
    int training;        /* 1: a plan for training: its executions may return each query row's log-sum-exp
                            (args.lse) and the heads' output before the output projection (args.context), what
                            clattn_plan_backward takes back to compute the gradients. 0 (default): neither, and
                            the plan keeps nothing for a backward pass. fp32 only, without kv_half */
    /* clattn 0.6: heads already projected (torch's scaled_dot_product_attention), and masks per batch entry or head */
    int separate_value;  /* 1: without Q/K/V weights and with cross = 1, keys and values are two inputs: kv is K
                            (B, Tk, HK*dk) and value is V (B, Tk, HK*dv), so head_dim_v (0 = dk) and kv_heads may
                            differ; kv_embed is then HK*dk (0 = that). 0: without weights K = V = kv (or x).
                            A decode plan (cross = 0) takes the new tokens' K and V the same way (decode args) */
    int attn_mask_per_batch; /* 1: attn_mask holds one (Tq, Tk) mask per batch entry: (B, Tq, Tk) */
    int attn_mask_per_head;  /* 1: one per query head: (H, Tq, Tk); with attn_mask_per_batch, (B, H, Tq, Tk) */
    /* clattn 0.7: */
    clattn_dtype dtype;  /* the type of x, kv, value, out, attn and the weights (host arrays and buffers); F32
                            (default), F16 or BF16: inputs widened to fp32 exactly, outputs rounded to nearest even
                            once. Attention, decode and encoder plans for inference in 0.7 (a decode plan's steps:
                            x, kv, value and out, its cache keeping its own type; an encoder layer's x, out and
                            every weight): a training plan refuses F16 and BF16 */
    /* clattn 0.8: */
    size_t kv_page_size; /* decode plans: the page size of the caches they run on (clattn_kv_cache_desc.page_size;
                            0: contiguous caches). Prefill and training plans: 0 */
    int varlen;          /* 1: variable-length batches (prefill and training plans): each execution packs `batch`
                            sequences of their own lengths without padding, sequence b at rows cu_seqlens_q[b] ..
                            cu_seqlens_q[b+1]-1 of x and out (and cu_seqlens_kv's of kv and value), as FlashAttention's
                            varlen functions; seq_q and seq_kv are the longest a sequence may be (the plan's sizes are
                            those of the padded batch, an upper bound). Causal and the window per sequence, top-left;
                            dropout keys sequence b's weight (h, i, j) as the padded batch's entry b's. Training
                            plans take it too. Refused with key_padding_mask (the lengths say it), attn_mask and
                            need_weights (README, "Variable-length batches") */
    clattn_rope rope;    /* rotary position embeddings on Q and K (above; kind NONE: off). Prefill, training and
                            decode plans; encoder plans refuse it */
    int sinks;           /* 1: attention sinks (gpt-oss): query head h has a logit sink_h (weights.sinks) in its
                            softmax's denominator and no value, so row i's weights are exp(s_ij) / (exp(sink_h) +
                            sum_j exp(s_ij)) and sum to less than 1; a row with no visible key still gives 0. -inf:
                            no sink for that head. Prefill and training plans in 0.8 (a training plan's lse is that
                            of the weights with the sink, log(exp(sink_h) + sum_j exp(s_ij)), sink_h in a row with no
                            visible key; the backward's gradients take the sinks as constants and give none for
                            them); decode and need_weights refuse it (README, "Attention variants") */
} clattn_attention_desc;

/* Weights, copied at plan creation. With w_query = w_key = w_value = NULL the
 * module has no Q/K/V projections: Q = x, K = V = kv (or x), split into heads; with desc.separate_value,
 * K = kv and V = value (clattn 0.6): the attention core alone on the heads, torch's scaled_dot_product_attention
 * (x (B, Tq, H*dk) is Q with head h at columns h*dk, and the output (B, Tq, H*dv) the heads side by side). Without
 * weights, kv_heads may differ from heads only in cross-attention: kv then holds HK heads (kv_embed = HK*dk).
 * Biases are optional (NULL = none). w_out NULL = no output projection.
 *   LINEAR layout: w_query (H*dk, E), w_key (HK*dk, Ekv), w_value (HK*dv, Ekv), w_out (Eo, H*dv)
 *   RAW layout:    the transposes of those. (HK = kv_heads, = H unless grouped-query.)
 * Every array comes with its element count (clattn 0.4): the plan refuses a count that is not the one the
 * description needs (CLATTN_STATUS_SHAPE_MISMATCH, naming both) before it reads anything, so a weight of
 * another shape is an error, never a read past its end. The count of an array not given is 0. */
typedef struct clattn_attention_weights {
    /* arrays of desc.dtype's elements (float, or uint16_t bit patterns for F16 and BF16; clattn 0.7: void *) */
    const void *w_query, *w_key, *w_value;
    const void *b_query, *b_key, *b_value;   /* (H*dk), (HK*dk), (HK*dv) */
    const void *w_out, *b_out;               /* b_out (Eo) */
    size_t w_query_count, w_key_count, w_value_count;
    size_t b_query_count, b_key_count, b_value_count;
    size_t w_out_count, b_out_count;
    /* clattn 0.8, desc.sinks only (else refused): each query head's sink logit (H), finite or -inf */
    const void *sinks;
    size_t sinks_count;
} clattn_attention_weights;

typedef struct clattn_plan clattn_plan;

CLATTN_API clattn_status clattn_plan_create(clattn_device *device, const clattn_attention_desc *desc,
                                            const clattn_attention_weights *weights,
                                            clattn_plan **plan);
CLATTN_API void clattn_plan_free(clattn_plan *plan);

/* Replace the plan's weights with new values of the same shapes (a training step's updated parameters), keeping
 * everything else the plan built (kernels, buffers, cores): far cheaper than a new plan. `weights` as at creation:
 * every array the plan was created with, each with its element count, in the description's layout; an array the
 * plan was created without, or one of its own left NULL, is refused, and after any refusal the plan keeps its old
 * weights. Executions and backward passes called after it returns use the new weights; on OpenCL, work enqueued
 * before it on the device's queue (clattn_plan_execute_buffers) still reads the old ones, and the arrays may be
 * freed when it returns. Not for decode or encoder plans. clattn 0.5. */
CLATTN_API clattn_status clattn_plan_set_weights(clattn_plan *plan, const clattn_attention_weights *weights);

/* The description with every default resolved (Tk, Ekv, dk, dv, scale). */
CLATTN_API clattn_status clattn_plan_desc(const clattn_plan *plan, clattn_attention_desc *desc);
/* The algorithm the plan runs: FUSED or UNFUSED on OpenCL (AUTO resolved), AUTO on ref. */
CLATTN_API clattn_algorithm clattn_plan_algorithm(const clattn_plan *plan);
CLATTN_API const char *clattn_algorithm_name(clattn_algorithm algorithm); /* "auto", "fused", "unfused" */

/* Bytes of device memory the plan's own buffers hold (weights, workspace, staging); 0 on ref. */
CLATTN_API size_t clattn_plan_device_bytes(const clattn_plan *plan);

/* Width of each output row: Eo with an output projection, else H*dv. */
CLATTN_API size_t clattn_plan_out_width(const clattn_plan *plan);

/* Change the dropout seed for the next executions. Setting it and executing are two calls: threads that share a
 * plan and give it their own seeds (or weights, clattn_plan_set_weights) hold a lock of their own over both. */
CLATTN_API clattn_status clattn_plan_set_seed(clattn_plan *plan, uint64_t seed);

/* Execution from host arrays. An array the description does not declare (kv for self-attention, a mask
 * the plan was made without) is refused (INVALID_ARGUMENT), never ignored; so is an output that shares memory with
 * an input or another output (out, attn, lse, context: "Memory" at the top). Every array comes with its
 * element count (clattn 0.4; 0 for one not given): a count that is not the plan's is refused
 * (CLATTN_STATUS_SHAPE_MISMATCH, naming both) before anything is read or written. */
typedef struct clattn_attention_args {
    /* x, kv, value, out and attn hold desc.dtype's elements (clattn 0.7: void *; float for F32) */
    const void *x;                    /* (B, Tq, E) */
    const void *kv;                   /* (B, Tk, Ekv), cross-attention only (else NULL) */
    const uint8_t *key_padding_mask;  /* (B, Tk), when desc.key_padding_mask (else NULL) */
    const void *attn_mask;            /* (Tq, Tk) uint8 or float, per desc.attn_mask (else NULL); (B, Tq, Tk),
                                         (H, Tq, Tk) or (B, H, Tq, Tk) per desc.attn_mask_per_batch / _per_head */
    void *out;                        /* (B, Tq, Eo or H*dv) */
    void *attn;                       /* optional (B, H, Tq, Tk): the weights applied to V; OpenCL plans
                                         need desc.need_weights (else CLATTN_STATUS_UNSUPPORTED) */
    size_t x_count, kv_count, key_padding_mask_count, attn_mask_count, out_count, attn_count;
    /* clattn 0.5, training plans (desc.training) only, else refused: */
    float *lse;                       /* optional (B, H, Tq): each query row's log-sum-exp of its scaled, masked
                                         scores, log(sum_j exp(s_ij)) before dropout (natural log); -inf for a row
                                         with no visible key */
    float *context;                   /* optional (B, Tq, H*dv): the heads' merged output before the output
                                         projection (without one, the same as out) */
    size_t lse_count, context_count;
    /* clattn 0.6, desc.separate_value only, else refused: */
    const void *value;                /* (B, Tk, HK*dv): V */
    size_t value_count;
    /* clattn 0.8, desc.varlen only, else refused: where each sequence starts, B+1 offsets from 0, non-decreasing
       (an empty sequence has two equal ones), each sequence at most seq_q (seq_kv) long. With them x is
       (total_q, E) and out (total_q, Eo or H*dv), total_q = cu_seqlens_q[B], and kv and value (cross-attention)
       (total_kv, ...), total_kv = cu_seqlens_kv[B]; the counts of x, kv, value and out are those of the packed rows.
       Self-attention: cu_seqlens_kv NULL (the keys are the queries' rows). A sequence with queries and no keys
       (cross-attention) gives the output of a row with no visible key: its context 0 */
    const uint32_t *cu_seqlens_q, *cu_seqlens_kv;
    size_t cu_seqlens_q_count, cu_seqlens_kv_count;
    /* clattn 0.8, desc.rope only, else refused; optional (NULL: row i of each sequence at position i): each query
       row's position for the rotation, as transformers' position_ids, (B, Tq) or, varlen, (total_q); in
       self-attention the keys' too (they are the queries' rows). rope_positions_kv: cross-attention's keys', (B, Tk)
       or (total_kv), given with rope_positions or not at all. Each at most CLATTN_ROPE_MAX_POSITION; the plan's
       table of cos and sin grows to the largest, rounded up to a power of two (8 bytes per position and rotated
       pair) */
    const uint32_t *rope_positions, *rope_positions_kv;
    size_t rope_positions_count, rope_positions_kv_count;
} clattn_attention_args;

/* The largest position a row may be given (args.rope_positions): 2^22 - 1. */
#define CLATTN_ROPE_MAX_POSITION 4194303u

CLATTN_API clattn_status clattn_plan_execute(clattn_plan *plan, const clattn_attention_args *args);

/* Execution on device buffers (OpenCL devices only). Offsets count elements
 * (bytes for the uint8 masks). Enqueued on the device's queue after the wait
 * list; `event` (optional) completes when out and attn are written. An output
 * (out, attn, lse, context) may not share memory with an input or with another output
 * (sub-buffers are seen through): such a call is refused (INVALID_ARGUMENT), as in
 * clattn_plan_execute (see "Memory" at the top).
 * A buffer the description does not declare (kv for self-attention, a mask
 * the plan was made without) is refused too, never ignored. */
typedef struct clattn_buffer {
    cl_mem mem;
    size_t offset;
} clattn_buffer;

typedef struct clattn_attention_buffers {
    clattn_buffer x, kv, key_padding_mask, attn_mask, out, attn; /* attn.mem NULL = not wanted */
    clattn_buffer lse, context; /* clattn 0.5, training plans: as args.lse and args.context (mem NULL = not wanted) */
    clattn_buffer value;        /* clattn 0.6, desc.separate_value only: as args.value */
    /* clattn 0.8, desc.varlen only: as args' (host arrays, read during the call; the buffers hold the packed rows) */
    const uint32_t *cu_seqlens_q, *cu_seqlens_kv;
    size_t cu_seqlens_q_count, cu_seqlens_kv_count;
    /* clattn 0.8, desc.rope only: as args' (host arrays, read during the call) */
    const uint32_t *rope_positions, *rope_positions_kv;
    size_t rope_positions_count, rope_positions_kv_count;
} clattn_attention_buffers;

CLATTN_API clattn_status clattn_plan_execute_buffers(clattn_plan *plan,
                                                     const clattn_attention_buffers *buffers,
                                                     cl_uint num_events_in_wait_list,
                                                     const cl_event *event_wait_list,
                                                     cl_event *event);

/* ---------------------------------------------------------------- training: the backward pass (clattn 0.5) */

/* The gradients of a loss L through one execution of a training plan (desc.training = 1), from dL/dout: for the
 * same inputs (args: x, kv, the masks; its outputs out, attn, lse and context must be NULL) and the plan's weights,
 * scale and dropout seed, so that dropout keeps exactly the forward's weights. Each gradient pointer left NULL is
 * not computed; each given one is overwritten (not accumulated), has the shape of its input and, for the weights,
 * the description's layout. A gradient the plan has no input for (grad_kv without cross, grad_w_out without an
 * output projection, grad_b_* without that bias, grad_w_* for a plan without projection weights) is refused.
 * Masks and the scale get no gradient. A query row with no visible key contributes nothing (zero gradients,
 * never NaN). lse and context: the forward's args.lse and args.context for these inputs (both or neither); given,
 * the backward trusts them and does not recompute the forward's statistics. A gradient may not share memory with
 * an input (args' arrays, grad_out, lse, context) or with another gradient ("Memory" at the top). */
typedef struct clattn_attention_grads {
    /* grad_out and every gradient hold desc.dtype's elements (clattn 0.7: void *; float for F32, uint16_t bit
       patterns for F16 and BF16, as the plan's inputs and weights); lse and context are float always */
    const void *grad_out;       /* (B, Tq, Eo or H*dv), required */
    const float *lse;           /* optional (B, H, Tq): the forward's */
    const float *context;       /* optional (B, Tq, H*dv): the forward's */
    void *grad_x;               /* (B, Tq, E) */
    void *grad_kv;              /* (B, Tk, Ekv), cross-attention */
    void *grad_w_query, *grad_w_key, *grad_w_value;    /* as w_query (H*dk, E), w_key (HK*dk, Ekv), w_value */
    void *grad_b_query, *grad_b_key, *grad_b_value;    /* (H*dk), (HK*dk), (HK*dv) */
    void *grad_w_out, *grad_b_out;                     /* (Eo, H*dv), (Eo) */
    size_t grad_out_count, lse_count, context_count, grad_x_count, grad_kv_count;
    size_t grad_w_query_count, grad_w_key_count, grad_w_value_count;
    size_t grad_b_query_count, grad_b_key_count, grad_b_value_count, grad_w_out_count, grad_b_out_count;
    /* clattn 0.6, desc.separate_value only: */
    void *grad_value;           /* (B, Tk, HK*dv); grad_kv is then K's gradient alone */
    size_t grad_value_count;
} clattn_attention_grads;

CLATTN_API clattn_status clattn_plan_backward(clattn_plan *plan, const clattn_attention_args *args,
                                              const clattn_attention_grads *grads);

/* The backward pass on device buffers (OpenCL devices): the inputs in `buffers` (x, kv, the masks; out, attn, lse
 * and context must have mem NULL), the gradients in `grads`, offsets in elements (bytes for the masks), each
 * gradient buffer with mem NULL not computed, shapes and rules as in clattn_attention_grads. Enqueued after the
 * wait list; `event` (optional) completes when every gradient is written. A gradient may not share memory with an
 * input or with another gradient (refused, INVALID_ARGUMENT). */
typedef struct clattn_attention_grad_buffers {
    clattn_buffer grad_out, lse, context;                 /* grad_out required; lse and context both or neither */
    clattn_buffer grad_x, grad_kv;
    clattn_buffer grad_w_query, grad_w_key, grad_w_value, grad_b_query, grad_b_key, grad_b_value;
    clattn_buffer grad_w_out, grad_b_out;
    clattn_buffer grad_value;   /* clattn 0.6, desc.separate_value only: as grads.grad_value */
} clattn_attention_grad_buffers;

CLATTN_API clattn_status clattn_plan_backward_buffers(clattn_plan *plan, const clattn_attention_buffers *buffers,
                                                      const clattn_attention_grad_buffers *grads,
                                                      cl_uint num_events_in_wait_list, const cl_event *event_wait_list,
                                                      cl_event *event);

/* ---------------------------------------------------------------- partial attention over key shards */

/* Attention over the keys split into shards (across devices or processes: ring attention) gives, per shard p,
 * the heads' output over its keys, out_p (B, Tq, H*dv: a training plan's args.context, or out without an output
 * projection), and its rows' log-sum-exp lse_p (B, H, Tq: args.lse). clattn_attention_merge combines `parts` of
 * them into what one call over all the keys gives: with L = log(sum_p exp(lse_p)) per row,
 *   out = sum_p exp(lse_p - L) out_p,   lse = L        (the math of decode's split-K combine)
 * A row no shard saw a key of gets out 0 and lse -inf; a NaN lse makes its row NaN. out and lse (either may be
 * NULL) may not overlap the inputs or each other; an lse of +inf (a sum that overflowed float) is refused, naming its
 * part and row, before anything is written. The shards' plans must see the keys as one call would: a causal or windowed
 * pattern across shards is an attn_mask of each shard's keys (their causal flag counts keys from 0), and dropout
 * does not split exactly (a weight's keep decision depends on the key's index within its shard). Attention sinks
 * (desc.sinks) across shards: shards without sinks, and one more part with out 0 and lse s_h on every row of head h. */
CLATTN_API clattn_status clattn_attention_merge(size_t parts, const float *const *outs, const float *const *lses,
                                                size_t batch, size_t seq_q, size_t heads, size_t head_dim_v,
                                                float *out, float *lse);

/* ---------------------------------------------------------------- tuning */

/* Tile sizes and kernel variants differ between a CPU running PoCL, an integrated GPU and an H100.
 * clattn_tune searches, for one device, each prefill core's parameters per head-size class (max(dk, dv)
 * up to 32, 64, 128, 256, above; `clattn cores` lists the parameters) on the shapes given, then which core
 * AUTO should give each class; the decode cores, the backward cores (a training plan's backward) and the GEMM
 * cores the same way on the first shape; and
 * CLBlast's own parameters (a random search of the spaces its tuners search, for its Xgemm and XgemmDirect
 * kernels) where CLBlast runs the GEMMs. CLBlast's parameters are per device and process: clattn_tune leaves
 * CLBlast, in this process, with what it kept, or with CLBlast's generic parameters when it kept nothing
 * (CLBlast cannot go back to its own entry for the device). It checks each candidate's output against
 * the defaults' before timing it, and keeps a candidate only when it beats the defaults by `margin` in
 * each of three repeated comparisons. It writes what it kept to the device's tuning file. Plans read that file (at device open) and use its entries: clattn_plan_tuned says whether
 * a plan does.
 * The file: $CLATTN_TUNE_FILE, else $XDG_CACHE_HOME/clattn/tune-<key hash>.txt (default ~/.cache/clattn/),
 * a small text file keyed by the device's name, vendor and driver version and clattn's version.
 * CLATTN_TUNE=0 ignores it. A missing, truncated, corrupted, stale (another driver or version) or hostile
 * file (huge numbers, values a kernel cannot take, parameters that fail to compile) is ignored for the
 * entries it affects, with a notice (clattn_device_tune_notice); the defaults are used instead.
 * Do not use the device from other threads while clattn_tune runs. */
typedef void (*clattn_tune_progress_fn)(const char *line, void *user);
typedef struct clattn_tune_options {
    double budget_s;              /* wall-clock budget in seconds (0 = 120) */
    const size_t *shapes;         /* n_shapes quadruples (B, T, E, H) of self-attention to tune on;
                                     NULL = {4, 512, 512, 8} */
    size_t n_shapes;
    double margin;                /* required gain over the defaults, as a fraction (0 = 0.03) */
    clattn_tune_progress_fn progress; /* optional: one line per step of the search */
    void *user;
    int clblast;                  /* CLBlast's parameters: 0 searched where CLBlast runs the device's GEMMs (AUTO's
                                     GEMM core after the search: GPUs), 1 always, -1 never */
} clattn_tune_options;
CLATTN_API clattn_status clattn_tune(clattn_device *device, const clattn_tune_options *options);
/* The device's tuning file path ("" on ref). */
CLATTN_API const char *clattn_device_tune_file(const clattn_device *device);
/* What the tuning file had that was ignored, and why; NULL when nothing was (or there is no file). */
CLATTN_API const char *clattn_device_tune_notice(const clattn_device *device);
/* Does the plan use tuned parameters (from the device's tuning file)? */
CLATTN_API int clattn_plan_tuned(const clattn_plan *plan);

/* ---------------------------------------------------------------- cores */

/* A core is one kernel family that computes the attention core of OpenCL plans, or their matrix products.
 * Prefill cores run clattn_plan_create's plans; decode cores run clattn_decode_plan_create's; GEMM cores run
 * every plan's GEMMs (projections, feed-forward layers, the unfused core's batched products). A plan picks
 * its cores when it is created: CLATTN_CORE=NAME[:P=V,...][;NAME[:P=V,...]...] in the environment first (at
 * most one core per kind; for the plans that can use that core; a plan it cannot serve is refused with the
 * core's reason), then the device's tuning file, then the device's order of preference. */
typedef enum clattn_core_kind {
    CLATTN_CORE_PREFILL = 0,
    CLATTN_CORE_DECODE = 1,
    CLATTN_CORE_GEMM = 2,         /* the matrix products of a plan: projections, feed-forward, unfused scores */
    CLATTN_CORE_BACKWARD = 3      /* clattn 0.5: the attention core's backward pass of training plans */
} clattn_core_kind;

/* Head-size classes, by max(dk, dv): <= 32, <= 64, <= 128, <= 256, above. Bit c of default_for. */
#define CLATTN_HEAD_CLASS_COUNT 5

typedef struct clattn_core_info {
    char name[32];                /* "unfused", "flash_rows", "flash_tiled", "decode_attend", ... */
    clattn_core_kind kind;
    clattn_algorithm algorithm;   /* FUSED or UNFUSED: what clattn_plan_algorithm reports for its plans */
    int produces_weights;         /* can return the attention weights */
    int supported;                /* the device can run it (for some plans) */
    char reason[256];             /* why not ("" when supported) */
    unsigned default_for;         /* bit c set: AUTO gives plans of head-size class c this core here */
    char params[128];             /* its tuning parameters, space-separated ("" = none) */
    char test_configs[128];       /* parameter sets the test suite runs it with, space-separated */
    int emulated;                 /* not supported here, but CLATTN_CORE=<name> runs an emulation of it (flash_mma
                                     without tensor cores: for tests; AUTO never picks it) */
    int reads_dtypes;             /* clattn 0.7: reads and writes F16 and BF16 arrays itself (a half plan without
                                     projections runs on them as they are); other cores' half plans convert at the
                                     plan's boundary (README, "Data types"). A GEMM core: reads F16 and BF16
                                     operands, so a half plan's projections read its inputs and weights as they are */
} clattn_core_info;

/* CLATTN_CORE checked as plans will read it, without a plan: SUCCESS when it is unset or every spec names a core and
 * parameters that core has (each parameter once, at most one core per kind); else INVALID_ARGUMENT with the reason in
 * clattn_last_error (`clattn cores` shows it). Whether a core fits a plan is known only at plan creation. clattn 0.5. */
CLATTN_API clattn_status clattn_core_env_check(void);

/* How many cores this library has registered (of every kind). */
CLATTN_API size_t clattn_core_count(void);
/* Core `index` (0 .. clattn_core_count() - 1) as seen from `device` (NULL: no device; supported = 0). */
CLATTN_API clattn_status clattn_core_describe(const clattn_device *device, size_t index, clattn_core_info *info);

/* ---------------------------------------------------------------- self-test */

/* Drivers compute wrong numbers without an error (README, "Drivers with defects"). clattn_device_selftest runs a
 * compact conformance set on `device` (an OpenCL device): every registered core the device runs, forced in turn,
 * on its kind's cases (attention: odd sizes, masks, GQA, a window, long rows, NaN inputs, the weights; GEMM: the
 * projections of those; decode: steps over prefilled and written caches, float and half; backward: training plans'
 * gradients), each compared element by element with the ref device's result (the fp32 tolerance, 1e-5 + 1e-4 |ref|;
 * gradients 1e-4 + 1e-3 |ref|; a NaN only where ref has one). quick: fewer and shorter cases. It writes one result
 * per core into results (at most `capacity`; *count: how many cores there are) and keeps the verdicts with the
 * device probes' facts: on this device and driver, AUTO then passes over a core that failed (CLATTN_CORE still forces
 * it; clattn_device_facts names them), until a new self-test records new verdicts: a full one replaces them, a quick
 * one adds its failures to them (its fewer cases prove no earlier failure wrong). The GEMM cores are tested first, and
 * the other kinds' plans then run on GEMM cores that did not fail (AUTO, CLATTN_CORE not read), so that a wrong GEMM
 * is not blamed on the cores that use it. Returns SUCCESS when the test ran, whatever its verdicts, with
 * clattn_last_notice saying so where the verdicts could not be kept on disk (then they hold for this device object
 * only); the first thing to run on a new device (`clattn selftest`). Do not use the device from other threads while it
 * runs. clattn 0.5. */
typedef enum clattn_verdict {
    CLATTN_VERDICT_PASS = 0,    /* every case within tolerance, or refused with a status (a limit of the device) */
    CLATTN_VERDICT_FAIL = 1,    /* a wrong number: kept, AUTO passes over the core here */
    CLATTN_VERDICT_NOT_RUN = 2, /* the device does not run the core at all (detail: why) */
    CLATTN_VERDICT_ERROR = 3    /* a case ended in an error that is neither a refusal nor a wrong number (out of
                                   memory, a driver's error; detail: which): not kept (clattn 0.5.1) */
} clattn_verdict;
typedef struct clattn_selftest_result {
    char core[32];
    clattn_core_kind kind;
    size_t cases;               /* cases computed and compared */
    size_t refused;             /* cases the core refused with the reason (TOO_LARGE_FOR_DEVICE, UNSUPPORTED) */
    double worst_error;         /* the largest |got - ref| over the cases' outputs */
    double worst_ratio;         /* the largest |got - ref| / tolerance: at most 1 passes */
    clattn_verdict verdict;
    char detail[300];           /* FAIL, ERROR: the first failure; NOT_RUN: why; PASS: the first refusal ("" none) */
} clattn_selftest_result;
CLATTN_API clattn_status clattn_device_selftest(clattn_device *device, int quick, clattn_selftest_result *results,
                                                size_t capacity, size_t *count);

/* "<=32", "<=64", "<=128", "<=256", ">256" for class 0 .. 4 ("?" otherwise). */
CLATTN_API const char *clattn_head_class_label(int head_class);
/* The core a plan runs ("ref" on the ref device), and the parameters it was built with, as CLATTN_CORE and
 * the tuning file write them ("ROWS=16,BK=16,VW=8"; "" on ref). */
CLATTN_API const char *clattn_plan_core(const clattn_plan *plan);
CLATTN_API const char *clattn_plan_core_params(const clattn_plan *plan);
/* A training plan's backward core and its parameters, the same way ("flash_backward", "ROWS=16,PART=4"; "ref"
 * and "" on ref; "" and "" for a plan that does not train). clattn 0.5. */
CLATTN_API const char *clattn_plan_backward_core(const clattn_plan *plan);
CLATTN_API const char *clattn_plan_backward_core_params(const clattn_plan *plan);
/* The GEMM core the plan's matrix products run on (the projections, and the unfused core's score and context
 * products: "gemm_tiles", "gemm_clblast"; "ref" on the ref device), and its parameters ("" when none). */
CLATTN_API const char *clattn_plan_gemm(const clattn_plan *plan);
CLATTN_API const char *clattn_plan_gemm_params(const clattn_plan *plan);

/* ---------------------------------------------------------------- KV cache and decoding */

/* A KV cache on a device: for B sequences, up to `capacity` positions of keys and values of
 * kv_heads heads, stored as float, as IEEE half (vstore_half_rte / vload_half: no cl_khr_fp16
 * needed) or as bfloat16 (clattn 0.7: 16 bits a float's upper half; a bfloat16 model's keys and values
 * exactly, with a float's range) or as int8 with scales (clattn 0.8, below). Each sequence has its own length.
 * Device memory: B*HK*capacity*(dk+dv) elements, and for INT8 also B*HK*capacity*2 floats (the scales).
 *
 * INT8: each (sequence, KV head, position) row of keys, and of values, is stored as dk (dv) signed bytes q_c and one
 * float scale s, symmetric: s = max_c |x_c| * (1/127 rounded to a float), computed in float, and q_c = x_c / s
 * rounded to nearest, ties to even (the exact quotient's rounding: the same codes on every device; |q_c| <= 127; a
 * row of zeros has s = 0, a row holding a NaN or an infinity s = NaN), quantised when the row is appended or written;
 * the cores read q_c * s. Each element's error
 * is at most half a step, |q_c s - x_c| <= s/2 = max_c |x_c| / 254 (a bound relative to the row's largest element,
 * not to the element; plus fp32 rounding). clattn_kv_cache_read gives q_c * s. At dk = dv = 64 a position takes 136
 * bytes against 256 for HALF and 512 for FLOAT. Decode plans only (desc.kv_half = 3): a prefill plan's kv_half
 * rounds each element alone, and an int8 row's rounding depends on the whole row. */
typedef enum clattn_kv_type {
    CLATTN_KV_FLOAT = 0,
    CLATTN_KV_HALF = 1,
    CLATTN_KV_BF16 = 2,  /* clattn 0.7: bfloat16 (a float's range, 8 significant bits), round to nearest even */
    CLATTN_KV_INT8 = 3   /* clattn 0.8: signed bytes with a float scale per row (above) */
} clattn_kv_type;

typedef struct clattn_kv_cache_desc {
    size_t batch;        /* B >= 1 sequences */
    size_t capacity;     /* Tmax >= 1 positions per sequence */
    size_t kv_heads;     /* HK >= 1 */
    size_t head_dim_qk;  /* dk >= 1 */
    size_t head_dim_v;   /* dv (0 = dk) */
    clattn_kv_type type;
    /* clattn 0.8: a paged cache (below) */
    size_t page_size;    /* P: positions per page, a power of two 1 .. 65536; 0: contiguous (one region per sequence) */
    size_t pages;        /* paged: the pool's pages (0 = B * ceil(capacity / P), every sequence full at once) */
} clattn_kv_cache_desc;

/* PAGED (clattn 0.8, page_size P > 0): the keys and values live in a pool of `pages` pages of P positions (all
 * kv_heads heads), and each sequence has a block table: its positions i*P .. i*P + P-1 are page table[i]. clattn keeps
 * the tables and counts the references to each page itself (the caller never writes a table): a step takes free
 * pages as its sequences grow (refused, nothing changed, when the pool has too few), clattn_kv_cache_share lets
 * sequences share the pages of a common prefix, a page shared by several sequences is copied before one of them
 * writes into it (copy-on-write: a step, clattn_kv_cache_accept; the last holder keeps the page), and pages no
 * position uses any more (truncate, reset, accept, share, a failed step; write lays every sequence out anew) go back
 * to the pool for reuse. capacity stays each sequence's limit. A decode plan runs on paged caches of its
 * desc.kv_page_size only. Device memory: pages * P * HK * (dk + dv) elements (INT8: and 2 floats per position and
 * head), and B * ceil(capacity / P) table entries. */
typedef struct clattn_kv_cache clattn_kv_cache;

CLATTN_API clattn_status clattn_kv_cache_create(clattn_device *device, const clattn_kv_cache_desc *desc,
                                                clattn_kv_cache **cache);
CLATTN_API void clattn_kv_cache_free(clattn_kv_cache *cache);
/* The description with defaults resolved. */
CLATTN_API clattn_status clattn_kv_cache_desc_get(const clattn_kv_cache *cache, clattn_kv_cache_desc *desc);
/* Every sequence's length back to 0. */
CLATTN_API clattn_status clattn_kv_cache_reset(clattn_kv_cache *cache);
/* Drop the tail of each sequence: lengths[b] (B entries) at most its current length (speculative
 * decoding rolls back rejected tokens). A length above the current one is refused, nothing changed. */
CLATTN_API clattn_status clattn_kv_cache_truncate(clattn_kv_cache *cache, const size_t *lengths);
/* The current lengths, B entries. */
CLATTN_API clattn_status clattn_kv_cache_lengths(const clattn_kv_cache *cache, size_t *lengths);
/* clattn 0.8: keep the accepted branch of a verify step (clattn_decode_args.tree_mask). Sequence b had from[b]
 * positions before the step; of the step's tokens (now at from[b] + i), it keeps counts[b] of them, the tokens
 * index[b*stride + 0 .. counts[b]-1] (strictly ascending: a branch of the tree, root first), moved in that order to
 * positions from[b] + 0 .. counts[b]-1, keys, values (and an INT8 cache's scales) alike; its length becomes
 * from[b] + counts[b]. Nothing before from[b] changes. counts[b] = 0 drops the whole step; for a chain (no tree),
 * clattn_kv_cache_truncate does the same as index 0 .. k-1. Refused with nothing changed: from[b] + index past the
 * current length, an index not ascending, counts[b] > stride. The cache does not know the plans that wrote it: with
 * rotary embeddings (desc.rope) its keys were rotated for the positions they were written at, so a token rotated at
 * its slot and moved to another is wrong there: of a step at its slots keep only prefixes (index 0 .. k-1); a draft
 * tree's tokens given the positions from[b] + depth (clattn_decode_args.rope_positions) may keep any branch
 * (clattn.Decoder checks which; the same holds for keys given to clattn_kv_cache_write, which must be rotated for
 * their positions). */
CLATTN_API clattn_status clattn_kv_cache_accept(clattn_kv_cache *cache, const size_t *from, const size_t *counts,
                                                const size_t *index, size_t stride);
/* Read the cache back as float: k (B, HK, Tmax, dk) and v (B, HK, Tmax, dv) (either may be NULL; the two may not
 * overlap); positions at or past a sequence's length read as 0. */
CLATTN_API clattn_status clattn_kv_cache_read(const clattn_kv_cache *cache, float *k, float *v);
/* Write the cache from float arrays in the layout clattn_kv_cache_read uses, k (B, HK, Tmax, dk) and
 * v (B, HK, Tmax, dv), and set the lengths to lengths[b] <= Tmax (B entries): a cache computed
 * elsewhere (another framework's prefill), or a benchmark's. Positions at or past a length are not
 * used. HALF and BF16 caches round to nearest even, INT8 caches quantise each row (clattn_kv_type). On error the
 * lengths do not change. */
CLATTN_API clattn_status clattn_kv_cache_write(clattn_kv_cache *cache, const float *k, const float *v,
                                               const size_t *lengths);
/* Bytes of device memory the cache holds, an INT8 cache's scales included (0 on ref). */
CLATTN_API size_t clattn_kv_cache_device_bytes(const clattn_kv_cache *cache);
/* clattn 0.8: sequence dst's positions become sequence src's first `length` (<= src's length): its own are dropped
 * first, and its length becomes `length` (a prompt's prefix shared between requests). A paged cache shares src's pages
 * (no copy; a page both then write into is copied first); a contiguous one copies the positions. dst = src, an index
 * past the batch or a length past src's are refused with nothing changed. */
CLATTN_API clattn_status clattn_kv_cache_share(clattn_kv_cache *cache, size_t dst, size_t src, size_t length);
/* clattn 0.8, paged caches: sequence b's pages, table[0 .. count-1] (count = ceil(length / P); at most
 * ceil(capacity / P) entries written), and the pages in use by any sequence. A contiguous cache: UNSUPPORTED. */
CLATTN_API clattn_status clattn_kv_cache_pages(const clattn_kv_cache *cache, size_t b, size_t *table, size_t *count,
                                               size_t *in_use);

/* A decode plan: self-attention with causal = 1 over a KV cache. Each execution takes n new tokens
 * per sequence, x (B, n, E) with 1 <= n <= desc.seq_q, projects them, appends their keys and values
 * to the cache at each sequence's length, and lets their queries attend to every cached position up
 * to their own (causal within the new block, the window honoured). Prefill (n large) and decode
 * (n = 1) are the same call, with no recompilation between them; the result equals one causal run
 * over the whole sequence. The description: seq_q = the most new tokens per call; causal = 1;
 * cross, masks, dropout and need_weights 0; kv_heads, window, kv_half, heads, head sizes as the
 * attention; the cache must match (batch, kv_heads, dk, dv, and its type kv_half: FLOAT 0, HALF 1, BF16 2,
 * INT8 3).
 * On OpenCL, a call with few new tokens splits the cached keys into parts processed by separate
 * work-items (split-K) and merges them with a second kernel. */
typedef struct clattn_decode_plan clattn_decode_plan;

CLATTN_API clattn_status clattn_decode_plan_create(clattn_device *device, const clattn_attention_desc *desc,
                                                   const clattn_attention_weights *weights,
                                                   clattn_decode_plan **plan);
CLATTN_API void clattn_decode_plan_free(clattn_decode_plan *plan);

typedef struct clattn_decode_args {
    /* x, out, kv and value hold desc.dtype's elements (clattn 0.7: void *; float for F32) */
    const void *x;             /* (B, n, E) */
    size_t new_tokens;         /* n: 1 <= n <= desc.seq_q */
    const size_t *valid;       /* optional (B): sequence b appends only its first valid[b] <= n tokens
                                  (prompts of different lengths in one prefill); the other rows get a zero
                                  attention output (so b_out, or 0, after the output projection). NULL: all n */
    void *out;                 /* (B, n, Eo or H*dv) */
    size_t x_count, valid_count, out_count; /* element counts (clattn 0.4), checked as the attention's */
    /* clattn 0.6, a plan with desc.separate_value (no weights) only, else refused: x is then the new tokens'
     * queries Q (B, n, H*dk), kv their keys and value their values, appended to the cache as they are */
    const void *kv;            /* (B, n, HK*dk) */
    const void *value;         /* (B, n, HK*dv) */
    size_t kv_count, value_count;
    /* clattn 0.8, a speculative decoding's verify step: the draft tokens' tree (B, n, n), optional. New token i of
     * sequence b sees new token j only where tree_mask[(b*n + i)*n + j] is nonzero (its ancestors in the draft
     * tree, and itself: the diagonal must be nonzero, the entries above it 0); every cached position stays visible.
     * NULL: causal among the new tokens (a chain). Not with a window (refused). The tokens are appended at positions
     * len + i as ever; clattn_kv_cache_accept keeps the accepted branch. With desc.rope, only with rope_positions
     * (below): give draft token i the position len + its depth in the tree, so that an accepted branch's keys sit at
     * the positions they were rotated for. */
    const uint8_t *tree_mask;
    size_t tree_mask_count;
    /* clattn 0.8, packed new tokens (optional): sequence b's new tokens are rows cu_new[b] .. cu_new[b+1]-1 of x (kv,
     * value) and out, B+1 offsets from 0, never decreasing, so that x is (cu_new[B], E) and out (cu_new[B], Eo or
     * H*dv): no padding row is computed or stored, and the element counts are those rows'. valid must then be NULL
     * (the offsets give each sequence's count; a sequence may bring none). new_tokens: the most new tokens any
     * sequence brings (each count at most new_tokens), or 0 for the longest of them; a step in which no sequence
     * brings a token changes nothing. tree_mask keeps its (B, new_tokens, new_tokens) layout; its rows past a
     * sequence's count are no token's, neither read nor checked. */
    const uint32_t *cu_new;
    size_t cu_new_count;
    /* clattn 0.8, desc.rope only (else refused), optional: each new token's position for the rotation, one per row
     * of x (B*n for a padded step, the padding rows' read but unused; cu_new[B] for a packed one), each at most
     * CLATTN_ROPE_MAX_POSITION. NULL: token t of sequence b at len[b] + t, its cache slot. A key is rotated once, at
     * its position, before it is cached, so a query sees each cached key at the position its step gave it: a cache
     * whose sequence starts at position p0 (the rest of a conversation kept elsewhere, keys written by
     * clattn_kv_cache_write rotated for their positions) gives p0 + len[b] + t at each of its steps; positions that
     * are not the slots' (transformers' position_ids in generate) likewise. The plan's table of cos and sin grows to
     * the largest position given, rounded up to a power of two */
    const uint32_t *rope_positions;
    size_t rope_positions_count;
} clattn_decode_args;

/* Appends and attends; on any error the cache and out are unchanged. A sequence whose length plus its
 * new tokens would exceed the cache's capacity is refused (CLATTN_STATUS_SHAPE_MISMATCH). */
CLATTN_API clattn_status clattn_decode_execute(clattn_decode_plan *plan, clattn_kv_cache *cache,
                                               const clattn_decode_args *args);

/* A decode step on device buffers (OpenCL devices only), as clattn_decode_execute: x (B, n, E) and out
 * (B, n, Eo or H*dv) are the caller's cl_mem with element offsets; valid (optional, B host entries) as
 * args.valid. Enqueued on the device's queue after the wait list; `event` (optional) completes when out
 * and the cache are written. Checks are made before anything is enqueued (sizes, the cache's capacity,
 * out sharing memory with x: refused), and the cache's lengths advance when the step is enqueued: the next
 * step, enqueued on the same queue, sees them. An error leaves the lengths unchanged. */
typedef struct clattn_decode_buffers {
    clattn_buffer x, out;
    clattn_buffer kv, value;   /* clattn 0.6, desc.separate_value only: as args.kv and args.value */
    /* clattn 0.8, desc.rope only: as args.rope_positions (a host array, read during the call) */
    const uint32_t *rope_positions;
    size_t rope_positions_count;
} clattn_decode_buffers;
CLATTN_API clattn_status clattn_decode_execute_buffers(clattn_decode_plan *plan, clattn_kv_cache *cache,
                                                       const clattn_decode_buffers *buffers, size_t new_tokens,
                                                       const size_t *valid, cl_uint num_events_in_wait_list,
                                                       const cl_event *event_wait_list, cl_event *event);
/* clattn 0.8: the same with packed new tokens (as clattn_decode_args.cu_new, a host array of cu_new_count = B+1
 * offsets read during the call): x (cu_new[B], E), out (cu_new[B], Eo or H*dv), kv and value likewise. */
CLATTN_API clattn_status clattn_decode_execute_buffers_varlen(clattn_decode_plan *plan, clattn_kv_cache *cache,
                                                              const clattn_decode_buffers *buffers, size_t new_tokens,
                                                              const uint32_t *cu_new, size_t cu_new_count,
                                                              cl_uint num_events_in_wait_list,
                                                              const cl_event *event_wait_list, cl_event *event);

/* Stage times of a decode step (OpenCL plans, on a queue with CL_QUEUE_PROFILING_ENABLE; ref refuses):
 * while profiling is on, each step records device timestamps between its stages, and
 * clattn_decode_plan_stage_times gives the last step's time per stage in ms (waiting for it when the
 * step ran on buffers; 0 for a stage that did not run: COMBINE without split-K, the projections of a
 * plan without weights). */
typedef enum clattn_decode_stage {
    CLATTN_DECODE_STAGE_PROJECTION = 0, /* x -> Q|K|V rows */
    CLATTN_DECODE_STAGE_APPEND,         /* the new keys and values into the cache */
    CLATTN_DECODE_STAGE_ATTEND,         /* the decode core over the cache */
    CLATTN_DECODE_STAGE_COMBINE,        /* the merge of split-K parts */
    CLATTN_DECODE_STAGE_OUT_PROJECTION,
    CLATTN_DECODE_STAGE_COUNT
} clattn_decode_stage;
CLATTN_API const char *clattn_decode_stage_name(clattn_decode_stage stage); /* "projection", ... */
CLATTN_API clattn_status clattn_decode_plan_set_profiling(clattn_decode_plan *plan, int enable);
CLATTN_API clattn_status clattn_decode_plan_stage_times(clattn_decode_plan *plan,
                                                        double ms[CLATTN_DECODE_STAGE_COUNT]);

/* Split-K: 0 = choose from the cache length, kv_heads and the device's compute units (default);
 * N = 1 .. 64: N parts (fewer only for calls with more new tokens than the partial buffers hold;
 * 1 = never split). For tests and benchmarks. */
CLATTN_API clattn_status clattn_decode_plan_set_splits(clattn_decode_plan *plan, size_t max_parts);
/* The number of parts the last execution used (1 = no split; ref: 1). */
CLATTN_API size_t clattn_decode_plan_last_splits(const clattn_decode_plan *plan);
/* The decode core the plan runs ("ref" on the ref device). */
CLATTN_API const char *clattn_decode_plan_core(const clattn_decode_plan *plan);
/* The GEMM core of its projections above a few rows ("ref" on the ref device). */
CLATTN_API const char *clattn_decode_plan_gemm(const clattn_decode_plan *plan);

/* ---------------------------------------------------------------- profiling */

typedef enum clattn_stage {
    CLATTN_STAGE_QKV_PROJECTION = 0,
    CLATTN_STAGE_HEAD_SPLIT,
    CLATTN_STAGE_SCORES,
    CLATTN_STAGE_SOFTMAX,     /* scale + mask + softmax (+ dropout) */
    CLATTN_STAGE_CONTEXT,
    CLATTN_STAGE_HEAD_MERGE,
    CLATTN_STAGE_OUT_PROJECTION,
    CLATTN_STAGE_COUNT,       /* 7: the stages of clattn 0.1, the length of clattn_plan_stage_times' array */
    CLATTN_STAGE_ATTENTION = CLATTN_STAGE_COUNT /* the fused core (scores + softmax + context in one kernel) */
} clattn_stage;
/* New stages are appended after CLATTN_STAGE_ATTENTION; clattn_stage_count() says how many this
 * library knows, and clattn_plan_stage_times_n reads them all. */

CLATTN_API const char *clattn_stage_name(clattn_stage stage);
CLATTN_API size_t clattn_stage_count(void);

/* Turn per-stage timing on or off (OpenCL plans; off by default). While on,
 * each execution records device timestamps between stages, and
 * clattn_plan_stage_times_n fills ms[0 .. n-1] (n at most clattn_stage_count())
 * with the last execution's device time per stage (0 for a stage that did not run:
 * a fused plan reports ATTENTION where an unfused one reports HEAD_SPLIT, SCORES,
 * SOFTMAX, CONTEXT and HEAD_MERGE). On ref it reports host wall time per stage.
 * clattn_plan_stage_times fills the first CLATTN_STAGE_COUNT (7) entries only.
 * Enabling it is CLATTN_STATUS_UNSUPPORTED, with the reason, on a queue without
 * CL_QUEUE_PROFILING_ENABLE and on a device whose timestamps the probes found not
 * real (Mesa 22's rusticl reports 0, 1, 2, 3 ns for every event; clattn_device_facts). */
CLATTN_API clattn_status clattn_plan_set_profiling(clattn_plan *plan, int enable);
CLATTN_API clattn_status clattn_plan_stage_times(const clattn_plan *plan, double ms[CLATTN_STAGE_COUNT]);
CLATTN_API clattn_status clattn_plan_stage_times_n(const clattn_plan *plan, double *ms, size_t n);

/* ---------------------------------------------------------------- encoder layer */

/* A transformer encoder layer (torch.nn.TransformerEncoderLayer, batch_first,
 * eval mode): self-attention, residual + LayerNorm, feed-forward
 * (Linear -> activation -> Linear), residual + LayerNorm.
 *   post-norm (default): y = LN1(x + Attn(x));  out = LN2(y + FF(y))
 *   pre-norm (norm_first): y = x + Attn(LN1(x)); out = y + FF(LN2(y)) */
typedef enum clattn_activation {
    CLATTN_ACTIVATION_RELU = 0,
    CLATTN_ACTIVATION_GELU = 1   /* erf form, as PyTorch's default */
} clattn_activation;

typedef struct clattn_encoder_desc {
    clattn_attention_desc attn;  /* self-attention (cross = 0); out_dim = embed (w_out required);
                                    causal and key_padding_mask pass through; attn.dropout must be 0 */
    size_t ff_dim;               /* F: hidden width of the feed-forward network */
    clattn_activation activation;
    int norm_first;              /* 1: pre-norm (GPT style) */
    float eps;                   /* LayerNorm epsilon, 0 = 1e-5 */
} clattn_encoder_desc;

typedef struct clattn_encoder_weights {
    clattn_attention_weights attn;             /* in attn.layout; w_out (E, H*dv) required */
    /* every array in desc.attn.dtype's elements (clattn 0.7: void *; float for F32) */
    const void *ln1_weight, *ln1_bias;         /* (E) */
    const void *w_ff1, *b_ff1;                 /* (F, E) in attn.layout's convention, (F) */
    const void *w_ff2, *b_ff2;                 /* (E, F), (E) */
    const void *ln2_weight, *ln2_bias;         /* (E) */
    size_t ln1_weight_count, ln1_bias_count, w_ff1_count, b_ff1_count; /* element counts (clattn 0.4), */
    size_t w_ff2_count, b_ff2_count, ln2_weight_count, ln2_bias_count; /* checked as the attention's */
} clattn_encoder_weights;

typedef struct clattn_encoder_plan clattn_encoder_plan;

CLATTN_API clattn_status clattn_encoder_plan_create(clattn_device *device, const clattn_encoder_desc *desc,
                                                    const clattn_encoder_weights *weights,
                                                    clattn_encoder_plan **plan);
CLATTN_API void clattn_encoder_plan_free(clattn_encoder_plan *plan);

typedef struct clattn_encoder_args {
    const void *x;                    /* (B, T, E), in desc.attn.dtype's elements (clattn 0.7: void *) */
    const uint8_t *key_padding_mask;  /* (B, T), when desc.attn.key_padding_mask */
    void *out;                        /* (B, T, E), in desc.attn.dtype's elements */
    size_t x_count, key_padding_mask_count, out_count; /* element counts (clattn 0.4) */
} clattn_encoder_args;

CLATTN_API clattn_status clattn_encoder_plan_execute(clattn_encoder_plan *plan, const clattn_encoder_args *args);

typedef struct clattn_encoder_buffers {
    clattn_buffer x, key_padding_mask, out;
} clattn_encoder_buffers;

CLATTN_API clattn_status clattn_encoder_plan_execute_buffers(clattn_encoder_plan *plan,
                                                             const clattn_encoder_buffers *buffers,
                                                             cl_uint num_events_in_wait_list,
                                                             const cl_event *event_wait_list, cl_event *event);
/* The core the layer's self-attention runs ("ref" on the ref device). */
CLATTN_API const char *clattn_encoder_plan_core(const clattn_encoder_plan *plan);
/* The GEMM core of its projections and feed-forward layers ("ref" on the ref device). */
CLATTN_API const char *clattn_encoder_plan_gemm(const clattn_encoder_plan *plan);

#ifdef __cplusplus
}
#endif
#endif /* CLATTN_H */
