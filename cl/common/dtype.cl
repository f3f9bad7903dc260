/* dtype.cl: the element types of a half-precision plan's arrays (desc.dtype), read and written by the kernels that
 * take them as they are (the boundary's dtype_widen / dtype_narrow, cl/attention/linear.cl; cores with reads_dtypes).
 * common/half.cl goes first. Half stays behind pointers: vload_half / vstore_half_rte are core OpenCL 1.2 (no
 * cl_khr_fp16). bfloat16 is a ushort, the upper 16 bits of a float: widened by a shift (exact), narrowed to nearest
 * even on the bits (half.cl's clattn_bf16).
 *   IO_DTYPE   0: float (default), 1: IEEE half, 2: bfloat16: io_t, and IO_LOAD / IO_STORE of one element */
#ifndef CLATTN_DTYPE_CL
#define CLATTN_DTYPE_CL

#ifndef IO_DTYPE
#define IO_DTYPE 0
#endif

inline ushort4 clattn_bf16_4(float4 f)
{
    return (ushort4)(clattn_bf16(f.s0), clattn_bf16(f.s1), clattn_bf16(f.s2), clattn_bf16(f.s3));
}
inline ushort8 clattn_bf16_8(float8 f) { return (ushort8)(clattn_bf16_4(f.lo), clattn_bf16_4(f.hi)); }

#if IO_DTYPE == 1
typedef half io_t;
#define IO_LOAD(i, p) vload_half((i), (p))
#define IO_STORE(x, i, p) vstore_half_rte((x), (i), (p))
#elif IO_DTYPE == 2
typedef ushort io_t;
#define IO_LOAD(i, p) clattn_bf16_value((p)[(i)])
#define IO_STORE(x, i, p) ((p)[(i)] = clattn_bf16((x)))
#else
typedef float io_t;
#define IO_LOAD(i, p) ((p)[(i)])
#define IO_STORE(x, i, p) ((p)[(i)] = (x))
#endif

/* VW-wide loads of io_t widened to float (a vector of VW floats, or one float where VW is not 4 or 8), and stores
 * rounded once: the vector width is the including core's -D VW (flash_rows, flash_gemm); 1 where none is given */
#if defined(VW) && (VW == 4 || VW == 8)
#if IO_DTYPE == 1 && VW == 8
#define IO_LOADW(i, p) vload_half8((i), (p))
#define IO_STOREW(x, i, p) vstore_half8_rte((x), (i), (p))
#elif IO_DTYPE == 1
#define IO_LOADW(i, p) vload_half4((i), (p))
#define IO_STOREW(x, i, p) vstore_half4_rte((x), (i), (p))
#elif IO_DTYPE == 2 && VW == 8
#define IO_LOADW(i, p) as_float8(convert_uint8(vload8((i), (p))) << 16)
#define IO_STOREW(x, i, p) vstore8(clattn_bf16_8(x), (i), (p))
#elif IO_DTYPE == 2
#define IO_LOADW(i, p) as_float4(convert_uint4(vload4((i), (p))) << 16)
#define IO_STOREW(x, i, p) vstore4(clattn_bf16_4(x), (i), (p))
#elif VW == 8
#define IO_LOADW(i, p) vload8((i), (p))
#define IO_STOREW(x, i, p) vstore8((x), (i), (p))
#else
#define IO_LOADW(i, p) vload4((i), (p))
#define IO_STOREW(x, i, p) vstore4((x), (i), (p))
#endif
#else
#define IO_LOADW(i, p) IO_LOAD((i), (p))
#define IO_STOREW(x, i, p) IO_STORE((x), (i), (p))
#endif

#endif
