"""ctypes view of libclattn's public C ABI (include/clattn.h). Layouts mirror the header
field by field; python/tests/test_clattn.py checks the sizes and offsets against a C compiler's."""
import ctypes
import os
from ctypes import POINTER, Structure, c_char, c_char_p, c_float, c_int, c_size_t, c_uint, c_uint8
from ctypes import c_uint64, c_void_p

c_float_p = POINTER(c_float)
c_uint8_p = POINTER(c_uint8)

STATUS_NAMES = {
    0: "CLATTN_STATUS_SUCCESS",
    -3001: "CLATTN_STATUS_INVALID_ARGUMENT",
    -3002: "CLATTN_STATUS_SHAPE_MISMATCH",
    -3003: "CLATTN_STATUS_SIZE_OVERFLOW",
    -3004: "CLATTN_STATUS_TOO_LARGE_FOR_DEVICE",
    -3005: "CLATTN_STATUS_OUT_OF_HOST_MEMORY",
    -3006: "CLATTN_STATUS_DEVICE_ALLOCATION",
    -3007: "CLATTN_STATUS_BUILD_FAILURE",
    -3008: "CLATTN_STATUS_UNSUPPORTED",
    -3009: "CLATTN_STATUS_NO_DEVICE",
    -3010: "CLATTN_STATUS_INVALID_DEVICE_SPEC",
}
INVALID_ARGUMENT, SHAPE_MISMATCH, BUILD_FAILURE = -3001, -3002, -3007

BACKEND_REF, BACKEND_OPENCL = 0, 1
MASK_NONE, MASK_BOOL, MASK_FLOAT = 0, 1, 2
DTYPE_F32, DTYPE_F16, DTYPE_BF16 = 0, 1, 2  # clattn_dtype
LAYOUT_LINEAR, LAYOUT_RAW = 0, 1
ALGORITHMS = {"auto": 0, "fused": 1, "unfused": 2}
PRECISIONS = {"fp32": 0, "tf32": 1}
ACTIVATIONS = {"relu": 0, "gelu": 1}


class DeviceInfo(Structure):
    _fields_ = [("selector", c_char * 32), ("platform", c_char * 128), ("name", c_char * 128),
                ("type", c_char * 16), ("compute_units", c_uint), ("global_mem_bytes", c_uint64),
                ("max_alloc_bytes", c_uint64), ("opencl_c_version", c_char * 64), ("fp16", c_int),
                ("fp64", c_int)]


class CoreInfo(Structure):
    _fields_ = [("name", c_char * 32), ("kind", c_int), ("algorithm", c_int), ("produces_weights", c_int),
                ("supported", c_int), ("reason", c_char * 256), ("default_for", c_uint), ("params", c_char * 128),
                ("test_configs", c_char * 128), ("emulated", c_int), ("reads_dtypes", c_int)]


class SelftestResult(Structure):
    _fields_ = [("core", c_char * 32), ("kind", c_int), ("cases", c_size_t), ("refused", c_size_t),
                ("worst_error", ctypes.c_double), ("worst_ratio", ctypes.c_double), ("verdict", c_int),
                ("detail", c_char * 300)]


VERDICTS = {0: "pass", 1: "fail", 2: "not run", 3: "error"}
CORE_KINDS = {0: "prefill", 1: "decode", 2: "gemm", 3: "backward"}
CORE_GEMM = 2
HEAD_CLASS_COUNT = 5


class Rope(Structure):
    _fields_ = [("kind", c_int), ("dims", c_size_t), ("theta", ctypes.c_double), ("scaling", c_int),
                ("factor", ctypes.c_double), ("original_max_position", c_size_t)]


ROPE_KINDS = {"half": 1, "interleaved": 2}
ROPE_SCALINGS = {None: 0, "linear": 1, "ntk": 2, "yarn": 3}


class AttentionDesc(Structure):
    _fields_ = [("batch", c_size_t), ("seq_q", c_size_t), ("seq_kv", c_size_t), ("embed", c_size_t),
                ("kv_embed", c_size_t), ("heads", c_size_t), ("head_dim_qk", c_size_t),
                ("head_dim_v", c_size_t), ("out_dim", c_size_t), ("cross", c_int), ("causal", c_int),
                ("attn_mask", c_int), ("key_padding_mask", c_int), ("scale", c_float), ("dropout", c_float),
                ("seed", c_uint64), ("layout", c_int), ("algorithm", c_int), ("need_weights", c_int),
                ("kv_heads", c_size_t), ("window", c_size_t), ("kv_half", c_int),
                ("precision", c_int), ("training", c_int), ("separate_value", c_int),
                ("attn_mask_per_batch", c_int), ("attn_mask_per_head", c_int), ("dtype", c_int),
                ("kv_page_size", c_size_t), ("varlen", c_int), ("rope", Rope), ("sinks", c_int)]


WEIGHT_NAMES = ("w_query", "w_key", "w_value", "b_query", "b_key", "b_value", "w_out", "b_out")


class AttentionWeights(Structure):
    _fields_ = [(n, c_float_p) for n in WEIGHT_NAMES] + [(n + "_count", c_size_t) for n in WEIGHT_NAMES] + [
        ("sinks", c_float_p), ("sinks_count", c_size_t)]


class AttentionArgs(Structure):
    _fields_ = [("x", c_float_p), ("kv", c_float_p), ("key_padding_mask", c_uint8_p), ("attn_mask", c_void_p),
                ("out", c_float_p), ("attn", c_float_p)] + [
        (n + "_count", c_size_t) for n in ("x", "kv", "key_padding_mask", "attn_mask", "out", "attn")] + [
        ("lse", c_float_p), ("context", c_float_p), ("lse_count", c_size_t), ("context_count", c_size_t),
        ("value", c_float_p), ("value_count", c_size_t),
        ("cu_seqlens_q", ctypes.POINTER(ctypes.c_uint32)), ("cu_seqlens_kv", ctypes.POINTER(ctypes.c_uint32)),
        ("cu_seqlens_q_count", c_size_t), ("cu_seqlens_kv_count", c_size_t),
        ("rope_positions", ctypes.POINTER(ctypes.c_uint32)), ("rope_positions_kv", ctypes.POINTER(ctypes.c_uint32)),
        ("rope_positions_count", c_size_t), ("rope_positions_kv_count", c_size_t)]


GRAD_NAMES = ("x", "kv") + WEIGHT_NAMES  # the differentiable inputs, in clattn_attention_grads' order


class AttentionGrads(Structure):
    _fields_ = [("grad_out", c_float_p), ("lse", c_float_p), ("context", c_float_p)] + [
        ("grad_" + n, c_float_p) for n in GRAD_NAMES] + [
        (n + "_count", c_size_t) for n in ("grad_out", "lse", "context") + tuple("grad_" + n for n in GRAD_NAMES)] + [
        ("grad_value", c_float_p), ("grad_value_count", c_size_t)]


class EncoderDesc(Structure):
    _fields_ = [("attn", AttentionDesc), ("ff_dim", c_size_t), ("activation", c_int), ("norm_first", c_int),
                ("eps", c_float)]


ENCODER_WEIGHT_NAMES = ("ln1_weight", "ln1_bias", "w_ff1", "b_ff1", "w_ff2", "b_ff2", "ln2_weight", "ln2_bias")


class EncoderWeights(Structure):
    _fields_ = [("attn", AttentionWeights)] + [(n, c_float_p) for n in ENCODER_WEIGHT_NAMES] + [
        (n + "_count", c_size_t) for n in ENCODER_WEIGHT_NAMES]


class EncoderArgs(Structure):
    _fields_ = [("x", c_float_p), ("key_padding_mask", c_uint8_p), ("out", c_float_p)] + [
        (n + "_count", c_size_t) for n in ("x", "key_padding_mask", "out")]


class KVCacheDesc(Structure):
    _fields_ = [("batch", c_size_t), ("capacity", c_size_t), ("kv_heads", c_size_t), ("head_dim_qk", c_size_t),
                ("head_dim_v", c_size_t), ("type", c_int), ("page_size", c_size_t), ("pages", c_size_t)]


class DecodeArgs(Structure):
    _fields_ = [("x", c_float_p), ("new_tokens", c_size_t), ("valid", POINTER(c_size_t)), ("out", c_float_p),
                ("x_count", c_size_t), ("valid_count", c_size_t), ("out_count", c_size_t),
                ("kv", c_float_p), ("value", c_float_p), ("kv_count", c_size_t), ("value_count", c_size_t),
                ("tree_mask", POINTER(ctypes.c_uint8)), ("tree_mask_count", c_size_t),  # clattn 0.8
                ("cu_new", POINTER(ctypes.c_uint32)), ("cu_new_count", c_size_t),  # clattn 0.8
                ("rope_positions", POINTER(ctypes.c_uint32)), ("rope_positions_count", c_size_t)]  # clattn 0.8


def _load():
    here = os.path.dirname(os.path.abspath(__file__))
    candidates = [os.environ.get("CLATTN_LIBRARY"), os.path.join(here, "libclattn.so"),
                  os.path.join(here, "libclattn.dylib"), os.path.join(here, "clattn.dll")]
    errors = []
    for path in candidates:
        if path and os.path.exists(path):
            try:
                return ctypes.CDLL(path)
            except OSError as e:  # a library that does not load: say why, try the next
                errors.append(f"{path}: {e}")
    raise ImportError("clattn: libclattn was not found next to the package (reinstall with "
                      "`pip install ./python`, or set CLATTN_LIBRARY)" + ("; " + "; ".join(errors) if errors else ""))


lib = _load()


def _fn(name, restype, *argtypes):
    f = getattr(lib, name)
    f.restype = restype
    f.argtypes = list(argtypes)
    return f


version = _fn("clattn_version", c_char_p)
status_string = _fn("clattn_status_string", c_char_p, c_int)
last_error = _fn("clattn_last_error", c_char_p)
last_notice = _fn("clattn_last_notice", c_char_p)
last_build_log = _fn("clattn_last_build_log", c_char_p)
device_list = _fn("clattn_device_list", c_int, POINTER(DeviceInfo), c_size_t, POINTER(c_size_t))
device_open = _fn("clattn_device_open", c_int, c_char_p, POINTER(c_void_p))
device_free = _fn("clattn_device_free", None, c_void_p)
dtype_convert = _fn("clattn_dtype_convert", c_int, c_void_p, c_int, c_void_p, c_int, c_size_t)
device_backend = _fn("clattn_device_backend", c_int, c_void_p)
device_name = _fn("clattn_device_name", c_char_p, c_void_p)
device_facts = _fn("clattn_device_facts", c_char_p, c_void_p)
core_count = _fn("clattn_core_count", c_size_t)
device_selftest = _fn("clattn_device_selftest", c_int, c_void_p, c_int, POINTER(SelftestResult), c_size_t,
                      POINTER(c_size_t))
core_describe = _fn("clattn_core_describe", c_int, c_void_p, c_size_t, POINTER(CoreInfo))
head_class_label = _fn("clattn_head_class_label", c_char_p, c_int)
plan_core = _fn("clattn_plan_core", c_char_p, c_void_p)
plan_core_params = _fn("clattn_plan_core_params", c_char_p, c_void_p)
plan_backward_core = _fn("clattn_plan_backward_core", c_char_p, c_void_p)
plan_backward_core_params = _fn("clattn_plan_backward_core_params", c_char_p, c_void_p)
decode_plan_core = _fn("clattn_decode_plan_core", c_char_p, c_void_p)
plan_gemm = _fn("clattn_plan_gemm", c_char_p, c_void_p)
decode_plan_gemm = _fn("clattn_decode_plan_gemm", c_char_p, c_void_p)
encoder_plan_gemm = _fn("clattn_encoder_plan_gemm", c_char_p, c_void_p)
plan_create = _fn("clattn_plan_create", c_int, c_void_p, POINTER(AttentionDesc), POINTER(AttentionWeights),
                  POINTER(c_void_p))
plan_free = _fn("clattn_plan_free", None, c_void_p)
plan_execute = _fn("clattn_plan_execute", c_int, c_void_p, POINTER(AttentionArgs))
plan_backward = _fn("clattn_plan_backward", c_int, c_void_p, POINTER(AttentionArgs), POINTER(AttentionGrads))
plan_algorithm = _fn("clattn_plan_algorithm", c_int, c_void_p)
plan_out_width = _fn("clattn_plan_out_width", c_size_t, c_void_p)
plan_desc = _fn("clattn_plan_desc", c_int, c_void_p, POINTER(AttentionDesc))
plan_set_seed = _fn("clattn_plan_set_seed", c_int, c_void_p, c_uint64)
plan_set_weights = _fn("clattn_plan_set_weights", c_int, c_void_p, POINTER(AttentionWeights))
encoder_plan_create = _fn("clattn_encoder_plan_create", c_int, c_void_p, POINTER(EncoderDesc),
                          POINTER(EncoderWeights), POINTER(c_void_p))
encoder_plan_free = _fn("clattn_encoder_plan_free", None, c_void_p)
encoder_plan_execute = _fn("clattn_encoder_plan_execute", c_int, c_void_p, POINTER(EncoderArgs))
kv_cache_create = _fn("clattn_kv_cache_create", c_int, c_void_p, POINTER(KVCacheDesc), POINTER(c_void_p))
kv_cache_free = _fn("clattn_kv_cache_free", None, c_void_p)
kv_cache_reset = _fn("clattn_kv_cache_reset", c_int, c_void_p)
kv_cache_truncate = _fn("clattn_kv_cache_truncate", c_int, c_void_p, POINTER(c_size_t))
kv_cache_lengths = _fn("clattn_kv_cache_lengths", c_int, c_void_p, POINTER(c_size_t))
kv_cache_share = _fn("clattn_kv_cache_share", c_int, c_void_p, c_size_t, c_size_t, c_size_t)
kv_cache_pages = _fn("clattn_kv_cache_pages", c_int, c_void_p, c_size_t, POINTER(c_size_t), POINTER(c_size_t),
                     POINTER(c_size_t))
kv_cache_accept = _fn("clattn_kv_cache_accept", c_int, c_void_p, POINTER(c_size_t), POINTER(c_size_t),
                      POINTER(c_size_t), c_size_t)
kv_cache_read = _fn("clattn_kv_cache_read", c_int, c_void_p, c_float_p, c_float_p)
kv_cache_write = _fn("clattn_kv_cache_write", c_int, c_void_p, c_float_p, c_float_p, POINTER(c_size_t))
decode_plan_create = _fn("clattn_decode_plan_create", c_int, c_void_p, POINTER(AttentionDesc),
                         POINTER(AttentionWeights), POINTER(c_void_p))
decode_plan_free = _fn("clattn_decode_plan_free", None, c_void_p)
decode_execute = _fn("clattn_decode_execute", c_int, c_void_p, c_void_p, POINTER(DecodeArgs))
decode_plan_set_splits = _fn("clattn_decode_plan_set_splits", c_int, c_void_p, c_size_t)
BuildNoticeFn = ctypes.CFUNCTYPE(None, c_char_p, c_void_p)
set_build_notice = _fn("clattn_set_build_notice", None, BuildNoticeFn, c_void_p)
kernel_cache_notice = _fn("clattn_kernel_cache_notice", c_char_p)
encoder_plan_core = _fn("clattn_encoder_plan_core", c_char_p, c_void_p)
