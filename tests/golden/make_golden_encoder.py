#!/usr/bin/python3
"""Generate clattn's encoder layer golden fixtures with PyTorch.

How to run (from the repository root; Debian's PyTorch 1.13 made the
committed fixtures)::

    /usr/bin/python3 tests/golden/make_golden_encoder.py

The script deletes and rewrites everything it generates:

* ``tests/golden/encoder/<case_name>/``: one directory per case (see below);
* ``src/cli/tutorial_encoder_data.h``: C header with tutorial 004's encoder
  block (input, weights, printed tables) for the CLI demo.

The output is deterministic (fixed seeds, single-threaded torch): running it
twice gives byte-identical files.

Case directory contract (the same as ``clattn encoder``'s input contract)
--------------------------------------------------------------------------
All arrays are written with ``np.save``: float32 little-endian, C order,
except the mask (bool).

``x.npy``                    (B, T, E) input.
``w_query.npy`` / ``w_key.npy`` / ``w_value.npy``   (E, E) nn.Linear [out, in]
                             (in_proj_weight split in three row blocks).
``b_query.npy`` / ``b_key.npy`` / ``b_value.npy``   (E) (in_proj_bias split).
``w_out.npy``, ``b_out.npy`` (E, E), (E): self_attn.out_proj.
``ln1_weight.npy``, ``ln1_bias.npy``  (E): norm1.
``w_ff1.npy``, ``b_ff1.npy`` (F, E), (F): linear1.
``w_ff2.npy``, ``b_ff2.npy`` (E, F), (E): linear2.
``ln2_weight.npy``, ``ln2_bias.npy``  (E): norm2.
``key_padding_mask.npy``     (B, T) bool, True = ignore that key.  Optional.
``meta.txt``                 ``key value`` lines, ``#`` comments.  Keys:
                             ``heads``, ``causal`` (0|1), ``norm_first`` (0|1),
                             ``activation`` (relu|gelu), ``eps``.
``expect_out.npy``           (B, T, E) torch's output.

Semantics (torch.nn.TransformerEncoderLayer, batch_first, eval, dropout 0):
  post-norm: y = LN1(x + SA(x));  out = LN2(y + FF(y))
  pre-norm:  y = x + SA(LN1(x));  out = y + FF(LN2(y))
with SA the multi-head self-attention (head size E/H, scale 1/sqrt(E/H)),
FF(z) = act(z W1^T + b1) W2^T + b2, act ReLU or GELU (erf form), LN over the
last dimension with the biased variance and eps.  ``causal 1`` masks key j >
query i; torch 1.13 has no is_causal, so torch got the equivalent boolean
src_mask (the fixture has no mask file for it).  No fixture has a query row
whose every key is masked.

Where the expectations come from
--------------------------------
* ``enc_*``: torch.nn.TransformerEncoderLayer with every parameter randomised
  (torch initialises the biases to 0 and the LayerNorms to gamma 1, beta 0,
  which would test nothing), inputs randn, from torch.Generator(seed).
  Autograd stays on (the parameters require grad) so that torch 1.13 takes the
  documented Python path, not the fused fast path (which, among other things,
  returns zeros at padded positions).
* ``tut004_encoder``: tutorial 004's encoder block on "My shoes are small, my
  feet are big.": its MultiHeadSelfAttention(d_model=2, num_heads=2), residual
  + LayerNorm(2), FeedForward(2, 4) (Linear -> ReLU -> Linear), residual +
  LayerNorm(2).  The notebook built the FeedForward right after the MHA, so
  its weights come next in the same RNG stream (see make_golden.py's
  tut004_mha2 for how that state is rebuilt); the LayerNorms are gamma 1,
  beta 0.  The tutorial's printed "MHA output", "Add & Norm", "ffn_out" and
  "Final encoder output" tables are asserted to 4 decimals, and the same
  weights loaded into nn.TransformerEncoderLayer give the same output.

Every case is re-read from disk and recomputed with a float64 numpy
implementation of the contract above; the script fails if they disagree.
"""

import math
import os
import shutil
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_golden as mg  # noqa: E402  (tutorial 004 constants and classes, helpers)

REPO = mg.REPO
CASES_DIR = os.path.join(REPO, "tests", "golden", "encoder")
HEADER_PATH = os.path.join(REPO, "src", "cli", "tutorial_encoder_data.h")
REGEN_CMD = "/usr/bin/python3 tests/golden/make_golden_encoder.py"

SUMMARY = []
HEADER_DATA = {}

# --------------------------------------------------------------------------
# tutorial 004's encoder block: the tables it printed
# --------------------------------------------------------------------------

P004_ADD_NORM = [[-0.9634, 0.9634], [-1.0000, 1.0000], [-1.0000, 1.0000],
                 [-0.9998, 0.9998], [1.0000, -1.0000], [1.0000, -1.0000],
                 [-1.0000, 1.0000], [-0.9999, 0.9999]]
P004_FFN_OUT = [[-0.0663, 0.2402], [-0.0638, 0.2437], [-0.0638, 0.2437],
                [-0.0638, 0.2437], [-0.2012, -0.0018], [-0.2012, -0.0018],
                [-0.0638, 0.2437], [-0.0638, 0.2437]]
P004_ENCODER_OUT = [[-1.0000, 1.0000], [-1.0000, 1.0000], [-1.0000, 1.0000],
                    [-1.0000, 1.0000], [1.0000, -1.0000], [1.0000, -1.0000],
                    [-1.0000, 1.0000], [-1.0000, 1.0000]]


class FeedForward(nn.Module):   # 004, as written there
    def __init__(self, d_model=2, hidden_dim=4):
        super().__init__()
        self.linear1 = nn.Linear(d_model, hidden_dim)
        self.relu = nn.ReLU()
        self.linear2 = nn.Linear(hidden_dim, d_model)

    def forward(self, x):
        x = self.linear1(x)
        x = self.relu(x)
        x = self.linear2(x)
        return x


# --------------------------------------------------------------------------
# float64 reference of the contract
# --------------------------------------------------------------------------

def ref_layernorm(v, g, b, eps):
    mean = v.mean(axis=-1, keepdims=True)
    var = ((v - mean) ** 2).mean(axis=-1, keepdims=True)
    return (v - mean) / np.sqrt(var + eps) * g + b


def ref_encoder(arrs, heads, causal, norm_first, activation, eps):
    a = {k: v.astype(np.float64) if v.dtype != np.bool_ else v for k, v in arrs.items()}
    E = a["x"].shape[2]
    dh = a["w_query"].shape[0] // heads

    def sa(z):
        inp = {k: a[k] for k in ("w_query", "w_key", "w_value", "b_query", "b_key", "b_value",
                                 "w_out", "b_out", "key_padding_mask") if k in a}
        inp["x"] = z
        out, _ = mg.reference_attention(inp, heads, dh, dh, causal, 1.0 / math.sqrt(dh))
        return out

    def act(h):
        if activation == "relu":
            return np.maximum(h, 0.0)
        erf = np.vectorize(math.erf)
        return 0.5 * h * (1.0 + erf(h / math.sqrt(2.0)))

    def ff(z):
        return act(z @ a["w_ff1"].T + a["b_ff1"]) @ a["w_ff2"].T + a["b_ff2"]

    ln1 = lambda v: ref_layernorm(v, a["ln1_weight"], a["ln1_bias"], eps)
    ln2 = lambda v: ref_layernorm(v, a["ln2_weight"], a["ln2_bias"], eps)
    x = a["x"]
    assert x.shape[2] == E
    if norm_first:
        y = x + sa(ln1(x))
        return y + ff(ln2(y))
    y = ln1(x + sa(x))
    return ln2(y + ff(y))


ARRAY_NAMES = ("x", "w_query", "w_key", "w_value", "b_query", "b_key", "b_value", "w_out", "b_out",
               "ln1_weight", "ln1_bias", "w_ff1", "b_ff1", "w_ff2", "b_ff2", "ln2_weight", "ln2_bias",
               "key_padding_mask", "expect_out")


def emit(name, comments, *, heads, causal, norm_first, activation, eps, arrays, rtol=1e-4, atol=2e-5):
    """Check one case's shapes, write it, re-read it and check it against the float64 reference."""
    arrs = {}
    for k, v in arrays.items():
        if v is None:
            continue
        t = mg.to_np(v)
        t = np.ascontiguousarray(t.astype(np.bool_ if k == "key_padding_mask" else "<f4"))
        if t.dtype != np.bool_ and not np.isfinite(t).all():
            raise AssertionError("%s/%s contains non-finite values" % (name, k))
        arrs[k] = t
    B, T, E = arrs["x"].shape
    Fd = arrs["w_ff1"].shape[0]
    assert E % heads == 0, name
    want = dict(w_query=(E, E), w_key=(E, E), w_value=(E, E), b_query=(E,), b_key=(E,), b_value=(E,),
                w_out=(E, E), b_out=(E,), ln1_weight=(E,), ln1_bias=(E,), w_ff1=(Fd, E), b_ff1=(Fd,),
                w_ff2=(E, Fd), b_ff2=(E,), ln2_weight=(E,), ln2_bias=(E,), expect_out=(B, T, E))
    for k, s in want.items():
        assert arrs[k].shape == s, (name, k, arrs[k].shape, s)
    if "key_padding_mask" in arrs:
        assert arrs["key_padding_mask"].shape == (B, T), name
    assert set(arrs) <= set(ARRAY_NAMES), set(arrs) - set(ARRAY_NAMES)

    d = os.path.join(CASES_DIR, name)
    os.makedirs(d)
    for k in ARRAY_NAMES:
        if k in arrs:
            np.save(os.path.join(d, k + ".npy"), arrs[k])
    lines = ["# " + c for c in comments]
    lines += ["heads %d" % heads, "causal %d" % int(causal), "norm_first %d" % int(norm_first),
              "activation %s" % activation, "eps %s" % mg.fmt_float(eps)]
    with open(os.path.join(d, "meta.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")

    back = {k: np.load(os.path.join(d, k + ".npy")) for k in ARRAY_NAMES
            if os.path.exists(os.path.join(d, k + ".npy"))}
    ref = ref_encoder({k: v for k, v in back.items() if k != "expect_out"}, heads, causal, norm_first,
                      activation, eps)
    np.testing.assert_allclose(back["expect_out"], ref, rtol=rtol, atol=atol,
                               err_msg="%s: expect_out vs float64 reference" % name)
    SUMMARY.append((name, {k: (tuple(v.shape), str(v.dtype)) for k, v in back.items()},
                    float(np.max(np.abs(back["expect_out"] - ref)))))


# --------------------------------------------------------------------------
# torch.nn.TransformerEncoderLayer cases
# --------------------------------------------------------------------------

def layer_arrays(layer):
    sa = layer.self_attn
    wq, wk, wv = sa.in_proj_weight.chunk(3, dim=0)
    bq, bk, bv = sa.in_proj_bias.chunk(3, dim=0)
    return dict(w_query=wq, w_key=wk, w_value=wv, b_query=bq, b_key=bk, b_value=bv,
                w_out=sa.out_proj.weight, b_out=sa.out_proj.bias,
                ln1_weight=layer.norm1.weight, ln1_bias=layer.norm1.bias,
                w_ff1=layer.linear1.weight, b_ff1=layer.linear1.bias,
                w_ff2=layer.linear2.weight, b_ff2=layer.linear2.bias,
                ln2_weight=layer.norm2.weight, ln2_bias=layer.norm2.bias)


def rows_ok(T, causal, kpm):
    m = np.zeros((kpm.shape[0], T, T), dtype=bool) | kpm[:, None, :]
    if causal:
        m |= np.triu(np.ones((T, T), dtype=bool), k=1)[None]
    return bool((~m).any(axis=-1).all())


def layer_case(name, seed, *, B, T, E, H, Fd, activation="relu", norm_first=False, causal=False,
               kpm=None, eps=1e-5, x_scale=1.0, comment=None):
    torch.manual_seed(seed)
    layer = nn.TransformerEncoderLayer(E, H, dim_feedforward=Fd, dropout=0.0, activation=activation,
                                       layer_norm_eps=eps, batch_first=True, norm_first=norm_first)
    layer.eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for pname, p in layer.named_parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g) * (1.3 / math.sqrt(p.shape[1])))
            elif pname.startswith("norm") and pname.endswith("weight"):
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
    x = torch.randn(B, T, E, generator=g) * x_scale
    src_mask = mg.causal_bool(T, T) if causal else None
    tkpm = None
    if kpm is not None:
        assert rows_ok(T, causal, kpm), name
        tkpm = torch.from_numpy(kpm)
    assert torch.is_grad_enabled() and layer.self_attn.in_proj_weight.requires_grad
    out = layer(x, src_mask=src_mask, src_key_padding_mask=tkpm)
    assert not torch.isnan(out).any(), name
    comments = ["torch.nn.TransformerEncoderLayer(d_model=%d, nhead=%d, dim_feedforward=%d, dropout=0, "
                "activation=%s, layer_norm_eps=%g, batch_first=True, norm_first=%s), eval"
                % (E, H, Fd, activation, eps, norm_first),
                "every parameter and the input randn from torch.Generator seed %d (LayerNorm gamma 1 + 0.3 randn)"
                % seed]
    if causal:
        comments.append("causal: torch 1.13 got the equivalent boolean src_mask (key j > query i)")
    if comment:
        comments.append(comment)
    emit(name, comments, heads=H, causal=causal, norm_first=norm_first, activation=activation, eps=eps,
         arrays=dict(x=x, key_padding_mask=kpm, expect_out=out, **layer_arrays(layer)))


def layer_cases():
    layer_case("enc_post_relu", 6001, B=2, T=7, E=12, H=3, Fd=37)
    layer_case("enc_post_gelu", 6002, B=2, T=5, E=10, H=2, Fd=31, activation="gelu")
    layer_case("enc_pre_relu", 6003, B=2, T=6, E=9, H=3, Fd=28, norm_first=True)
    layer_case("enc_pre_gelu", 6004, B=1, T=9, E=6, H=2, Fd=19, norm_first=True, activation="gelu")
    layer_case("enc_causal_t37", 6005, B=2, T=37, E=15, H=3, Fd=46, causal=True)
    layer_case("enc_pre_causal_gelu_t37", 6006, B=1, T=37, E=11, H=1, Fd=34, causal=True, norm_first=True,
               activation="gelu")
    kpm = np.zeros((3, 8), dtype=bool)
    kpm[0, 5:] = True
    kpm[2, [0, 3, 6]] = True
    layer_case("enc_kpm", 6007, B=3, T=8, E=12, H=4, Fd=37, kpm=kpm,
               comment="key_padding_mask per batch entry (0: keys 5-7, 1: none, 2: keys 0,3,6)")
    kpm = np.zeros((2, 8), dtype=bool)
    kpm[0, 6:] = True
    kpm[1, [2, 5]] = True
    layer_case("enc_pre_kpm_causal", 6008, B=2, T=8, E=10, H=5, Fd=31, kpm=kpm, causal=True, norm_first=True,
               activation="gelu",
               comment="key_padding_mask (0: keys 6-7, 1: keys 2,5) and causal; key 0 never padded")
    layer_case("enc_t1", 6009, B=2, T=1, E=7, H=7, Fd=22, activation="gelu")
    layer_case("enc_pre_t1", 6010, B=3, T=1, E=5, H=1, Fd=16, norm_first=True)
    layer_case("enc_eps", 6011, B=2, T=4, E=8, H=2, Fd=25, eps=1e-2, x_scale=0.05,
               comment="layer_norm_eps 1e-2 and inputs scaled by 0.05, so that eps matters")


# --------------------------------------------------------------------------
# tutorial 004's encoder block
# --------------------------------------------------------------------------

def tutorial_case():
    words = mg.SENTENCE_004.replace(",", "").split()
    dc = {s: i for i, s in enumerate(sorted(words))}
    sentence_int = torch.tensor([dc[s] for s in words])
    torch.manual_seed(123)
    emb = torch.nn.Embedding(8, 2)(sentence_int).detach()
    mg.assert_printed("004 embedded_sentence", emb, mg.P004_EMBEDDED)
    # the notebook's RNG state when it built the MHA (see make_golden.py, tut004_mha2)
    torch.manual_seed(123)
    torch.rand(3, 2), torch.rand(3, 2), torch.rand(4, 2)
    mha = mg.MultiHeadSelfAttention(d_model=2, num_heads=2)
    x_in = emb.unsqueeze(0)
    mha_out = mha(x_in)
    mg.assert_printed("004 MHA output", mha_out[0], mg.P004_MHA_OUT)
    layer_norm_1 = nn.LayerNorm(normalized_shape=2)
    normed_1 = layer_norm_1(x_in + mha_out)
    mg.assert_printed("004 Add & Norm", normed_1[0], P004_ADD_NORM)
    ffn = FeedForward(d_model=2, hidden_dim=4)       # next in the RNG stream
    ffn_out = ffn(normed_1)
    mg.assert_printed("004 ffn_out", ffn_out[0], P004_FFN_OUT)
    layer_norm_2 = nn.LayerNorm(normalized_shape=2)
    encoder_out = layer_norm_2(normed_1 + ffn_out)
    mg.assert_printed("004 Final encoder output", encoder_out[0], P004_ENCODER_OUT)

    # the same weights in torch's own encoder layer give the same output
    layer = nn.TransformerEncoderLayer(2, 2, dim_feedforward=4, dropout=0.0, batch_first=True)
    layer.eval()
    with torch.no_grad():
        sa = layer.self_attn
        sa.in_proj_weight.copy_(torch.cat([mha.W_Q.weight, mha.W_K.weight, mha.W_V.weight]))
        sa.in_proj_bias.copy_(torch.cat([mha.W_Q.bias, mha.W_K.bias, mha.W_V.bias]))
        sa.out_proj.weight.copy_(mha.out_proj.weight)
        sa.out_proj.bias.copy_(mha.out_proj.bias)
        layer.linear1.weight.copy_(ffn.linear1.weight)
        layer.linear1.bias.copy_(ffn.linear1.bias)
        layer.linear2.weight.copy_(ffn.linear2.weight)
        layer.linear2.bias.copy_(ffn.linear2.bias)
        for ln_t, ln_l in ((layer_norm_1, layer.norm1), (layer_norm_2, layer.norm2)):
            assert (ln_t.weight == 1).all() and (ln_t.bias == 0).all()
            ln_l.weight.copy_(ln_t.weight)
            ln_l.bias.copy_(ln_t.bias)
    torch_out = layer(x_in)
    np.testing.assert_allclose(mg.to_np(torch_out), mg.to_np(encoder_out), rtol=1e-5, atol=1e-6,
                               err_msg="tutorial block vs nn.TransformerEncoderLayer")

    arrays = dict(x=x_in, expect_out=encoder_out, **layer_arrays(layer))
    emit("tut004_encoder",
         ["tutorial 004 encoder block on \"%s\" (nn.Embedding(8, 2), torch.manual_seed(123))" % mg.SENTENCE_004,
          "MultiHeadSelfAttention(d_model=2, num_heads=2) + residual + LayerNorm(2), FeedForward(2, 4) "
          "(Linear, ReLU, Linear) + residual + LayerNorm(2)",
          "MHA weights from the RNG state of make_golden.py's tut004_mha2; the FeedForward is built next in the "
          "same stream; LayerNorms gamma 1, beta 0",
          "expect_out is the tutorial modules' output (printed 'Final encoder output'); "
          "nn.TransformerEncoderLayer with these weights agrees"],
         heads=2, causal=False, norm_first=False, activation="relu", eps=1e-5, arrays=arrays)

    t = lambda a: mg.to_np(a)
    HEADER_DATA.update({
        "clattn_tut004_enc_x": (t(emb), "tutorial 004 embedded sentence, 8 tokens x d_model 2"),
        "clattn_tut004_enc_w_query": (t(mha.W_Q.weight), "MultiHeadSelfAttention W_Q.weight [out=2][in=2]"),
        "clattn_tut004_enc_b_query": (t(mha.W_Q.bias), "W_Q.bias"),
        "clattn_tut004_enc_w_key": (t(mha.W_K.weight), "W_K.weight [out=2][in=2]"),
        "clattn_tut004_enc_b_key": (t(mha.W_K.bias), "W_K.bias"),
        "clattn_tut004_enc_w_value": (t(mha.W_V.weight), "W_V.weight [out=2][in=2]"),
        "clattn_tut004_enc_b_value": (t(mha.W_V.bias), "W_V.bias"),
        "clattn_tut004_enc_w_out": (t(mha.out_proj.weight), "out_proj.weight [out=2][in=2]"),
        "clattn_tut004_enc_b_out": (t(mha.out_proj.bias), "out_proj.bias"),
        "clattn_tut004_enc_ln1_weight": (t(layer_norm_1.weight), "layer_norm_1 = nn.LayerNorm(2): gamma"),
        "clattn_tut004_enc_ln1_bias": (t(layer_norm_1.bias), "layer_norm_1: beta"),
        "clattn_tut004_enc_w_ff1": (t(ffn.linear1.weight), "FeedForward linear1.weight [hidden=4][d_model=2]"),
        "clattn_tut004_enc_b_ff1": (t(ffn.linear1.bias), "linear1.bias"),
        "clattn_tut004_enc_w_ff2": (t(ffn.linear2.weight), "FeedForward linear2.weight [d_model=2][hidden=4]"),
        "clattn_tut004_enc_b_ff2": (t(ffn.linear2.bias), "linear2.bias"),
        "clattn_tut004_enc_ln2_weight": (t(layer_norm_2.weight), "layer_norm_2 = nn.LayerNorm(2): gamma"),
        "clattn_tut004_enc_ln2_bias": (t(layer_norm_2.bias), "layer_norm_2: beta"),
        "clattn_tut004_enc_mha_out_printed": (np.array(mg.P004_MHA_OUT), "tutorial 004 printed 'MHA output'"),
        "clattn_tut004_enc_add_norm_printed": (np.array(P004_ADD_NORM), "tutorial 004 printed 'Add & Norm'"),
        "clattn_tut004_enc_out_printed": (np.array(P004_ENCODER_OUT),
                                          "tutorial 004 printed 'Final encoder output'"),
    })


def write_header():
    parts = [
        "/* GENERATED FILE - DO NOT EDIT.",
        " *",
        " * Generated by tests/golden/make_golden_encoder.py; regenerate from the repository root with:",
        " *     %s" % REGEN_CMD,
        " *",
        " * Tutorial 004's encoder block (/work/shared/seeds/004_*: \"My shoes are small, my feet are big.\")",
        " * for the CLI demo: the input and weights are the exact float32 values torch produced (\"%.9g\");",
        " * the *_printed tables are what the tutorial printed (4 decimals, copied as printed).",
        " * The matching fixture is tests/golden/encoder/tut004_encoder.",
        " */",
        "#ifndef CLATTN_CLI_TUTORIAL_ENCODER_DATA_H",
        "#define CLATTN_CLI_TUTORIAL_ENCODER_DATA_H",
        "",
    ]
    for name, (arr, comment) in HEADER_DATA.items():
        parts.append(mg.c_array(name, arr, comment))
        parts.append("")
    parts.append("#endif /* CLATTN_CLI_TUTORIAL_ENCODER_DATA_H */")
    with open(HEADER_PATH, "w") as f:
        f.write("\n".join(parts) + "\n")


def main():
    torch.set_num_threads(1)
    if not torch.__version__.startswith("1.13"):
        print("note: fixtures were made with torch 1.13, this is torch %s" % torch.__version__, file=sys.stderr)
    if os.path.isdir(CASES_DIR):
        shutil.rmtree(CASES_DIR)
    os.makedirs(CASES_DIR)
    tutorial_case()
    layer_cases()
    write_header()
    total = 0
    for root, _, files in os.walk(CASES_DIR):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    print("asserted %d printed tutorial tables" % len(mg.CHECKED))
    for what in mg.CHECKED:
        print("  ok  " + what)
    print("wrote %d cases to %s (%.1f KiB)" % (len(SUMMARY), os.path.relpath(CASES_DIR, REPO), total / 1024))
    for name, shapes, dout in SUMMARY:
        desc = ", ".join("%s%s" % (k, list(s)) + ("" if dt == "float32" else ":" + dt)
                         for k, (s, dt) in shapes.items() if k not in ("w_key", "w_value", "b_key", "b_value"))
        print("  %-24s %s  (max|d| vs f64 ref %.1e)" % (name, desc, dout))
    print("wrote %s" % os.path.relpath(HEADER_PATH, REPO))
    assert total < 1024 * 1024, "encoder fixtures too large"


if __name__ == "__main__":
    main()
