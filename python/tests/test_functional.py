"""pytest: clattn.functional.scaled_dot_product_attention against a float64 oracle written here (torch's formula:
softmax(Q K^T * scale + mask) V, in float64, with GQA by repeating K and V): every mask form (bool True = attend,
float added) and broadcast, GQA with enable_gqa and a broadcast key head, is_causal with L != S, scale, 0-2 leading
dimensions, value heads of another size, the gradients of query, key and value; a fully masked row (0, clattn's
choice); refusals; plans cached per shape; dropout repeatable under torch.manual_seed; and, with torch >= 2.4, the
custom operator under torch.compile. Runs on Debian's torch 1.13 and on PyPI's torch 2.x (scripts/ci-torch2.sh)."""
import math
import threading

import numpy as np
import pytest

import clattn

torch = pytest.importorskip("torch")
import clattn.functional as CF  # noqa: E402 (needs torch)

HAVE_OPENCL = len(clattn.devices()) > 1
DEVICES = ["ref"] + (["opencl"] if HAVE_OPENCL else [])
FWD = dict(rtol=1e-4, atol=1e-5)
GRAD = dict(rtol=1e-3, atol=1e-5)


def oracle(q, k, v, mask=None, is_causal=False, scale=None):
    """torch's scaled_dot_product_attention in float64, written out (GQA: K and V repeated per group); a row that
    sees no key gives 0."""
    q, k, v = q.double(), k.double(), v.double()
    if q.dim() >= 3 and k.shape[-3] != q.shape[-3]:
        g = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(g, dim=-3), v.repeat_interleave(g, dim=-3)
    s = q @ k.transpose(-1, -2) * (scale if scale is not None else 1.0 / math.sqrt(q.shape[-1]))
    L, S = s.shape[-2:]
    if is_causal:
        s = s.masked_fill(~torch.ones(L, S, dtype=torch.bool).tril(), float("-inf"))
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask.double()
    return torch.softmax(s, -1).nan_to_num(0.0) @ v


def weights_of(q, k, mask=None):
    """The oracle's attention weights in float64 (GQA: K repeated per group; a row that sees no key: 0)."""
    q, k = q.double(), k.double()
    if k.shape[-3] != q.shape[-3]:
        k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s, -1).nan_to_num(0.0)


def inputs(qs, ks, vs, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*s, generator=g).requires_grad_(True) for s in (qs, ks, vs))


def check(q, k, v, device, mask=None, grads=True, **kw):
    out = CF.scaled_dot_product_attention(q, k, v, attn_mask=mask, device=device, **kw)
    want = oracle(q, k, v, mask, kw.get("is_causal", False), kw.get("scale"))
    assert out.shape == want.shape and out.dtype == torch.float32
    torch.testing.assert_close(out.double(), want.detach(), **FWD)
    if grads:
        g = torch.randn(out.shape, generator=torch.Generator().manual_seed(7))
        got = torch.autograd.grad(out, (q, k, v), g)
        exp = torch.autograd.grad(want, (q, k, v), g.double())
        for name, a, b in zip("qkv", got, exp):
            torch.testing.assert_close(a.double(), b.double(), **GRAD, msg=lambda m: f"grad {name}: {m}")


def same_grads(out, want, inputs, seed, names="qkv"):
    """The gradients of out and of the float64 want through `inputs` from one random dOut (seed) agree (GRAD)."""
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed))
    got = torch.autograd.grad(out, inputs, g)
    exp = torch.autograd.grad(want, inputs, g.double())
    for name, a, b in zip(names, got, exp):
        torch.testing.assert_close(a.double(), b.double(), **GRAD, msg=lambda m: f"grad {name}: {m}")


B, H, L, S, E = 2, 4, 7, 13, 8

MASKS = {  # name: (shape, bool or float): every way a mask broadcasts to (B, H, L, S)
    "bool_LS": ((L, S), torch.bool),
    "bool_B1LS": ((B, 1, L, S), torch.bool),
    "bool_BHLS": ((B, H, L, S), torch.bool),
    "bool_1S": ((1, S), torch.bool),
    "float_HLS": ((H, L, S), torch.float32),
    "float_B11S": ((B, 1, 1, S), torch.float32),
    "float_1H1S": ((1, H, 1, S), torch.float32),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mask_name", sorted(MASKS))
def test_every_mask_form(device, mask_name):
    shape, dtype = MASKS[mask_name]
    g = torch.Generator().manual_seed(hash(mask_name) % 1000)
    if dtype == torch.bool:
        mask = torch.rand(*shape, generator=g) > 0.3
    else:
        mask = torch.randn(*shape, generator=g)
        mask[torch.rand(*shape, generator=g) < 0.2] = float("-inf")
    check(*inputs((B, H, L, E), (B, H, S, E), (B, H, S, 6)), device, mask=mask)


@pytest.mark.parametrize("device", DEVICES)
def test_gqa_and_broadcast_key_heads(device):
    check(*inputs((B, H, L, E), (B, 2, S, E), (B, 2, S, E), seed=1), device, enable_gqa=True)
    check(*inputs((B, H, L, E), (B, 1, S, E), (B, 1, S, 5), seed=2), device, enable_gqa=True, is_causal=True)
    check(*inputs((B, H, L, E), (B, 1, S, E), (B, 1, S, E), seed=3), device)  # one key head broadcasts
    q, k, v = inputs((B, H, L, E), (B, 2, S, E), (B, 2, S, E), seed=4)
    with pytest.raises(clattn.ShapeMismatchError, match="enable_gqa"):
        CF.scaled_dot_product_attention(q, k, v, device=device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("Lq,Lk", [(5, 9), (9, 5), (1, 1), (61, 61)])
def test_causal_top_left(device, Lq, Lk):
    check(*inputs((B, H, Lq, E), (B, H, Lk, E), (B, H, Lk, E), seed=Lq * 100 + Lk), device, is_causal=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("lead", [(), (3,), (2, 3)])
def test_leading_dimensions_and_scale(device, lead):
    """(L, E) / (H, L, E) / (N, H, L, E) / (N1, N2, H, L, E), a key broadcast over the first leading dimension."""
    if not lead:
        q, k, v = inputs((L, E), (S, E), (S, E), seed=5)
    else:
        q, k, v = inputs((*lead, H, L, E), (*((1,) + lead[1:]), H, S, E), (*lead, H, S, E), seed=6)
    check(q, k, v, device, scale=0.37)


@pytest.mark.parametrize("device", DEVICES)
def test_fully_masked_row_gives_zero_and_no_nan_gradient(device):
    q, k, v = inputs((1, 2, 4, E), (1, 2, 5, E), (1, 2, 5, E), seed=8)
    mask = torch.ones(1, 1, 4, 5, dtype=torch.bool)
    mask[..., 2, :] = False  # row 2 sees nothing
    out = CF.scaled_dot_product_attention(q, k, v, attn_mask=mask, device=device)
    assert torch.all(out[:, :, 2] == 0)
    out.sum().backward()
    assert torch.all(q.grad[:, :, 2] == 0) and not any(torch.isnan(t.grad).any() for t in (q, k, v))
    check(q.detach().requires_grad_(), k.detach().requires_grad_(), v.detach().requires_grad_(), device, mask=mask)


HALF_UNIT = {torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}  # the unit roundoff of each type


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dt", [torch.float16, torch.bfloat16])
def test_half_dtypes_native(device, dt):
    """Half inputs of one type run on a plan of that type (desc.dtype; no float32 copy): the result in the type,
    within the README's bound of the float64 oracle on the same (rounded) inputs: the fp32 bound plus the output's
    one rounding (u = 2^-11 for float16, 2^-8 for bfloat16), with GQA, a bool mask and a decode-shaped call."""
    u = HALF_UNIT[dt]
    atol, rtol = 1e-5 * (1 + u) + (2.0 ** -25 if dt == torch.float16 else 0.0), 1e-4 + u * (1 + 1e-4)
    q, k, v = (t.detach().to(dt) for t in inputs((B, H, L, E), (B, 2, S, E), (B, 2, S, 6), seed=9))
    mask = torch.rand(B, 1, L, S, generator=torch.Generator().manual_seed(3)) > 0.3
    _, cache = CF._device(device)
    code = {torch.float16: 1, torch.bfloat16: 2}[dt]
    for qq, m in ((q, mask), (q[:, :, :1], None)):  # (1 row: the bucketed decode-shaped plan)
        out = CF.scaled_dot_product_attention(qq, k, v, attn_mask=m, enable_gqa=True, device=device)
        assert out.dtype == dt and out.shape == (B, H, qq.shape[2], 6)
        want = oracle(qq, k, v, m)
        extra = 0.0
        if any(key[-1] == code and clattn._lib.plan_core(p.handle).decode() == "flash_mma"
               for key, p in cache._plans.items()):
            # flash_mma's fp16/bf16 tensor-core products round P to the type before P V (README, "Precision"):
            # u sum_j a_ij |v_jc| (+ 2^-25 sum_j |v_jc| for float16's subnormal weights) per element
            va = v.double().abs().repeat_interleave(H // v.shape[1], dim=1)
            extra = u * (weights_of(qq, k, m) @ va)
            if dt == torch.float16:
                extra = extra + 2.0 ** -25 * va.sum(-2, keepdim=True)
        bound = atol + rtol * want.abs() + extra
        assert ((out.double() - want).abs() <= bound).all(), f"off by {((out.double() - want).abs() - bound).max()}"
    assert any(key[-1] == code for key in cache._plans), "no plan of the type was made: the call was widened"


@pytest.mark.parametrize("device", DEVICES)
def test_half_training_widens(device):
    """A half call that wants gradients runs on a float32 training plan (float32 copies, the same numbers as a half
    training plan's once rounded) and gives the gradients in the inputs' type."""
    q, k, v = (t.detach().to(torch.bfloat16).requires_grad_() for t in
               inputs((B, H, L, E), (B, H, S, E), (B, H, S, E), seed=4))
    out = CF.scaled_dot_product_attention(q, k, v, device=device)
    assert out.dtype == torch.bfloat16
    out.float().sum().backward()
    assert q.grad.dtype == torch.bfloat16 and torch.isfinite(q.grad.float()).all()


def test_refusals():
    q, k, v = inputs((B, H, L, E), (B, H, S, E), (B, H, S, E))
    with pytest.raises(clattn.InvalidArgumentError, match="float64"):
        CF.scaled_dot_product_attention(q.double(), k, v)
    with pytest.raises(clattn.InvalidArgumentError, match="is_causal"):
        CF.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(L, S, dtype=torch.bool), is_causal=True)
    with pytest.raises(clattn.ShapeMismatchError, match="broadcast"):
        CF.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(3, L, S, dtype=torch.bool))
    with pytest.raises(clattn.ShapeMismatchError, match="head size"):
        CF.scaled_dot_product_attention(q, k[..., :4], v)
    with pytest.raises(clattn.UnsupportedError, match="requires grad"):
        CF.scaled_dot_product_attention(q, k, v, attn_mask=torch.zeros(L, S, requires_grad=True))
    with pytest.raises(clattn.InvalidArgumentError, match="dropout_p"):
        CF.scaled_dot_product_attention(q, k, v, dropout_p=1.0)
    with pytest.raises(clattn.InvalidArgumentError, match="dtype"):
        CF.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(L, S, dtype=torch.int32))


@pytest.mark.parametrize("device", DEVICES)
def test_plans_cached_per_shape(device):
    _, cache = CF._device(device)
    q, k, v = (t.detach() for t in inputs((1, 2, 3, 4), (1, 2, 5, 4), (1, 2, 5, 4), seed=10))
    CF.scaled_dot_product_attention(q, k, v, device=device)
    n = len(cache)
    for _ in range(3):
        CF.scaled_dot_product_attention(q + 1, k, v, device=device)
    assert len(cache) == n


@pytest.mark.parametrize("device", DEVICES)
def test_dropout_repeatable_and_scaled(device):
    q, k, v = inputs((1, 2, 16, E), (1, 2, 64, E), (1, 2, 64, E), seed=11)
    torch.manual_seed(3)
    a = CF.scaled_dot_product_attention(q, k, v, dropout_p=0.5, device=device)
    torch.manual_seed(3)
    b = CF.scaled_dot_product_attention(q, k, v, dropout_p=0.5, device=device)
    c = CF.scaled_dot_product_attention(q, k, v, device=device)
    torch.manual_seed(5)  # another draw: other weights dropped
    d = CF.scaled_dot_product_attention(q, k, v, dropout_p=0.5, device=device)
    assert torch.equal(a, b) and not torch.allclose(a, c) and not torch.allclose(a, d)
    # out is linear in V: with V = ones, each row is the sum of its kept weights / (1 - p), 1 in expectation
    ones = torch.ones(1, 2, 64, E)
    torch.manual_seed(4)
    s = CF.scaled_dot_product_attention(q.detach(), k.detach(), ones, dropout_p=0.5, device=device)
    assert abs(s.mean().item() - 1.0) < 0.15
    a.sum().backward()  # the backward keeps the forward's weights: d(sum)/dV = column sums of the kept weights
    torch.manual_seed(3)
    w = CF.scaled_dot_product_attention(q.detach(), k.detach(), torch.eye(64).expand(1, 2, 64, 64),
                                        dropout_p=0.5, device=device)
    torch.testing.assert_close(v.grad, w.sum(2).unsqueeze(-1).expand(1, 2, 64, E), **GRAD)


@pytest.mark.skipif(not CF._HAS_CUSTOM_OP, reason="torch.library.custom_op needs torch >= 2.4")
def test_custom_op_under_torch_compile():
    """A small attention block through torch.compile(fullgraph=True): no graph break, FakeTensor shapes, the same
    output and gradients as eager."""
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = torch.nn.Linear(32, 96)
            self.out = torch.nn.Linear(32, 32)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.qkv(x).view(b, t, 3, 4, 8).permute(2, 0, 3, 1, 4)
            o = CF.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.out(o.transpose(1, 2).reshape(b, t, 32))

    torch.manual_seed(0)
    m = Block()
    x = torch.randn(2, 9, 32)
    eager = m(x)
    compiled = torch.compile(m, fullgraph=True, backend="aot_eager")
    got = compiled(x)
    torch.testing.assert_close(got, eager)
    gx = torch.autograd.grad(got.sum(), m.qkv.weight)[0]
    ge = torch.autograd.grad(eager.sum(), m.qkv.weight)[0]
    torch.testing.assert_close(gx, ge, **GRAD)
    torch.library.opcheck(torch.ops.clattn.attend.default,
                          (torch.randn(1, 3, 2, 4), torch.randn(1, 5, 1, 4), torch.randn(1, 5, 1, 4), None, False, 0,
                           0.5, 0.0, 0, False, "", "", None, None))
    torch.library.opcheck(torch.ops.clattn.attend.default,  # with rotary embeddings (a Rope's spec)
                          (torch.randn(1, 3, 2, 4), torch.randn(1, 5, 1, 4), torch.randn(1, 5, 1, 4), None, True, 0,
                           0.5, 0.0, 0, False, "", CF._rope_spec(CF.Rope(kind="interleaved")), None, None))
    torch.library.opcheck(torch.ops.clattn.attend.default,  # and the rows' positions: 3 queries', then 5 keys'
                          (torch.randn(1, 3, 2, 4), torch.randn(1, 5, 1, 4), torch.randn(1, 5, 1, 4), None, False, 0,
                           0.5, 0.0, 0, False, "", CF._rope_spec(CF.Rope()),
                           torch.tensor([7, 8, 9, 0, 1, 2, 3, 900], dtype=torch.int32), None))
    torch.library.opcheck(torch.ops.clattn.attend.default,  # attention sinks (inference): one per query head
                          (torch.randn(1, 3, 2, 4), torch.randn(1, 5, 1, 4), torch.randn(1, 5, 1, 4), None, True, 0,
                           0.5, 0.0, 0, False, "", "", None, torch.tensor([0.5, -1.0])))


@pytest.mark.parametrize("device", DEVICES)
def test_decode_steps_share_a_plan_per_key_bucket(device, monkeypatch):
    """Inference calls of one query row over a growing key length, as generate() makes them: every answer right
    (with and without a padding mask), and one plan per CF.KEY_BUCKET keys, not one per call."""
    made = []
    real = CF._create
    monkeypatch.setattr(CF, "_create", lambda dev, create, free, d, *a: made.append(d.seq_kv) or
                        real(dev, create, free, d, *a))
    CF._device(device)[1].resize(0)  # nothing cached before: every plan this test needs is made
    CF._device(device)[1].resize(CF.PLAN_CACHE_SIZE)
    g = torch.Generator().manual_seed(12)
    k_all, v_all = torch.randn(2, 2, 140, E, generator=g), torch.randn(2, 2, 140, 6, generator=g)
    pad = torch.ones(2, 1, 1, 140, dtype=torch.bool)
    pad[0, ..., :3] = False  # left padding of the first sequence
    steps = list(range(60, 70)) + [127, 128, 129]
    with torch.no_grad():
        for S in steps:
            q = torch.randn(2, 4, 1, E, generator=g)
            k, v = k_all[:, :, :S], v_all[:, :, :S]
            out = CF.scaled_dot_product_attention(q, k, v, enable_gqa=True, device=device)
            torch.testing.assert_close(out.double(), oracle(q, k, v), **FWD)
            out = CF.scaled_dot_product_attention(q, k, v, attn_mask=pad[..., :S], enable_gqa=True, device=device)
            torch.testing.assert_close(out.double(), oracle(q, k, v, pad[..., :S]), **FWD)
    # 26 calls, two mask forms over the buckets of 64, 128 and 192 keys: 6 plans
    assert sorted(made) == [64, 64, 128, 128, 192, 192], made


def varlen_oracle(q, k, v, cq, ck, causal=False, window=0):
    """Each packed sequence alone through the oracle: (L, H, E) rows as (H, L, E); a causal window hides keys
    i - j >= window; a sequence without keys gives 0."""
    out = torch.zeros((q.shape[0], q.shape[1], v.shape[2]), dtype=torch.float64)
    for b in range(len(cq) - 1):
        qs, ks, vs = (t[c[b]:c[b + 1]].transpose(0, 1) for t, c in ((q, cq), (k, ck), (v, ck)))
        if qs.shape[1] == 0 or ks.shape[1] == 0:
            continue
        L, S = qs.shape[1], ks.shape[1]
        i, j = torch.arange(L)[:, None], torch.arange(S)[None, :]
        allowed = (j <= i) & ((i - j < window) if window else True) if causal else None
        out[cq[b]:cq[b + 1]] = oracle(qs, ks, vs, allowed).transpose(0, 1)
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("causal,window", [(False, 0), (True, 0), (True, 3)])
def test_varlen_each_sequence_alone(device, causal, window):
    lq, lk = [7, 1, 0, 30], [9, 1, 0, 30] if not causal else [7, 1, 0, 30]
    if not causal:
        lk[2] = 4  # a sequence without queries but with keys
    cq = [0] + torch.tensor(lq).cumsum(0).tolist()
    ck = [0] + torch.tensor(lk).cumsum(0).tolist()
    g = torch.Generator().manual_seed(3)
    q = torch.randn(cq[-1], 4, 8, generator=g)
    k, v = torch.randn(ck[-1], 2, 8, generator=g), torch.randn(ck[-1], 2, 5, generator=g)
    with torch.no_grad():
        out = CF.varlen_attention(q, k, v, cq, torch.tensor(ck), max(lq), max(lk), causal=causal, window=window,
                                  device=device)
    assert out.shape == (cq[-1], 4, 5) and out.dtype == torch.float32
    torch.testing.assert_close(out.double(), varlen_oracle(q, k, v, cq, ck, causal, window), **FWD)
    # a sequence with queries and no keys: 0
    with torch.no_grad():
        none = CF.varlen_attention(q[:7], k[:0], v[:0], [0, 7], [0, 0], 7, 1, device=device)
    assert torch.equal(none, torch.zeros_like(none))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_dropout_as_padded(device, causal):
    """dropout: sequence b's weights kept or dropped as attend() on the padded batch keeps its entry b's (the same
    draw from torch's generator), in the output and in query, key and value's gradients"""
    lq, lk = [5, 0, 9, 3], [5, 0, 9, 3] if causal else [8, 2, 9, 0]
    cq = [0] + torch.tensor(lq).cumsum(0).tolist()
    ck = [0] + torch.tensor(lk).cumsum(0).tolist()
    g = torch.Generator().manual_seed(12)
    q = torch.randn(cq[-1], 4, 8, generator=g).requires_grad_(True)
    k = torch.randn(ck[-1], 2, 8, generator=g).requires_grad_(True)
    v = torch.randn(ck[-1], 2, 6, generator=g).requires_grad_(True)
    torch.manual_seed(5)
    out = CF.varlen_attention(q, k, v, cq, ck, 9, 9, causal=causal, dropout_p=0.4, device=device)
    torch.manual_seed(6)  # another draw on the same plan between out's forward and its backward
    other = CF.varlen_attention(q, k, v, cq, ck, 9, 9, causal=causal, dropout_p=0.4, device=device)
    gout = torch.randn(out.shape, generator=g)
    got = torch.autograd.grad(out, (q, k, v), gout)

    def padded(t, c, n):
        p = torch.zeros((4, n) + tuple(t.shape[1:]))
        for b in range(4):
            p[b, :c[b + 1] - c[b]] = t[c[b]:c[b + 1]]
        return p

    def packed(p, c):
        return torch.cat([p[b, :c[b + 1] - c[b]] for b in range(4)])

    qp, kp, vp = (padded(t.detach(), c, 9).requires_grad_(True) for t, c in ((q, cq), (k, ck), (v, ck)))
    keep = (torch.arange(9)[None, :] < torch.tensor(lk)[:, None])[:, None, None, :]  # (B, 1, 1, S)
    torch.manual_seed(5)
    want = CF.attend(qp, kp, vp, keep, causal=causal, dropout_p=0.4, device=device)
    torch.testing.assert_close(out, packed(want, cq), **FWD)
    exp = torch.autograd.grad(want, (qp, kp, vp), padded(gout, cq, 9))
    for name, a, b, c in zip("qkv", got, exp, (cq, ck, ck)):
        torch.testing.assert_close(a, packed(b, c), **GRAD, msg=lambda m: f"grad {name}: {m}")
    # the dropout is there: without it (or with another draw) the output differs
    with torch.no_grad():
        plain = CF.varlen_attention(q, k, v, cq, ck, 9, 9, causal=causal, device=device)
    assert not torch.allclose(out, plain) and not torch.allclose(out, other)
    with pytest.raises(clattn.InvalidArgumentError, match="dropout_p"):
        CF.varlen_attention(q, k, v, cq, ck, 9, 9, dropout_p=1.0, device=device)


@pytest.mark.parametrize("device", DEVICES)
def test_varlen_half_and_refusals(device):
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(12, 2, 8, generator=g) for _ in range(3))
    cu = [0, 5, 12]
    with torch.no_grad():
        out = CF.varlen_attention(q.half(), k.half(), v.half(), cu, cu, 7, 7, causal=True, device=device)
    assert out.dtype == torch.float16
    want = varlen_oracle(q.half().float(), k.half().float(), v.half().float(), cu, cu, True)
    torch.testing.assert_close(out.double(), want, rtol=2e-3, atol=1e-3)
    with pytest.raises(clattn.ShapeMismatchError, match="rows"):
        CF.varlen_attention(q, k, v, [0, 5, 11], cu, 7, 7, device=device)
    with pytest.raises(clattn.InvalidArgumentError, match="decreas"):
        CF.varlen_attention(q, k, v, [0, 13, 12], [0, 13, 12], 64, 64, device=device)
    with pytest.raises(clattn.ShapeMismatchError, match="past max_seqlen_q"):
        CF.varlen_attention(q, k, v, [0, 0, 12], [0, 0, 12], 3, 3, device=device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_gradients(device, causal):
    """query, key and value's gradients through varlen_attention against the oracle's per sequence, GQA, an empty
    sequence and (non-causal) one with queries and no keys"""
    lq, lk = [5, 0, 9, 3], [5, 0, 9, 3] if causal else [8, 2, 9, 0]
    cq = [0] + torch.tensor(lq).cumsum(0).tolist()
    ck = [0] + torch.tensor(lk).cumsum(0).tolist()
    g = torch.Generator().manual_seed(9)
    q = torch.randn(cq[-1], 4, 8, generator=g).requires_grad_(True)
    k = torch.randn(ck[-1], 2, 8, generator=g).requires_grad_(True)
    v = torch.randn(ck[-1], 2, 6, generator=g).requires_grad_(True)
    out = CF.varlen_attention(q, k, v, cq, ck, 9, 9, causal=causal, window=4 if causal else 0, device=device)
    want = varlen_oracle(q, k, v, cq, ck, causal, 4 if causal else 0)
    torch.testing.assert_close(out.double(), want.detach(), **FWD)
    same_grads(out, want, (q, k, v), 2)


# ---------------------------------------------------------------- rotary embeddings (clattn.functional.Rope)

def rope_inv_freq(dim, theta, scaling, factor, orig):
    """The rotary frequencies and the cos/sin factor as transformers writes them (modeling_rope_utils: default,
    linear, yarn with beta_fast 32, beta_slow 1 and truncation; NTK-aware as bloc97's base * factor^(d/(d-2))),
    here in float64."""
    base = theta * factor ** (dim / (dim - 2)) if scaling == "ntk" else theta
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    inv = 1.0 / pos_freqs
    if scaling == "linear":
        return inv / factor, 1.0
    if scaling != "yarn":
        return inv, 1.0

    def correction_dim(rot):
        return dim * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(base))

    low, high = max(math.floor(correction_dim(32)), 0), min(math.ceil(correction_dim(1)), dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    extrapolation = 1 - ramp
    inv = inv / factor * (1 - extrapolation) + inv * extrapolation
    return inv, (0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0)


def rope_reference(x, rope, positions=None):
    """x (B, L, H, E) rotated in float64 as transformers' apply_rotary_pos_emb (rotate_half: "half") or GPT-J's
    rotate_every_two ("interleaved"), positions 0 .. L-1 or the (B, L) positions given (transformers'
    position_ids); the values past rope.dims as they are."""
    x = x.double()
    dim = rope.dims or x.shape[-1]
    inv, m = rope_inv_freq(dim, rope.theta, rope.scaling, rope.factor, rope.original_max_position)
    if positions is None:
        positions = torch.arange(x.shape[1])[None, :].expand(x.shape[0], -1)
    ang = positions.double()[:, :, None] * inv[None, None, :]  # (B, L, dim/2)
    cos, sin = (m * ang.cos())[:, :, None, :], (m * ang.sin())[:, :, None, :]
    xr, rest = x[..., :dim], x[..., dim:]
    if rope.kind == "half":
        cos, sin = torch.cat([cos, cos], -1), torch.cat([sin, sin], -1)
        turned = torch.cat([-xr[..., dim // 2:], xr[..., :dim // 2]], -1)
    else:
        cos, sin = cos.repeat_interleave(2, -1), sin.repeat_interleave(2, -1)
        turned = torch.stack([-xr[..., 1::2], xr[..., ::2]], -1).flatten(-2)
    return torch.cat([xr * cos + turned * sin, rest], -1)


ROPES = {
    "half": CF.Rope(),
    "interleaved_partial": CF.Rope(kind="interleaved", dims=4, theta=500.0),
    "linear": CF.Rope(scaling="linear", factor=4.0),
    "ntk_partial": CF.Rope(dims=6, scaling="ntk", factor=2.0, theta=1e6),
    "yarn": CF.Rope(kind="interleaved", scaling="yarn", factor=8.0, original_max_position=16),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(ROPES))
def test_rope_matches_torch_reference(device, name):
    """attend(rope=...) against the reference rotation then the float64 oracle (torch's layout (B, H, L, E)):
    output and the gradients of query, key and value (through the rotation), GQA, causal with L != S"""
    rope = ROPES[name]
    q, k, v = inputs((2, 7, 4, 8), (2, 13, 2, 8), (2, 13, 2, 5), seed=5)
    out = CF.attend(q, k, v, causal=True, rope=rope, device=device)
    want = oracle(rope_reference(q, rope).transpose(1, 2), rope_reference(k, rope).transpose(1, 2),
                  v.double().transpose(1, 2), is_causal=True).transpose(1, 2)
    torch.testing.assert_close(out.double(), want.detach(), **FWD)
    same_grads(out, want, (q, k, v), 8)
    with torch.no_grad():  # inference (another plan), and without rope the same call differs
        torch.testing.assert_close(CF.attend(q, k, v, causal=True, rope=rope, device=device).double(), want, **FWD)
        assert not torch.allclose(CF.attend(q, k, v, causal=True, device=device).double(), want, **FWD)


@pytest.mark.parametrize("device", DEVICES)
def test_rope_varlen_each_sequence_from_zero(device):
    """varlen_attention(rope=...): each sequence rotated from position 0, as attend() on it alone; gradients too"""
    rope = CF.Rope(kind="interleaved", scaling="linear", factor=2.0)
    lq = [5, 0, 9, 3]
    cq = [0] + torch.tensor(lq).cumsum(0).tolist()
    g = torch.Generator().manual_seed(21)
    q = torch.randn(cq[-1], 4, 8, generator=g).requires_grad_(True)
    k = torch.randn(cq[-1], 2, 8, generator=g).requires_grad_(True)
    v = torch.randn(cq[-1], 2, 6, generator=g).requires_grad_(True)
    out = CF.varlen_attention(q, k, v, cq, cq, 9, 9, causal=True, rope=rope, device=device)
    rq = torch.cat([rope_reference(q[cq[b]:cq[b + 1]][None], rope)[0] for b in range(4)])
    rk = torch.cat([rope_reference(k[cq[b]:cq[b + 1]][None], rope)[0] for b in range(4)])
    want = varlen_oracle(rq, rk, v.double(), cq, cq, causal=True)
    torch.testing.assert_close(out.double(), want.detach(), **FWD)
    same_grads(out, want, (q, k, v), 4)


def left_padded_position_ids(attention_mask):
    """transformers' position_ids for a left-padded batch (its generate()): each entry's real tokens from 0, the
    padding at 1."""
    pos = attention_mask.long().cumsum(-1) - 1
    return pos.masked_fill(attention_mask == 0, 1)


@pytest.mark.parametrize("device", DEVICES)
def test_rope_at_position_ids(device):
    """attend(rope=..., position_ids=...): each row rotated at the position given, against the reference rotation at
    those positions then the float64 oracle: a left-padded entry (the padding hidden: positions shifted alike, which
    RoPE does not see), one of two documents packed (positions from 0 again), one of positions in the thousands,
    causal, GQA, with gradients, and the bucketed inference call; cross-attention's keys at key_position_ids (one
    row of positions for every batch entry)"""
    rope = CF.Rope(kind="half", scaling="yarn", factor=4.0, original_max_position=32)
    q, k, v = inputs((3, 9, 4, 8), (3, 9, 2, 8), (3, 9, 2, 5), seed=31)
    am = torch.ones(3, 9, dtype=torch.long)
    am[0, :3] = 0
    pos = left_padded_position_ids(am)
    pos[1] = torch.tensor([0, 1, 2, 3, 0, 1, 2, 3, 4])  # two documents in one row, as packed training gives them
    pos[2] = torch.arange(9) * 7 + 2500
    visible = (am[:, None, None, :] == 1) & torch.ones(9, 9, dtype=torch.bool).tril()  # (B, 1, L, S)
    out = CF.attend(q, k, v, visible, causal=True, rope=rope, position_ids=pos, device=device)
    want = oracle(rope_reference(q, rope, pos).transpose(1, 2), rope_reference(k, rope, pos).transpose(1, 2),
                  v.double().transpose(1, 2), mask=visible).transpose(1, 2)
    torch.testing.assert_close(out.double(), want.detach(), **FWD)
    same_grads(out, want, (q, k, v), 9)
    with torch.no_grad():
        torch.testing.assert_close(CF.attend(q, k, v, visible, causal=True, rope=rope, position_ids=pos,
                                             device=device).double(), want, **FWD)
        # rows 0 .. L-1 (no position_ids) differ on the entries whose positions are not a shift of them
        assert not torch.allclose(CF.attend(q, k, v, visible, causal=True, rope=rope, device=device).double(), want,
                                  **FWD)
    # cross-attention: 5 queries at 3000.., 13 keys at their own positions, every batch entry alike
    q, k, v = inputs((2, 5, 4, 8), (2, 13, 2, 8), (2, 13, 2, 6), seed=32)
    rope = CF.Rope(kind="interleaved", dims=6, theta=500.0)
    pq, pk = torch.arange(3000, 3005), torch.tensor([7, 3, 2999, 0, 1, 5, 4100, 8, 9, 9, 10, 3004, 2])
    out = CF.attend(q, k, v, rope=rope, position_ids=pq, key_position_ids=pk, device=device)
    want = oracle(rope_reference(q, rope, pq.expand(2, -1)).transpose(1, 2),
                  rope_reference(k, rope, pk.expand(2, -1)).transpose(1, 2), v.double().transpose(1, 2)).transpose(1, 2)
    torch.testing.assert_close(out.double(), want.detach(), **FWD)
    same_grads(out, want, (q, k, v), 10)


def test_position_ids_refusals():
    q, k, v = inputs((2, 3, 2, 6), (2, 3, 2, 6), (2, 3, 2, 6))
    rope, ok = CF.Rope(), torch.arange(3)
    for kw, err, msg in (
            (dict(position_ids=ok), clattn.InvalidArgumentError, "position_ids without rope"),
            (dict(rope=rope, key_position_ids=ok), clattn.InvalidArgumentError, "without position_ids"),
            (dict(rope=rope, position_ids=ok.float()), clattn.InvalidArgumentError, "positions are integers"),
            (dict(rope=rope, position_ids=torch.arange(4)), clattn.ShapeMismatchError, r"\(batch, length\) = \(2, 3\)"),
            (dict(rope=rope, position_ids=torch.tensor([0, -1, 2])), clattn.InvalidArgumentError, "0 .. 4194303"),
            (dict(rope=rope, position_ids=torch.tensor([0, 2 ** 22, 2])), clattn.InvalidArgumentError,
             "0 .. 4194303")):
        with pytest.raises(err, match=msg):
            CF.attend(q, k, v, device="ref", **kw)
    torch.testing.assert_close(CF.attend(q, k, v, rope=rope, position_ids=ok[None] + 5, device="ref"),
                               CF.attend(q, k, v, rope=rope, position_ids=(ok + 5).expand(2, -1), device="ref"))
    with pytest.raises(clattn.InvalidArgumentError, match="contiguous 1-D int32"):  # the operator's own check
        CF._attend_impl(q.detach(), k.detach(), v.detach(), None, False, 0, 0.5, 0.0, 0, False, "ref",
                        CF._rope_spec(rope), pos=torch.zeros(5, dtype=torch.int64))
    with pytest.raises(clattn.ShapeMismatchError, match="key_position_ids is needed"):
        CF.attend(q, k[:, :2], v[:, :2], rope=rope, position_ids=ok, device="ref")


def test_rope_refusals():
    q, k, v = inputs((1, 3, 2, 6), (1, 3, 2, 6), (1, 3, 2, 6))
    with pytest.raises(clattn.InvalidArgumentError, match="the kinds are 'half'"):
        CF.Rope(kind="neox")
    with pytest.raises(clattn.InvalidArgumentError, match="'linear', 'ntk' or 'yarn'"):
        CF.Rope(scaling="dynamic")
    with pytest.raises(clattn.InvalidArgumentError, match=r"pass clattn.Rope\("):
        CF.attend(q, k, v, rope={"kind": "half"}, device="ref")
    with pytest.raises(clattn.ShapeMismatchError, match=r"rope.dims \(8\) exceeds head_dim_qk \(6\)"):
        CF.attend(q, k, v, rope=CF.Rope(dims=8), device="ref")
    with pytest.raises(clattn.InvalidArgumentError, match="YARN needs rope.original_max_position"):
        CF.attend(q, k, v, rope=CF.Rope(scaling="yarn", factor=2.0), device="ref")


@pytest.mark.parametrize("device", DEVICES)
def test_rope_in_attention_module_and_decoder(device):
    """clattn.Attention(rope=...) and clattn.Decoder(rope=...), a Llama-style block (GQA, biases on Q and K, partial
    rotary dims, YaRN) against torch: the projections, the reference rotation and the oracle in float64; the
    module's backward (every weight's gradient and x's) against autograd's through the same reference; the decoder's
    prompt and steps equal to the one causal run"""
    rope = clattn.Rope(kind="half", dims=4, scaling="yarn", factor=4.0, original_max_position=8)
    g = torch.Generator().manual_seed(17)
    E, Hq, Hk, D, T = 16, 4, 2, 6, 11
    w = {"w_query": torch.randn(Hq * D, E, generator=g) * 0.4, "w_key": torch.randn(Hk * D, E, generator=g) * 0.4,
         "w_value": torch.randn(Hk * D, E, generator=g) * 0.4, "w_out": torch.randn(E, Hq * D, generator=g) * 0.3,
         "b_query": torch.randn(Hq * D, generator=g) * 0.2, "b_key": torch.randn(Hk * D, generator=g) * 0.2}
    x = torch.randn(2, T, E, generator=g)
    w64 = {k: v.double().requires_grad_(True) for k, v in w.items()}
    x64 = x.double().requires_grad_(True)

    def reference(xx):
        B, L, _ = xx.shape
        q = (xx @ w64["w_query"].T + w64["b_query"]).view(B, L, Hq, D)
        k = (xx @ w64["w_key"].T + w64["b_key"]).view(B, L, Hk, D)
        v = (xx @ w64["w_value"].T).view(B, L, Hk, D)
        o = oracle(rope_reference(q, rope).transpose(1, 2), rope_reference(k, rope).transpose(1, 2),
                   v.transpose(1, 2), is_causal=True)
        return o.transpose(1, 2).reshape(B, L, Hq * D) @ w64["w_out"].T

    want = reference(x64)
    npw = {k: v.numpy() for k, v in w.items()}
    attn = clattn.Attention(Hq, kv_heads=Hk, head_dim_qk=D, causal=True, rope=rope, device=device, **npw)
    assert "rope=Rope(" in repr(attn)
    out, _ = attn(x.numpy())
    torch.testing.assert_close(torch.from_numpy(out).double(), want.detach(), **FWD)
    dout = torch.randn(want.shape, generator=g)
    grads = attn.backward(x.numpy(), dout.numpy())
    exp = torch.autograd.grad(want, [x64] + list(w64.values()), dout.double())
    for name, e in zip(["x"] + list(w64), exp):
        torch.testing.assert_close(torch.from_numpy(grads[name]).double(), e, **GRAD, msg=lambda m: f"{name}: {m}")
    dec = clattn.Decoder(Hq, kv_heads=Hk, head_dim_qk=D, batch=2, capacity=16, max_new_tokens=4, rope=rope,
                         device=device, **npw)
    xs = x.numpy()
    steps = [dec(xs[:, :4])] + [dec(xs[:, t:t + 1]) for t in range(4, T)]
    torch.testing.assert_close(torch.from_numpy(np.concatenate(steps, axis=1)).double(), want.detach(), **FWD)
    with pytest.raises(clattn.InvalidArgumentError, match="pass clattn.Rope"):
        clattn.Attention(Hq, kv_heads=Hk, head_dim_qk=D, rope="half", **npw)


def gqa_weights(g, E, Hq, Hk, D):
    """A GQA block's weights (float32 torch tensors): Q, K and V projections, the output projection, a key bias."""
    return {"w_query": torch.randn(Hq * D, E, generator=g) * 0.4, "w_key": torch.randn(Hk * D, E, generator=g) * 0.4,
            "w_value": torch.randn(Hk * D, E, generator=g) * 0.4, "w_out": torch.randn(E, Hq * D, generator=g) * 0.3,
            "b_key": torch.randn(Hk * D, generator=g) * 0.2}


@pytest.mark.parametrize("device", DEVICES)
def test_rope_module_at_position_ids(device):
    """clattn.Attention(rope=...) called with position_ids (clattn 0.8): self-attention with two documents packed in
    one row and an entry at positions in the thousands, against the projections, the reference rotation at those
    positions and the oracle in float64; forward_train and backward with the same positions (every gradient against
    autograd's); the sequence-first layout and one sequence; cross-attention's keys at key_position_ids; the
    refusals"""
    rope = clattn.Rope(kind="interleaved", dims=4, theta=500.0)
    g = torch.Generator().manual_seed(29)
    E, Hq, Hk, D, T = 12, 4, 2, 6, 9
    w = gqa_weights(g, E, Hq, Hk, D)
    w64 = {k: v.double().requires_grad_(True) for k, v in w.items()}
    pos = torch.stack((torch.tensor([0, 1, 2, 3, 0, 1, 2, 3, 4]), torch.arange(T) * 5 + 3000))

    def reference(xx, kvx=None, pq=pos, pk=pos, causal=True):
        kvx = xx if kvx is None else kvx
        B, L, S = xx.shape[0], xx.shape[1], kvx.shape[1]
        q = (xx @ w64["w_query"].T).view(B, L, Hq, D)
        k = (kvx @ w64["w_key"].T + w64["b_key"]).view(B, S, Hk, D)
        v = (kvx @ w64["w_value"].T).view(B, S, Hk, D)
        o = oracle(rope_reference(q, rope, pq).transpose(1, 2), rope_reference(k, rope, pk).transpose(1, 2),
                   v.transpose(1, 2), is_causal=causal)
        return o.transpose(1, 2).reshape(B, L, Hq * D) @ w64["w_out"].T

    x = torch.randn(2, T, E, generator=g)
    x64 = x.double().requires_grad_(True)
    want = reference(x64)
    npw = {k: v.numpy() for k, v in w.items()}
    attn = clattn.Attention(Hq, kv_heads=Hk, head_dim_qk=D, causal=True, rope=rope, device=device, **npw)
    out, _ = attn(x.numpy(), position_ids=pos.numpy())
    torch.testing.assert_close(torch.from_numpy(out).double(), want.detach(), **FWD)
    # rows at 0 .. T-1 (no position_ids) differ: the positions are not a shift of them
    assert not np.allclose(attn(x.numpy())[0], out, rtol=1e-4, atol=1e-5)
    out_t, lse, ctx = attn.forward_train(x.numpy(), position_ids=pos)  # (a torch tensor of positions too)
    torch.testing.assert_close(torch.from_numpy(np.asarray(out_t)).double(), want.detach(), **FWD)
    dout = torch.randn(want.shape, generator=g)
    exp = torch.autograd.grad(want, [x64] + list(w64.values()), dout.double())
    for saved in ({}, {"lse": lse, "context": ctx}):
        grads = attn.backward(x.numpy(), dout.numpy(), position_ids=pos.numpy(), **saved)
        for name, e in zip(["x"] + list(w64), exp):
            torch.testing.assert_close(torch.from_numpy(grads[name]).double(), e, **GRAD,
                                       msg=lambda m: f"{name}: {m}")
    # sequence first (positions stay (batch, length)), and one sequence with (T,) positions
    seq = clattn.Attention(Hq, kv_heads=Hk, head_dim_qk=D, causal=True, rope=rope, batch_first=False,
                           device=device, **npw)
    got, _ = seq(np.ascontiguousarray(x.numpy().transpose(1, 0, 2)), position_ids=pos.numpy())
    torch.testing.assert_close(torch.from_numpy(got.transpose(1, 0, 2)).double(), want.detach(), **FWD)
    one, _ = attn(x.numpy()[1], position_ids=pos.numpy()[1])
    torch.testing.assert_close(torch.from_numpy(one).double(), want[1].detach(), **FWD)
    # cross-attention: 9 queries, 7 keys at positions of their own, one row of positions for every batch entry
    kvx = torch.randn(2, 7, E, generator=g)
    pk = torch.tensor([7, 3, 2999, 0, 1, 4100, 8])
    cross = clattn.Attention(Hq, kv_heads=Hk, head_dim_qk=D, rope=rope, device=device, **npw)
    got, _ = cross(x.numpy(), kvx.numpy(), position_ids=pos.numpy(), key_position_ids=pk.numpy())
    torch.testing.assert_close(torch.from_numpy(got).double(),
                               reference(x.double(), kvx.double(), pos, pk.expand(2, -1), causal=False), **FWD)
    # keys as many as the queries: key_position_ids defaults to position_ids
    kv9 = torch.randn(2, T, E, generator=g)
    got, _ = cross(x.numpy(), kv9.numpy(), position_ids=pos.numpy())
    torch.testing.assert_close(torch.from_numpy(got).double(), reference(x.double(), kv9.double(), causal=False),
                               **FWD)
    plain = clattn.Attention(Hq, kv_heads=Hk, head_dim_qk=D, device=device, **npw)
    for mod, kw, err, msg in (
            (plain, dict(position_ids=pos.numpy()), clattn.InvalidArgumentError, "position_ids without rope"),
            (attn, dict(key_position_ids=pos.numpy()), clattn.InvalidArgumentError, "without position_ids"),
            (attn, dict(position_ids=pos.numpy(), key_position_ids=pos.numpy()), clattn.InvalidArgumentError,
             "self-attention's keys"),
            (attn, dict(position_ids=pos.numpy() * 1.0), clattn.InvalidArgumentError, "positions are integers"),
            (attn, dict(position_ids=pos.numpy() > 0), clattn.InvalidArgumentError, "positions are integers"),
            (attn, dict(position_ids=np.arange(T + 1)), clattn.ShapeMismatchError, r"\(batch, length\) = \(2, 9\)"),
            (attn, dict(position_ids=np.stack((pos.numpy()[0],) * 3)), clattn.ShapeMismatchError, "= \\(2, 9\\)"),
            (attn, dict(position_ids=np.arange(T) - 1), clattn.InvalidArgumentError, "0 .. 4194303"),
            (attn, dict(position_ids=np.arange(T) + 2 ** 22 - 8), clattn.InvalidArgumentError, "0 .. 4194303")):
        with pytest.raises(err, match=msg):
            mod(x.numpy(), **kw)
    with pytest.raises(clattn.ShapeMismatchError, match="key_position_ids is needed"):
        cross(x.numpy(), kvx.numpy(), position_ids=pos.numpy())
    with pytest.raises(clattn.InvalidArgumentError, match="without position_ids"):
        attn.backward(x.numpy(), dout.numpy(), key_position_ids=pos.numpy())
    # the largest position taken
    top, _ = attn(x.numpy(), position_ids=np.arange(T) + 2 ** 22 - T)
    torch.testing.assert_close(torch.from_numpy(top).double(),
                               reference(x.double(), pq=(torch.arange(T) + 2 ** 22 - T).expand(2, -1),
                                         pk=(torch.arange(T) + 2 ** 22 - T).expand(2, -1)), **FWD)


@pytest.mark.parametrize("device", DEVICES)
def test_decoder_at_position_ids(device):
    """clattn.Decoder(rope=...) with position_ids (clattn 0.8): each step's tokens at the positions it gives, not at
    their cache slots (packed documents' positions in one sequence, positions in the thousands in the other), a prompt
    and single steps, then packed steps (cu_seqlens, one position per row), against the projections, the reference
    rotation at those positions and the oracle's causal attention in float64; the refusals"""
    rope = clattn.Rope(kind="half", dims=4, theta=500.0)
    g = torch.Generator().manual_seed(31)
    E, Hq, Hk, D, T = 12, 4, 2, 6, 9
    w = gqa_weights(g, E, Hq, Hk, D)
    w64 = {k: v.double() for k, v in w.items()}
    pos = torch.stack((torch.tensor([0, 1, 2, 3, 0, 1, 2, 3, 4]), torch.arange(T) * 5 + 3000))
    x = torch.randn(2, T, E, generator=g)
    B, L = x.shape[:2]
    q = (x.double() @ w64["w_query"].T).view(B, L, Hq, D)
    k = (x.double() @ w64["w_key"].T + w64["b_key"]).view(B, L, Hk, D)
    v = (x.double() @ w64["w_value"].T).view(B, L, Hk, D)
    o = oracle(rope_reference(q, rope, pos).transpose(1, 2), rope_reference(k, rope, pos).transpose(1, 2),
               v.transpose(1, 2), is_causal=True)
    want = o.transpose(1, 2).reshape(B, L, Hq * D) @ w64["w_out"].T
    npw = {k: v.numpy() for k, v in w.items()}
    xs, ps = x.numpy(), pos.numpy()

    def decoder():
        return clattn.Decoder(Hq, kv_heads=Hk, head_dim_qk=D, batch=2, capacity=16, max_new_tokens=4, rope=rope,
                              device=device, **npw)

    dec = decoder()
    steps = [dec(xs[:, :4], position_ids=ps[:, :4])] + [dec(xs[:, t:t + 1], position_ids=ps[:, t:t + 1])
                                                         for t in range(4, T)]
    torch.testing.assert_close(torch.from_numpy(np.concatenate(steps, axis=1)).double(), want, **FWD)
    dflt = decoder()  # at the cache slots, the numbers differ: the positions are not a shift of the slots
    slots = [dflt(xs[:, :4])] + [dflt(xs[:, t:t + 1]) for t in range(4, T)]
    assert not np.allclose(np.concatenate(slots, axis=1), np.concatenate(steps, axis=1), rtol=1e-4, atol=1e-5)
    # packed steps: sequence 0 brings 3, 4, then 2 tokens, sequence 1 brings 4, 1, then 4; one position per row
    dec = decoder()
    got = [[], []]
    for cut in ((3, 4), (4, 1), (2, 4)):
        done = [sum(a.shape[0] for a in got[b]) for b in range(2)]
        rows = np.concatenate([xs[b, done[b]:done[b] + cut[b]] for b in range(2)])
        rp = np.concatenate([ps[b, done[b]:done[b] + cut[b]] for b in range(2)])
        cu = [0, cut[0], cut[0] + cut[1]]
        out = dec(rows, cu_seqlens=cu, position_ids=rp)
        got[0].append(out[:cut[0]]), got[1].append(out[cut[0]:])
    for b in range(2):
        torch.testing.assert_close(torch.from_numpy(np.concatenate(got[b])).double(), want[b], **FWD)
    # padded steps with valid: sequence 0 brings 2, 4, then 3 tokens, sequence 1 brings 4, 4, then 1 (its padding
    # rows given position 0: read, unused)
    dec = decoder()
    got = [[], []]
    for cut in ((2, 4), (4, 4), (3, 1)):
        done = [sum(a.shape[0] for a in got[b]) for b in range(2)]
        n = max(cut)
        xb, pb = np.zeros((2, n, E), np.float32), np.zeros((2, n), np.int64)
        for b in range(2):
            xb[b, :cut[b]], pb[b, :cut[b]] = xs[b, done[b]:done[b] + cut[b]], ps[b, done[b]:done[b] + cut[b]]
        out = dec(xb, valid=list(cut), position_ids=pb)
        got[0].append(out[0, :cut[0]]), got[1].append(out[1, :cut[1]])
    for b in range(2):
        torch.testing.assert_close(torch.from_numpy(np.concatenate(got[b])).double(), want[b], **FWD)
    plain = clattn.Decoder(Hq, kv_heads=Hk, head_dim_qk=D, batch=2, capacity=16, max_new_tokens=4, device=device,
                           **npw)
    for mod, kw, err, msg in (
            (plain, dict(position_ids=ps[:, :2]), clattn.InvalidArgumentError, "position_ids without rope"),
            (dec, dict(position_ids=ps[:, :3]), clattn.ShapeMismatchError, r"\(batch, length\) = \(2, 2\)"),
            (dec, dict(position_ids=ps[:, :2] * 1.0), clattn.InvalidArgumentError, "positions are integers"),
            (dec, dict(position_ids=ps[:, :2] - 3000), clattn.InvalidArgumentError, "0 .. 4194303")):
        with pytest.raises(err, match=msg):
            mod(xs[:, :2], **kw)
    with pytest.raises(clattn.ShapeMismatchError, match=r"\(batch, length\) = \(1, 3\)"):
        dec(xs[0, :3], cu_seqlens=[0, 1, 3], position_ids=ps[0, :2])
    assert dec.lengths == [9, 9]  # the refusals appended nothing


@pytest.mark.parametrize("device", DEVICES)
def test_decoder_tree_with_rope(device):
    """A verify step's draft tree with rope (clattn 0.8): the drafts at the length + their depths (position_ids); each
    draft's output equals the last row of one causal run over the context and its path from the root; accept() keeps
    a branch that is not a prefix of the step, and the step after it equals the causal run over the context, the
    branch and the new token (the float64 reference); without positions the tree is refused"""
    rope = clattn.Rope(kind="interleaved", theta=500.0)
    g = torch.Generator().manual_seed(37)
    E, Hq, Hk, D = 12, 4, 2, 6
    w = {"w_query": torch.randn(Hq * D, E, generator=g) * 0.4, "w_key": torch.randn(Hk * D, E, generator=g) * 0.4,
         "w_value": torch.randn(Hk * D, E, generator=g) * 0.4, "b_key": torch.randn(Hk * D, generator=g) * 0.2}
    w64 = {k: v.double() for k, v in w.items()}

    def last_row(rows):  # the causal run over rows (L, E), its last row
        L = rows.shape[0]
        q = (rows.double() @ w64["w_query"].T).view(1, L, Hq, D)
        k = (rows.double() @ w64["w_key"].T + w64["b_key"]).view(1, L, Hk, D)
        v = (rows.double() @ w64["w_value"].T).view(1, L, Hk, D)
        o = oracle(rope_reference(q, rope).transpose(1, 2), rope_reference(k, rope).transpose(1, 2),
                   v.transpose(1, 2), is_causal=True)
        return o.transpose(1, 2).reshape(L, Hq * D)[-1]

    ctx, drafts, nxt = (torch.randn(n, E, generator=g) for n in (4, 5, 1))
    parent = [-1, 0, 0, 1, 3]
    paths, depth = [], []
    for i in range(5):
        path, a = [], i
        while a >= 0:
            path.insert(0, a)
            a = parent[a]
        paths.append(path), depth.append(len(path) - 1)
    tree = np.zeros((5, 5), bool)
    for i, path in enumerate(paths):
        tree[i, path] = True
    dec = clattn.Decoder(Hq, kv_heads=Hk, head_dim_qk=D, capacity=16, max_new_tokens=5, rope=rope, device=device,
                         **{k: v.numpy() for k, v in w.items()})
    dec(ctx.numpy()[None])
    with pytest.raises(clattn.UnsupportedError, match="tree_mask with rope and no"):
        dec(drafts.numpy()[None], tree_mask=tree)
    out = dec(drafts.numpy()[None], tree_mask=tree, position_ids=4 + np.array(depth))
    for i, path in enumerate(paths):
        torch.testing.assert_close(torch.from_numpy(out[0, i]).double(), last_row(torch.cat((ctx, drafts[path]))),
                                   **FWD, msg=lambda m: f"draft {i}: {m}")
    dec.accept([4], [[0, 1, 3]])  # not a prefix of the step: draft 2 dropped
    assert dec.lengths == [7]
    got = dec(nxt.numpy()[None])
    torch.testing.assert_close(torch.from_numpy(got[0, 0]).double(),
                               last_row(torch.cat((ctx, drafts[[0, 1, 3]], nxt))), **FWD)
    dec(drafts.numpy()[:2], cu_seqlens=[0, 2])  # a packed step at its slots: a prefix only
    with pytest.raises(clattn.InvalidArgumentError, match="keep a prefix of a step at its slots"):
        dec.accept([8], [[1]])
    # a chain given positions (an offset p0 = 100, as transformers' position_ids): moving a token is refused too
    dec.accept([8], [[]])
    dec(drafts.numpy()[None, :3], position_ids=100 + 8 + np.arange(3))
    with pytest.raises(clattn.InvalidArgumentError, match="draft 2 was rotated at position 110 and would sit where "
                                                          "position 109 belongs"):
        dec.accept([8], [[0, 2]])
    with pytest.raises(clattn.InvalidArgumentError, match="is not the length before the last step"):
        dec.accept([7], [[0, 2]])
    dec.accept([8], [[0, 1]])  # a prefix: nothing moves
    assert dec.lengths == [10]


def test_rope_option_changes_and_branches():
    """Attention.rope set after construction takes effect (a new plan), and a half module's float32 twin follows it;
    Rope refuses non-finite numbers; a Decoder with rope keeps only prefixes of a step (accept)."""
    g = torch.Generator().manual_seed(23)
    E, Hq, D = 8, 2, 4
    w = {k: (torch.randn(Hq * D, E, generator=g) * 0.4).numpy() for k in ("w_query", "w_key", "w_value")}
    x = torch.randn(1, 6, E, generator=g).numpy()
    plain = clattn.Attention(Hq, head_dim_qk=D, causal=True, device="ref", **w)
    rotated = clattn.Attention(Hq, head_dim_qk=D, causal=True, device="ref", rope=clattn.Rope(), **w)
    before = plain(x)[0]
    plain.rope = clattn.Rope()
    np.testing.assert_array_equal(plain(x)[0], rotated(x)[0])
    assert not np.allclose(before, rotated(x)[0])
    with pytest.raises(clattn.InvalidArgumentError, match="pass clattn.Rope"):
        plain.rope = "half"
    half = clattn.Attention(Hq, head_dim_qk=D, causal=True, device="ref", dtype="float16", **w)
    half.rope = clattn.Rope()
    assert half._trainer().rope == clattn.Rope()
    for bad in (dict(theta=float("inf")), dict(factor=float("nan"), scaling="linear")):
        with pytest.raises(clattn.InvalidArgumentError, match="must be finite"):
            clattn.Rope(**bad)
    dec = clattn.Decoder(Hq, head_dim_qk=D, capacity=8, max_new_tokens=3, rope=clattn.Rope(), device="ref", **w)
    dec(x[:, :3])
    with pytest.raises(clattn.InvalidArgumentError, match="keep a prefix of a step at its slots"):
        dec.accept([0], [[0, 2]])
    dec.accept([0], [[0, 1]])
    assert dec.lengths == [2]


def sinks_reference(x, w, heads, kv_heads, sinks, causal=False, window=0, kpm=None):
    """gpt-oss's eager attention in float64 torch: Q, K, V from nn.Linear weights (w: w_query, w_key, w_value, w_out,
    b_out), each head's sink logit concatenated to its rows' scaled, masked scores as one more column, the softmax over
    them, the sink's column dropped (it has no value), then the output projection."""
    x = torch.as_tensor(x).double()
    B, T, _ = x.shape
    d = w["w_query"].shape[0] // heads
    q = (x @ torch.as_tensor(w["w_query"]).double().T).view(B, T, heads, d).transpose(1, 2)
    k = (x @ torch.as_tensor(w["w_key"]).double().T).view(B, T, kv_heads, d).transpose(1, 2)
    v = (x @ torch.as_tensor(w["w_value"]).double().T).view(B, T, kv_heads, -1).transpose(1, 2)
    k, v = k.repeat_interleave(heads // kv_heads, 1), v.repeat_interleave(heads // kv_heads, 1)
    s = q @ k.transpose(-1, -2) / math.sqrt(d)
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    hidden = torch.zeros(T, T, dtype=torch.bool)
    if causal:
        hidden |= j > i
    if window:
        hidden |= i - j >= window
    s = s.masked_fill(hidden, -math.inf)
    if kpm is not None:
        s = s.masked_fill(torch.as_tensor(kpm)[:, None, None, :], -math.inf)
    col = torch.as_tensor(sinks).double().view(1, heads, 1, 1).expand(B, heads, T, 1)
    p = torch.softmax(torch.cat([s, col], -1), -1)[..., :-1]
    p = torch.nan_to_num(p, nan=0.0)  # a row with no visible key and no sink: clattn's 0 where torch gives NaN
    out = (p @ v).transpose(1, 2).reshape(B, T, -1)
    return out @ torch.as_tensor(w["w_out"]).double().T + torch.as_tensor(w["b_out"]).double()


@pytest.mark.parametrize("device", DEVICES)
def test_attention_sinks_match_gpt_oss(device):
    """clattn.Attention(sinks=...) against gpt-oss's formula written above: GQA, causal with a sliding window, a padded
    batch entry, a head without a sink (-inf) and one whose sink outweighs its keys; a bfloat16 module on the same
    (rounded) numbers; set_weights with new sinks; training with them fixed (forward_train, backward: the gradients of
    x and every weight); what 0.8 does not compute with sinks refused by name"""
    g = torch.Generator().manual_seed(43)
    B, T, E, H, HK, d = 2, 11, 16, 4, 2, 4
    w = dict(w_query=torch.randn(H * d, E, generator=g) * 0.4, w_key=torch.randn(HK * d, E, generator=g) * 0.4,
             w_value=torch.randn(HK * d, E, generator=g) * 0.4, w_out=torch.randn(E, H * d, generator=g) * 0.4,
             b_out=torch.randn(E, generator=g) * 0.1)
    sinks = torch.tensor([-math.inf, 0.5, 3.0, -1.0])
    x = torch.randn(B, T, E, generator=g)
    kpm = torch.zeros(B, T, dtype=torch.bool)
    kpm[1, :3] = True
    a = clattn.Attention(H, kv_heads=HK, causal=True, window=5, sinks=sinks, device=device, **w)
    out, _ = a(x, key_padding_mask=kpm)
    want = sinks_reference(x, w, H, HK, sinks, causal=True, window=5, kpm=kpm)
    torch.testing.assert_close(out.double(), want, **FWD)
    plain, _ = clattn.Attention(H, kv_heads=HK, causal=True, window=5, device=device, **w)(x, key_padding_mask=kpm)
    assert not torch.allclose(plain.double(), want, **FWD)  # the sinks change every head but the first
    # a bfloat16 module: its weights, sinks and input rounded once, its output once (README, "Data types")
    rw = {k: v.bfloat16().float() for k, v in w.items()}
    half = clattn.Attention(H, kv_heads=HK, causal=True, sinks=sinks.bfloat16(), dtype="bfloat16", device=device, **w)
    got = half(x.bfloat16())[0]
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.double(), sinks_reference(x.bfloat16().float(), rw, H, HK, sinks, causal=True),
                               rtol=2 ** -7, atol=1e-3)
    # new sinks through set_weights (every weight the module has, sinks among them)
    other = torch.tensor([1.0, -math.inf, -2.0, 6.0])
    with pytest.raises(clattn.InvalidArgumentError, match="sinks is missing"):
        a.set_weights(**w)
    a.set_weights(**w, sinks=other)
    torch.testing.assert_close(a(x, key_padding_mask=kpm)[0].double(),
                               sinks_reference(x, w, H, HK, other, causal=True, window=5, kpm=kpm), **FWD)
    with pytest.raises(clattn.ShapeMismatchError, match="sinks: 3 values, expected one per query head"):
        clattn.Attention(H, kv_heads=HK, sinks=torch.zeros(3), device=device, **w)
    with pytest.raises(clattn.InvalidArgumentError, match=r"weights.sinks\[1\] is nan"):
        clattn.Attention(H, kv_heads=HK, sinks=torch.tensor([0.0, math.nan, 0.0, 0.0]), device=device, **w)(x)
    # training with the sinks fixed: forward_train's output, backward's gradients of x and of every weight
    x64 = x.double().requires_grad_(True)
    w64 = {k: t.double().requires_grad_(True) for k, t in w.items()}
    want = sinks_reference(x64, w64, H, HK, other, causal=True, window=5)
    out_t, lse, ctx = a.forward_train(x)
    torch.testing.assert_close(torch.as_tensor(out_t).double(), want.detach(), **FWD)
    dout = torch.randn(want.shape, generator=g)
    for given in (dict(lse=lse, context=ctx), {}):  # the forward's statistics, or computed again with the sinks
        grads = a.backward(x, dout, **given)
        exp = torch.autograd.grad(want, [x64] + list(w64.values()), dout.double(), retain_graph=True)
        for name, e in zip(["x"] + list(w64), exp):
            torch.testing.assert_close(torch.as_tensor(grads[name]).double(), e, **GRAD,
                                       msg=lambda m: f"grad {name} ({'given' if given else 'again'}): {m}")
    with pytest.raises(clattn.UnsupportedError, match="sinks with need_weights"):
        a(x, need_weights=True)


def sdpa_sinks_reference(q, k, v, sinks, mask=None, is_causal=False):
    """(B, H, L, E) heads: gpt-oss's eager attention in float64 (the sink a column of the logits, dropped after the
    softmax); a row with no visible key and no sink gives 0."""
    q, k, v = q.double(), k.double(), v.double()
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    L, S = s.shape[-2:]
    if is_causal:
        s = s.masked_fill(~torch.ones(L, S, dtype=torch.bool).tril(), float("-inf"))
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    col = torch.as_tensor(sinks).double().view(1, -1, 1, 1).expand(s.shape[0], -1, L, 1)
    return torch.softmax(torch.cat([s, col], -1), -1)[..., :-1].nan_to_num(0.0) @ v


@pytest.mark.parametrize("device", DEVICES)
def test_attend_sinks(device):
    """attend(sinks=...) in inference against gpt-oss's formula: causal GQA, a decode-like call (one query, keys
    bucketed: the padded keys hidden), a bool mask with a row that sees no key, half inputs (the sinks rounded to
    their type); training with the sinks fixed (query, key and value's gradients); a sink that requires grad and the
    wrong shape refused (threads: test_plan_state_is_each_calls_own)"""
    q, k, v = inputs((2, 9, 4, 8), (2, 9, 2, 8), (2, 9, 2, 5), seed=47)
    sinks = torch.tensor([-math.inf, 0.25, 2.0, -1.5])
    with torch.no_grad():
        out = CF.attend(q, k, v, causal=True, sinks=sinks, device=device)
        want = sdpa_sinks_reference(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), sinks,
                                    is_causal=True).transpose(1, 2)
        torch.testing.assert_close(out.double(), want, **FWD)
        one = CF.attend(q[:, 8:], k, v, sinks=sinks, device=device)  # one query: the bucketed plan
        torch.testing.assert_close(one.double(), want[:, 8:], **FWD)
        mask = torch.ones(2, 1, 9, 9, dtype=torch.bool)
        mask[1, :, 2] = False  # entry 1's row 2 sees no key
        got = CF.attend(q, k, v, mask, sinks=sinks, device=device)
        ref = sdpa_sinks_reference(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), sinks, mask=mask)
        torch.testing.assert_close(got.double(), ref.transpose(1, 2), **FWD)
        assert torch.all(got[1, 2] == 0)
        hq, hk, hv, hs = q.bfloat16(), k.bfloat16(), v.bfloat16(), sinks.bfloat16()
        half = CF.attend(hq, hk, hv, causal=True, sinks=sinks, device=device)
        assert half.dtype == torch.bfloat16
        ref = sdpa_sinks_reference(hq.transpose(1, 2), hk.transpose(1, 2), hv.transpose(1, 2), hs.float(),
                                   is_causal=True).transpose(1, 2)
        torch.testing.assert_close(half.double(), ref, rtol=2 ** -7, atol=1e-3)
    # training with the sinks held fixed: the output and query, key and value's gradients against the formula's
    out = CF.attend(q, k, v, causal=True, sinks=sinks, device=device)
    want = sdpa_sinks_reference(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), sinks,
                                is_causal=True).transpose(1, 2)
    torch.testing.assert_close(out.double(), want.detach(), **FWD)
    same_grads(out, want, (q, k, v), 31)
    sq = q.detach()[:, :, :2].clone().requires_grad_(True)  # two heads of a GQA pair, cross lengths, dropout off
    out = CF.attend(sq, k[:, :5, :1], v[:, :5, :1], sinks=sinks[2:], device=device)
    want = sdpa_sinks_reference(sq.transpose(1, 2), k[:, :5, :1].transpose(1, 2), v[:, :5, :1].transpose(1, 2),
                                sinks[2:]).transpose(1, 2)
    same_grads(out, want, (sq,), 32, names="q")
    with pytest.raises(clattn.UnsupportedError, match="sinks that require grad"):  # learned: no gradient of its own
        CF.attend(q.detach(), k.detach(), v.detach(), sinks=sinks.clone().requires_grad_(), device=device)
    with torch.no_grad(), pytest.raises(clattn.ShapeMismatchError, match=r"sinks: \(3,\), expected one logit"):
        CF.attend(q, k, v, sinks=sinks[:3], device=device)


class RaceForcer:
    """Makes the race between setting a plan's per-call state (its dropout seed, its sinks) and running the plan
    happen whenever the code leaves room for it: each run (the library's plan_execute and plan_backward) first waits,
    up to `wait` seconds, until another thread has set a plan's state since this thread last did. Without a lock over
    set-and-run, the other thread's state then reaches this call; with one, the other thread waits on that lock, and
    the wait times out."""

    def __init__(self, monkeypatch, wait=0.4):
        from clattn import _lib
        self.cond, self.last, self.wait = threading.Condition(), None, wait
        for name in ("plan_set_seed", "plan_set_weights"):
            monkeypatch.setattr(_lib, name, self._setter(getattr(_lib, name)))
        for name in ("plan_execute", "plan_backward"):
            monkeypatch.setattr(_lib, name, self._runner(getattr(_lib, name)))

    def _setter(self, real):
        def setter(*a):
            got = real(*a)
            with self.cond:
                self.last = threading.get_ident()
                self.cond.notify_all()
            return got
        return setter

    def _runner(self, real):
        def runner(*a):
            me = threading.get_ident()
            with self.cond:
                self.cond.wait_for(lambda: self.last not in (None, me), timeout=self.wait)
            return real(*a)
        return runner


def test_plan_state_is_each_calls_own(monkeypatch):
    """Two threads on one shared plan, each call with its own dropout seed (attend and varlen_attention, forward and
    backward; the Attention module's forward_train and backward with seed=) or its own sinks (attend): each call
    gives exactly what it gives alone. The race is forced (RaceForcer): without the plan's lock held from setting its
    state to the end of the run (_plan_state), a call of each pair would run with the other thread's seed or
    sinks."""
    device = DEVICES[-1]
    mine = threading.local()  # each thread's dropout seed, as torch's generator would draw it
    real_randint = torch.randint
    monkeypatch.setattr(torch, "randint", lambda *a, **kw: torch.tensor([mine.seed]) if getattr(mine, "seed", None)
                        else real_randint(*a, **kw))
    q0, k0, v0 = inputs((2, 9, 4, 8), (2, 9, 2, 8), (2, 9, 2, 5), seed=48)
    sinks = torch.tensor([-math.inf, 0.25, 2.0, -1.5])
    cq, ck = [0, 5, 14], [0, 7, 16]
    g = torch.Generator().manual_seed(3)
    qv, kv_, vv = (torch.randn(n, h, d, generator=g) for n, h, d in ((14, 4, 8), (16, 2, 8), (16, 2, 6)))
    E, H = 12, 3
    w = {"w_query": torch.randn(E, E, generator=g), "w_key": torch.randn(E, E, generator=g),
         "w_value": torch.randn(E, E, generator=g), "w_out": torch.randn(E, E, generator=g)}
    module = clattn.Attention(H, dropout=0.3, device=device, **{k: t.numpy() for k, t in w.items()})
    x = torch.randn(2, 7, E, generator=g).numpy()

    def grads(out, ins):
        return [out.detach()] + list(torch.autograd.grad(out, ins, torch.ones_like(out)))

    def sinks_call(t):
        with torch.no_grad():
            return [CF.attend(q0, k0, v0, causal=True, sinks=sinks + t, device=device)]

    def dropout_call(t):
        mine.seed = 1000 + t
        q, k, v = (a.detach().requires_grad_(True) for a in (q0, k0, v0))
        return grads(CF.attend(q, k, v, causal=True, dropout_p=0.3, device=device), (q, k, v))

    def varlen_call(t):
        mine.seed = 2000 + t
        q, k, v = (a.clone().requires_grad_(True) for a in (qv, kv_, vv))
        return grads(CF.varlen_attention(q, k, v, cq, ck, 9, 9, causal=True, dropout_p=0.3, device=device),
                     (q, k, v))

    def module_call(t):
        out, lse, ctx = module.forward_train(x, seed=3000 + t)
        got = module.backward(x, np.ones_like(out), lse=lse, context=ctx, seed=3000 + t)
        return [torch.from_numpy(out)] + [torch.from_numpy(got[k]) for k in sorted(got)]

    for call in (sinks_call, dropout_call, varlen_call, module_call):
        wants = [call(t) for t in range(2)]
        assert not torch.equal(wants[0][0], wants[1][0])  # the two threads' calls differ
        with monkeypatch.context() as m:
            RaceForcer(m)
            results, errors = {}, []
            start = threading.Barrier(2)

            def worker(t):
                try:
                    start.wait()
                    results[t] = call(t)
                except Exception as e:  # reported below, with the thread
                    errors.append((t, e))

            threads = [threading.Thread(target=worker, args=(t,)) for t in range(2)]
            for th in threads:
                th.start()
            for th in threads:
                th.join()
        assert not errors, errors
        for t in range(2):
            for i, (got, want) in enumerate(zip(results[t], wants[t])):
                assert torch.equal(got, want), f"{call.__name__}, thread {t}, result {i}: not the call's own"
