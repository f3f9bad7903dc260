"""pytest: the edges of the Python package (issue 21). Every shape checked before the library is called, with
the Python argument named; integers range-checked instead of wrapped by ctypes; torch tensors in and out
(float32 kept, float16/bfloat16 widened and rounded back, float64 refused); nn.MultiheadAttention's forward;
from_torch refusing what it cannot carry over; the plan cache bounded; the build notice; an exception class
per C status; and 1000 random calls in a subprocess that must never crash."""
import ctypes
import gc
import inspect
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import clattn
from clattn import _lib

TOL = dict(rtol=1e-4, atol=1e-5)
HAVE_OPENCL = len(clattn.devices()) > 1
DEVICES = ["ref"] + (["opencl"] if HAVE_OPENCL else [])


def rnd(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def mha_weights(rng, E, Ekv=None, Eo=None, rows=None):
    Ekv, Eo, rows = Ekv or E, Eo or E, rows or E
    return dict(w_query=rnd(rng, rows, E, scale=0.3), w_key=rnd(rng, rows, Ekv, scale=0.3),
                w_value=rnd(rng, rows, Ekv, scale=0.3), w_out=rnd(rng, Eo, rows, scale=0.3))


# ---------------------------------------------------------------- shapes, checked with Python names

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("width", [65, 63, 200000])
def test_input_width_that_is_not_the_modules_is_refused(device, width):
    a = clattn.Attention(4, **mha_weights(np.random.default_rng(0), 64), device=device)
    x = np.zeros((2, 16, width), np.float32)
    with pytest.raises(clattn.ShapeMismatchError) as e:
        a(x)
    assert f"x: last dimension {width}" in e.value.message and "64" in e.value.message
    with pytest.raises(clattn.ShapeMismatchError, match=f"query: last dimension {width}"):
        a.forward(x, x, x)
    assert isinstance(e.value, ValueError) and a.plans_cached == 0  # refused before any plan was made


def test_weights_that_do_not_fit_each_other_are_refused():
    rng = np.random.default_rng(1)
    # w_query (64, 63): the module takes inputs of width 63 for queries but 64 for keys: only cross-attention fits
    a = clattn.Attention(2, w_query=rnd(rng, 64, 63), w_key=rnd(rng, 64, 64), w_value=rnd(rng, 64, 64), device="ref")
    for width in (63, 64):
        with pytest.raises(clattn.ShapeMismatchError, match="x: last dimension"):
            a(np.zeros((1, 3, width), np.float32))
    out, _ = a(np.zeros((1, 3, 63), np.float32), np.zeros((1, 5, 64), np.float32))  # cross: fits
    with pytest.raises(clattn.ShapeMismatchError, match="x: last dimension 62, but w_query takes inputs of width 63"):
        a(np.zeros((1, 3, 62), np.float32), np.zeros((1, 5, 64), np.float32))
    assert out.shape == (1, 3, 64)
    with pytest.raises(clattn.ShapeMismatchError, match="kv: last dimension 63, but w_key and w_value take inputs of width 64"):
        a(np.zeros((1, 3, 63), np.float32), np.zeros((1, 5, 63), np.float32))
    w = mha_weights(rng, 64)
    cases = [
        (dict(heads=5), "w_query: 64 output features do not split into heads=5"),
        (dict(heads=4, head_dim_qk=20), "head_dim_qk: 20, but the weights make it 16"),
        (dict(heads=4, w_key=rnd(rng, 48, 64)), "w_key: 48 output features, expected kv_heads\\*head_dim_qk = 4\\*16"),
        (dict(heads=4, w_value=rnd(rng, 64, 60)), "w_key and w_value take inputs of width 64 and 60"),
        (dict(heads=4, w_out=rnd(rng, 64, 60)), "w_out: takes 60 input features, expected heads\\*head_dim_v"),
        (dict(heads=4, b_query=rnd(rng, 63)), "b_query: 63 values, expected 64"),
        (dict(heads=4, b_out=rnd(rng, 65)), "b_out: 65 values, expected 64"),
        (dict(heads=4, kv_heads=3), "kv_heads: 3 does not divide heads"),
    ]
    for kw, needle in cases:
        args = {**w, **kw}
        heads = args.pop("heads")
        with pytest.raises(clattn.ShapeMismatchError, match=needle):
            clattn.Attention(heads, device="ref", **args)
    with pytest.raises(clattn.InvalidArgumentError, match="b_query without w_query"):
        clattn.Attention(2, b_query=np.zeros(4, np.float32), device="ref")
    with pytest.raises(clattn.InvalidArgumentError, match="b_out without w_out"):
        clattn.Attention(2, b_out=np.zeros(4, np.float32), device="ref")
    with pytest.raises(clattn.InvalidArgumentError, match="head_dim_qk: without w_query"):
        clattn.Attention(2, head_dim_qk=4, device="ref")


def test_masks_and_batches_are_checked_with_their_names():
    a = clattn.Attention(2, device="ref")
    x = np.zeros((2, 4, 6), np.float32)
    for kw, needle in [(dict(key_padding_mask=np.zeros((2, 5), bool)), "key_padding_mask: shape \\(2, 5\\), expected \\(2, 4\\)"),
                       (dict(key_padding_mask=np.zeros((2, 4), np.float32)), "key_padding_mask: dtype float32"),
                       (dict(attn_mask=np.zeros((4, 4, 1), bool)), "attn_mask: shape"),
                       (dict(attn_mask=np.zeros((4, 4), np.complex64)), "attn_mask: dtype complex64")]:
        with pytest.raises(clattn.Error, match=needle):
            a(x, **kw)
    with pytest.raises(clattn.ShapeMismatchError, match="kv: batch 1, but x has batch 2"):
        a(x, np.zeros((1, 4, 6), np.float32))
    with pytest.raises(clattn.ShapeMismatchError, match="x: shape \\(0, 4, 6\\) is empty"):
        a(np.zeros((0, 4, 6), np.float32))
    with pytest.raises(clattn.InvalidArgumentError, match="x: not an array"):
        a([[1.0, 2.0], [3.0]])


# ---------------------------------------------------------------- the C counts, through ctypes

def test_the_library_refuses_weights_of_another_size_naming_both_counts():
    """heads=5, head_dim_qk=16 with 64-row weights: the C plan would read 80 rows; the counts stop it."""
    dev = ctypes.c_void_p()
    assert _lib.device_open(b"ref", ctypes.byref(dev)) == 0
    w64 = np.zeros((64, 64), np.float32)
    p = w64.ctypes.data_as(_lib.c_float_p)
    d = _lib.AttentionDesc(batch=1, seq_q=4, embed=64, heads=5, head_dim_qk=16)
    w = _lib.AttentionWeights(w_query=p, w_key=p, w_value=p, w_query_count=4096, w_key_count=4096,
                              w_value_count=4096)
    plan = ctypes.c_void_p()
    st = _lib.plan_create(dev, ctypes.byref(d), ctypes.byref(w), ctypes.byref(plan))
    msg = _lib.last_error().decode()
    assert st == _lib.SHAPE_MISMATCH and "w_query" in msg and "4096" in msg and "5120" in msg and not plan.value
    # an undeclared mask at execution is refused, not ignored
    d = _lib.AttentionDesc(batch=1, seq_q=4, embed=8, heads=2)
    assert _lib.plan_create(dev, ctypes.byref(d), None, ctypes.byref(plan)) == 0
    x, out = np.zeros((1, 4, 8), np.float32), np.full((1, 4, 8), np.nan, np.float32)
    kpm = np.zeros((1, 4), np.uint8)
    args = _lib.AttentionArgs(x=x.ctypes.data_as(_lib.c_float_p), out=out.ctypes.data_as(_lib.c_float_p),
                              key_padding_mask=kpm.ctypes.data_as(_lib.c_uint8_p), x_count=32, out_count=32,
                              key_padding_mask_count=4)
    st = _lib.plan_execute(plan, ctypes.byref(args))
    assert st == _lib.INVALID_ARGUMENT and "key_padding_mask" in _lib.last_error().decode()
    assert np.isnan(out).all()  # nothing written
    _lib.plan_free(plan)
    _lib.device_free(dev)


# ---------------------------------------------------------------- integers and numbers

def test_integers_are_range_checked_not_wrapped():
    rng = np.random.default_rng(2)
    w = mha_weights(rng, 8)
    for kw, needle in [(dict(window=2 ** 64 + 1, causal=True), "window: 18446744073709551617 is out of range"),
                       (dict(seed=-1), "seed: -1 is out of range"), (dict(seed=2 ** 64), "seed"),
                       (dict(kv_heads=2 ** 64 + 2), "kv_heads"), (dict(plan_cache_size=-1), "plan_cache_size"),
                       (dict(window=1.5, causal=True), "window: 1.5 is not an integer"),
                       (dict(scale=float("nan")), "scale"), (dict(scale=1e39), "scale"),
                       (dict(dropout=1.0), "dropout"), (dict(causal=2), "causal"), (dict(window=3), "needs causal")]:
        with pytest.raises(clattn.InvalidArgumentError, match=needle):
            clattn.Attention(2, device="ref", **{**w, **kw})
    for heads in (2 ** 64 + 2, 0, -1, True, "2"):
        with pytest.raises(clattn.InvalidArgumentError, match="heads"):
            clattn.Attention(heads, device="ref")
    clattn.Attention(2, seed=2 ** 64 - 1, device="ref", **w)(rnd(rng, 1, 3, 8))  # the largest seed is fine
    dec = clattn.Decoder(2, **{k: v for k, v in w.items()}, batch=2, capacity=8, max_new_tokens=4, device="ref")
    x = rnd(rng, 2, 3, 8)
    for valid, needle in [([-1, 1], "valid\\[0\\]: -1 is out of range"), ([1, 4], "valid\\[1\\]: 4 is out of range"),
                          ([1], "valid: 1 values"), ([1.0, 1], "valid\\[0\\]: 1.0 is not an integer")]:
        with pytest.raises(clattn.Error, match=needle):
            dec(x, valid=valid)
    assert dec.lengths == [0, 0]
    dec(x)
    for lengths, needle in [([-1, 0], "lengths\\[0\\]: -1"), ([2 ** 64 + 1, 0], "lengths\\[0\\]"),
                            ([4, 0], "lengths\\[0\\]: 4 is out of range \\(0 .. 3\\)")]:
        with pytest.raises(clattn.InvalidArgumentError, match=needle):
            dec.truncate(lengths)
    assert dec.lengths == [3, 3]
    for kw in (dict(capacity=0), dict(batch=2 ** 64), dict(max_new_tokens=-3)):
        with pytest.raises(clattn.InvalidArgumentError):
            clattn.Decoder(2, **{**w, "batch": 1, "capacity": 8, "max_new_tokens": 4, **kw}, device="ref")


def test_decoder_errors_speak_python():
    rng = np.random.default_rng(3)
    dec = clattn.Decoder(2, **mha_weights(rng, 8), batch=1, capacity=6, max_new_tokens=4, device="ref")
    with pytest.raises(clattn.ShapeMismatchError) as e:
        dec(rnd(rng, 1, 5, 8))
    assert "max_new_tokens=4" in e.value.message and "seq_q" not in e.value.message and "args." not in e.value.message
    dec(rnd(rng, 1, 4, 8))
    with pytest.raises(clattn.ShapeMismatchError, match="sequence 0 holds 4 tokens; 3 more exceed capacity=6"):
        dec(rnd(rng, 1, 3, 8))
    with pytest.raises(clattn.ShapeMismatchError, match="x: shape \\(2, 1, 8\\), expected"):
        dec(rnd(rng, 2, 1, 8))
    assert dec.lengths == [4]
    # the options are the plan's: a new value would be ignored, so setting one is refused and changes nothing
    for name, value in (("window", 2), ("scale", 0.5), ("rope", clattn.Rope(dims=4)), ("batch", 2), ("capacity", 9)):
        before = getattr(dec, name)
        with pytest.raises(AttributeError, match=f"Decoder.{name} is fixed when the decoder is made"):
            setattr(dec, name, value)
        assert getattr(dec, name) == before


# ---------------------------------------------------------------- exceptions

def test_every_status_has_its_exception_class():
    expected = {-3001: (clattn.InvalidArgumentError, ValueError), -3002: (clattn.ShapeMismatchError, ValueError),
                -3003: (clattn.SizeOverflowError, OverflowError), -3004: (clattn.TooLargeForDeviceError, MemoryError),
                -3005: (clattn.OutOfHostMemoryError, MemoryError), -3006: (clattn.DeviceAllocationError, MemoryError),
                -3007: (clattn.BuildFailureError, RuntimeError), -3008: (clattn.UnsupportedError, NotImplementedError),
                -3009: (clattn.NoDeviceError, RuntimeError), -3010: (clattn.InvalidDeviceSpecError, ValueError),
                -5: (clattn.OpenCLError, RuntimeError), -2046: (clattn.OpenCLError, RuntimeError)}
    assert set(expected) >= set(s for s in _lib.STATUS_NAMES if s)
    from clattn._errors import error
    for status, (cls, builtin) in expected.items():
        e = error(status, "m")
        assert type(e) is cls and isinstance(e, clattn.Error) and isinstance(e, builtin)
        assert e.status == status and e.status_name and e.message == "m"
    assert error(-5, "").status_name == "CL_OUT_OF_RESOURCES"
    with pytest.raises(clattn.NoDeviceError):
        clattn.Attention(2, device="name=NoSuchDeviceAnywhere")
    with pytest.raises(clattn.InvalidDeviceSpecError):
        clattn.Attention(2, device="bogus")


def test_public_classes_have_signatures_docs_and_reprs():
    rng = np.random.default_rng(4)
    w = mha_weights(rng, 8)
    enc = dict(ln1_weight=np.ones(8, np.float32), ln1_bias=np.zeros(8, np.float32), w_ff1=rnd(rng, 12, 8),
               b_ff1=np.zeros(12, np.float32), w_ff2=rnd(rng, 8, 12), b_ff2=np.zeros(8, np.float32),
               ln2_weight=np.ones(8, np.float32), ln2_bias=np.zeros(8, np.float32))
    objs = [clattn.Attention(2, causal=True, device="ref", **w),
            clattn.Decoder(2, batch=1, capacity=4, max_new_tokens=2, device="ref", **w),
            clattn.EncoderLayer(2, device="ref", **w, **enc)]
    for o in objs:
        r = repr(o)
        assert r.startswith("clattn.") and "heads=2" in r and "embed=8" in r and "ref" in r
        cls = type(o)
        assert cls.__doc__ and cls.__call__.__doc__
        params = inspect.signature(cls.__init__).parameters
        assert not any(p.kind == p.VAR_KEYWORD for p in params.values()), cls  # every option named
        assert all(p.annotation is not inspect.Parameter.empty for n, p in params.items() if n != "self"), cls
    assert "capacity" in inspect.signature(clattn.Decoder).parameters
    assert "causal=True" in repr(objs[0]) and "capacity=4" in repr(objs[1]) and "ff_dim=12" in repr(objs[2])
    for name in clattn.__all__:
        assert getattr(clattn, name).__doc__, name


# ---------------------------------------------------------------- the plan cache

def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc")
def test_plan_cache_is_bounded_and_memory_flat_over_500_shapes():
    rng = np.random.default_rng(5)
    E = 128  # each plan copies 4 x 64 KiB of weights: 500 kept plans would hold 125 MiB
    a = clattn.Attention(2, **mha_weights(rng, E), plan_cache_size=4, device="ref")
    shapes = [(b, t) for b in range(1, 26) for t in range(1, 21)]
    assert len(shapes) == 500
    before = None
    for i, (b, t) in enumerate(shapes):
        out, _ = a(np.ones((b, t, E), np.float32))
        assert out.shape == (b, t, E) and np.isfinite(out).all()
        assert a.plans_cached <= 4
        if i == 49:
            gc.collect()
            before = rss_bytes()
    gc.collect()
    grown = rss_bytes() - before
    assert grown < 24 << 20, f"memory grew by {grown >> 20} MiB over 450 shapes"
    # least recently used out: the last four shapes are kept, and reusing one keeps it
    a.plan_cache_size = 2
    assert a.plans_cached == 2
    a.plan_cache_size = 0
    a(np.ones((1, 3, E), np.float32))
    assert a.plans_cached == 0


def test_two_hundred_lengths_keep_at_most_the_cache_size():
    a = clattn.Attention(2, device="ref")
    for t in range(1, 201):
        a(np.ones((1, t, 8), np.float32))
    assert a.plans_cached == a.plan_cache_size == 16


# ---------------------------------------------------------------- the build notice

@pytest.mark.skipif(not HAVE_OPENCL, reason="no OpenCL device")
def test_a_cold_compile_is_announced_once(tmp_path):
    script = textwrap.dedent("""
        import numpy as np, clattn
        a = clattn.Attention(2, device="opencl")
        a(np.ones((1, 5, 8), np.float32))
        a(np.ones((1, 6, 8), np.float32))
    """)
    env = dict(os.environ, CLATTN_CACHE_DIR=str(tmp_path / "kernels"), PYTHONPATH=os.pathsep.join(sys.path))
    cold = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert cold.returncode == 0, cold.stderr
    assert cold.stderr.count("compiling OpenCL kernels for") == 1, cold.stderr
    warm = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert warm.returncode == 0 and "compiling" not in warm.stderr, warm.stderr


def test_a_core_variable_that_does_nothing_for_a_plan_is_said_once(caplog):
    """CLATTN_CORE naming no core a plan runs (here: any plan on ref) is logged as a warning, once per text."""
    import logging
    os.environ["CLATTN_CORE"] = "decode_group"
    try:
        with caplog.at_level(logging.WARNING, logger="clattn"):
            a = clattn.Attention(2, device="ref")
            a(np.ones((1, 5, 8), np.float32))
            a(np.ones((1, 6, 8), np.float32))
    finally:
        del os.environ["CLATTN_CORE"]
    said = [r.getMessage() for r in caplog.records if "CLATTN_CORE" in r.getMessage()]
    assert len(said) == 1 and "not used on the ref device" in said[0], said


# ---------------------------------------------------------------- torch

def need_torch():  # imported per test: the rest runs without torch
    return pytest.importorskip("torch")


def torch_mha(E=16, H=4, batch_first=True, **kw):
    t = need_torch()
    t.manual_seed(0)
    m = t.nn.MultiheadAttention(E, H, batch_first=batch_first, **kw).eval()
    with t.no_grad():
        for p in m.parameters():
            p.copy_(t.randn_like(p) * 0.3)
    return m


@pytest.mark.parametrize("device", DEVICES)
def test_torch_in_torch_out_and_the_forward_call(device):
    t = need_torch()
    m = torch_mha()
    a = clattn.from_torch(m, device=device)
    x = t.randn(2, 7, 16)
    kpm = t.zeros(2, 7, dtype=t.bool)
    kpm[0, 5:] = True
    want, want_avg = m(x, x, x, kpm)
    out, avg = a.forward(x, x, x, kpm)                    # torch's positional order and defaults
    assert isinstance(out, t.Tensor) and out.dtype == t.float32 and out.shape == want.shape
    np.testing.assert_allclose(out.numpy(), want.detach().numpy(), **TOL)
    np.testing.assert_allclose(avg.numpy(), want_avg.detach().numpy(), **TOL)
    out2, none = a.forward(x, x, x, need_weights=False)
    assert none is None
    np.testing.assert_allclose(out2.numpy(), m(x, x, x, need_weights=False)[0].detach().numpy(), **TOL)
    per_head = a.forward(x, x, x, average_attn_weights=False)[1]
    np.testing.assert_allclose(per_head.numpy(), m(x, x, x, average_attn_weights=False)[1].detach().numpy(), **TOL)
    # attn(x, x, x): the third argument is the value, not a mask
    out3, _ = a(x, x, x)
    np.testing.assert_allclose(out3.numpy(), m(x, x, x)[0].detach().numpy(), **TOL)
    # cross-attention and a copy of x as key: the same numbers
    kv = t.randn(2, 9, 16)
    np.testing.assert_allclose(a.forward(x, kv, kv)[0].numpy(), m(x, kv, kv)[0].detach().numpy(), **TOL)
    np.testing.assert_allclose(a.forward(x, x.clone(), x.clone())[0].numpy(), m(x, x, x)[0].detach().numpy(), **TOL)
    causal = t.triu(t.ones(7, 7, dtype=t.bool), 1)
    np.testing.assert_allclose(a.forward(x, x, x, attn_mask=causal)[0].numpy(),
                               m(x, x, x, attn_mask=causal)[0].detach().numpy(), **TOL)
    with pytest.raises(clattn.InvalidArgumentError, match="value"):
        a.forward(x, kv, t.randn(2, 9, 16))
    # unbatched (T, E)
    np.testing.assert_allclose(a.forward(x[0], x[0], x[0])[0].numpy(), m(x[0], x[0], x[0])[0].detach().numpy(), **TOL)


def test_requires_grad_and_batch_first_false():
    t = need_torch()
    m = torch_mha(batch_first=False)
    a = clattn.from_torch(m, device="ref")
    assert not a.batch_first
    x = t.randn(7, 2, 16, requires_grad=True)   # (T, B, E)
    out, w = a.forward(x, x, x)
    want, want_w = m(x, x, x)
    assert out.shape == (7, 2, 16) and not out.requires_grad
    np.testing.assert_allclose(out.numpy(), want.detach().numpy(), **TOL)
    np.testing.assert_allclose(w.numpy(), want_w.detach().numpy(), **TOL)


@pytest.mark.parametrize("dtype,rtol", [("float16", 2e-3), ("bfloat16", 1.6e-2)])
def test_half_and_bfloat16_are_widened_computed_in_fp32_and_rounded_back(dtype, rtol):
    t = need_torch()
    dt = getattr(t, dtype)
    m = torch_mha().to(dt)
    a = clattn.from_torch(m, device="ref")     # the weights widened exactly
    x = t.randn(2, 5, 16).to(dt)
    out, w = a.forward(x, x, x)
    assert out.dtype == dt and w.dtype == dt
    m32 = torch_mha()
    with t.no_grad():
        for p32, p in zip(m32.parameters(), m.parameters()):
            p32.copy_(p.float())                # the same (rounded) weights in float32
    want = m32(x.float(), x.float(), x.float())[0].detach()
    np.testing.assert_allclose(out.float().numpy(), want.to(dt).float().numpy(), rtol=rtol, atol=rtol)
    with pytest.raises(clattn.InvalidArgumentError, match="float64 tensor.*\\.float\\(\\)"):
        a.forward(x.double(), x.double(), x.double())
    with pytest.raises(clattn.InvalidArgumentError, match="float64"):
        clattn.from_torch(torch_mha().double())
    with pytest.raises(clattn.InvalidArgumentError, match="int64"):
        a(t.ones(1, 2, 16, dtype=t.int64))


def test_from_torch_refuses_what_it_cannot_carry():
    t = need_torch()
    for kw, needle in [(dict(add_bias_kv=True), "add_bias_kv"), (dict(add_zero_attn=True), "add_zero_attn"),
                       (dict(kdim=8, vdim=12), "kdim=8 and vdim=12")]:
        with pytest.raises(clattn.InvalidArgumentError, match=needle):
            clattn.from_torch(torch_mha(**kw), device="ref")
    train = torch_mha(dropout=0.1).train()
    with pytest.raises(clattn.InvalidArgumentError, match="training mode.*eval"):
        clattn.from_torch(train, device="ref")
    clattn.from_torch(train.eval(), device="ref")
    enc = t.nn.TransformerEncoderLayer(16, 4, 24, batch_first=True, activation=t.nn.functional.silu).eval()
    with pytest.raises(clattn.InvalidArgumentError, match="activation"):
        clattn.from_torch(enc, device="ref")
    with pytest.raises(clattn.InvalidArgumentError, match="training mode"):
        clattn.from_torch(t.nn.TransformerEncoderLayer(16, 4, 24, batch_first=True), device="ref")
    with pytest.raises(clattn.InvalidArgumentError, match="not nn.MultiheadAttention"):
        clattn.from_torch(t.nn.Linear(3, 3))
    # kdim == vdim != embed: cross-attention with separate projections works
    m = torch_mha(kdim=12, vdim=12)
    a = clattn.from_torch(m, device="ref")
    q, kv = t.randn(1, 3, 16), t.randn(1, 5, 12)
    np.testing.assert_allclose(a.forward(q, kv, kv)[0].numpy(), m(q, kv, kv)[0].detach().numpy(), **TOL)


@pytest.mark.parametrize("batch_first", [True, False])
def test_encoder_layer_forward_matches_torch(batch_first):
    t = need_torch()
    t.manual_seed(1)
    enc = t.nn.TransformerEncoderLayer(16, 4, 24, dropout=0.1, batch_first=batch_first, norm_first=True).eval()
    layer = clattn.from_torch(enc, device=DEVICES[-1])
    x = t.randn(2, 6, 16) if batch_first else t.randn(6, 2, 16)
    kpm = t.zeros(2, 6, dtype=t.bool)
    kpm[1, 4:] = True
    np.testing.assert_allclose(layer.forward(x, src_key_padding_mask=kpm).numpy(),
                               enc(x, src_key_padding_mask=kpm).detach().numpy(), rtol=1e-4, atol=2e-5)
    causal = t.nn.Transformer.generate_square_subsequent_mask(6)
    np.testing.assert_allclose(layer.forward(x, src_mask=causal).numpy(), enc(x, src_mask=causal).detach().numpy(),
                               rtol=1e-4, atol=2e-5)
    with pytest.raises(clattn.InvalidArgumentError, match="src_mask: clattn's encoder layer takes only the causal"):
        layer.forward(x, src_mask=t.zeros(6, 6))
    with pytest.raises(clattn.ShapeMismatchError, match="src: last dimension 15"):
        layer.forward(x[..., :15])


# ---------------------------------------------------------------- never a crash

FUZZ = textwrap.dedent(r"""
    # A consistent module and call, then (half the time) one to three things made wrong: a dimension, a dtype,
    # a rank, an integer out of range, a mask of another shape. Every call must return finite numbers of the
    # right shape or raise clattn.Error; anything else (another exception, a crash) fails.
    import random, sys
    import numpy as np
    import clattn
    try:
        import torch
    except ImportError:
        torch = None
    seed, device, total = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    rng = random.Random(seed)
    nrng = np.random.default_rng(seed)
    BAD_DTYPES = [np.float64, np.float16, np.int32, np.bool_, np.complex64, object]

    def arr(shape, dtype=np.float32, scale=0.4):
        if dtype is object:
            return [["a"] * (shape[-1] if shape else 1)]
        if np.dtype(dtype).kind in "fc":
            return (nrng.standard_normal(shape) * scale).astype(dtype)
        return (nrng.random(shape) < 0.3).astype(dtype)

    def as_torch(a):
        if torch is None or not isinstance(a, np.ndarray) or a.dtype.kind not in "fb" or rng.random() < 0.7:
            return a
        t = torch.from_numpy(np.ascontiguousarray(a))
        if t.dtype == torch.float32 and rng.random() < 0.3:
            t = t.to(rng.choice([torch.float16, torch.bfloat16, torch.float64]))
        return t

    def bent(v):
        return rng.choice([0, 1, v + 1, max(v - 1, 0), 2 * v + 3, 200000 if rng.random() < 0.05 else v + 2])

    calls = ok = modules = 0
    while calls < total:
        H = rng.choice([1, 2, 4])
        HK = rng.choice([h for h in (1, 2, 4) if H % h == 0])
        dk, dv = rng.choice([2, 4, 8]), rng.choice([2, 4, 8])
        E = H * dk if rng.random() < 0.5 else rng.choice([4, 6, 8, 12])
        B, Tq, Tk = rng.randint(1, 3), rng.randint(1, 9), rng.randint(1, 9)
        weights = rng.random() < 0.7
        cross = rng.random() < 0.3
        Ekv = rng.choice([E, E + 2]) if (cross and weights) else E
        if not weights:
            E = Ekv = H * dk
            HK, dv = H, dk
        Eo = rng.choice([0, E, 5])
        w = dict(w_query=(H * dk, E), w_key=(HK * dk, Ekv), w_value=(HK * dv, Ekv), b_query=(H * dk,),
                 b_value=(HK * dv,), w_out=(Eo, H * dv if weights else E), b_out=(Eo,)) if weights else \
            (dict(w_out=(Eo, E), b_out=(Eo,)))
        if not Eo:
            w.pop("w_out"), w.pop("b_out")
        opts = dict(kv_heads=HK if weights else None, causal=rng.random() < 0.4, window=0, dropout=0.0, seed=seed,
                    algorithm=rng.choice(["auto", "fused", "unfused"]), plan_cache_size=rng.choice([0, 1, 4]))
        if opts["causal"] and rng.random() < 0.3:
            opts["window"] = rng.randint(1, 5)
        x_shape, kv_shape = (B, Tq, E), (B, Tk, Ekv)
        kpm_shape, am_shape = (B, Tk if cross else Tq), (Tq, Tk if cross else Tq)
        use_kpm, use_am = rng.random() < 0.3, rng.random() < 0.3
        dt = dict(x=np.float32, kv=np.float32, kpm=np.bool_, am=rng.choice([np.bool_, np.float32]))
        unbatched = rng.random() < 0.1
        for _ in range(rng.randint(1, 3) if rng.random() < 0.5 else 0):   # make something wrong
            what = rng.randrange(9)
            if what == 0 and w:
                name = rng.choice(list(w))
                w[name] = tuple(bent(v) for v in w[name])
            elif what == 1:
                x_shape = tuple(bent(v) if rng.random() < 0.5 else v for v in x_shape)
            elif what == 2:
                kv_shape = tuple(bent(v) for v in kv_shape)
            elif what == 3:
                kpm_shape, use_kpm = tuple(bent(v) for v in kpm_shape), True
            elif what == 4:
                am_shape, use_am = tuple(bent(v) for v in am_shape), True
            elif what == 5:
                dt[rng.choice(list(dt))] = rng.choice(BAD_DTYPES)
            elif what == 6:
                opts[rng.choice(["kv_heads", "window", "seed", "plan_cache_size"])] = rng.choice([-1, 2 ** 64 + 1, 3])
            elif what == 7:
                H = rng.choice([0, 3, 5, 2 ** 64 + 2])
            else:
                x_shape = x_shape + (2,) if rng.random() < 0.5 else x_shape[1:]
        if unbatched and len(x_shape) == 3:
            x_shape, kv_shape, kpm_shape = x_shape[1:], kv_shape[1:], kpm_shape[1:]
        modules += 1
        try:
            calls += 1
            a = clattn.Attention(H, device=device, **opts, **{k: as_torch(arr(v)) for k, v in w.items()})
            for _ in range(rng.randint(1, 3)):
                calls += 1
                x = as_torch(arr(x_shape, dt["x"], 1.0))
                kv = as_torch(arr(kv_shape, dt["kv"], 1.0)) if cross else None
                kpm = as_torch(arr(kpm_shape, dt["kpm"])) if use_kpm else None
                am = as_torch(arr(am_shape, dt["am"])) if use_am else None
                if rng.random() < 0.5:
                    out, _ = a(x, kv, key_padding_mask=kpm, attn_mask=am, need_weights=rng.random() < 0.3)
                else:
                    k = x if kv is None else kv
                    out, _ = a.forward(x, k, k, kpm, rng.random() < 0.5, am)
                o = out.float().numpy() if torch is not None and isinstance(out, torch.Tensor) else out
                assert np.isfinite(o).all(), "non-finite output"
                assert o.shape[-1] == (Eo or H * (dv if weights else dk)), (o.shape, Eo)
            ok += 1
        except clattn.Error:
            pass
    print(f"fuzz: {calls} calls on {modules} modules: {ok} modules computed every call, {modules - ok} refused")
""")


@pytest.mark.parametrize("device", DEVICES)
def test_a_thousand_random_calls_never_crash(device, tmp_path):
    calls = 1000 if device == "ref" else 150
    script = tmp_path / "fuzz.py"
    script.write_text(FUZZ)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    r = subprocess.run([sys.executable, str(script), "21", device, str(calls)], env=env, capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    assert r.stdout.startswith("fuzz: ") and int(r.stdout.split()[1]) >= calls, r.stdout


# ---------------------------------------------------------------- the report's first rows, through from_torch

@pytest.mark.parametrize("width", [65, 200000])
def test_from_torch_module_refuses_another_width(width):
    t = need_torch()
    a = clattn.from_torch(torch_mha(E=64, H=4), device=DEVICES[-1])
    x = t.zeros(2, 16, width)
    with pytest.raises(clattn.ShapeMismatchError, match=f"query: last dimension {width}, but w_query takes inputs "
                                                        f"of width 64"):
        a.forward(x, x, x)
    with pytest.raises(clattn.ShapeMismatchError, match=f"x: last dimension {width}"):
        a(x)


@pytest.mark.parametrize("device", DEVICES)
def test_one_module_from_four_threads(device):
    """The report's 30 wrong results of 40: each thread's calls on one module give its own right answer."""
    import threading
    rng = np.random.default_rng(8)
    w = mha_weights(rng, 16)
    a = clattn.Attention(4, causal=True, device=device, **w)
    xs = [rnd(rng, 2, 9 + k, 16) for k in range(4)]      # different shapes share the plan cache too
    wants = [a(x)[0] for x in xs]
    errors = []

    def work(k):
        try:
            for _ in range(10):
                out, _ = a(xs[k])
                np.testing.assert_allclose(out, wants[k], **TOL)
        except Exception as e:  # reported below, with the thread
            errors.append((k, e))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors


@pytest.mark.parametrize("device", DEVICES)
def test_every_module_in_eval_and_train_mode(device):
    """Each Python module against torch in both modes: from_torch carries eval semantics, so a module in training
    mode converts only when it has no dropout to apply (then torch's train-mode output is its eval output, and
    clattn's equals it), is refused naming eval() when it has, and converts after eval(); the autograd module
    applies dropout in train() (two steps differ) and none in eval() (torch's eval output)."""
    t = need_torch()
    ca = pytest.importorskip("clattn.autograd")
    x = t.randn(2, 6, 16)
    for p in (0.0, 0.25):
        mha = torch_mha(dropout=p).train()
        enc = t.nn.TransformerEncoderLayer(16, 4, 24, dropout=p, batch_first=True).train()
        for m, call in ((mha, lambda m, x: m(x, x, x, need_weights=False)[0]), (enc, lambda m, x: m(x))):
            if p > 0:
                with pytest.raises(clattn.InvalidArgumentError, match="training mode.*eval"):
                    clattn.from_torch(m, device=device)
                m.eval()
            with t.no_grad():
                want = call(m, x)
            got = clattn.from_torch(m, device=device)(x) if m is enc else \
                clattn.from_torch(m, device=device).forward(x, x, x)[0]
            np.testing.assert_allclose(np.asarray(got), want.numpy(), **TOL)
    t.manual_seed(3)
    ref = t.nn.MultiheadAttention(16, 4, dropout=0.25, batch_first=True)
    mine = ca.MultiheadAttention(16, 4, dropout=0.25, batch_first=True, device=device)
    mine.load_state_dict(ref.state_dict())
    mine.train()
    a, b = mine(x, x, x)[0], mine(x, x, x)[0]
    assert not t.allclose(a, b), "train(): each step draws its own dropout"
    ref.eval(), mine.eval()
    with t.no_grad():
        np.testing.assert_allclose(mine(x, x, x)[0].detach().numpy(), ref(x, x, x, need_weights=False)[0].numpy(),
                                   **TOL)
