#!/usr/bin/env python3
"""Regenerate the small .npy fixtures used by tests/test_npy.c.

Run from anywhere:  /usr/bin/python3 tests/data/npy/make_npy.py
"""
import os

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def save(name, arr):
    np.save(os.path.join(HERE, name), arr, allow_pickle=False)


# Accepted.
save("f32_2d.npy", (np.arange(12, dtype=np.float32).reshape(3, 4) * 0.5 - 1.5))
save("bool_2d.npy", np.array([[True, False, True], [False, False, True]]))
save("u8_1d.npy", np.array([0, 1, 127, 128, 255], dtype=np.uint8))
with open(os.path.join(HERE, "f32_v2.npy"), "wb") as f:
    np.lib.format.write_array(f, np.arange(6, dtype=np.float32).reshape(2, 3) + 0.25,
                              version=(2, 0), allow_pickle=False)
save("f32_0d.npy", np.array(3.25, dtype=np.float32))
save("f32_empty.npy", np.zeros((2, 0, 3), dtype=np.float32))
save("f32_be.npy", (np.arange(5, dtype=np.float32) * 1.25 - 2.0).astype(">f4"))

# Rejected.
save("f64_1d.npy", np.arange(4, dtype=np.float64))
save("f32_fortran.npy", np.asfortranarray(np.arange(6, dtype=np.float32).reshape(2, 3)))
