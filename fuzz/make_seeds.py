#!/usr/bin/env python3
"""fuzz/make_seeds.py: writes the seed corpora fuzz/corpus/npy and fuzz/corpus/plan.

    python3 fuzz/make_seeds.py        # from the repository root; rewrites both directories

npy: the numpy-made files of tests/data/npy (copied) plus hand-made headers numpy can
also write or that sit at the parser's edges (version 3.0, double quotes, uint8, bool
with nonzero bytes, a 0-d bool, padding without a trailing comma, and a few invalid files).
plan: descriptions in fuzz_plan.c's byte layout (see decode() there). Plain Python, no numpy.
"""
import os
import shutil
import struct

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NPY_DIR = os.path.join(ROOT, "fuzz", "corpus", "npy")
PLAN_DIR = os.path.join(ROOT, "fuzz", "corpus", "plan")


def npy(header, data, version=(1, 0), pad=True):
    """A .npy file with this header dict text and data bytes (header padded to 64 like numpy)."""
    h = header.encode("utf-8")
    pre = 10 if version[0] == 1 else 12
    if pad:
        total = pre + len(h) + 1
        h += b" " * ((64 - total % 64) % 64)
    h += b"\n"
    size = struct.pack("<H", len(h)) if version[0] == 1 else struct.pack("<I", len(h))
    return b"\x93NUMPY" + bytes(version) + size + h + data


def write_npy_corpus():
    if os.path.isdir(NPY_DIR):
        shutil.rmtree(NPY_DIR)
    os.makedirs(NPY_DIR)
    src = os.path.join(ROOT, "tests", "data", "npy")
    for name in sorted(os.listdir(src)):
        if name.endswith(".npy"):
            shutil.copy(os.path.join(src, name), os.path.join(NPY_DIR, name))
    f32 = struct.pack("<6f", 1.0, -2.5, 0.0, float("inf"), float("nan"), 3.25)
    files = {
        "u8_2d.npy": npy("{'descr': '|u1', 'fortran_order': False, 'shape': (2, 3), }", bytes([0, 1, 2, 254, 255, 7])),
        "bool_nonzero.npy": npy("{'descr': '|b1', 'fortran_order': False, 'shape': (4,), }", bytes([0, 1, 2, 255])),
        "bool_0d.npy": npy("{'descr': '<b1', 'fortran_order': False, 'shape': (), }", b"\x01"),
        "f32_v3_utf8.npy": npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", f32, version=(3, 0)),
        "f32_dquote.npy": npy('{"descr": "<f4", "fortran_order": False, "shape": (3, 2)}', f32),
        "f32_keys_reordered.npy": npy("{'shape': (1, 6), 'fortran_order': False, 'descr': '=f4'}", f32),
        "f32_3d_unpadded.npy": npy("{'descr':'<f4','fortran_order':False,'shape':(1,2,3)}", f32, pad=False),
        "f32_zero_dim.npy": npy("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 0, 5), }", b""),
        "bad_truncated.npy": npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", f32[:10]),
        "bad_trailing.npy": npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", f32[:12]),
        "bad_dtype_f8.npy": npy("{'descr': '<f8', 'fortran_order': False, 'shape': (1,), }", b"\0" * 8),
        "bad_huge_shape.npy": npy("{'descr': '<f4', 'fortran_order': False, "
                                  "'shape': (4294967296, 4294967296, 2), }", b""),
        "bad_magic.npy": b"\x93NUMPZ\x01\x00\x10\x00{'descr': '<f4'}\n",
    }
    for name, data in files.items():
        with open(os.path.join(NPY_DIR, name), "wb") as f:
            f.write(data)


# ---- plan descriptions (fuzz_plan.c decode())

def dim(v):
    """The byte that decodes to dimension v (0..44 and 62..64 directly, else a special value)."""
    if v <= 8:
        return v
    for b in range(0xC0, 0xF0):
        if b % 65 == v:
            return b
    special = {255: 4, 256: 5, 65535: 6, 65536: 7, 0x7FFFFFFF: 8, 0xFFFFFFFF: 9, 1 << 32: 10,
               (1 << 32) + 1: 11, 1 << 62: 12, (1 << 63): 13, (1 << 64) - 2: 14, (1 << 64) - 1: 15}
    return 0xF0 | special[v]


def plan(B, Tq, E, H, Tk=0, Ekv=0, dk=0, dv=0, Eo=0, cross=0, causal=0, kpm=0, mask=0, raw=0,
         scale=b"\x00", dropout=b"\x00", seed=0, qkv=0, biases=0, wout=0, bout=0, attn=1, prof=0,
         inf_mask=0, nonfinite=0, wild=None, data_seed=1):
    b = bytes(dim(v) for v in (B, Tq, Tk, E, Ekv, H, dk, dv, Eo))
    flags = cross | causal << 1 | kpm << 2 | mask << 3 | raw << 5 | (0xC0 if wild else 0)
    b += bytes([flags]) + (bytes(x & 0xFF for x in wild) if wild else b"")
    b += scale + dropout + struct.pack("<Q", seed)
    b += bytes([(1 if qkv else 0) | biases << 5, wout | bout << 1,
                attn | prof << 1 | inf_mask << 3 | nonfinite << 4])
    return b + struct.pack("<Q", data_seed)


def write_plan_corpus():
    if os.path.isdir(PLAN_DIR):
        shutil.rmtree(PLAN_DIR)
    os.makedirs(PLAN_DIR)
    seeds = {
        # the tutorials: softmax(x x^T) x, then SelfAttention_v1 (RAW), v2, causal, dropout
        "tutorial_no_weights": plan(1, 6, 3, 1, scale=b"\x80\x10"),                 # scale 1
        "tutorial_raw_v1": plan(1, 6, 3, 1, dk=2, qkv=1, raw=1),
        "tutorial_causal_dropout": plan(1, 6, 3, 1, dk=2, qkv=1, causal=1, dropout=b"\xa0\x80", seed=123),
        # multi-head with every weight, key padding mask
        "mha_out_proj": plan(2, 5, 8, 2, dk=4, Eo=8, qkv=1, biases=7, wout=1, bout=1, kpm=1, prof=1),
        # cross-attention, dk != dv, float mask with -inf, dropout
        "cross_float_mask": plan(2, 4, 6, 3, Tk=7, Ekv=5, dk=2, dv=3, cross=1, mask=2, inf_mask=1,
                                 qkv=1, dropout=b"\xa0\x40", seed=9),
        # bool mask, heads splitting E without weights, non-finite inputs
        "bool_mask_nonfinite": plan(3, 9, 12, 4, mask=1, causal=1, nonfinite=1),
        # every dimension 1
        "all_ones": plan(1, 1, 1, 1, dk=1, dv=1, Eo=1, qkv=1, biases=7, wout=1, bout=1),
        # validation paths: all zero, huge batch, dk + dv wrapping, NaN scale, p = 1, wild flags
        "zero": plan(0, 0, 0, 0),
        "huge_batch": plan((1 << 64) - 1, 4, 4, 1),
        "dk_dv_wrap": plan(1, 2, 4, 1, dk=(1 << 63), dv=(1 << 63), qkv=1),
        "nan_scale": plan(1, 2, 4, 2, scale=b"\xf0"),
        "dropout_one": plan(1, 2, 4, 2, dropout=b"\xf0"),
        "wild_flags": plan(1, 2, 4, 2, wild=[2, -1, 1, 9, 7]),
    }
    for name, data in seeds.items():
        with open(os.path.join(PLAN_DIR, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    write_npy_corpus()
    write_plan_corpus()
    print("wrote", NPY_DIR, "and", PLAN_DIR)
