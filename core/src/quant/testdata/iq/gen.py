#!/usr/bin/env python3
"""Reference dequantisations of random IQ1/IQ2 blocks, made by gguf-py.

usage: gen.py path/to/llama.cpp/gguf-py   (writes <TYPE>.raw and <TYPE>.f32 here)
Any bytes are a valid block; only the f16 scale is set to a finite, small
value. `<TYPE>.f32` is the dequantised row as little-endian f32.
"""
import os
import sys

import numpy as np

sys.path.insert(0, sys.argv[1])
from gguf import quants  # noqa: E402
from gguf.constants import GGMLQuantizationType as T  # noqa: E402

BLOCKS = 3
here = os.path.dirname(os.path.abspath(__file__))
rng = np.random.default_rng(26)


def scale():
    return np.float16(rng.uniform(0.2, 1.2) * 2e-3 * (-1 if rng.integers(4) == 0 else 1))


for name, ty, size in [("IQ2_XXS", T.IQ2_XXS, 66), ("IQ2_XS", T.IQ2_XS, 74), ("IQ2_S", T.IQ2_S, 82),
                       ("IQ1_S", T.IQ1_S, 50), ("IQ1_M", T.IQ1_M, 56)]:
    raw = rng.integers(0, 256, size=(BLOCKS, size), dtype=np.uint8)
    for b in raw:
        bits = int(scale().view(np.uint16))
        if name == "IQ1_M":  # the f16 is the top nibbles of the 4 scale words
            for i in range(4):
                b[49 + 2 * i] = (b[49 + 2 * i] & 0x0F) | (((bits >> (4 * i)) & 0xF) << 4)
        else:
            b[0], b[1] = bits & 0xFF, bits >> 8
    deq = quants.dequantize(raw.reshape(-1), ty).astype("<f4")
    assert deq.shape == (BLOCKS * 256,) and np.isfinite(deq).all(), name
    raw.tofile(os.path.join(here, f"{name}.raw"))
    deq.tofile(os.path.join(here, f"{name}.f32"))
