/* status.c: status names, and the per-thread detail of the last failure. */
#include "runtime.h"

#include <stdio.h>
#include <string.h>

static _Thread_local char last_error[1024];
static _Thread_local char build_log[16384];
static _Thread_local char notice[1024];

clattn_status clattn_fail(clattn_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return status;
}

void clattn_clear_error(void) { last_error[0] = '\0'; }

void clattn_set_build_log(const char *log)
{
    snprintf(build_log, sizeof build_log, "%s", log ? log : "");
}

const char *clattn_last_error(void) { return last_error; }

void clattn_set_notice(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(notice, sizeof notice, fmt, ap);
    va_end(ap);
}

const char *clattn_last_notice(void) { return notice; }
const char *clattn_last_build_log(void) { return build_log; }

static const char *opencl_name(int s)
{
    switch (s) {
    case -1: return "CL_DEVICE_NOT_FOUND";
    case -2: return "CL_DEVICE_NOT_AVAILABLE";
    case -3: return "CL_COMPILER_NOT_AVAILABLE";
    case -4: return "CL_MEM_OBJECT_ALLOCATION_FAILURE";
    case -5: return "CL_OUT_OF_RESOURCES";
    case -6: return "CL_OUT_OF_HOST_MEMORY";
    case -7: return "CL_PROFILING_INFO_NOT_AVAILABLE";
    case -8: return "CL_MEM_COPY_OVERLAP";
    case -9: return "CL_IMAGE_FORMAT_MISMATCH";
    case -10: return "CL_IMAGE_FORMAT_NOT_SUPPORTED";
    case -11: return "CL_BUILD_PROGRAM_FAILURE";
    case -12: return "CL_MAP_FAILURE";
    case -13: return "CL_MISALIGNED_SUB_BUFFER_OFFSET";
    case -14: return "CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST";
    case -15: return "CL_COMPILE_PROGRAM_FAILURE";
    case -16: return "CL_LINKER_NOT_AVAILABLE";
    case -17: return "CL_LINK_PROGRAM_FAILURE";
    case -18: return "CL_DEVICE_PARTITION_FAILED";
    case -19: return "CL_KERNEL_ARG_INFO_NOT_AVAILABLE";
    case -30: return "CL_INVALID_VALUE";
    case -31: return "CL_INVALID_DEVICE_TYPE";
    case -32: return "CL_INVALID_PLATFORM";
    case -33: return "CL_INVALID_DEVICE";
    case -34: return "CL_INVALID_CONTEXT";
    case -35: return "CL_INVALID_QUEUE_PROPERTIES";
    case -36: return "CL_INVALID_COMMAND_QUEUE";
    case -37: return "CL_INVALID_HOST_PTR";
    case -38: return "CL_INVALID_MEM_OBJECT";
    case -39: return "CL_INVALID_IMAGE_FORMAT_DESCRIPTOR";
    case -40: return "CL_INVALID_IMAGE_SIZE";
    case -41: return "CL_INVALID_SAMPLER";
    case -42: return "CL_INVALID_BINARY";
    case -43: return "CL_INVALID_BUILD_OPTIONS";
    case -44: return "CL_INVALID_PROGRAM";
    case -45: return "CL_INVALID_PROGRAM_EXECUTABLE";
    case -46: return "CL_INVALID_KERNEL_NAME";
    case -47: return "CL_INVALID_KERNEL_DEFINITION";
    case -48: return "CL_INVALID_KERNEL";
    case -49: return "CL_INVALID_ARG_INDEX";
    case -50: return "CL_INVALID_ARG_VALUE";
    case -51: return "CL_INVALID_ARG_SIZE";
    case -52: return "CL_INVALID_KERNEL_ARGS";
    case -53: return "CL_INVALID_WORK_DIMENSION";
    case -54: return "CL_INVALID_WORK_GROUP_SIZE";
    case -55: return "CL_INVALID_WORK_ITEM_SIZE";
    case -56: return "CL_INVALID_GLOBAL_OFFSET";
    case -57: return "CL_INVALID_EVENT_WAIT_LIST";
    case -58: return "CL_INVALID_EVENT";
    case -59: return "CL_INVALID_OPERATION";
    case -60: return "CL_INVALID_GL_OBJECT";
    case -61: return "CL_INVALID_BUFFER_SIZE";
    case -62: return "CL_INVALID_MIP_LEVEL";
    case -63: return "CL_INVALID_GLOBAL_WORK_SIZE";
    case -64: return "CL_INVALID_PROPERTY";
    case -65: return "CL_INVALID_IMAGE_DESCRIPTOR";
    case -66: return "CL_INVALID_COMPILER_OPTIONS";
    case -67: return "CL_INVALID_LINKER_OPTIONS";
    case -68: return "CL_INVALID_DEVICE_PARTITION_COUNT";
    case -69: return "CL_INVALID_PIPE_SIZE";
    case -70: return "CL_INVALID_DEVICE_QUEUE";
    case -1001: return "CL_PLATFORM_NOT_FOUND_KHR (no OpenCL platform installed)";
    default: return NULL;
    }
}

static const char *clblast_name(int s)
{
    switch (s) {
    case -1024: return "CLBlast: routine or functionality not implemented";
    case -1022: return "CLBlast: matrix A is not a valid OpenCL buffer";
    case -1021: return "CLBlast: matrix B is not a valid OpenCL buffer";
    case -1020: return "CLBlast: matrix C is not a valid OpenCL buffer";
    case -1019: return "CLBlast: vector X is not a valid OpenCL buffer";
    case -1018: return "CLBlast: vector Y is not a valid OpenCL buffer";
    case -1017: return "CLBlast: op(A) dimensions are zero or invalid";
    case -1016: return "CLBlast: leading dimension of A is smaller than the matrix's first dimension";
    case -1015: return "CLBlast: leading dimension of B is smaller than the matrix's first dimension";
    case -1014: return "CLBlast: leading dimension of C is smaller than the matrix's first dimension";
    case -1013: return "CLBlast: increment of vector X cannot be zero";
    case -1012: return "CLBlast: increment of vector Y cannot be zero";
    case -1011: return "CLBlast: matrix A's OpenCL buffer is too small";
    case -1010: return "CLBlast: matrix B's OpenCL buffer is too small";
    case -1009: return "CLBlast: matrix C's OpenCL buffer is too small";
    case -1008: return "CLBlast: vector X's OpenCL buffer is too small";
    case -1007: return "CLBlast: vector Y's OpenCL buffer is too small";
    case -2050: return "CLBlast: temporary buffer too small";
    case -2049: return "CLBlast: invalid batch count";
    case -2048: return "CLBlast: invalid override kernel";
    case -2047: return "CLBlast: missing override parameter";
    case -2046: return "CLBlast: invalid local memory usage";
    case -2045: return "CLBlast: half precision not supported by the device";
    case -2044: return "CLBlast: double precision not supported by the device";
    case -2043: return "CLBlast: unit-sized vector is not a valid OpenCL buffer";
    case -2042: return "CLBlast: unit-sized vector's OpenCL buffer is too small";
    case -2041: return "CLBlast: no database entry for the device";
    case -2040: return "CLBlast: unknown error";
    case -2039: return "CLBlast: unexpected error";
    default: return NULL;
    }
}

const char *clattn_status_string(int status)
{
    switch (status) {
    case CLATTN_STATUS_SUCCESS: return "success";
    case CLATTN_STATUS_INVALID_ARGUMENT: return "clattn: invalid argument";
    case CLATTN_STATUS_SHAPE_MISMATCH: return "clattn: shape mismatch";
    case CLATTN_STATUS_SIZE_OVERFLOW: return "clattn: size overflow";
    case CLATTN_STATUS_TOO_LARGE_FOR_DEVICE: return "clattn: too large for the device";
    case CLATTN_STATUS_OUT_OF_HOST_MEMORY: return "clattn: out of host memory";
    case CLATTN_STATUS_DEVICE_ALLOCATION: return "clattn: device allocation failed";
    case CLATTN_STATUS_BUILD_FAILURE: return "clattn: kernel build failed (see clattn_last_build_log)";
    case CLATTN_STATUS_UNSUPPORTED: return "clattn: unsupported on this device";
    case CLATTN_STATUS_NO_DEVICE: return "clattn: no device matches the spec";
    case CLATTN_STATUS_INVALID_DEVICE_SPEC: return "clattn: invalid device spec";
    default: break;
    }
    const char *s = opencl_name(status);
    if (!s) s = clblast_name(status);
    if (s) return s;
    if (status < 0 && status > -1007) return "OpenCL error (unknown code)";
    if (status <= -1007 && status >= -2050) return "CLBlast error (unknown code)";
    return "unknown status";
}
