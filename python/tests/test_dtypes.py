"""pytest: half-precision modules (clattn.Attention(dtype=...), from_torch on float16/bfloat16 modules) and the
library's rounding (clattn_dtype_convert through the package). A half plan computes the fp32 function of its (rounded)
inputs and weights and rounds each output once (README, "Data types"), so its results are exactly the float32
module's on the same rounded values, rounded once: that is what these tests check, bit for bit, on every device,
and that inputs already of the module's type are taken as they are. The one exception is flash_mma (AUTO's core on
NVIDIA GPUs) on a half module without weights: its fp16/bf16 tensor-core products round P to the type, checked
against that rounding's bound."""
import numpy as np
import pytest

import clattn
from clattn import _arrays as _a

HAVE_OPENCL = len(clattn.devices()) > 1
DEVICES = ["ref"] + (["opencl"] if HAVE_OPENCL else [])
rng = np.random.default_rng(11)


def rounded(a, d):
    """a (float32) rounded to dtype d and widened back: the values a module of that type computes with."""
    return _a.convert(_a.convert(np.ascontiguousarray(a, np.float32), "float32", d), d, "float32")


def weights(E=16, Eo=16):
    w = {k: (rng.standard_normal((E, E)) * 0.3).astype(np.float32) for k in ("w_query", "w_key", "w_value")}
    w["w_out"] = (rng.standard_normal((Eo, E)) * 0.3).astype(np.float32)
    w.update({k: (rng.standard_normal(E) * 0.1).astype(np.float32) for k in ("b_query", "b_key", "b_value")})
    w["b_out"] = (rng.standard_normal(Eo) * 0.1).astype(np.float32)
    return w


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_module_is_the_float32_module_rounded_once(device, dtype):
    w = weights()
    x = rng.standard_normal((2, 9, 16)).astype(np.float32)
    kv = rng.standard_normal((2, 13, 16)).astype(np.float32)
    half = clattn.Attention(4, **w, causal=True, device=device, dtype=dtype)
    full = clattn.Attention(4, **{k: rounded(v, dtype) for k, v in w.items()}, causal=True, device=device)
    assert half.dtype == dtype and full.dtype == "float32" and f"dtype='{dtype}'" in repr(half)
    for args in ((x,), (x, kv)):
        out, wts = half(*args, need_weights=True)
        want, want_w = full(*(rounded(a, dtype) for a in args), need_weights=True)
        # NumPy: float16 results as float16, bfloat16 ones widened to float32 (NumPy has no bfloat16)
        assert out.dtype == (np.float16 if dtype == "float16" else np.float32)
        np.testing.assert_array_equal(np.asarray(out, np.float32), rounded(want, dtype))
        np.testing.assert_array_equal(np.asarray(wts, np.float32), rounded(want_w, dtype))


@pytest.mark.parametrize("device", DEVICES)
def test_module_without_weights_float16_numpy(device):
    """NumPy float16 in (taken as it is), float16 out; the core alone (flash_rows reads the type on a CPU device)."""
    x = rng.standard_normal((2, 33, 64)).astype(np.float16)
    half = clattn.Attention(2, causal=True, device=device, dtype=np.float16)
    out, _ = half(x)
    want, _ = clattn.Attention(2, causal=True, device=device)(x.astype(np.float32))
    assert out.dtype == np.float16
    if half.core_used == "flash_mma":
        # its fp16 tensor-core products round P to float16 before P V (README, "Precision"): within
        # u max|v| (+ 2^-25 per key for half's subnormal weights) and the two outputs' roundings of each other
        u, v = 2.0 ** -11, float(np.abs(x.astype(np.float64)).max())
        tol = u * v + 2.0 ** -25 * x.shape[1] * v + 2 * u * np.abs(want.astype(np.float64)) + 1e-7
        assert np.all(np.abs(out.astype(np.float64) - want.astype(np.float64)) <= tol)
    else:
        np.testing.assert_array_equal(out, want.astype(np.float16))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dt_name", ["float16", "bfloat16"])
def test_from_torch_half_module(device, dt_name):
    torch = pytest.importorskip("torch")
    dt = getattr(torch, dt_name)
    torch.manual_seed(1)
    mha = torch.nn.MultiheadAttention(16, 4, batch_first=True).eval()
    with torch.no_grad():
        for p in mha.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    a32 = clattn.from_torch(mha.to(dt).float(), device=device)  # the rounded weights, in a float32 module
    a = clattn.from_torch(mha.to(dt), device=device)
    assert a.dtype == dt_name and a32.dtype == "float32"
    x = torch.randn(2, 7, 16).to(dt)
    out, w = a.forward(x, x, x, need_weights=True, average_attn_weights=False)
    want, want_w = a32.forward(x.float(), x.float(), x.float(), need_weights=True, average_attn_weights=False)
    assert out.dtype == dt and w.dtype == dt
    assert torch.equal(out, want.to(dt)) and torch.equal(w, want_w.to(dt))
    # the weights averaged over heads: the (rounded) per-head weights averaged in float32, rounded again
    _, avg = a.forward(x, x, x)
    assert avg.dtype == dt and torch.equal(avg, w.float().mean(dim=1).to(dt))
    # a float32 input to a half module: rounded to the type on the way in, the result in the input's type
    out32, _ = a(x.float())
    assert out32.dtype == torch.float32 and torch.equal(out32, out.float())
    # training runs on float32 plans (clattn 0.7): a half module's forward_train and backward are its float32 twin's
    g = torch.randn(2, 7, 16, generator=torch.Generator().manual_seed(2)).to(dt)
    o_t, lse, ctx = a.forward_train(x)
    o_w, lse_w, ctx_w = a32.forward_train(x.float())
    assert torch.equal(o_t.float(), o_w.to(dt).float()) and np.array_equal(lse, lse_w) and np.array_equal(ctx, ctx_w)
    got, want = a.backward(x, g, lse=lse, context=ctx), a32.backward(x.float(), g.float(), lse=lse_w, context=ctx_w)
    assert sorted(got) == sorted(want) and all(np.array_equal(got[k], want[k]) for k in got)
    assert a.backward_core_used == a32.backward_core_used


def test_dtype_refusals_and_convert():
    with pytest.raises(clattn.InvalidArgumentError, match="dtype"):
        clattn.Attention(2, dtype="float64", device="ref")
    with pytest.raises(clattn.InvalidArgumentError, match="dtype"):
        clattn.Attention(2, dtype="int8", device="ref")
    # the library's rounding: ties to even, half's overflow, NaN kept
    f = np.array([1 + 2 ** -11, 1 + 3 * 2 ** -11, 65520.0, np.nan, 1 + 2 ** -8, 1 + 3 * 2 ** -8], np.float32)
    h = _a.convert(f, "float32", "float16")
    assert h.dtype == np.float16 and list(h[:3]) == [1.0, 1 + 2 ** -9, np.inf] and np.isnan(h[3])
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(h, f.astype(np.float16))  # NumPy rounds to nearest even too
    b = _a.convert(f, "float32", "bfloat16")
    assert b.dtype == np.uint16 and list(b[4:]) == [0x3F80, 0x3F82] and (b[3] & 0x7F80) == 0x7F80 and b[3] & 0x7F


@pytest.mark.parametrize("device", DEVICES)
def test_float32_module_rounds_half_inputs_back(device):
    """A float32 module given half tensors widens them exactly and gives its results back in their dtype, rounded once
    from its float32 results."""
    torch = pytest.importorskip("torch")
    a = clattn.Attention(2, **weights(), device=device)
    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(5))
    for dt in (torch.float16, torch.bfloat16):
        out, w = a(x.to(dt), need_weights=True)
        want, want_w = a(x.to(dt).float(), need_weights=True)
        assert out.dtype == dt and w.dtype == dt
        assert torch.equal(out, want.to(dt)) and torch.equal(w, want_w.to(dt))


def decode_float_and(device, kvd):
    """The same prefill and steps through a float32 cache and one of type kvd: each one's outputs and cache read back
    (k, v). Checked here for both types: the repr names kvd, the outputs are close (rounded or quantised keys and
    values) but not equal (the cache did change them), kv_half=True with kvd is refused."""
    w = weights()
    x = rng.standard_normal((2, 9, 16)).astype(np.float32)
    kw = dict(w_query=w["w_query"], w_key=w["w_key"], w_value=w["w_value"], w_out=w["w_out"], capacity=12,
              max_new_tokens=5, batch=2, device=device)
    outs, caches = {}, {}
    for t in ("float32", kvd):
        dec = clattn.Decoder(4, kv_dtype=t, **kw)
        assert dec.kv_dtype == t and (t == "float32" or f"kv_dtype='{kvd}'" in repr(dec))
        outs[t] = np.concatenate([dec(x[:, :5])] + [dec(x[:, i:i + 1]) for i in range(5, 9)], axis=1)
        caches[t] = dec.read_cache()
    np.testing.assert_allclose(outs[kvd], outs["float32"], rtol=3e-2, atol=3e-2)
    assert not np.array_equal(outs[kvd], outs["float32"])
    with pytest.raises(clattn.InvalidArgumentError, match="kv_half=True with kv_dtype"):
        clattn.Decoder(4, kv_half=True, kv_dtype=kvd, **kw)
    return caches


@pytest.mark.parametrize("device", DEVICES)
def test_decoder_bfloat16_cache(device):
    """Decoder(kv_dtype="bfloat16"): a bfloat16 KV cache (CLATTN_KV_BF16) holds every appended key and value rounded
    to bfloat16 (read back exactly representable), the outputs close to the float cache's (keys and values off by at
    most 2^-9 of themselves); kv_half and kv_dtype together must agree."""
    for a in decode_float_and(device, "bfloat16")["bfloat16"]:
        np.testing.assert_array_equal(a, rounded(a, "bfloat16"))


@pytest.mark.parametrize("device", DEVICES)
def test_decoder_int8_cache(device):
    """Decoder(kv_dtype="int8") (clattn 0.8, CLATTN_KV_INT8): every cached row (one position's keys, or values, of a KV
    head) reads back as whole steps of its own scale, max |row| / 127, with at most 127 steps, and within half a
    step of the float cache's row (the keys and values as projected); the outputs close to the float cache's."""
    caches = decode_float_and(device, "int8")
    for exact, got in zip(caches["float32"], caches["int8"]):
        exact, got = exact[:, :, :9].astype(np.float64), got[:, :, :9].astype(np.float64)
        step = np.abs(exact).max(axis=-1, keepdims=True) / 127
        assert (np.abs(got - exact) <= step * (0.5 + 1e-5) + 1e-6).all()
        q = got / step
        assert (np.abs(q - np.rint(q)) < 1e-3).all() and (np.abs(q) <= 127.001).all()


@pytest.mark.parametrize("device", DEVICES)
def test_decoder_verify_tree_and_accept(device):
    """A verify step with a draft tree (clattn 0.8): draft token i's output equals the last output of a plain causal
    run of the context followed by i's ancestors and i (a chain, on another Decoder); accept() keeps a branch, and
    the next step equals the chain's next step."""
    w = weights()
    kw = dict(w_query=w["w_query"], w_key=w["w_key"], w_value=w["w_value"], w_out=w["w_out"], capacity=16,
              max_new_tokens=6, batch=1, device=device)
    ctx = rng.standard_normal((1, 5, 16)).astype(np.float32)
    drafts = rng.standard_normal((1, 6, 16)).astype(np.float32)
    parent = [-1, 0, 0, 1, -1, 3]
    tree = np.zeros((6, 6), bool)
    for i in range(6):
        a = i
        while a >= 0:
            tree[i, a] = True
            a = parent[a]
    dec = clattn.Decoder(4, **kw)
    dec(ctx)
    out = dec(drafts, tree_mask=tree)
    assert dec.lengths == [11]

    def chain(i):
        path, a = [], i
        while a >= 0:
            path.insert(0, a)
            a = parent[a]
        ref = clattn.Decoder(4, **kw)
        ref(ctx)
        return path, ref, ref(drafts[:, path])
    for i in range(6):
        _, _, want = chain(i)
        np.testing.assert_allclose(out[:, i], want[:, -1], rtol=1e-4, atol=1e-5)
    path, ref, _ = chain(5)
    dec.accept([5], [path])
    assert dec.lengths == [5 + len(path)]
    nxt = rng.standard_normal((1, 1, 16)).astype(np.float32)
    np.testing.assert_allclose(dec(nxt), ref(nxt), rtol=1e-4, atol=1e-5)
    with pytest.raises(clattn.InvalidArgumentError, match="diagonal"):
        dec(drafts[:, :2], tree_mask=np.zeros((2, 2)))
    with pytest.raises(clattn.InvalidArgumentError, match="does not come after"):
        dec.accept([5], [[1, 0]])


@pytest.mark.parametrize("device", DEVICES)
def test_decoder_paged_shared_prefix(device):
    """Decoder(page_size=4) (clattn 0.8, a paged cache): a prompt in sequence 0, shared with sequences 1 and 2
    (share(): the same pages, none taken), then steps of every sequence's own tokens: each sequence's outputs equal a
    contiguous Decoder's that took its prefix of the prompt and its tokens itself; shared pages copied only as written;
    truncation gives pages back; a pool too small raises TooLargeForDeviceError with nothing changed."""
    w = weights()
    kw = dict(w_query=w["w_query"], w_key=w["w_key"], w_value=w["w_value"], w_out=w["w_out"], capacity=16,
              max_new_tokens=9, device=device)
    prompt = rng.standard_normal((1, 9, 16)).astype(np.float32)
    steps = rng.standard_normal((3, 3, 1, 16)).astype(np.float32)  # (step, sequence, token, embed)
    dec = clattn.Decoder(4, batch=3, page_size=4, **kw)
    x = np.zeros((3, 9, 16), np.float32)
    x[0] = prompt[0]
    dec(x, valid=[9, 0, 0])
    dec.share(1, 0)
    dec.share(2, 0, 6)
    assert dec.lengths == [9, 9, 6] and dec.pages_in_use == 3
    assert dec.pages_of(1) == dec.pages_of(0) and dec.pages_of(2) == dec.pages_of(0)[:2]
    outs = [dec(steps[s, :, 0][:, None]) for s in range(3)]
    for b, pre in enumerate([9, 9, 6]):
        ref = clattn.Decoder(4, batch=1, **kw)
        ref(prompt[:, :pre])
        for s in range(3):
            np.testing.assert_allclose(outs[s][b], ref(steps[s, b][None])[0], rtol=1e-4, atol=1e-5)
    # pages: 0 wrote into the prompt's last page (a copy; 1, the last holder, kept it); 2 copied the page of
    # positions 4 .. 7 and took a new one for position 8
    assert dec.pages_in_use == 3 + 1 + 2
    dec.truncate([12, 12, 0])  # 2's two pages of its own back; the prompt's first page stays 0's and 1's
    assert dec.pages_in_use == 3 + 1
    small = clattn.Decoder(4, batch=2, page_size=4, pages=3, **kw)
    small(np.concatenate([prompt, prompt]), valid=[9, 0])
    small.share(1, 0)
    with pytest.raises(clattn.TooLargeForDeviceError, match="free pages"):
        small(np.zeros((2, 1, 16), np.float32))
    assert small.lengths == [9, 9] and small.pages_in_use == 3
    with pytest.raises(clattn.InvalidArgumentError, match="power of two"):
        clattn.Decoder(4, batch=1, page_size=3, **kw)
    with pytest.raises(clattn.InvalidArgumentError, match="without page_size"):
        clattn.Decoder(4, batch=1, pages=3, **kw)
