#!/usr/bin/python3
"""Write clattn's committed dropout-mask fixtures, from a Philox written here.

How to run (from the repository root; needs only numpy)::

    /usr/bin/python3 tests/golden/make_dropout_mask.py

This is the independent oracle of clattn's dropout: it shares no code with
cl/philox.cl (the OpenCL kernels and the CPU reference both compile that file,
so comparing them with each other proves nothing about the mask). The Philox
here is checked against Random123's published known-answer vectors before any
file is written.

The semantics it writes down (README, "Dropout"): the attention weight
(b, h, i, j) is dropped when r0 < floor(p * 2^32), where r0 is the first word
of Philox4x32-10 with counter (j, i, h, b) and key (seed mod 2^32, seed >> 32);
p is the float32 dropout probability. A kept weight is multiplied by 1/(1 - p).

Each case writes tests/golden/dropout/<name>.npy: uint8 (B, H, Tq, Tk),
1 = kept, and tests/golden/dropout/<name>.txt with ``key value`` lines
(batch heads seq_q seq_kv p seed threshold). Running it twice gives
byte-identical files.
"""
import os

import numpy as np

M0, M1 = 0xD2511F53, 0xCD9E8D57
W0, W1 = 0x9E3779B9, 0xBB67AE85
MASK = 0xFFFFFFFF


def philox4x32_10(ctr, key):
    c0, c1, c2, c3 = ctr
    k0, k1 = key
    for rnd in range(10):
        if rnd:
            k0, k1 = (k0 + W0) & MASK, (k1 + W1) & MASK
        p0, p1 = M0 * c0, M1 * c2
        c0, c1, c2, c3 = ((p1 >> 32) ^ c1 ^ k0) & MASK, p1 & MASK, ((p0 >> 32) ^ c3 ^ k1) & MASK, p0 & MASK
    return c0, c1, c2, c3


KAT = [  # Random123 kat_vectors: philox4x32 10 rounds
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((MASK,) * 4, (MASK, MASK), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


def threshold(p):
    t = int(np.float64(np.float32(p)) * 4294967296.0)  # floor for p >= 0
    return min(t, MASK)


def keep_mask(B, H, Tq, Tk, p, seed):
    t = threshold(p)
    key = (seed & MASK, seed >> 32)
    m = np.zeros((B, H, Tq, Tk), np.uint8)
    for b in range(B):
        for h in range(H):
            for i in range(Tq):
                for j in range(Tk):
                    m[b, h, i, j] = philox4x32_10((j, i, h, b), key)[0] >= t
    return m, t


CASES = [
    # name, B, H, Tq, Tk, p, seed
    ("mask_b2_h3_q7_k9", 2, 3, 7, 9, 0.375, 0x123456789ABCDEF),
    ("mask_b1_h2_q5_k61", 1, 2, 5, 61, 0.1, 0xFFFFFFFF),
]


def main():
    for ctr, key, want in KAT:
        got = philox4x32_10(ctr, key)
        assert got == want, (ctr, key, [hex(g) for g in got])
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dropout")
    os.makedirs(out, exist_ok=True)
    for name, B, H, Tq, Tk, p, seed in CASES:
        m, t = keep_mask(B, H, Tq, Tk, p, seed)
        np.save(os.path.join(out, name + ".npy"), m)
        with open(os.path.join(out, name + ".txt"), "w") as f:
            f.write("# made by tests/golden/make_dropout_mask.py; 1 = kept\n")
            f.write(f"batch {B}\nheads {H}\nseq_q {Tq}\nseq_kv {Tk}\np {p!r}\nseed {seed}\nthreshold {t}\n")
        print(f"{name}: {int(m.sum())} of {m.size} kept (p = {p})")


if __name__ == "__main__":
    main()
