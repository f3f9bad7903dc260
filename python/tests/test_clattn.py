"""pytest for the clattn Python package: parity with a float64 NumPy reference written here, on ref
and on the OpenCL device (when there is one), from_torch parity (when torch is installed), the
struct layouts against a C compiler's, and every error path."""
import ctypes
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

import clattn
from clattn import _lib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOL = dict(rtol=1e-4, atol=1e-5)

HAVE_OPENCL = len(clattn.devices()) > 1
DEVICES = ["ref"] + (["opencl"] if HAVE_OPENCL else [])


# ---------------------------------------------------------------- the float64 reference

def ref_attention(x, heads, wq=None, wk=None, wv=None, bq=None, bk=None, bv=None, wo=None, bo=None, kv=None,
                  causal=False, kpm=None, mask=None, scale=None):
    """softmax(scale Q K^T + masks) V per head, nn.Linear weights; a row with no key gives 0."""
    x = x.astype(np.float64)
    src = x if kv is None else kv.astype(np.float64)
    if wq is not None:
        q, k, v = x @ wq.T, src @ wk.T, src @ wv.T
        q = q + (0 if bq is None else bq)
        k = k + (0 if bk is None else bk)
        v = v + (0 if bv is None else bv)
    else:
        q, k, v = x, src, src
    B, Tq, _ = q.shape
    Tk = k.shape[1]
    dk, dv = q.shape[2] // heads, v.shape[2] // heads
    qh = q.reshape(B, Tq, heads, dk).transpose(0, 2, 1, 3)
    kh = k.reshape(B, Tk, heads, dk).transpose(0, 2, 1, 3)
    vh = v.reshape(B, Tk, heads, dv).transpose(0, 2, 1, 3)
    s = (qh @ kh.transpose(0, 1, 3, 2)) * (1 / np.sqrt(dk) if scale is None else scale)
    hidden = np.zeros((B, 1, Tq, Tk), bool)
    if causal:
        hidden |= np.triu(np.ones((Tq, Tk), bool), 1)
    if kpm is not None:
        hidden |= kpm[:, None, None, :].astype(bool)
    if mask is not None:
        if mask.dtype == np.bool_:
            hidden |= mask
        else:
            s = s + mask
    s = np.where(hidden, -np.inf, s)
    live = np.isfinite(s).any(-1, keepdims=True)
    m = np.where(live, np.max(np.where(np.isfinite(s), s, -np.inf), -1, keepdims=True), 0)
    e = np.where(np.isfinite(s), np.exp(np.where(np.isfinite(s), s, 0) - m), 0)
    w = np.where(live, e / np.where(live, e.sum(-1, keepdims=True), 1), 0)
    ctx = (w @ vh).transpose(0, 2, 1, 3).reshape(B, Tq, heads * dv)
    out = ctx if wo is None else ctx @ wo.T + (0 if bo is None else bo)
    return out, w


def ref_encoder(x, p, heads, norm_first, activation, causal=False, kpm=None, eps=1e-5):
    def ln(v, g, b):
        mu = v.mean(-1, keepdims=True)
        var = ((v - mu) ** 2).mean(-1, keepdims=True)
        return (v - mu) / np.sqrt(var + eps) * g + b

    def attn(v):
        return ref_attention(v.astype(np.float32), heads, p["w_query"], p["w_key"], p["w_value"], p["b_query"],
                             p["b_key"], p["b_value"], p["w_out"], p["b_out"], causal=causal, kpm=kpm)[0]

    def ff(v):
        h = v @ p["w_ff1"].T + p["b_ff1"]
        h = np.maximum(h, 0) if activation == "relu" else 0.5 * h * (1 + np.vectorize(__import__("math").erf)(h / np.sqrt(2)))
        return h @ p["w_ff2"].T + p["b_ff2"]

    x = x.astype(np.float64)
    if norm_first:
        y = x + attn(ln(x, p["ln1_weight"], p["ln1_bias"]))
        return y + ff(ln(y, p["ln2_weight"], p["ln2_bias"]))
    y = ln(x + attn(x), p["ln1_weight"], p["ln1_bias"])
    return ln(y + ff(y), p["ln2_weight"], p["ln2_bias"])


def rnd(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


# ---------------------------------------------------------------- ABI

def test_struct_layouts_match_the_c_compiler(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to check the layouts against")
    src = tmp_path / "sizes.c"
    src.write_text('#include <stdio.h>\n#include <stddef.h>\n#include "clattn.h"\nint main(void) {\n'
                   'printf("%zu %zu %zu %zu %zu %zu %zu %zu %zu %zu %zu %zu %zu %zu %zu %zu %zu %zu %zu %zu %zu\\n", sizeof(clattn_device_info), '
                   'sizeof(clattn_attention_desc), sizeof(clattn_attention_weights), sizeof(clattn_attention_args), '
                   'sizeof(clattn_encoder_desc), sizeof(clattn_encoder_weights), sizeof(clattn_encoder_args), '
                   'offsetof(clattn_attention_desc, seed), offsetof(clattn_encoder_desc, eps), '
                   'sizeof(clattn_kv_cache_desc), sizeof(clattn_decode_args), offsetof(clattn_attention_desc, kv_half),'
                   ' sizeof(clattn_core_info), offsetof(clattn_core_info, default_for),'
                   ' offsetof(clattn_attention_desc, precision), offsetof(clattn_core_info, emulated),'
                   ' offsetof(clattn_attention_desc, training), sizeof(clattn_attention_grads),'
                   ' offsetof(clattn_attention_grads, grad_out_count), offsetof(clattn_attention_desc, rope),'
                   ' sizeof(clattn_rope));'
                   '\nreturn 0; }\n')
    exe = tmp_path / "sizes"
    r = subprocess.run([cc, "-std=c11", "-I", os.path.join(ROOT, "include"), str(src), "-o", str(exe)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip("cannot compile against clattn.h here: " + r.stderr[:200])
    got = [int(v) for v in subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split()]
    want = [ctypes.sizeof(_lib.DeviceInfo), ctypes.sizeof(_lib.AttentionDesc), ctypes.sizeof(_lib.AttentionWeights),
            ctypes.sizeof(_lib.AttentionArgs), ctypes.sizeof(_lib.EncoderDesc), ctypes.sizeof(_lib.EncoderWeights),
            ctypes.sizeof(_lib.EncoderArgs), _lib.AttentionDesc.seed.offset, _lib.EncoderDesc.eps.offset,
            ctypes.sizeof(_lib.KVCacheDesc), ctypes.sizeof(_lib.DecodeArgs), _lib.AttentionDesc.kv_half.offset,
            ctypes.sizeof(_lib.CoreInfo), _lib.CoreInfo.default_for.offset, _lib.AttentionDesc.precision.offset,
            _lib.CoreInfo.emulated.offset, _lib.AttentionDesc.training.offset, ctypes.sizeof(_lib.AttentionGrads),
            _lib.AttentionGrads.grad_out_count.offset, _lib.AttentionDesc.rope.offset, ctypes.sizeof(_lib.Rope)]
    assert got == want


def test_versions_agree():
    assert clattn.version() == clattn.__version__
    header = open(os.path.join(ROOT, "include", "clattn.h")).read()
    parts = [int(line.split()[2]) for line in header.splitlines()
             if line.startswith("#define CLATTN_VERSION_") and line.split()[1][-5:] in ("MAJOR", "MINOR", "PATCH")]
    assert ".".join(map(str, parts)) == clattn.__version__


def test_devices():
    ds = clattn.devices()
    assert ds[0]["selector"] == "ref"
    for d in ds[1:]:
        assert d["selector"].startswith("opencl:") and d["name"]
        assert "facts" not in d


def test_devices_verbose_shows_the_probes():
    for d in clattn.devices(verbose=True)[1:]:
        facts = d["facts"]
        for key in ("class", "driver", "loop limit", "nan and inf arithmetic", "profiling timestamps", "probe notes"):
            assert key in facts, (d["selector"], facts)
        if "Portable Computing Language" in d["platform"]:  # PoCL: no defect the probes know
            assert facts["loop limit"].startswith("none below"), facts
            assert facts["nan and inf arithmetic"] == "IEEE" and facts["profiling timestamps"] == "real", facts


@pytest.mark.skipif(not HAVE_OPENCL, reason="no OpenCL device")
def test_selftest_passes_and_keeps_no_failure(tmp_path, monkeypatch):
    monkeypatch.setenv("CLATTN_CACHE_DIR", str(tmp_path))  # its verdicts in a directory of the test's own
    results = clattn.selftest("opencl", quick=True)
    assert [r["core"] for r in results] == [c["name"] for c in clattn.cores("opencl")]
    for r in results:
        assert r["verdict"] != "fail", r
        if r["verdict"] == "pass":
            assert r["cases"] + r["refused"] > 0 and r["worst_ratio"] <= 1.0, r
        else:
            assert r["detail"], r
    assert sum(r["verdict"] == "pass" for r in results) >= 4
    facts = clattn.devices(verbose=True)[1]["facts"]
    assert facts["self-test failures"] == "none", facts
    with pytest.raises(clattn.UnsupportedError):
        clattn.selftest("ref")


def test_cores_match_the_cli():
    keys = ["name", "kind", "supported", "reason", "emulated", "default_for", "algorithm", "weights", "reads_dtypes",
            "params", "test_configs"]
    for device in DEVICES:
        listed = clattn.cores(device)
        assert [sorted(c) for c in listed] == [sorted(keys)] * len(listed)
        cli = os.path.join(ROOT, "build", "clattn")
        if os.path.exists(cli):  # the same list as `clattn cores --json`
            out = subprocess.run([cli, "cores", "--json", "--device", device], capture_output=True, text=True,
                                 check=True).stdout
            assert [json.loads(line) for line in out.splitlines()] == listed
        names = [c["name"] for c in listed]
        assert {"unfused", "flash_rows", "flash_tiled", "decode_attend"} <= set(names)
        if device == "ref":
            assert not any(c["supported"] for c in listed)
        else:
            for kind in ("prefill", "gemm"):  # one default per head-size class, for the attention and the GEMMs
                classes = [cls for c in listed if c["kind"] == kind for cls in c["default_for"]]
                assert sorted(classes) == sorted(["<=32", "<=64", "<=128", "<=256", ">256"])
        gemms = [c for c in listed if c["kind"] == "gemm"]
        assert {"gemm_tiles", "gemm_clblast"} <= {c["name"] for c in gemms}
        assert all(c["algorithm"] is None and not c["weights"] for c in gemms)
    a = clattn.Attention(2, w_query=np.eye(16, dtype=np.float32), w_key=np.eye(16, dtype=np.float32),
                         w_value=np.eye(16, dtype=np.float32), device=DEVICES[-1])
    assert a.core_used is None and a.gemm_used is None
    a(np.zeros((1, 3, 16), np.float32))
    assert a.core_used in names + ["ref"]
    assert a.gemm_used in [c["name"] for c in gemms] + ["ref"]
    assert (a.gemm_used == "ref") == (a.core_used == "ref")


# ---------------------------------------------------------------- attention parity

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("algorithm", ["auto", "unfused"])
def test_self_attention_with_weights(device, algorithm):
    rng = np.random.default_rng(1)
    B, T, E, H = 2, 13, 12, 3
    p = dict(wq=rnd(rng, E, E, scale=0.3), wk=rnd(rng, E, E, scale=0.3), wv=rnd(rng, E, E, scale=0.3),
             bq=rnd(rng, E), bk=rnd(rng, E), bv=rnd(rng, E), wo=rnd(rng, 10, E, scale=0.3), bo=rnd(rng, 10))
    x = rnd(rng, B, T, E)
    kpm = rng.random((B, T)) < 0.2
    kpm[1, :] = True  # a fully masked batch entry: weights 0, out = b_out
    a = clattn.Attention(H, w_query=p["wq"], w_key=p["wk"], w_value=p["wv"], b_query=p["bq"], b_key=p["bk"],
                         b_value=p["bv"], w_out=p["wo"], b_out=p["bo"], causal=True, algorithm=algorithm,
                         device=device)
    out, w = a(x, key_padding_mask=kpm, need_weights=True)
    want_out, want_w = ref_attention(x, H, *p.values(), causal=True, kpm=kpm)
    np.testing.assert_allclose(out, want_out, **TOL)
    np.testing.assert_allclose(w, want_w, **TOL)
    assert a.algorithm_used == ("reference" if device == "ref" else "unfused")
    out2, none = a(x, key_padding_mask=kpm)  # a second shape key: without the weights
    assert none is None
    np.testing.assert_allclose(out2, want_out, **TOL)


@pytest.mark.parametrize("device", DEVICES)
def test_cross_attention_masks_and_unbatched(device):
    rng = np.random.default_rng(2)
    Tq, Tk, E, Ekv, H = 5, 11, 8, 6, 2
    wq, wk, wv = rnd(rng, E, E, scale=0.4), rnd(rng, E, Ekv, scale=0.4), rnd(rng, 6, Ekv, scale=0.4)
    x, kv = rnd(rng, 2, Tq, E), rnd(rng, 2, Tk, Ekv)
    bmask = rng.random((Tq, Tk)) < 0.3
    fmask = rnd(rng, Tq, Tk)
    a = clattn.Attention(H, w_query=wq, w_key=wk, w_value=wv, device=device)
    for mask in (bmask, fmask):
        out, w = a(x, kv, attn_mask=mask, need_weights=True)
        want_out, want_w = ref_attention(x, H, wq, wk, wv, kv=kv, mask=mask)
        np.testing.assert_allclose(out, want_out, **TOL)
        np.testing.assert_allclose(w, want_w, **TOL)
    # one sequence, 2-D: out (Tq, Eo), weights (H, Tq, Tk)
    out1, w1 = a(x[1], kv[1], attn_mask=bmask, need_weights=True)
    want_out, want_w = ref_attention(x[1:], H, wq, wk, wv, kv=kv[1:], mask=bmask)
    assert out1.shape == (Tq, 6) and w1.shape == (H, Tq, Tk)
    np.testing.assert_allclose(out1, want_out[0], **TOL)
    np.testing.assert_allclose(w1, want_w[0], **TOL)


@pytest.mark.parametrize("device", DEVICES)
def test_no_weights_and_conversions(device):
    rng = np.random.default_rng(3)
    x64 = rng.standard_normal((1, 7, 8))            # float64: converted
    xt = np.asfortranarray(rng.standard_normal((7, 8)).astype(np.float32))  # non-contiguous: copied
    a = clattn.Attention(2, scale=0.5, device=device)
    out, _ = a(x64)
    np.testing.assert_allclose(out, ref_attention(x64.astype(np.float32), 2, scale=0.5)[0], **TOL)
    out, _ = a(xt)
    np.testing.assert_allclose(out, ref_attention(np.ascontiguousarray(xt)[None], 2, scale=0.5)[0][0], **TOL)


@pytest.mark.parametrize("device", DEVICES)
def test_dropout_is_deterministic_and_scaled(device):
    rng = np.random.default_rng(4)
    x = rnd(rng, 1, 16, 8)
    a = clattn.Attention(2, dropout=0.5, seed=7, algorithm="unfused", device=device)
    _, w1 = a(x, need_weights=True)
    _, w2 = a(x, need_weights=True)
    np.testing.assert_array_equal(w1, w2)
    a.seed = 8  # a new seed on the same plan: other weights dropped, and the first seed's back after
    assert not np.array_equal(a(x, need_weights=True)[1], w1)
    a.seed = 7
    np.testing.assert_array_equal(a(x, need_weights=True)[1], w1)
    _, w_eval = clattn.Attention(2, device=device)(x, need_weights=True)
    kept = w1 != 0
    assert 0.3 < kept.mean() < 0.7
    np.testing.assert_allclose(w1[kept], 2 * w_eval[kept], **TOL)


# ---------------------------------------------------------------- encoder parity

def encoder_params(rng, E, F):
    s = 1 / np.sqrt(E)
    return dict(w_query=rnd(rng, E, E, scale=s), w_key=rnd(rng, E, E, scale=s), w_value=rnd(rng, E, E, scale=s),
                b_query=rnd(rng, E, scale=0.1), b_key=rnd(rng, E, scale=0.1), b_value=rnd(rng, E, scale=0.1),
                w_out=rnd(rng, E, E, scale=s), b_out=rnd(rng, E, scale=0.1), ln1_weight=1 + rnd(rng, E, scale=0.1),
                ln1_bias=rnd(rng, E, scale=0.1), w_ff1=rnd(rng, F, E, scale=s), b_ff1=rnd(rng, F, scale=0.1),
                w_ff2=rnd(rng, E, F, scale=1 / np.sqrt(F)), b_ff2=rnd(rng, E, scale=0.1),
                ln2_weight=1 + rnd(rng, E, scale=0.1), ln2_bias=rnd(rng, E, scale=0.1))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("norm_first,activation", [(False, "relu"), (True, "gelu")])
def test_encoder_layer(device, norm_first, activation):
    rng = np.random.default_rng(5)
    E, F, H, B, T = 12, 20, 3, 2, 9
    p = encoder_params(rng, E, F)
    x = rnd(rng, B, T, E)
    kpm = rng.random((B, T)) < 0.2
    kpm[:, 0] = False
    layer = clattn.EncoderLayer(H, **p, norm_first=norm_first, activation=activation, causal=True, device=device)
    out = layer(x, key_padding_mask=kpm)
    np.testing.assert_allclose(out, ref_encoder(x, p, H, norm_first, activation, causal=True, kpm=kpm), **TOL)
    np.testing.assert_allclose(layer(x[0]), ref_encoder(x[:1], p, H, norm_first, activation, causal=True)[0], **TOL)


# ---------------------------------------------------------------- from_torch

def test_from_torch_parity():
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(12, 3, batch_first=True).eval()
    with torch.no_grad():
        for prm in mha.parameters():
            prm.copy_(torch.randn_like(prm) * 0.3)
    x = torch.randn(2, 7, 12)
    want, want_w = mha(x, x, x, need_weights=True, average_attn_weights=False)
    a = clattn.from_torch(mha, device=DEVICES[-1])
    out, w = a(x.numpy(), need_weights=True)
    np.testing.assert_allclose(out, want.detach().numpy(), **TOL)
    np.testing.assert_allclose(w, want_w.detach().numpy(), **TOL)
    enc = torch.nn.TransformerEncoderLayer(12, 3, dim_feedforward=20, dropout=0.0, batch_first=True,
                                           activation="gelu").eval()
    layer = clattn.from_torch(enc, device=DEVICES[-1])
    np.testing.assert_allclose(layer(x.numpy()), enc(x).detach().numpy(), rtol=1e-4, atol=2e-5)


# ---------------------------------------------------------------- errors

def test_errors_carry_status_and_message():
    with pytest.raises(clattn.Error) as e:
        clattn.Attention(2, device="name=NoSuchDeviceAnywhere")
    assert e.value.status_name == "CLATTN_STATUS_NO_DEVICE" and "NoSuchDeviceAnywhere" in e.value.message
    with pytest.raises(clattn.Error) as e:
        clattn.Attention(2, device="bogus")
    assert e.value.status_name == "CLATTN_STATUS_INVALID_DEVICE_SPEC"
    a = clattn.Attention(3, device="ref")
    with pytest.raises(clattn.Error) as e:   # heads must divide E without weights: the library says so
        a(np.zeros((1, 4, 8), np.float32))
    assert e.value.status_name == "CLATTN_STATUS_SHAPE_MISMATCH" and e.value.build_log == ""


def test_precision_tf32_opt_in():
    """precision="tf32" is the core's (flash_mma's) and refused elsewhere with the reason; a bad name is an error."""
    x = np.random.default_rng(3).standard_normal((1, 5, 8)).astype(np.float32)
    with pytest.raises(clattn.Error) as e:
        clattn.Attention(2, device="ref", precision="tf32")(x)
    assert e.value.status_name == "CLATTN_STATUS_UNSUPPORTED" and "TF32" in e.value.message
    with pytest.raises((ValueError, clattn.Error)):
        clattn.Attention(2, device="ref", precision="fp16")
    a = clattn.Attention(2, device="ref", precision="fp32")
    assert a(x)[0].shape == (1, 5, 8)
    assert "precision" not in repr(a) and "precision='tf32'" in repr(clattn.Attention(2, device="ref", precision="tf32"))
    assert all("emulated" in c for c in clattn.cores())


@pytest.mark.parametrize("bad,status,needle", [
    (np.zeros((1, 4, 6), np.int32), "CLATTN_STATUS_INVALID_ARGUMENT", "floating"),
    (np.zeros((4,), np.float32), "CLATTN_STATUS_SHAPE_MISMATCH", "1-D"),
    (np.zeros((1, 1, 4, 6), np.float32), "CLATTN_STATUS_SHAPE_MISMATCH", "4-D"),
])
def test_bad_arrays(bad, status, needle):
    a = clattn.Attention(2, device="ref")
    with pytest.raises(clattn.Error) as e:
        a(bad)
    assert e.value.status_name == status and needle in str(e.value)


def test_bad_masks_and_arguments():
    a = clattn.Attention(2, device="ref")
    x = np.zeros((2, 4, 6), np.float32)
    with pytest.raises(clattn.Error, match="key_padding_mask: shape"):
        a(x, key_padding_mask=np.zeros((2, 5), bool))
    with pytest.raises(clattn.Error, match="key_padding_mask: dtype"):
        a(x, key_padding_mask=np.zeros((2, 4), np.float32))
    with pytest.raises(clattn.Error, match="attn_mask: shape"):
        a(x, attn_mask=np.zeros((4, 5), bool))
    with pytest.raises(clattn.Error, match="kv: batch"):
        a(x, np.zeros((1, 4, 6), np.float32))
    with pytest.raises(clattn.Error, match="heads"):
        clattn.Attention(0)
    with pytest.raises(clattn.Error, match="all three or none"):
        clattn.Attention(1, w_query=np.eye(4, dtype=np.float32))
    with pytest.raises(clattn.Error, match="layout"):
        clattn.Attention(1, layout="columns")
    with pytest.raises(clattn.Error, match="algorithm"):
        clattn.Attention(1, algorithm="fast")
    with pytest.raises(clattn.Error, match="activation"):
        clattn.EncoderLayer(1, activation="tanh", **encoder_params(np.random.default_rng(0), 4, 4))
    try:
        import torch  # noqa: F401
    except ImportError:
        return
    with pytest.raises(clattn.Error, match="not nn.MultiheadAttention"):
        clattn.from_torch(object())


@pytest.mark.skipif(not HAVE_OPENCL, reason="no OpenCL device")
def test_fused_refuses_weights():
    a = clattn.Attention(2, algorithm="fused", device="opencl")
    with pytest.raises(clattn.Error) as e:
        a(np.zeros((1, 4, 6), np.float32), need_weights=True)
    assert e.value.status_name == "CLATTN_STATUS_INVALID_ARGUMENT" and "need_weights" in e.value.message


# ---------------------------------------------------------------- pictures

def test_plot_attention(tmp_path):
    pytest.importorskip("matplotlib")
    rng = np.random.default_rng(6)
    _, w = clattn.Attention(2, device="ref")(rnd(rng, 6, 4), need_weights=True)
    path = tmp_path / "heads.png"
    fig = clattn.plot_attention(w, tokens=["a", "b", "c", "d", "e", "f"], path=str(path))
    assert path.stat().st_size > 1000 and len(fig.axes) >= 2
    with pytest.raises(clattn.Error, match="tokens"):
        clattn.plot_attention(w, tokens=["a"])


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))


# ---------------------------------------------------------------- grouped-query attention and decoding

def ref_gqa(x, heads, kv_heads, wq, wk, wv, wo, window=0):
    """Causal grouped-query attention in float64: query head h reads key/value head h // (heads // kv_heads)."""
    x = x.astype(np.float64)
    q, k, v = x @ wq.T, x @ wk.T, x @ wv.T
    B, T, _ = q.shape
    dk, dv, g = q.shape[2] // heads, v.shape[2] // kv_heads, heads // kv_heads
    qh = q.reshape(B, T, heads, dk).transpose(0, 2, 1, 3)
    kh = np.repeat(k.reshape(B, T, kv_heads, dk).transpose(0, 2, 1, 3), g, axis=1)
    vh = np.repeat(v.reshape(B, T, kv_heads, dv).transpose(0, 2, 1, 3), g, axis=1)
    s = qh @ kh.transpose(0, 1, 3, 2) / np.sqrt(dk)
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    hidden = (j > i) | ((i - j >= window) if window else False)
    s = np.where(hidden, -np.inf, s)
    w = np.exp(s - s.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    return ((w @ vh).transpose(0, 2, 1, 3).reshape(B, T, heads * dv)) @ wo.T


@pytest.mark.parametrize("device", DEVICES)
def test_gqa_window_attention_and_decoder(device):
    rng = np.random.default_rng(7)
    B, T, E, H, HK, d = 2, 19, 16, 4, 2, 4
    wq, wk, wv = rnd(rng, H * d, E, scale=0.4), rnd(rng, HK * d, E, scale=0.4), rnd(rng, HK * d, E, scale=0.4)
    wo, x = rnd(rng, E, H * d, scale=0.4), rnd(rng, B, T, E)
    want = ref_gqa(x, H, HK, wq, wk, wv, wo, window=5)
    a = clattn.Attention(H, kv_heads=HK, window=5, w_query=wq, w_key=wk, w_value=wv, w_out=wo, causal=True,
                         device=device)
    np.testing.assert_allclose(a(x)[0], want, **TOL)
    dec = clattn.Decoder(H, kv_heads=HK, window=5, w_query=wq, w_key=wk, w_value=wv, w_out=wo, batch=B,
                         capacity=T, max_new_tokens=8, device=device)
    outs = [dec(x[:, :8])] + [dec(x[:, t:t + 1]) for t in range(8, T)]
    np.testing.assert_allclose(np.concatenate(outs, axis=1), want, **TOL)
    assert dec.lengths == [T, T]
    k, v = dec.read_cache()
    np.testing.assert_allclose(k[:, :, :T].transpose(0, 2, 1, 3).reshape(B, T, HK * d), x @ wk.T, **TOL)
    dec.truncate([T - 3, T - 1])
    assert dec.lengths == [T - 3, T - 1]
    with pytest.raises(clattn.Error) as e:
        dec(x[:, :4])  # 16 + 4 > 19 for the second sequence
    assert e.value.status_name == "CLATTN_STATUS_SHAPE_MISMATCH" and "capacity" in e.value.message
    dec.reset()
    assert dec.lengths == [0, 0]
    with pytest.raises(clattn.Error):
        dec(x[:, :9])  # more than max_new_tokens
    with pytest.raises(clattn.Error):
        clattn.Attention(H, kv_heads=3, w_query=wq, w_key=wk, w_value=wv)


@pytest.mark.parametrize("device", DEVICES)
def test_decoder_packed_steps(device):
    """cu_seqlens (clattn 0.8): packed new tokens, no padding rows; each sequence equals its own causal run."""
    rng = np.random.default_rng(17)
    B, T, E, H, HK, d = 3, 11, 16, 4, 2, 4
    wq, wk, wv = rnd(rng, H * d, E, scale=0.4), rnd(rng, HK * d, E, scale=0.4), rnd(rng, HK * d, E, scale=0.4)
    wo = rnd(rng, E, H * d, scale=0.4)
    x = rnd(rng, B, T, E)
    want = ref_gqa(x, H, HK, wq, wk, wv, wo)
    dec = clattn.Decoder(H, kv_heads=HK, w_query=wq, w_key=wk, w_value=wv, w_out=wo, batch=B, capacity=T,
                         max_new_tokens=6, device=device)
    steps = [[6, 0, 2], [1, 4, 0], [0, 0, 0], [4, 6, 1], [0, 1, 6]]  # counts per sequence, summing to T
    got = [[] for _ in range(B)]
    at = [0] * B
    for counts in steps:
        cu = np.concatenate([[0], np.cumsum(counts)])
        packed = np.concatenate([x[b, at[b]:at[b] + counts[b]] for b in range(B)]).reshape(-1, E)
        out = dec(packed, cu_seqlens=cu)
        assert out.shape == (cu[-1], E)
        for b in range(B):
            got[b].append(out[cu[b]:cu[b + 1]])
            at[b] += counts[b]
    assert dec.lengths == at
    for b in range(B):
        np.testing.assert_allclose(np.concatenate(got[b])[:at[b]], want[b, :at[b]], **TOL)
    dec.reset()
    with pytest.raises(clattn.Error) as e:
        dec(x[0, :3], cu_seqlens=[0, 1, 2])  # B + 1 = 4 offsets
    assert "batch + 1" in e.value.message
    with pytest.raises(clattn.Error) as e:
        dec(x[0, :3], cu_seqlens=[0, 2, 1, 3])
    assert "never decrease" in e.value.message
    with pytest.raises(clattn.Error) as e:
        dec(x[0, :7], cu_seqlens=[0, 7, 7, 7])
    assert "max_new_tokens=6" in e.value.message
    with pytest.raises(clattn.Error) as e:
        dec(x[0, :3], cu_seqlens=[0, 1, 2, 3], valid=[1, 1, 1])
    assert "valid with cu_seqlens" in e.value.message
    with pytest.raises(clattn.Error) as e:
        dec(x[0, :4], cu_seqlens=[0, 1, 2, 3])
    assert "cu_seqlens[-1]" in e.value.message
    assert dec.lengths == [0, 0, 0]


# ---------------------------------------------------------------- backward (clattn 0.5)
def test_backward_matches_torch_autograd():
    torch = pytest.importorskip("torch")
    torch.manual_seed(26)
    B, T, E, H = 2, 7, 12, 3
    mha = torch.nn.MultiheadAttention(E, H, batch_first=True).double()
    with torch.no_grad():
        for p in mha.parameters():
            p.copy_(torch.randn(p.shape, dtype=torch.float64) * 0.4)
    x32 = torch.randn(B, T, E).float()
    dout32 = torch.randn(B, T, E).float()
    kpm = np.zeros((B, T), dtype=bool)
    kpm[1, 4:] = True
    x = x32.double().requires_grad_(True)
    causal = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
    out, _ = mha(x, x, x, key_padding_mask=torch.from_numpy(kpm), attn_mask=causal, need_weights=False)
    (out * dout32.double()).sum().backward()
    wq, wk, wv = (w.detach().float().numpy() for w in mha.in_proj_weight.chunk(3))
    bq, bk, bv = (b.detach().float().numpy() for b in mha.in_proj_bias.chunk(3))
    attn = clattn.Attention(H, w_query=wq, w_key=wk, w_value=wv, b_query=bq, b_key=bk, b_value=bv,
                            w_out=mha.out_proj.weight.detach().float().numpy(),
                            b_out=mha.out_proj.bias.detach().float().numpy(), causal=True, device="ref")
    g = attn.backward(x32.numpy(), dout32.numpy(), key_padding_mask=kpm)
    assert sorted(g) == ["b_key", "b_out", "b_query", "b_value", "w_key", "w_out", "w_query", "w_value", "x"]
    gq, gk, gv = (t.numpy() for t in mha.in_proj_weight.grad.chunk(3))
    gbq, gbk, gbv = (t.numpy() for t in mha.in_proj_bias.grad.chunk(3))
    want = dict(x=x.grad.numpy(), w_query=gq, w_key=gk, w_value=gv, b_query=gbq, b_key=gbk, b_value=gbv,
                w_out=mha.out_proj.weight.grad.numpy(), b_out=mha.out_proj.bias.grad.numpy())
    for k, v in want.items():
        np.testing.assert_allclose(g[k], v, rtol=1e-3, atol=1e-4, err_msg=k)


def test_backward_refusals():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 5, 8), dtype=np.float32)
    attn = clattn.Attention(2, device="ref")
    assert attn.backward_core_used is None
    g = attn.backward(x, np.ones((1, 5, 8), np.float32))
    assert sorted(g) == ["x"] and g["x"].shape == (1, 5, 8) and np.isfinite(g["x"]).all()
    assert attn.backward_core_used == "ref"
    with pytest.raises(clattn.ShapeMismatchError):
        attn.backward(x, np.ones((1, 5, 7), np.float32))
    if len(clattn.devices()) > 1:  # an OpenCL device: its backward core computes what ref does
        dout = rng.standard_normal((1, 5, 8), dtype=np.float32)
        a_ref, a_cl = clattn.Attention(2, causal=True, device="ref"), clattn.Attention(2, causal=True, device="opencl")
        np.testing.assert_allclose(a_cl.backward(x, dout)["x"], a_ref.backward(x, dout)["x"], rtol=1e-3, atol=1e-4)
        # AUTO's backward core: flash_backward on CPUs, flash_backward_gemm on NVIDIA's GPUs; named with its parameters
        assert re.fullmatch(r"flash_backward(_gemm)?:[A-Z]+=\d+(,[A-Z]+=\d+)*", a_cl.backward_core_used), \
            a_cl.backward_core_used


def test_autograd_module_trains_like_torch():
    """clattn.autograd.MultiheadAttention from torch.nn.MultiheadAttention's state: the same loss and gradients,
    and three SGD steps later the same parameters (float32 on both sides)."""
    torch = pytest.importorskip("torch")
    import clattn.autograd as ca
    torch.manual_seed(5)
    B, T, E, H = 2, 9, 16, 4
    ref = torch.nn.MultiheadAttention(E, H, batch_first=True)
    mine = ca.MultiheadAttention(E, H, batch_first=True)
    mine.load_state_dict(ref.state_dict())
    x, target = torch.randn(B, T, E), torch.randn(B, T, E)
    kpm = torch.zeros(B, T, dtype=torch.bool)
    kpm[1, 6:] = True
    causal = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
    opt_r, opt_m = torch.optim.SGD(ref.parameters(), lr=0.5), torch.optim.SGD(mine.parameters(), lr=0.5)
    for step in range(3):
        losses = []
        for mod, opt in ((ref, opt_r), (mine, opt_m)):
            opt.zero_grad()
            xi = x.clone().requires_grad_(True)
            out, _ = mod(xi, xi, xi, key_padding_mask=kpm, attn_mask=causal, need_weights=False)
            loss = ((out - target) ** 2).mean()
            loss.backward()
            losses.append((loss.item(), xi.grad.clone()))
            opt.step()
        assert abs(losses[0][0] - losses[1][0]) <= 1e-5 * abs(losses[0][0]) + 1e-6, (step, losses[0][0], losses[1][0])
        torch.testing.assert_close(losses[1][1], losses[0][1], rtol=1e-3, atol=1e-5)
    for (n, a), b in zip(ref.state_dict().items(), mine.state_dict().values()):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5, msg=n)
    with pytest.raises(clattn.Error):
        mine(x, x, x, need_weights=True)
