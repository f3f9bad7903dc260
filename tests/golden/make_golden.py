#!/usr/bin/python3
"""Generate clattn's golden test fixtures with PyTorch.

How to run (from the repository root; needs PyTorch, Debian's 1.13 is what
the committed fixtures were made with, and numpy)::

    /usr/bin/python3 tests/golden/make_golden.py

The script deletes and rewrites everything it generates:

* ``tests/golden/cases/<case_name>/``: one directory per case (see below);
* ``src/cli/tutorial_data.h``: C header with the tutorial inputs, weights and
  printed tables that the CLI demo shows side by side.

The output is deterministic: fixed seeds everywhere, single-threaded torch.
Running it twice gives byte-identical files on one machine. Another BLAS under
torch can move the last bit of a float32 value (the mha_* fixtures older than
mha_causal_kpm were written before libopenblas0-pthread was installed here and
differ from a fresh run by at most 2.4e-7, far inside the test tolerance);
commit only the cases you meant to change.

Case directory contract (the same as ``clattn run``'s input contract)
----------------------------------------------------------------------
All arrays are written with ``np.save``: float32 little-endian, C order,
unless said otherwise.

``x.npy``            (B, Tq, E) queries input, always 3-D.
``kv.npy``           (B, Tk, Ekv) key/value input, only for cross-attention.
``w_query.npy``      (H*dk, E)   torch nn.Linear layout [out, in].
``w_key.npy``        (H*dk, Ekv) ditto.
``w_value.npy``      (H*dv, Ekv) ditto.  All three absent: no trainable
                     weights (Q = x, K = V = kv or x).  Tutorials that
                     compute ``x @ W`` with W as [in, out] are stored as W.T.
``b_query.npy``      (H*dk), ``b_key.npy`` (H*dk), ``b_value.npy`` (H*dv):
                     only when the case has those biases.
``w_out.npy``        (Eo, H*dv), ``b_out.npy`` (Eo): output projection, only
                     when the case has one (``b_out`` only if it has a bias).
``key_padding_mask.npy`` (B, Tk) bool, True = ignore that key.  Optional.
``attn_mask.npy``    (Tq, Tk) bool (True = not allowed) or float32 (added to
                     the scaled scores).  Optional.
``meta.txt``         ``key value`` lines, ``#`` comments.  Keys: ``heads``,
                     ``dk``, ``dv``, ``causal`` (always), ``scale`` (only
                     when it is not the default 1/sqrt(dk)) and ``dtype``
                     (``f16`` or ``bf16``: a half-precision case, below).
``expect_out.npy``   (B, Tq, Eo) or (B, Tq, H*dv) expected output.
``expect_attn.npy``  (B, H, Tq, Tk) attention weights after masking and
                     softmax (eval mode: no dropout in any fixture).

Semantics: scores = scale * Q_h K_h^T (+ float attn_mask); ``causal`` masks
key j > query i (top-left aligned, also when Tq != Tk); boolean masks and
the key padding mask set scores to -inf; softmax over keys; context =
weights @ V_h; heads concatenated in head order; optional output projection.
Fully masked query rows appear only in ``mha_causal_kpm`` and
``mha_fully_masked``: PyTorch gives NaN there, and those two fixtures hold
clattn's documented values instead (weights 0, output = out_proj.bias),
after the script has checked that PyTorch's NaNs fall exactly on those rows.

Where the expectations come from
--------------------------------
* ``tut*``: the tutorials in /work/shared/seeds (000..004), reproduced with
  their exact ``torch.manual_seed`` calls.  Every table the tutorials print
  for these cases is hard-coded below and asserted to 4 decimals.  The 003
  tables printed in training mode (dropout 0.2) are reproduced too, by
  running the tutorial classes in training mode with the tutorial's seed
  (torch's CPU dropout RNG reproduces them); the fixtures themselves hold the
  eval-mode (no dropout) expectations.
* ``mha_*``: torch.nn.MultiheadAttention (batch_first, eval, dropout 0,
  need_weights, average_attn_weights=False) with randomised parameters.
  torch 1.13 has no ``is_causal``: torch gets the equivalent boolean mask,
  the fixture says ``causal 1`` and has no attn_mask.npy for it.
* ``manual_*``: computed in float64 with numpy (cast to float32 at the end)
  and cross-checked against an independent per-head float64 torch loop.
* ``half_*``: half-precision plans (``dtype`` in meta.txt, issue 38).  The
  same torch.nn.MultiheadAttention, its parameters and inputs rounded to
  float16 or bfloat16 (torch's ``.to(dtype)``, to nearest even), then the
  module run in float64 on those values: the expectation is the float64
  function of the rounded inputs, which README "Precision" bounds a half
  plan's output against (torch 1.13 has no half matmul on a CPU to compare
  with).  The arrays are float32 files like every case's, holding the rounded
  values exactly; a test runs the case in its type and in float32.

Every case, whatever its source, is re-read from disk and recomputed with a
float64 numpy implementation of the contract above; the script fails if the
files disagree with the expectations.
"""

import math
import os
import shutil
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CASES_DIR = os.path.join(REPO, "tests", "golden", "cases")
HEADER_PATH = os.path.join(REPO, "src", "cli", "tutorial_data.h")
REGEN_CMD = "/usr/bin/python3 tests/golden/make_golden.py"

# Tolerance for comparing against numbers a tutorial printed with 4 decimals:
# half a unit of the last printed digit plus float32 noise.
PRINT_TOL = 5e-5 + 2e-6

SUMMARY = []       # (case name, {file: shape/dtype}) for the final report
HEADER_DATA = {}   # name -> (np.ndarray, comment) for tutorial_data.h


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------

def to_np(t):
    """Tensor / array -> numpy array (no copy of semantics, just a view)."""
    if isinstance(t, torch.Tensor):
        return t.detach().cpu().numpy()
    return np.asarray(t)


def assert_printed(what, actual, printed, tol=PRINT_TOL):
    """Assert that `actual` rounds to the table a tutorial printed."""
    a = np.asarray(to_np(actual), dtype=np.float64)
    p = np.asarray(printed, dtype=np.float64)
    if a.shape != p.shape:
        raise AssertionError("%s: shape %s, tutorial printed %s"
                             % (what, a.shape, p.shape))
    err = np.max(np.abs(a - p)) if a.size else 0.0
    if not err <= tol:
        raise AssertionError(
            "%s does not match the tutorial's printed table (max |diff| %.3g > %.3g)\n"
            "computed:\n%s\nprinted:\n%s" % (what, err, tol, np.round(a, 4), p))
    CHECKED.append(what)


CHECKED = []  # descriptions of asserted printed tables, for the report


def fmt_float(v):
    """repr-like short float for meta.txt (%.9g)."""
    return "%.9g" % v


def reference_attention(arrs, heads, dk, dv, causal, scale):
    """float64 numpy implementation of the fixture contract.

    Returns (out, attn) with out (B, Tq, Eo or H*dv) and attn (B, H, Tq, Tk).
    """
    x = arrs["x"].astype(np.float64)
    kv = arrs["kv"].astype(np.float64) if "kv" in arrs else x
    B, Tq, _ = x.shape
    Tk = kv.shape[1]
    if "w_query" in arrs:
        q = x @ arrs["w_query"].astype(np.float64).T
        k = kv @ arrs["w_key"].astype(np.float64).T
        v = kv @ arrs["w_value"].astype(np.float64).T
        if "b_query" in arrs:
            q = q + arrs["b_query"]
        if "b_key" in arrs:
            k = k + arrs["b_key"]
        if "b_value" in arrs:
            v = v + arrs["b_value"]
    else:
        q, k, v = x, kv, kv
    q = q.reshape(B, Tq, heads, dk).transpose(0, 2, 1, 3)
    k = k.reshape(B, Tk, heads, dk).transpose(0, 2, 1, 3)
    v = v.reshape(B, Tk, heads, dv).transpose(0, 2, 1, 3)
    s = scale * (q @ k.transpose(0, 1, 3, 2))          # (B, H, Tq, Tk)
    masked = np.zeros((B, 1, Tq, Tk), dtype=bool)
    if "attn_mask" in arrs:
        m = arrs["attn_mask"]
        if m.dtype == np.bool_:
            masked |= m[None, None]
        else:
            s = s + m.astype(np.float64)[None, None]
    if causal:
        masked |= np.triu(np.ones((Tq, Tk), dtype=bool), k=1)[None, None]
    if "key_padding_mask" in arrs:
        masked |= arrs["key_padding_mask"][:, None, None, :]
    s = np.where(masked, -np.inf, s)
    allowed = np.isfinite(s)
    live = allowed.any(axis=-1, keepdims=True)   # rows with at least one key
    mx = np.where(live, np.where(allowed, s, -np.inf).max(axis=-1, keepdims=True), 0.0)
    e = np.where(allowed, np.exp(np.where(allowed, s, 0.0) - mx), 0.0)
    # clattn's documented choice: a row with no visible key has weights 0 (torch: NaN)
    a = np.where(live, e / np.where(live, e.sum(axis=-1, keepdims=True), 1.0), 0.0)
    ctx = (a @ v).transpose(0, 2, 1, 3).reshape(B, Tq, heads * dv)
    if "w_out" in arrs:
        ctx = ctx @ arrs["w_out"].astype(np.float64).T
        if "b_out" in arrs:
            ctx = ctx + arrs["b_out"]
    return ctx, a


ARRAY_NAMES = ("x", "kv", "w_query", "w_key", "w_value", "b_query", "b_key",
               "b_value", "w_out", "b_out", "key_padding_mask", "attn_mask",
               "expect_out", "expect_attn")


def emit(name, comments, *, x, heads, dk, dv, causal, out, attn, scale=None,
         kv=None, w_query=None, w_key=None, w_value=None, b_query=None,
         b_key=None, b_value=None, w_out=None, b_out=None,
         key_padding_mask=None, attn_mask=None, rtol=1e-4, atol=2e-5, dtype=None):
    """Validate one case against the contract, write it, re-read and check it."""
    arrs = {}
    given = dict(x=x, kv=kv, w_query=w_query, w_key=w_key, w_value=w_value,
                 b_query=b_query, b_key=b_key, b_value=b_value, w_out=w_out,
                 b_out=b_out, key_padding_mask=key_padding_mask,
                 attn_mask=attn_mask, expect_out=out, expect_attn=attn)
    for k, v in given.items():
        if v is None:
            continue
        a = to_np(v)
        if k == "key_padding_mask" or (k == "attn_mask" and a.dtype == np.bool_):
            a = np.ascontiguousarray(a.astype(np.bool_))
        else:
            a = np.ascontiguousarray(a.astype("<f4"))
        if a.dtype != np.bool_ and not np.isfinite(a).all() and k != "attn_mask":
            raise AssertionError("%s/%s contains non-finite values" % (name, k))
        arrs[k] = a

    # ---- contract shape checks ----
    H = heads
    xa = arrs["x"]
    assert xa.ndim == 3, name
    B, Tq, E = xa.shape
    kva = arrs.get("kv", xa)
    assert kva.ndim == 3 and kva.shape[0] == B, name
    Tk, Ekv = kva.shape[1], kva.shape[2]
    wset = [k in arrs for k in ("w_query", "w_key", "w_value")]
    assert all(wset) or not any(wset), "%s: w_query/w_key/w_value all or none" % name
    if all(wset):
        assert arrs["w_query"].shape == (H * dk, E), (name, arrs["w_query"].shape)
        assert arrs["w_key"].shape == (H * dk, Ekv), (name, arrs["w_key"].shape)
        assert arrs["w_value"].shape == (H * dv, Ekv), (name, arrs["w_value"].shape)
    else:
        assert E == H * dk and Ekv == H * dk and Ekv == H * dv, name
        assert not any(b in arrs for b in ("b_query", "b_key", "b_value")), name
    for b, n in (("b_query", dk), ("b_key", dk), ("b_value", dv)):
        if b in arrs:
            assert arrs[b].shape == (H * n,), (name, b)
    Eo = H * dv
    if "w_out" in arrs:
        assert arrs["w_out"].ndim == 2 and arrs["w_out"].shape[1] == H * dv, name
        Eo = arrs["w_out"].shape[0]
        if "b_out" in arrs:
            assert arrs["b_out"].shape == (Eo,), name
    else:
        assert "b_out" not in arrs, name
    if "key_padding_mask" in arrs:
        assert arrs["key_padding_mask"].shape == (B, Tk), name
    if "attn_mask" in arrs:
        assert arrs["attn_mask"].shape == (Tq, Tk), name
        assert arrs["attn_mask"].dtype in (np.bool_, np.dtype("<f4")), name
    assert arrs["expect_out"].shape == (B, Tq, Eo), (name, arrs["expect_out"].shape)
    assert arrs["expect_attn"].shape == (B, H, Tq, Tk), (name, arrs["expect_attn"].shape)

    # ---- write ----
    d = os.path.join(CASES_DIR, name)
    os.makedirs(d)
    for k in ARRAY_NAMES:
        if k in arrs:
            np.save(os.path.join(d, k + ".npy"), arrs[k])
    lines = ["# " + c for c in comments]
    lines += ["heads %d" % heads, "dk %d" % dk, "dv %d" % dv,
              "causal %d" % (1 if causal else 0)]
    if scale is not None:
        lines.append("scale %s" % fmt_float(scale))
    if dtype is not None:
        assert dtype in ("f16", "bf16"), name
        lines.append("dtype %s" % dtype)
        tt = torch.float16 if dtype == "f16" else torch.bfloat16
        for k in ("x", "kv", "w_query", "w_key", "w_value", "b_query", "b_key", "b_value", "w_out", "b_out"):
            if k in arrs:  # every input a value of the type: the float32 file holds it exactly
                assert np.array_equal(arrs[k], torch.from_numpy(arrs[k]).to(tt).float().numpy()), (name, k)
    with open(os.path.join(d, "meta.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")

    # ---- re-read from disk and check against the float64 reference ----
    back = {}
    for k in ARRAY_NAMES:
        p = os.path.join(d, k + ".npy")
        if os.path.exists(p):
            back[k] = np.load(p)
            assert back[k].dtype.byteorder in ("<", "|", "=") and back[k].flags.c_contiguous
    ref_scale = scale if scale is not None else 1.0 / math.sqrt(dk)
    rout, rattn = reference_attention(back, heads, dk, dv, causal, ref_scale)
    np.testing.assert_allclose(back["expect_out"], rout, rtol=rtol, atol=atol,
                               err_msg="%s: expect_out vs float64 reference" % name)
    np.testing.assert_allclose(back["expect_attn"], rattn, rtol=rtol, atol=atol,
                               err_msg="%s: expect_attn vs float64 reference" % name)
    rows = back["expect_attn"].sum(axis=-1)
    # every row sums to 1, except the fully masked ones (all weights 0, clattn's choice)
    assert np.all(np.isclose(rows, 1.0, atol=1e-5) | (np.abs(back["expect_attn"]).max(axis=-1) == 0.0)), name
    SUMMARY.append((name, {k: (tuple(v.shape), str(v.dtype)) for k, v in back.items()},
                    float(np.max(np.abs(back["expect_out"] - rout))),
                    float(np.max(np.abs(back["expect_attn"] - rattn)))))


def causal_bool(tq, tk):
    """Top-left aligned causal mask: True where key j > query i."""
    return torch.triu(torch.ones(tq, tk, dtype=torch.bool), diagonal=1)


# --------------------------------------------------------------------------
# tutorial inputs and printed tables (copied from /work/shared/seeds)
# --------------------------------------------------------------------------

# 001 / 002: "Your journey starts with one step"
YOUR_JOURNEY = [[0.43, 0.15, 0.89],   # Your
                [0.55, 0.87, 0.66],   # journey
                [0.57, 0.85, 0.64],   # starts
                [0.22, 0.58, 0.33],   # with
                [0.77, 0.25, 0.10],   # one
                [0.05, 0.80, 0.55]]   # step

P001_SCORES = [[0.9995, 0.9544, 0.9422, 0.4753, 0.4576, 0.6310],
               [0.9544, 1.4950, 1.4754, 0.8434, 0.7070, 1.0865],
               [0.9422, 1.4754, 1.4570, 0.8296, 0.7154, 1.0605],
               [0.4753, 0.8434, 0.8296, 0.4937, 0.3474, 0.6565],
               [0.4576, 0.7070, 0.7154, 0.3474, 0.6654, 0.2935],
               [0.6310, 1.0865, 1.0605, 0.6565, 0.2935, 0.9450]]
P001_ATTN = [[0.2098, 0.2006, 0.1981, 0.1242, 0.1220, 0.1452],
             [0.1385, 0.2379, 0.2333, 0.1240, 0.1082, 0.1581],
             [0.1390, 0.2369, 0.2326, 0.1242, 0.1108, 0.1565],
             [0.1435, 0.2074, 0.2046, 0.1462, 0.1263, 0.1720],
             [0.1526, 0.1958, 0.1975, 0.1367, 0.1879, 0.1295],
             [0.1385, 0.2184, 0.2128, 0.1420, 0.0988, 0.1896]]
P001_CONTEXT = [[0.4421, 0.5931, 0.5790],
                [0.4419, 0.6515, 0.5683],
                [0.4431, 0.6496, 0.5671],
                [0.4304, 0.6298, 0.5510],
                [0.4671, 0.5910, 0.5266],
                [0.4177, 0.6503, 0.5645]]
P001_W_QUERY = [[0.2961, 0.5166], [0.2517, 0.6886], [0.0740, 0.8665]]
P001_QUERY_2 = [0.4306, 1.4551]
P001_SA_SCORES_2 = [1.2705, 1.8524, 1.8111, 1.0795, 0.5577, 1.5440]
P001_SA_ATTN_2 = [0.1500, 0.2264, 0.2199, 0.1311, 0.0906, 0.1820]
P001_SA_V1 = [[0.2996, 0.8053],
              [0.3061, 0.8210],
              [0.3058, 0.8203],
              [0.2948, 0.7939],
              [0.2927, 0.7891],
              [0.2990, 0.8040]]
# 002 prints the unscaled scores and the scaled softmax of the same weights
P002_SA_SCORES = [[0.9231, 1.3545, 1.3241, 0.7910, 0.4032, 1.1330],
                  [1.2705, 1.8524, 1.8111, 1.0795, 0.5577, 1.5440],
                  [1.2544, 1.8284, 1.7877, 1.0654, 0.5508, 1.5238],
                  [0.6973, 1.0167, 0.9941, 0.5925, 0.3061, 0.8475],
                  [0.6114, 0.8819, 0.8626, 0.5121, 0.2707, 0.7307],
                  [0.8995, 1.3165, 1.2871, 0.7682, 0.3937, 1.0996]]
P002_SA_ATTN = [[0.1551, 0.2104, 0.2059, 0.1413, 0.1074, 0.1799],
                [0.1500, 0.2264, 0.2199, 0.1311, 0.0906, 0.1820],
                [0.1503, 0.2256, 0.2192, 0.1315, 0.0914, 0.1819],
                [0.1591, 0.1994, 0.1962, 0.1477, 0.1206, 0.1769],
                [0.1610, 0.1949, 0.1923, 0.1501, 0.1265, 0.1752],
                [0.1557, 0.2092, 0.2048, 0.1419, 0.1089, 0.1794]]
P001_SA_V2 = [[-0.0739, 0.0713],
              [-0.0748, 0.0703],
              [-0.0749, 0.0702],
              [-0.0760, 0.0685],
              [-0.0763, 0.0679],
              [-0.0754, 0.0693]]

# 000
INPUT_EMB_000 = [[0.12, 0.45, 0.67],   # Attention
                 [0.34, 0.56, 0.78],   # Mechanism
                 [0.23, 0.57, 0.91],   # drives
                 [0.76, 0.88, 0.45],   # contextual
                 [0.54, 0.12, 0.34]]   # embedding
P000_SA = [[-0.5128, -0.0366],
           [-0.5141, -0.0376],
           [-0.5143, -0.0377],
           [-0.5143, -0.0377],
           [-0.5129, -0.0367]]

# 003
EXAMPLE_003 = [[0.23, 0.87, 0.45],
               [0.12, 0.76, 0.34],
               [0.98, 0.54, 0.21],
               [0.67, 0.39, 0.88],
               [0.53, 0.29, 0.74],
               [0.41, 0.65, 0.32]]
P003_SIMPLE_SCORES = [[1.0123, 0.8418, 0.7897, 0.8894, 0.7072, 0.8038],
                      [0.8418, 0.7076, 0.5994, 0.6760, 0.5356, 0.6520],
                      [0.7897, 0.5994, 1.2961, 1.0520, 0.8314, 0.8200],
                      [0.8894, 0.6760, 1.0520, 1.3754, 1.1194, 0.8098],
                      [0.7072, 0.5356, 0.8314, 1.1194, 0.9126, 0.6426],
                      [0.8038, 0.6520, 0.8200, 0.8098, 0.6426, 0.6930]]
P003_SIMPLE_ATTN = [[0.1970, 0.1661, 0.1577, 0.1742, 0.1452, 0.1599],
                    [0.1972, 0.1725, 0.1548, 0.1671, 0.1452, 0.1631],
                    [0.1458, 0.1205, 0.2419, 0.1895, 0.1520, 0.1503],
                    [0.1472, 0.1189, 0.1732, 0.2394, 0.1853, 0.1360],
                    [0.1504, 0.1267, 0.1703, 0.2271, 0.1847, 0.1410],
                    [0.1777, 0.1527, 0.1806, 0.1788, 0.1512, 0.1591]]
P003_SIMPLE_CONTEXT = [[0.4790, 0.5967, 0.4901],
                       [0.4736, 0.5996, 0.4866],
                       [0.5542, 0.5647, 0.4847],
                       [0.5322, 0.5475, 0.5343],
                       [0.5244, 0.5528, 0.5281],
                       [0.5013, 0.5851, 0.4899]]
P003_RAW_W_QUERY = [[0.7902, 0.9813], [0.5914, 0.3650], [0.7470, 0.6896]]
P003_RAW_W_KEY = [[0.8815, 0.7708], [0.7810, 0.2139], [0.1007, 0.5230]]
P003_RAW_W_VALUE = [[0.3128, 0.8854], [0.6202, 0.9351], [0.4072, 0.3055]]
P003_RAW_KEYS = [[0.9275, 0.5987], [0.7335, 0.4328], [1.3067, 0.9807],
                 [0.9838, 1.0601], [0.7682, 0.8576], [0.9013, 0.6224]]
P003_RAW_VALUES = [[0.7948, 1.1547], [0.6473, 0.9208], [0.7269, 1.4368],
                   [0.8098, 1.2268], [0.6469, 0.9665], [0.6617, 1.0686]]
P003_RAW_ATTN_2 = [0.1517, 0.1263, 0.2228, 0.1924, 0.1556, 0.1511]
P003_SA_RAW = [[0.7227, 1.1697],
               [0.7208, 1.1596],
               [0.7256, 1.1836],
               [0.7266, 1.1898],
               [0.7245, 1.1777],
               [0.7225, 1.1676]]
P003_SA_V2 = [[-0.5480, -0.1288],
              [-0.5475, -0.1291],
              [-0.5503, -0.1260],
              [-0.5530, -0.1225],
              [-0.5523, -0.1232],
              [-0.5487, -0.1277]]
P003_SA_V2_ATTN = [[0.1699, 0.1678, 0.1666, 0.1654, 0.1634, 0.1670],
                   [0.1701, 0.1690, 0.1659, 0.1642, 0.1633, 0.1675],
                   [0.1663, 0.1617, 0.1698, 0.1717, 0.1663, 0.1642],
                   [0.1616, 0.1544, 0.1735, 0.1797, 0.1701, 0.1607],
                   [0.1622, 0.1562, 0.1725, 0.1777, 0.1698, 0.1616],
                   [0.1684, 0.1659, 0.1675, 0.1674, 0.1647, 0.1661]]
P003_CAUSAL_ATTN = [[1.0000, 0.0000, 0.0000, 0.0000, 0.0000, 0.0000],
                    [0.5016, 0.4984, 0.0000, 0.0000, 0.0000, 0.0000],
                    [0.3341, 0.3249, 0.3410, 0.0000, 0.0000, 0.0000],
                    [0.2415, 0.2307, 0.2593, 0.2685, 0.0000, 0.0000],
                    [0.1935, 0.1863, 0.2057, 0.2120, 0.2025, 0.0000],
                    [0.1684, 0.1659, 0.1675, 0.1674, 0.1647, 0.1661]]
# printed in TRAINING mode (dropout 0.2 active): reproduced in training mode
P003_CAUSAL_TRAIN = [[[-0.6411, -0.2989], [-0.5690, -0.2869], [-0.6798, -0.3041],
                      [-0.7194, -0.1945], [-0.7039, -0.1326], [-0.4672, -0.1319]],
                     [[0.0000, 0.0000], [-0.5690, -0.2869], [-0.5185, -0.2148],
                      [-0.7194, -0.1945], [-0.7039, -0.1326], [-0.5828, -0.1157]]]
P003_SIMPLE_MHA_TRAIN = [
    [[-0.6411, -0.2989, 0.5830, 0.5474, 0.6471, 0.3096],
     [-0.5690, -0.2869, 0.2212, 0.2294, 0.3217, 0.1539],
     [-0.5185, -0.2148, 0.6319, 0.5352, 0.6957, 0.2858],
     [-0.3459, -0.1508, 0.6740, 0.4963, 0.4929, 0.2423],
     [-0.4001, -0.1784, 0.4313, 0.2915, 0.6202, 0.2783],
     [-0.3938, -0.0890, 0.5032, 0.3488, 0.5450, 0.2628]],
    [[-0.6411, -0.2989, 0.5830, 0.5474, 0.6471, 0.3096],
     [-0.5690, -0.2869, 0.2212, 0.2294, 0.3217, 0.1539],
     [-0.6798, -0.3041, 0.6319, 0.5352, 0.6957, 0.2858],
     [-0.7194, -0.1945, 0.6740, 0.4963, 0.5811, 0.2489],
     [-0.7039, -0.1326, 0.3620, 0.2731, 0.4472, 0.1912],
     [-0.4969, -0.1330, 0.6556, 0.4547, 0.6202, 0.2750]]]
P003_MHA_TRAIN = [
    [[-0.5541, 0.0125, 0.2086, 0.3608, -0.0163, 0.1243],
     [-0.5025, 0.0758, 0.0628, 0.3633, -0.0425, 0.0346],
     [-0.4246, 0.0624, 0.3454, 0.4126, -0.0856, 0.2563],
     [-0.2565, 0.0844, 0.2199, 0.6000, -0.1633, 0.2833],
     [-0.3168, -0.0127, 0.4560, 0.5945, -0.1321, 0.4386],
     [-0.3281, 0.0271, 0.2888, 0.5457, -0.1322, 0.3014]],
    [[-0.4187, -0.1174, 0.2735, 0.6119, -0.0837, 0.2908],
     [-0.4279, 0.0210, 0.0660, 0.4885, -0.0798, 0.0995],
     [-0.4039, -0.0576, 0.3259, 0.5950, -0.0789, 0.3235],
     [-0.3660, -0.0625, 0.3912, 0.6157, -0.0995, 0.3895],
     [-0.3168, -0.0127, 0.4560, 0.5945, -0.1321, 0.4386],
     [-0.3541, 0.0049, 0.4174, 0.5522, -0.1166, 0.3840]]]

# 004: "My shoes are small, my feet are big."
SENTENCE_004 = "My shoes are small, my feet are big."
P004_EMBEDDED = [[0.3374, -0.1778], [0.1794, 1.8951], [0.3486, 0.6603],
                 [0.4954, 0.2692], [0.6984, -1.4097], [0.7671, -1.1925],
                 [0.3486, 0.6603], [-0.2196, -0.3792]]
P004_W_QUERY = [[0.2961, 0.5166], [0.2517, 0.6886], [0.0740, 0.8665]]
P004_W_KEY = [[0.1366, 0.1025], [0.1841, 0.7264], [0.3153, 0.6871]]
P004_W_VALUE = [[0.0756, 0.1966], [0.3164, 0.4017], [0.1186, 0.8274],
                [0.3821, 0.6605]]
P004_QUERIES = [[0.0081, -0.0375, -0.1291], [1.0321, 1.3501, 1.6555],
                [0.4443, 0.5424, 0.5980], [0.2858, 0.3100, 0.2699],
                [-0.5214, -0.7949, -1.1699], [-0.3889, -0.6280, -0.9766],
                [0.4443, 0.5424, 0.5980], [-0.2609, -0.3164, -0.3448]]
P004_KEYS = [[0.0279, -0.0671, -0.0158], [0.2187, 1.4097, 1.3587],
             [0.1153, 0.5439, 0.5636], [0.0953, 0.2867, 0.3412],
             [-0.0491, -0.8956, -0.7485], [-0.0174, -0.7251, -0.5775],
             [0.1153, 0.5439, 0.5636], [-0.0689, -0.3159, -0.3298]]
P004_VALUES = [[-0.0094, 0.0353, -0.1071, 0.0115], [0.3862, 0.8181, 1.5893, 1.3203],
               [0.1562, 0.3756, 0.5877, 0.5693], [0.0904, 0.2649, 0.2815, 0.3671],
               [-0.2244, -0.3454, -1.0836, -0.6643], [-0.1765, -0.2364, -0.8957, -0.4945],
               [0.1562, 0.3756, 0.5877, 0.5693], [-0.0912, -0.2218, -0.3398, -0.3344]]
P004_OMEGA_2 = [-0.0879, 4.3783, 1.7863, 1.0502, -2.4988, -1.9530, 1.7863, -1.0434]
P004_ATTN_2 = [0.0432, 0.5687, 0.1273, 0.0832, 0.0107, 0.0147, 0.1273, 0.0249]
P004_CONTEXT_2 = [0.2593, 0.5718, 1.0390, 0.9041]
# 3-head random weights printed later in 004 (drawn from the same RNG state
# that the MultiHeadSelfAttention was built from; see tut004_mha2)
P004_MULTIHEAD_W_QUERY = [[[0.8536, 0.5932], [0.6367, 0.9826], [0.2745, 0.6584]],
                          [[0.2775, 0.8573], [0.8993, 0.0390], [0.9268, 0.7388]],
                          [[0.7179, 0.7058], [0.9156, 0.4340], [0.0772, 0.3565]]]
P004_MHA_Q = [[-0.1736, 0.1679], [0.0204, 1.5522], [-0.0576, 0.7421],
              [-0.0357, 0.5035], [-0.1554, -0.6032], [-0.0924, -0.4416],
              [-0.0576, 0.7421], [-0.4787, -0.0773]]
P004_MHA_K = [[0.4076, 0.6441], [1.5049, -0.7966], [0.8276, 0.1040],
              [0.5838, 0.4420], [-0.3285, 1.6511], [-0.2403, 1.5483],
              [0.8276, 0.1040], [0.4811, 0.4608]]
P004_MHA_V = [[-0.5458, 0.0120], [0.0089, -0.2744], [-0.2984, -0.0596],
              [-0.3670, 0.0632], [-0.7932, 0.3392], [-0.7088, 0.3594],
              [-0.2984, -0.0596], [-0.7761, -0.2966]]
P004_MHA_OUT = [[0.1839, 0.7218], [0.1803, 0.6445], [0.1805, 0.6862],
                [0.1774, 0.6997], [0.1777, 0.7618], [0.1746, 0.7531],
                [0.1805, 0.6862], [0.2011, 0.7406]]


# --------------------------------------------------------------------------
# tutorial classes (logic copied from the tutorials; the only additions are
# `last_attn` attributes that keep the attention weights for the fixtures)
# --------------------------------------------------------------------------

class SelfAttention_v1(nn.Module):          # 001 / 002
    def __init__(self, d_in, d_out):
        super().__init__()
        self.W_query = nn.Parameter(torch.rand(d_in, d_out))
        self.W_key = nn.Parameter(torch.rand(d_in, d_out))
        self.W_value = nn.Parameter(torch.rand(d_in, d_out))

    def forward(self, x, causal=False):
        keys = x @ self.W_key
        queries = x @ self.W_query
        values = x @ self.W_value
        attn_scores = queries @ keys.T
        if causal:   # not in the tutorial class: the tut001_sa_v1_causal variant
            n = attn_scores.shape[0]
            attn_scores = attn_scores.masked_fill(causal_bool(n, n), -torch.inf)
        attn_weights = torch.softmax(attn_scores / keys.shape[-1] ** 0.5, dim=-1)
        self.last_attn = attn_weights
        return attn_weights @ values


class SelfAttention_v2(nn.Module):          # 001 (also 000's SelfAttention)
    def __init__(self, d_in, d_out, qkv_bias=False):
        super().__init__()
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)

    def forward(self, x):
        keys = self.W_key(x)
        queries = self.W_query(x)
        values = self.W_value(x)
        attn_scores = queries @ keys.T
        attn_weights = torch.softmax(attn_scores / keys.shape[-1] ** 0.5, dim=-1)
        self.last_attn = attn_weights
        return attn_weights @ values


class SelfAttention003(nn.Module):          # 003 "SelfAttention" (raw matrices)
    def __init__(self, input_dim, output_dim):
        super().__init__()
        self.weight_query = nn.Parameter(torch.rand(input_dim, output_dim))
        self.weight_key = nn.Parameter(torch.rand(input_dim, output_dim))
        self.weight_value = nn.Parameter(torch.rand(input_dim, output_dim))

    def forward(self, x):
        queries = x @ self.weight_query
        keys = x @ self.weight_key
        values = x @ self.weight_value
        attention_scores = queries @ keys.T
        scaling_factor = keys.shape[-1] ** 0.5
        attention_weights = torch.softmax(attention_scores / scaling_factor, dim=-1)
        self.last_attn = attention_weights
        return attention_weights @ values


class SelfAttentionv2_003(nn.Module):       # 003 "SelfAttentionv2"
    def __init__(self, input_dim, output_dim, qkv_bias=False):
        super().__init__()
        self.weight_query = nn.Linear(input_dim, output_dim, bias=qkv_bias)
        self.weight_key = nn.Linear(input_dim, output_dim, bias=qkv_bias)
        self.weight_value = nn.Linear(input_dim, output_dim, bias=qkv_bias)

    def forward(self, x):
        queries = self.weight_query(x)
        keys = self.weight_key(x)
        values = self.weight_value(x)
        attention_scores = queries @ keys.T
        scaling_factor = keys.shape[-1] ** 0.5
        attention_weights = torch.softmax(attention_scores / scaling_factor, dim=-1)
        self.last_attn = attention_weights
        return attention_weights @ values


class CausalAttention(nn.Module):           # 003
    def __init__(self, input_dim, output_dim, dropout, context_length, qkv_bias=False):
        super().__init__()
        self.query_weight = nn.Linear(input_dim, output_dim, qkv_bias)
        self.key_weight = nn.Linear(input_dim, output_dim, qkv_bias)
        self.value_weight = nn.Linear(input_dim, output_dim, qkv_bias)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("causal_mask", torch.triu(torch.ones(context_length, context_length), diagonal=1))

    def forward(self, x):
        num_tokens = x.shape[1]
        queries = self.query_weight(x)
        keys = self.key_weight(x)
        values = self.value_weight(x)
        attention_scores = queries @ keys.transpose(1, 2)
        attention_scores.masked_fill_(self.causal_mask.bool()[:num_tokens, :num_tokens], -torch.inf)
        scaling_factor = keys.shape[-1] ** 0.5
        attention_weights = torch.softmax(attention_scores / scaling_factor, dim=-1)
        attention_weights = self.dropout(attention_weights)
        self.last_attn = attention_weights
        return attention_weights @ values


class SimpleMultiHeadAttention(nn.Module):  # 003
    def __init__(self, input_dim, output_dim, dropout, context_length, num_heads, qkv_bias=False):
        super().__init__()
        self.heads = nn.ModuleList(
            [CausalAttention(input_dim, output_dim, dropout, context_length, qkv_bias)
             for _ in range(num_heads)])

    def forward(self, x):
        head_outputs = [head(x) for head in self.heads]
        return torch.cat(head_outputs, dim=-1)


class MultiHeadAttention(nn.Module):        # 003
    def __init__(self, input_dim, output_dim, dropout, context_length, num_heads, qkv_bias=False):
        super().__init__()
        assert output_dim % num_heads == 0, "Output dimension must be divisible by number of heads"
        self.output_dim = output_dim
        self.num_heads = num_heads
        self.head_dim = output_dim // num_heads
        self.weight_query = nn.Linear(input_dim, output_dim, qkv_bias)
        self.weight_key = nn.Linear(input_dim, output_dim, qkv_bias)
        self.weight_value = nn.Linear(input_dim, output_dim, qkv_bias)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("causal_mask", torch.triu(torch.ones(context_length, context_length), diagonal=1))
        self.output_projection = nn.Linear(output_dim, output_dim)

    def forward(self, x):
        batch_size, num_tokens, _ = x.shape
        queries = self.weight_query(x).view(batch_size, num_tokens, self.num_heads, self.head_dim).transpose(1, 2)
        keys = self.weight_key(x).view(batch_size, num_tokens, self.num_heads, self.head_dim).transpose(1, 2)
        values = self.weight_value(x).view(batch_size, num_tokens, self.num_heads, self.head_dim).transpose(1, 2)
        attention_scores = queries @ keys.transpose(2, 3)
        attention_scores.masked_fill_(self.causal_mask.bool()[:num_tokens, :num_tokens], -torch.inf)
        attention_weights = torch.softmax(attention_scores / keys.shape[-1] ** 0.5, dim=-1)
        attention_weights = self.dropout(attention_weights)
        self.last_attn = attention_weights
        return self.output_projection(
            (attention_weights @ values).transpose(1, 2).contiguous().view(batch_size, num_tokens, self.output_dim))


class MultiHeadSelfAttention(nn.Module):    # 004 (debug prints removed)
    def __init__(self, d_model=2, num_heads=2):
        super().__init__()
        assert d_model % num_heads == 0, "d_model must be divisible by num_heads"
        self.d_model = d_model
        self.num_heads = num_heads
        self.head_dim = d_model // num_heads
        self.W_Q = nn.Linear(d_model, d_model)
        self.W_K = nn.Linear(d_model, d_model)
        self.W_V = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def forward(self, x):
        batch_size, seq_len, d_model = x.shape
        Q = self.W_Q(x)
        K = self.W_K(x)
        V = self.W_V(x)
        self.last_qkv = (Q, K, V)
        Q = Q.reshape(batch_size, seq_len, self.num_heads, self.head_dim).transpose(1, 2)
        K = K.reshape(batch_size, seq_len, self.num_heads, self.head_dim).transpose(1, 2)
        V = V.reshape(batch_size, seq_len, self.num_heads, self.head_dim).transpose(1, 2)
        scores = torch.matmul(Q, K.transpose(-1, -2)) / (self.head_dim ** 0.5)
        attn_weights = F.softmax(scores, dim=-1)
        self.last_attn = attn_weights
        context = torch.matmul(attn_weights, V)
        context = context.transpose(1, 2).reshape(batch_size, seq_len, d_model)
        return self.out_proj(context)


# --------------------------------------------------------------------------
# tutorial cases
# --------------------------------------------------------------------------

def tutorial_cases():
    inputs = torch.tensor(YOUR_JOURNEY)
    HEADER_DATA["clattn_tut_inputs"] = (
        to_np(inputs), "\"Your journey starts with one step\" inputs (tutorials 001/002), 6 tokens x 3")

    # ---- tut001_simple: no weights, no scaling ----
    scores = inputs @ inputs.T
    assert_printed("001 attn_scores = inputs @ inputs.T", scores, P001_SCORES)
    attn = torch.softmax(scores, dim=-1)
    assert_printed("001 attn_weights (softmax, unscaled)", attn, P001_ATTN)
    ctx = attn @ inputs
    assert_printed("001 all_context_vecs", ctx, P001_CONTEXT)
    emit("tut001_simple",
         ["tutorial 001 section 1: self-attention without trainable weights, no scaling",
          "\"Your journey starts with one step\" inputs; Q = K = V = x; scale 1"],
         x=inputs[None], heads=1, dk=3, dv=3, causal=False, scale=1.0,
         out=ctx[None], attn=attn[None, None])
    HEADER_DATA["clattn_tut001_simple_attn_printed"] = (
        np.array(P001_ATTN), "tutorial 001 printed attention weights softmax(x x^T)")
    HEADER_DATA["clattn_tut001_simple_context_printed"] = (
        np.array(P001_CONTEXT), "tutorial 001 printed context vectors attn @ x")

    # ---- tut001_sa_v1 (and its causal variant) ----
    torch.manual_seed(123)
    sa_v1 = SelfAttention_v1(3, 2)
    assert_printed("001/002 W_query after torch.manual_seed(123)", sa_v1.W_query, P001_W_QUERY)
    out = sa_v1(inputs)
    attn = sa_v1.last_attn
    assert_printed("001 query_2 = x_2 @ W_query", inputs[1] @ sa_v1.W_query, P001_QUERY_2)
    assert_printed("001 attn_scores_2", (inputs[1] @ sa_v1.W_query) @ (inputs @ sa_v1.W_key).T,
                   P001_SA_SCORES_2)
    assert_printed("002 attention_scores (unscaled, trainable weights)",
                   (inputs @ sa_v1.W_query) @ (inputs @ sa_v1.W_key).T, P002_SA_SCORES)
    assert_printed("001 attn_weights_2 (scaled)", attn[1], P001_SA_ATTN_2)
    assert_printed("002 scaled softmax attention weights", attn, P002_SA_ATTN)
    assert_printed("001/002 SelfAttention_v1 context", out, P001_SA_V1)
    w = dict(w_query=sa_v1.W_query.T, w_key=sa_v1.W_key.T, w_value=sa_v1.W_value.T)
    emit("tut001_sa_v1",
         ["tutorial 001 SelfAttention_v1(d_in=3, d_out=2), torch.manual_seed(123)",
          "raw torch.rand(3,2) weights used as x @ W; stored transposed ([out,in])"],
         x=inputs[None], heads=1, dk=2, dv=2, causal=False,
         out=out[None], attn=attn[None, None], **w)
    out_c = sa_v1(inputs, causal=True)
    emit("tut001_sa_v1_causal",
         ["tutorial 001 SelfAttention_v1 weights (torch.manual_seed(123)) with a causal mask",
          "not printed by the tutorial: expectation computed by torch"],
         x=inputs[None], heads=1, dk=2, dv=2, causal=True,
         out=out_c[None], attn=sa_v1.last_attn[None, None], **w)
    for n in ("query", "key", "value"):
        HEADER_DATA["clattn_tut001_sa_v1_w_" + n] = (
            to_np(getattr(sa_v1, "W_" + n)),
            "tutorial 001 SelfAttention_v1 W_%s, raw [in=3][out=2] layout (x @ W), torch.manual_seed(123)" % n)
    HEADER_DATA["clattn_tut001_sa_v1_context_printed"] = (
        np.array(P001_SA_V1), "tutorial 001 printed SelfAttention_v1 context vectors")
    HEADER_DATA["clattn_tut001_sa_v1_attn_printed"] = (
        np.array(P002_SA_ATTN), "tutorial 002 printed scaled attention weights for the same weights")

    # ---- tut001_sa_v2 ----
    torch.manual_seed(789)
    sa_v2 = SelfAttention_v2(3, 2)
    out = sa_v2(inputs)
    assert_printed("001 SelfAttention_v2 context (seed 789)", out, P001_SA_V2)
    emit("tut001_sa_v2",
         ["tutorial 001 SelfAttention_v2(d_in=3, d_out=2), torch.manual_seed(789)",
          "nn.Linear(3, 2, bias=False) weights ([out,in]), created query, key, value"],
         x=inputs[None], heads=1, dk=2, dv=2, causal=False,
         out=out[None], attn=sa_v2.last_attn[None, None],
         w_query=sa_v2.W_query.weight, w_key=sa_v2.W_key.weight, w_value=sa_v2.W_value.weight)
    for n in ("query", "key", "value"):
        HEADER_DATA["clattn_tut001_sa_v2_w_" + n] = (
            to_np(getattr(sa_v2, "W_" + n).weight),
            "tutorial 001 SelfAttention_v2 W_%s.weight, nn.Linear [out=2][in=3] layout, torch.manual_seed(789)" % n)
    HEADER_DATA["clattn_tut001_sa_v2_context_printed"] = (
        np.array(P001_SA_V2), "tutorial 001 printed SelfAttention_v2 context vectors")

    # ---- tut001_mha3: 003's MultiHeadAttention on the Your-journey inputs ----
    torch.manual_seed(123)
    mha3 = MultiHeadAttention(3, 6, 0.0, 6, 3).eval()
    xb = inputs[None]
    out = mha3(xb)
    emit("tut001_mha3",
         ["tutorial 003 MultiHeadAttention(input_dim=3, output_dim=6, dropout=0, context_length=6,",
          "num_heads=3), torch.manual_seed(123), eval, causal, on tutorial 001's inputs (batch 1)",
          "not printed by any tutorial: expectation computed by torch"],
         x=xb, heads=3, dk=2, dv=2, causal=True, out=out, attn=mha3.last_attn,
         w_query=mha3.weight_query.weight, w_key=mha3.weight_key.weight,
         w_value=mha3.weight_value.weight, w_out=mha3.output_projection.weight,
         b_out=mha3.output_projection.bias)
    for n in ("query", "key", "value"):
        HEADER_DATA["clattn_tut001_mha3_w_" + n] = (
            to_np(getattr(mha3, "weight_" + n).weight),
            "tut001_mha3 w_%s: nn.Linear [out=6][in=3], 3 heads of 2" % n)
    HEADER_DATA["clattn_tut001_mha3_w_out"] = (
        to_np(mha3.output_projection.weight), "tut001_mha3 output projection weight [out=6][in=6]")
    HEADER_DATA["clattn_tut001_mha3_b_out"] = (
        to_np(mha3.output_projection.bias), "tut001_mha3 output projection bias [6]")
    HEADER_DATA["clattn_tut001_mha3_context_torch"] = (
        to_np(out[0]), "tut001_mha3 expected output computed by torch (no tutorial prints it; full float32)")

    # ---- tut000_sa ----
    input_emb = torch.tensor(INPUT_EMB_000, dtype=torch.float32)
    torch.manual_seed(123)
    sa = SelfAttention_v2(3, 2)     # 000's SelfAttention is the same class
    out = sa(input_emb)
    assert_printed("000 SelfAttention context (seed 123)", out, P000_SA)
    emit("tut000_sa",
         ["tutorial 000 SelfAttention(d_in=3, d_out=2), torch.manual_seed(123), 5x3 input_emb",
          "nn.Linear(3, 2, bias=False) weights, created query, key, value"],
         x=input_emb[None], heads=1, dk=2, dv=2, causal=False,
         out=out[None], attn=sa.last_attn[None, None],
         w_query=sa.W_query.weight, w_key=sa.W_key.weight, w_value=sa.W_value.weight)

    # ---- 003 ----
    ex = torch.tensor(EXAMPLE_003)
    scores = ex @ ex.T
    assert_printed("003 all_attention_scores (no weights)", scores, P003_SIMPLE_SCORES)
    attn = torch.softmax(scores, dim=-1)
    assert_printed("003 all_normalized_attention_scores", attn, P003_SIMPLE_ATTN)
    ctx = attn @ ex
    assert_printed("003 all_example_context_vectors", ctx, P003_SIMPLE_CONTEXT)
    emit("tut003_simple",
         ["tutorial 003 step 1/2: attention without trainable weights, no scaling (scale 1)"],
         x=ex[None], heads=1, dk=3, dv=3, causal=False, scale=1.0,
         out=ctx[None], attn=attn[None, None])

    torch.manual_seed(246)
    sa_raw = SelfAttention003(3, 2)
    assert_printed("003 weight_query (seed 246)", sa_raw.weight_query, P003_RAW_W_QUERY)
    assert_printed("003 weight_key (seed 246)", sa_raw.weight_key, P003_RAW_W_KEY)
    assert_printed("003 weight_value (seed 246)", sa_raw.weight_value, P003_RAW_W_VALUE)
    assert_printed("003 keys (seed 246)", ex @ sa_raw.weight_key, P003_RAW_KEYS)
    assert_printed("003 values (seed 246)", ex @ sa_raw.weight_value, P003_RAW_VALUES)
    out = sa_raw(ex)
    assert_printed("003 attention weights for 2nd query (seed 246)", sa_raw.last_attn[1], P003_RAW_ATTN_2)
    assert_printed("003 SelfAttention context (seed 246)", out, P003_SA_RAW)
    emit("tut003_sa_raw",
         ["tutorial 003 SelfAttention(input_dim=3, output_dim=2), torch.manual_seed(246)",
          "raw torch.rand(3,2) weights used as x @ W; stored transposed ([out,in])"],
         x=ex[None], heads=1, dk=2, dv=2, causal=False,
         out=out[None], attn=sa_raw.last_attn[None, None],
         w_query=sa_raw.weight_query.T, w_key=sa_raw.weight_key.T, w_value=sa_raw.weight_value.T)

    torch.manual_seed(123)
    sa2 = SelfAttentionv2_003(3, 2)
    out = sa2(ex)
    assert_printed("003 SelfAttentionv2 context (seed 123)", out, P003_SA_V2)
    assert_printed("003 SelfAttentionv2 attention weights", sa2.last_attn, P003_SA_V2_ATTN)
    emit("tut003_sa_v2",
         ["tutorial 003 SelfAttentionv2(input_dim=3, output_dim=2), torch.manual_seed(123)",
          "nn.Linear(3, 2, bias=False) weights, created query, key, value"],
         x=ex[None], heads=1, dk=2, dv=2, causal=False,
         out=out[None], attn=sa2.last_attn[None, None],
         w_query=sa2.weight_query.weight, w_key=sa2.weight_key.weight,
         w_value=sa2.weight_value.weight)

    batched = torch.stack([ex, ex], dim=0)
    # CausalAttention: the tutorial printed training-mode (dropout 0.2) output.
    # Reproduce that first (validates the weights and the RNG order) ...
    torch.manual_seed(123)
    ca = CausalAttention(3, 2, 0.2, 6)
    assert_printed("003 CausalAttention context (TRAINING mode, dropout 0.2, seed 123)",
                   ca(batched), P003_CAUSAL_TRAIN)
    # ... then export the eval-mode (no dropout) expectation.
    torch.manual_seed(123)
    ca = CausalAttention(3, 2, 0.2, 6).eval()
    out = ca(batched)
    assert_printed("003 causal masked attention weights (eval)", ca.last_attn[0], P003_CAUSAL_ATTN)
    assert_printed("003 causal masked attention weights (eval, batch 1)", ca.last_attn[1], P003_CAUSAL_ATTN)
    # row 0 attends to key 0 only, and with eval mode the two batch entries agree
    assert torch.equal(out[0], out[1])
    emit("tut003_causal",
         ["tutorial 003 CausalAttention(3, 2, dropout=0.2, context_length=6), torch.manual_seed(123),",
          "batch of 2 identical sequences, EVAL mode: the tutorial printed training-mode (dropout)",
          "output, which cannot be the fixture; the script reproduces it in training mode as a",
          "check and asserts the printed causal attention weights instead"],
         x=batched, heads=1, dk=2, dv=2, causal=True, out=out, attn=ca.last_attn[:, None],
         w_query=ca.query_weight.weight, w_key=ca.key_weight.weight, w_value=ca.value_weight.weight)

    torch.manual_seed(123)
    smha = SimpleMultiHeadAttention(3, 2, 0.2, 6, 3)
    assert_printed("003 SimpleMultiHeadAttention context (TRAINING mode, dropout 0.2, seed 123)",
                   smha(batched), P003_SIMPLE_MHA_TRAIN)
    torch.manual_seed(123)
    smha = SimpleMultiHeadAttention(3, 2, 0.2, 6, 3).eval()
    out = smha(batched)
    attn = torch.stack([h.last_attn for h in smha.heads], dim=1)
    emit("tut003_simple_mha",
         ["tutorial 003 SimpleMultiHeadAttention(3, 2, dropout=0.2, context_length=6, num_heads=3),",
          "torch.manual_seed(123), EVAL mode (the tutorial printed training-mode output; reproduced",
          "in training mode by the script as a check). Head weights stacked in head order."],
         x=batched, heads=3, dk=2, dv=2, causal=True, out=out, attn=attn,
         w_query=torch.cat([h.query_weight.weight for h in smha.heads], 0),
         w_key=torch.cat([h.key_weight.weight for h in smha.heads], 0),
         w_value=torch.cat([h.value_weight.weight for h in smha.heads], 0))

    torch.manual_seed(123)
    mha = MultiHeadAttention(3, 6, 0.2, 6, 3)
    assert_printed("003 MultiHeadAttention context (TRAINING mode, dropout 0.2, seed 123)",
                   mha(batched), P003_MHA_TRAIN)
    torch.manual_seed(123)
    mha = MultiHeadAttention(3, 6, 0.2, 6, 3).eval()
    out = mha(batched)
    emit("tut003_mha",
         ["tutorial 003 MultiHeadAttention(3, 6, dropout=0.2, context_length=6, num_heads=3),",
          "torch.manual_seed(123), EVAL mode (the tutorial printed training-mode output; reproduced",
          "in training mode by the script as a check). qkv_bias False, out projection with bias."],
         x=batched, heads=3, dk=2, dv=2, causal=True, out=out, attn=mha.last_attn,
         w_query=mha.weight_query.weight, w_key=mha.weight_key.weight,
         w_value=mha.weight_value.weight, w_out=mha.output_projection.weight,
         b_out=mha.output_projection.bias)

    # ---- 004 ----
    words = SENTENCE_004.replace(",", "").split()
    dc = {s: i for i, s in enumerate(sorted(words))}
    sentence_int = torch.tensor([dc[s] for s in words])
    assert sentence_int.tolist() == [0, 6, 2, 7, 5, 4, 2, 3]
    torch.manual_seed(123)
    embed = torch.nn.Embedding(8, 2)
    emb = embed(sentence_int).detach()
    assert_printed("004 embedded_sentence (nn.Embedding(8,2), seed 123)", emb, P004_EMBEDDED)
    torch.manual_seed(123)
    W_query = torch.rand(3, 2)   # [d_q, d] = [out, in]
    W_key = torch.rand(3, 2)
    W_value = torch.rand(4, 2)
    assert_printed("004 W_query", W_query, P004_W_QUERY)
    assert_printed("004 W_key", W_key, P004_W_KEY)
    assert_printed("004 W_value", W_value, P004_W_VALUE)
    queries = W_query.matmul(emb.T).T
    keys = W_key.matmul(emb.T).T
    values = W_value.matmul(emb.T).T
    assert_printed("004 queries", queries, P004_QUERIES)
    assert_printed("004 keys", keys, P004_KEYS)
    assert_printed("004 values", values, P004_VALUES)
    omega = queries @ keys.T
    assert_printed("004 omega_2 (raw scores for token 2)", omega[1], P004_OMEGA_2)
    attn = F.softmax(omega / 3 ** 0.5, dim=-1)
    assert_printed("004 attention_weights_2", attn[1], P004_ATTN_2)
    ctx = attn @ values
    assert_printed("004 context_vector_2", ctx[1], P004_CONTEXT_2)
    emit("tut004_dk_dv",
         ["tutorial 004: \"%s\" embedded by nn.Embedding(8, 2) (torch.manual_seed(123))" % SENTENCE_004,
          "W_query (3,2), W_key (3,2), W_value (4,2) = torch.rand after torch.manual_seed(123), already [out,in];",
          "d_q = d_k = 3, d_v = 4, scale 1/sqrt(3)"],
         x=emb[None], heads=1, dk=3, dv=4, causal=False, out=ctx[None], attn=attn[None, None],
         w_query=W_query, w_key=W_key, w_value=W_value)
    HEADER_DATA["clattn_tut004_embedded"] = (
        to_np(emb), "tutorial 004 embedded sentence \"%s\", 8 tokens x 2" % SENTENCE_004)
    HEADER_DATA["clattn_tut004_w_query"] = (to_np(W_query), "tutorial 004 W_query [d_q=3][d=2] ([out,in])")
    HEADER_DATA["clattn_tut004_w_key"] = (to_np(W_key), "tutorial 004 W_key [d_k=3][d=2] ([out,in])")
    HEADER_DATA["clattn_tut004_w_value"] = (to_np(W_value), "tutorial 004 W_value [d_v=4][d=2] ([out,in])")
    HEADER_DATA["clattn_tut004_queries_printed"] = (np.array(P004_QUERIES), "tutorial 004 printed queries")
    HEADER_DATA["clattn_tut004_keys_printed"] = (np.array(P004_KEYS), "tutorial 004 printed keys")
    HEADER_DATA["clattn_tut004_values_printed"] = (np.array(P004_VALUES), "tutorial 004 printed values")
    HEADER_DATA["clattn_tut004_attn_token2_printed"] = (
        np.array(P004_ATTN_2), "tutorial 004 printed attention weights of token 2 (\"shoes\", row index 1)")
    HEADER_DATA["clattn_tut004_context_token2_printed"] = (
        np.array(P004_CONTEXT_2), "tutorial 004 printed context vector of token 2 (\"shoes\", row index 1)")

    # tut004_mha2: the notebook built MultiHeadSelfAttention right after the
    # cell "torch.manual_seed(123); W_query/W_key/W_value = torch.rand(...)";
    # its printed 3-head weights (next torch.rand in the same state) prove it.
    torch.manual_seed(123)
    torch.rand(3, 2), torch.rand(3, 2), torch.rand(4, 2)
    state = torch.get_rng_state()
    assert_printed("004 multihead_W_query (RNG state check)", torch.rand(3, 3, 2), P004_MULTIHEAD_W_QUERY)
    torch.set_rng_state(state)
    mhsa = MultiHeadSelfAttention(d_model=2, num_heads=2)
    x_in = emb.unsqueeze(0)
    out = mhsa(x_in)
    Q, K, V = mhsa.last_qkv
    assert_printed("004 MHA Q before reshaping", Q[0], P004_MHA_Q)
    assert_printed("004 MHA K before reshaping", K[0], P004_MHA_K)
    assert_printed("004 MHA V before reshaping", V[0], P004_MHA_V)
    assert_printed("004 MHA output", out[0], P004_MHA_OUT)
    emit("tut004_mha2",
         ["tutorial 004 MultiHeadSelfAttention(d_model=2, num_heads=2): W_Q/W_K/W_V/out_proj nn.Linear(2,2) with bias",
          "RNG state reproduced: torch.manual_seed(123); torch.rand(3,2); torch.rand(3,2); torch.rand(4,2); then construct",
          "(matches the printed Q/K/V and 'MHA output'); head_dim 1 so scale 1 is the default"],
         x=x_in, heads=2, dk=1, dv=1, causal=False, out=out, attn=mhsa.last_attn,
         w_query=mhsa.W_Q.weight, w_key=mhsa.W_K.weight, w_value=mhsa.W_V.weight,
         b_query=mhsa.W_Q.bias, b_key=mhsa.W_K.bias, b_value=mhsa.W_V.bias,
         w_out=mhsa.out_proj.weight, b_out=mhsa.out_proj.bias)


# --------------------------------------------------------------------------
# torch.nn.MultiheadAttention cases
# --------------------------------------------------------------------------

def mha_case(name, seed, *, B, Tq, E, H, Tk=None, kdim=None, bias=True,
             causal=False, kpm=None, attn_mask=None, extra_comment=None,
             fully_masked=False, dtype=None):
    """Run torch.nn.MultiheadAttention and emit the fixture.

    kpm: (B, Tk) bool numpy array or None.  attn_mask: (Tq, Tk) bool or float32
    numpy array or None (the explicit mask; `causal` is added for torch only).
    fully_masked: the case has query rows that see no key. torch gives NaN
    there (weights and output); clattn's documented choice is weights 0, so a
    context of 0 and an output of out_proj.bias (0 without bias). The script
    checks that torch's NaNs are exactly those rows, then writes clattn's
    values for them and torch's everywhere else.
    dtype: torch.float16 or torch.bfloat16 for a half case: the parameters,
    x, kv and a float mask rounded to it, the module then run in float64.
    """
    cross = kdim is not None
    Tk = Tq if Tk is None else Tk
    g = torch.Generator().manual_seed(seed)
    mha = nn.MultiheadAttention(E, H, dropout=0.0, bias=bias, batch_first=True,
                                kdim=kdim, vdim=kdim)
    mha.eval()
    # torch initialises in_proj_bias and out_proj.bias to zero: randomise every
    # parameter so that biases are really exercised.
    with torch.no_grad():
        for pname, p in mha.named_parameters():
            if p.dim() == 2:
                std = 1.3 / math.sqrt(p.shape[1])
            else:
                std = 0.3
            p.copy_(torch.randn(p.shape, generator=g) * std)
    x = torch.randn(B, Tq, E, generator=g)
    kv = torch.randn(B, Tk, kdim, generator=g) if cross else x
    if dtype is not None:  # the values rounded to the type, the arithmetic float64
        mha = mha.double()
        with torch.no_grad():
            for p in mha.parameters():
                p.copy_(p.to(dtype).to(torch.float64))
        x = x.to(dtype).to(torch.float64)
        kv = kv.to(dtype).to(torch.float64) if cross else x
        if attn_mask is not None and attn_mask.dtype != np.bool_:
            assert np.array_equal(attn_mask, torch.from_numpy(attn_mask).to(dtype).float().numpy()), \
                "a half case's float mask must hold values of the type"
            attn_mask = attn_mask.astype(np.float64)

    tmask = None
    if causal:
        tmask = causal_bool(Tq, Tk)
    if attn_mask is not None:
        am = torch.from_numpy(attn_mask)
        if am.dtype == torch.bool:
            tmask = am if tmask is None else (tmask | am)
        else:
            assert tmask is None, "float mask + causal not used in these fixtures"
            tmask = am
    tkpm = torch.from_numpy(kpm) if kpm is not None else None
    # Autograd stays on (parameters require grad) so that torch 1.13 takes the
    # documented "slow" path of F.multi_head_attention_forward, not the fused
    # fast path.
    out, attn = mha(x, kv, kv, key_padding_mask=tkpm, need_weights=True,
                    attn_mask=tmask, average_attn_weights=False)
    hidden = np.zeros((B, Tq, Tk), dtype=bool)
    if causal:
        hidden |= np.triu(np.ones((Tq, Tk), dtype=bool), k=1)[None]
    if attn_mask is not None:
        hidden |= (attn_mask if attn_mask.dtype == np.bool_ else np.isneginf(attn_mask))[None]
    if kpm is not None:
        hidden |= kpm[:, None, :]
    dead = hidden.all(axis=-1)  # (B, Tq): rows that see no key
    assert bool(dead.any()) == fully_masked, (name, "fully masked rows", dead)
    if fully_masked:
        out, attn = out.detach().clone(), attn.detach().clone()
        tdead = torch.from_numpy(dead)
        # torch: NaN exactly on the dead rows, finite elsewhere
        assert torch.isnan(attn).any(dim=-1).eq(tdead[:, None, :]).all(), name
        assert torch.isnan(attn).all(dim=-1).eq(tdead[:, None, :]).all(), name
        assert torch.isnan(out).all(dim=-1).eq(tdead).all(), name
        attn[torch.isnan(attn)] = 0.0
        ob = mha.out_proj.bias.detach() if bias else torch.zeros(E)
        out[tdead] = ob
    assert not torch.isnan(out).any() and not torch.isnan(attn).any(), name

    dh = E // H
    if mha._qkv_same_embed_dim:
        wq, wk, wv = mha.in_proj_weight.chunk(3, dim=0)
    else:
        wq, wk, wv = mha.q_proj_weight, mha.k_proj_weight, mha.v_proj_weight
    kw = dict(w_query=wq, w_key=wk, w_value=wv, w_out=mha.out_proj.weight)
    if bias:
        bq, bk, bv = mha.in_proj_bias.chunk(3, dim=0)
        kw.update(b_query=bq, b_key=bk, b_value=bv, b_out=mha.out_proj.bias)
    else:
        assert mha.in_proj_bias is None and mha.out_proj.bias is None
    comments = ["torch.nn.MultiheadAttention(embed_dim=%d, num_heads=%d, bias=%s%s), batch_first, eval,"
                % (E, H, bias, ", kdim=vdim=%d" % kdim if cross else ""),
                "dropout 0; all parameters and inputs randn from torch.Generator seed %d" % seed]
    if causal:
        comments.append("causal: torch 1.13 has no is_causal, torch got the equivalent boolean "
                        "mask (key j > query i); no attn_mask.npy for it")
    if dtype is not None:
        comments.append("half case: parameters and inputs rounded to %s (to nearest even), the module then run "
                        "in float64 on those values (expect_* rounded to float32 at the end)" % dtype)
    if extra_comment:
        comments.append(extra_comment)
    emit(name, comments, x=x, kv=kv if cross else None, heads=H, dk=dh, dv=dh,
         causal=causal, out=out, attn=attn, key_padding_mask=kpm,
         attn_mask=attn_mask.astype(np.float32) if attn_mask is not None and attn_mask.dtype == np.float64
         else attn_mask,
         dtype={None: None, torch.float16: "f16", torch.bfloat16: "bf16"}[dtype], **kw)


def rows_ok(Tq, Tk, B, causal, mask_bool=None, kpm=None, float_mask=None):
    """True when every (batch, query) row keeps at least one key."""
    m = np.zeros((B, Tq, Tk), dtype=bool)
    if causal:
        m |= np.triu(np.ones((Tq, Tk), dtype=bool), k=1)[None]
    if mask_bool is not None:
        m |= mask_bool[None]
    if float_mask is not None:
        m |= np.isneginf(float_mask)[None]
    if kpm is not None:
        m |= kpm[:, None, :]
    return bool((~m).any(axis=-1).all())


def mha_cases():
    mha_case("mha_basic", 1001, B=2, Tq=7, E=12, H=3)
    mha_case("mha_nobias", 1002, B=1, Tq=5, E=8, H=2, bias=False)
    mha_case("mha_causal", 1003, B=3, Tq=61, E=32, H=4, causal=True)
    mha_case("mha_t1", 1004, B=2, Tq=1, E=16, H=4)
    mha_case("mha_head1", 1005, B=2, Tq=9, E=5, H=5)
    mha_case("mha_t130", 1006, B=1, Tq=130, E=64, H=8, causal=True)
    mha_case("mha_cross", 1007, B=2, Tq=5, Tk=11, E=12, kdim=7, H=3,
             extra_comment="cross-attention: key = value = kv (Tk=11, Ekv=7); "
                           "separate q/k/v_proj_weight because kdim != embed_dim")
    mha_case("mha_cross_causal", 1008, B=2, Tq=6, Tk=9, E=8, kdim=10, H=2, causal=True,
             extra_comment="cross-attention with Tq=6 < Tk=9; causal is top-left aligned")

    kpm = np.zeros((3, 8), dtype=bool)
    kpm[0, 5:] = True            # entry 0: last 3 keys padded
    # entry 1: no padding
    kpm[2, [0, 3, 6]] = True     # entry 2: scattered keys, including key 0
    assert rows_ok(8, 8, 3, False, kpm=kpm)
    mha_case("mha_kpm", 1009, B=3, Tq=8, E=12, H=3, kpm=kpm,
             extra_comment="key_padding_mask differs per batch entry (0: keys 5-7, 1: none, 2: keys 0,3,6)")

    rng = np.random.default_rng(2010)
    while True:
        bm = rng.random((7, 7)) < 0.35
        if rows_ok(7, 7, 1, False, mask_bool=bm) and bm.any():
            break
    mha_case("mha_bool_mask", 1010, B=2, Tq=7, E=8, H=2, attn_mask=bm,
             extra_comment="random boolean attn_mask (True = not allowed), every row keeps a key")

    rng = np.random.default_rng(2011)
    fm = rng.standard_normal((7, 7)).astype(np.float32)
    fm[rng.random((7, 7)) < 0.25] = -np.inf
    for i in range(7):                      # never a whole row of -inf
        if np.isneginf(fm[i]).all():
            fm[i, i] = 0.0
    assert rows_ok(7, 7, 1, False, float_mask=fm) and np.isneginf(fm).any()
    mha_case("mha_float_mask", 1011, B=2, Tq=7, E=8, H=2, attn_mask=fm,
             extra_comment="float attn_mask added to the scaled scores: randn plus some -inf entries")

    rng = np.random.default_rng(2012)
    kpm = np.zeros((2, 8), dtype=bool)
    kpm[0, 6:] = True            # entry 0: last 2 keys padded
    kpm[1, [2, 5]] = True        # entry 1: keys 2 and 5 ignored
    while True:
        bm = rng.random((8, 8)) < 0.3
        # the causal part must still matter: keep some allowed-by-mask future keys
        if rows_ok(8, 8, 2, True, mask_bool=bm, kpm=kpm) and (bm & np.tril(np.ones((8, 8), bool))).any():
            break
    mha_case("mha_kpm_causal_bool", 1012, B=2, Tq=8, E=12, H=3, causal=True,
             kpm=kpm, attn_mask=bm,
             extra_comment="key_padding_mask + causal + random boolean attn_mask; torch got "
                           "attn_mask | causal; no fully masked row")

    kpm = np.zeros((3, 13), dtype=bool)
    kpm[0, [4, 9, 10]] = True    # entry 0: scattered keys
    kpm[1, 0] = True             # entry 1: key 0 padded -> causal query 0 sees nothing
    kpm[2, 7:] = True            # entry 2: a padded tail
    mha_case("mha_causal_kpm", 1013, B=3, Tq=13, E=12, H=3, causal=True, kpm=kpm,
             fully_masked=True,
             extra_comment="causal + key_padding_mask; entry 1 pads key 0, so its query 0 sees "
                           "no key: torch gives NaN there, clattn weights 0 and output out_proj.bias")

    rng = np.random.default_rng(2014)
    bm = rng.random((9, 9)) < 0.3
    bm[:, 0] = False             # causal keeps key 0 for every row ...
    bm[5, :] = True              # ... except row 5: fully masked
    kpm = np.zeros((2, 9), dtype=bool)
    kpm[1, :] = True             # entry 1: every key padded
    mha_case("mha_fully_masked", 1014, B=2, Tq=9, E=8, H=2, causal=True, kpm=kpm, attn_mask=bm,
             fully_masked=True,
             extra_comment="fully masked rows three ways: bool mask row 5, batch entry 1 all padded, "
                           "with causal; torch's NaN rows written as clattn's 0 weights and "
                           "out_proj.bias outputs")
    mha_case("mha_causal_bool", 1015, B=2, Tq=11, E=16, H=4, causal=True,
             attn_mask=np.asarray(np.random.default_rng(2015).random((11, 11)) < 0.25) & ~np.eye(11, dtype=bool),
             extra_comment="causal + random boolean attn_mask (the diagonal kept: no fully masked row)")


def half_cases():
    """Half-precision plans' fixtures (issue 38): mha_case with dtype."""
    kpm = np.zeros((2, 13), dtype=bool)
    kpm[0, 10:] = True
    kpm[1, 3] = True
    mha_case("half_f16_causal_kpm", 1101, B=2, Tq=13, E=16, H=4, causal=True, kpm=kpm, dtype=torch.float16,
             extra_comment="causal + key_padding_mask (batch 0: keys 10..12 ignored, batch 1: key 3)")
    fm = np.zeros((6, 9), dtype=np.float32)
    fm[:, 7] = -np.inf
    fm[2, :4] = -1.5
    fm[4, 5] = 0.75
    mha_case("half_bf16_cross_float_mask", 1102, B=2, Tq=6, Tk=9, E=12, kdim=10, H=3, attn_mask=fm,
             dtype=torch.bfloat16, extra_comment="cross-attention, float attn_mask (key 7 -inf, values of bfloat16)")
    mha_case("half_bf16_t1", 1103, B=3, Tq=1, E=8, H=2, dtype=torch.bfloat16)


# --------------------------------------------------------------------------
# manual float64 cases
# --------------------------------------------------------------------------

def torch64_loop(x, kv, heads, dk, dv, scale, causal, wq=None, wk=None, wv=None,
                 bq=None, bk=None, bv=None, wo=None, bo=None):
    """Independent per-(batch, head) float64 torch computation for cross-checking."""
    t = lambda a: torch.from_numpy(np.asarray(a, dtype=np.float64))
    x, kv = t(x), t(kv)
    B, Tq, _ = x.shape
    Tk = kv.shape[1]
    outs, attns = [], []
    for b in range(B):
        if wq is not None:
            Q = F.linear(x[b], t(wq), None if bq is None else t(bq))
            K = F.linear(kv[b], t(wk), None if bk is None else t(bk))
            V = F.linear(kv[b], t(wv), None if bv is None else t(bv))
        else:
            Q, K, V = x[b], kv[b], kv[b]
        heads_out, heads_attn = [], []
        for h in range(heads):
            q = Q[:, h * dk:(h + 1) * dk]
            k = K[:, h * dk:(h + 1) * dk]
            v = V[:, h * dv:(h + 1) * dv]
            s = (q @ k.T) * scale
            if causal:
                s = s.masked_fill(causal_bool(Tq, Tk), float("-inf"))
            a = torch.softmax(s, dim=-1)
            heads_attn.append(a)
            heads_out.append(a @ v)
        o = torch.cat(heads_out, dim=-1)
        if wo is not None:
            o = F.linear(o, t(wo), None if bo is None else t(bo))
        outs.append(o)
        attns.append(torch.stack(heads_attn))
    return torch.stack(outs).numpy(), torch.stack(attns).numpy()


def manual_case(name, seed, comments, *, B, Tq, E, H, dk, dv, Tk=None, Ekv=None,
                qkv_weights=True, qkv_bias=False, Eo=None, out_bias=False,
                scale=None, causal=False):
    rng = np.random.default_rng(seed)
    f32 = lambda a: np.asarray(a, dtype=np.float32)
    cross = Ekv is not None
    Tk = Tq if Tk is None else Tk
    x = f32(rng.standard_normal((B, Tq, E)))
    kv = f32(rng.standard_normal((B, Tk, Ekv))) if cross else x
    Ek = kv.shape[2]
    p = {}
    if qkv_weights:
        p["wq"] = f32(rng.standard_normal((H * dk, E)) * (1.2 / math.sqrt(E)))
        p["wk"] = f32(rng.standard_normal((H * dk, Ek)) * (1.2 / math.sqrt(Ek)))
        p["wv"] = f32(rng.standard_normal((H * dv, Ek)) / math.sqrt(Ek))
        if qkv_bias:
            p["bq"] = f32(rng.standard_normal(H * dk) * 0.3)
            p["bk"] = f32(rng.standard_normal(H * dk) * 0.3)
            p["bv"] = f32(rng.standard_normal(H * dv) * 0.3)
    if Eo is not None:
        p["wo"] = f32(rng.standard_normal((Eo, H * dv)) / math.sqrt(H * dv))
        if out_bias:
            p["bo"] = f32(rng.standard_normal(Eo) * 0.3)
    sc = scale if scale is not None else 1.0 / math.sqrt(dk)
    arrs = {"x": x}
    if cross:
        arrs["kv"] = kv
    names = dict(wq="w_query", wk="w_key", wv="w_value", bq="b_query", bk="b_key",
                 bv="b_value", wo="w_out", bo="b_out")
    for k, v in p.items():
        arrs[names[k]] = v
    out64, attn64 = reference_attention(arrs, H, dk, dv, causal, sc)
    chk_out, chk_attn = torch64_loop(x, kv, H, dk, dv, sc, causal, **p)
    np.testing.assert_allclose(out64, chk_out, rtol=1e-12, atol=1e-12, err_msg=name)
    np.testing.assert_allclose(attn64, chk_attn, rtol=1e-12, atol=1e-12, err_msg=name)
    emit(name, comments, x=x, kv=kv if cross else None, heads=H, dk=dk, dv=dv,
         causal=causal, scale=scale, out=out64, attn=attn64,
         **{names[k]: v for k, v in p.items()}, rtol=1e-6, atol=1e-6)


def manual_cases():
    manual_case("manual_dk_dv", 3001,
                ["computed in float64 (numpy, cross-checked with a per-head torch float64 loop), cast to float32",
                 "dk=3 != dv=5, biases on q/k/v, output projection 10 -> 6 with bias; numpy default_rng(3001)"],
                B=2, Tq=7, E=10, H=2, dk=3, dv=5, qkv_bias=True, Eo=6, out_bias=True)
    manual_case("manual_cross_dk_dv", 3002,
                ["computed in float64 (numpy, cross-checked with a per-head torch float64 loop), cast to float32",
                 "cross-attention Tq=4, Tk=6, E=6, Ekv=5, dk=2, dv=4; no biases, no out projection; "
                 "numpy default_rng(3002)"],
                B=2, Tq=4, Tk=6, E=6, Ekv=5, H=3, dk=2, dv=4)
    manual_case("manual_scale", 3003,
                ["computed in float64 (numpy, cross-checked with a per-head torch float64 loop), cast to float32",
                 "explicit scale 0.3 (default would be 1/sqrt(4)), causal, q/k/v weights without bias, "
                 "no out projection; numpy default_rng(3003)"],
                B=1, Tq=6, E=8, H=2, dk=4, dv=4, scale=0.3, causal=True)
    manual_case("manual_noweights_heads", 3004,
                ["computed in float64 (numpy, cross-checked with a per-head torch float64 loop), cast to float32",
                 "no trainable weights (Q = K = V = x) split into 2 heads of 4, default scale 1/sqrt(4); "
                 "numpy default_rng(3004)"],
                B=2, Tq=5, E=8, H=2, dk=4, dv=4, qkv_weights=False)


# --------------------------------------------------------------------------
# C header
# --------------------------------------------------------------------------

def c_float(v):
    """float32 value as a C float literal, "%.9g" plus an f suffix."""
    v = float(np.float32(v))
    s = "%.9g" % v
    if not any(c in s for c in ".en"):   # "%.9g" of 1.0 is "1": make it a float literal
        s += ".0"
    return s + "f"


def c_printed(v):
    """A number a tutorial printed with 4 decimals, written the way it printed it."""
    return "%.4ff" % v


def c_array(name, arr, comment):
    # *_printed tables are the tutorials' 4-decimal text; everything else is
    # an exact float32 value
    fmt = c_printed if name.endswith("_printed") else c_float
    if fmt is c_float:
        arr = np.asarray(arr, dtype=np.float32)
    else:
        arr = np.asarray(arr, dtype=np.float64)
    dims = "".join("[%d]" % n for n in arr.shape)
    lines = ["/* %s */" % comment, "static const float %s%s = {" % (name, dims)]
    if arr.ndim == 1:
        lines.append("    " + ", ".join(fmt(v) for v in arr))
    elif arr.ndim == 2:
        rows = ["    {" + ", ".join(fmt(v) for v in r) + "}" for r in arr]
        lines.append(",\n".join(rows))
    else:
        raise ValueError(name)
    lines.append("};")
    return "\n".join(lines)


def write_header():
    order = [
        "clattn_tut_inputs",
        "clattn_tut001_simple_attn_printed", "clattn_tut001_simple_context_printed",
        "clattn_tut001_sa_v1_w_query", "clattn_tut001_sa_v1_w_key", "clattn_tut001_sa_v1_w_value",
        "clattn_tut001_sa_v1_attn_printed", "clattn_tut001_sa_v1_context_printed",
        "clattn_tut001_sa_v2_w_query", "clattn_tut001_sa_v2_w_key", "clattn_tut001_sa_v2_w_value",
        "clattn_tut001_sa_v2_context_printed",
        "clattn_tut001_mha3_w_query", "clattn_tut001_mha3_w_key", "clattn_tut001_mha3_w_value",
        "clattn_tut001_mha3_w_out", "clattn_tut001_mha3_b_out", "clattn_tut001_mha3_context_torch",
        "clattn_tut004_embedded", "clattn_tut004_w_query", "clattn_tut004_w_key", "clattn_tut004_w_value",
        "clattn_tut004_queries_printed", "clattn_tut004_keys_printed", "clattn_tut004_values_printed",
        "clattn_tut004_attn_token2_printed", "clattn_tut004_context_token2_printed",
    ]
    assert sorted(order) == sorted(HEADER_DATA), set(order) ^ set(HEADER_DATA)
    parts = [
        "/* GENERATED FILE - DO NOT EDIT.",
        " *",
        " * Generated by tests/golden/make_golden.py; regenerate from the repository root with:",
        " *     %s" % REGEN_CMD,
        " *",
        " * Tutorial data for the CLI demo: inputs and weights are the exact float32 values",
        " * torch produced (printed with \"%.9g\"); the *_printed tables are what the tutorials",
        " * printed (4 decimals, copied as printed), for side-by-side display; *_torch tables",
        " * are full-precision torch results where no tutorial printed one.  The tutorials are in",
        " * /work/shared/seeds (001/002: \"Your journey\", 003: MultiHeadAttention class,",
        " * 004: \"My shoes are small, my feet are big.\").  Matching fixtures live in",
        " * tests/golden/cases/tut001_*, tut004_dk_dv.",
        " */",
        "#ifndef CLATTN_CLI_TUTORIAL_DATA_H",
        "#define CLATTN_CLI_TUTORIAL_DATA_H",
        "",
    ]
    for name in order:
        arr, comment = HEADER_DATA[name]
        parts.append(c_array(name, arr, comment))
        parts.append("")
    parts.append("#endif /* CLATTN_CLI_TUTORIAL_DATA_H */")
    os.makedirs(os.path.dirname(HEADER_PATH), exist_ok=True)
    with open(HEADER_PATH, "w") as f:
        f.write("\n".join(parts) + "\n")


# --------------------------------------------------------------------------

def main():
    torch.set_num_threads(1)   # reproducible float32 reductions
    if not torch.__version__.startswith("1.13"):
        print("note: fixtures were made with torch 1.13, this is torch %s" % torch.__version__,
              file=sys.stderr)
    if os.path.isdir(CASES_DIR):
        shutil.rmtree(CASES_DIR)
    os.makedirs(CASES_DIR)

    tutorial_cases()
    mha_cases()
    manual_cases()
    half_cases()
    write_header()

    total = 0
    for root, _, files in os.walk(CASES_DIR):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    print("asserted %d printed tutorial tables" % len(CHECKED))
    for what in CHECKED:
        print("  ok  " + what)
    print("wrote %d cases to %s (%.1f KiB)" % (len(SUMMARY), os.path.relpath(CASES_DIR, REPO), total / 1024))
    for name, shapes, dout, dattn in SUMMARY:
        desc = ", ".join("%s%s" % (k, list(s)) + ("" if dt == "float32" else ":" + dt)
                         for k, (s, dt) in shapes.items())
        print("  %-22s %s  (max|d| vs f64 ref: out %.1e attn %.1e)" % (name, desc, dout, dattn))
    print("wrote %s" % os.path.relpath(HEADER_PATH, REPO))
    assert total < 2 * 1024 * 1024, "golden fixtures too large"


if __name__ == "__main__":
    main()
