#!/usr/bin/env python3
"""Reference dequantisations of random TQ1_0 / TQ2_0 blocks, made by gguf-py
and checked against llama.cpp's own `dequantize_row_tq*` (libggml-base).

usage: gen.py path/to/llama.cpp/gguf-py path/to/libggml-base.so
(writes <TYPE>.raw and <TYPE>.f32 here). Any bytes are a valid block; only
the f16 scale is set to a finite, small value. `<TYPE>.f32` is the
dequantised row as little-endian f32.
"""
import ctypes
import os
import sys

import numpy as np

sys.path.insert(0, sys.argv[1])
from gguf import quants  # noqa: E402
from gguf.constants import GGMLQuantizationType as T  # noqa: E402


class TypeTraits(ctypes.Structure):
    _fields_ = [("type_name", ctypes.c_char_p), ("blck_size", ctypes.c_int64),
                ("blck_size_interleave", ctypes.c_int64), ("type_size", ctypes.c_size_t),
                ("is_quantized", ctypes.c_bool), ("to_float", ctypes.c_void_p),
                ("from_float_ref", ctypes.c_void_p)]


ggml = ctypes.CDLL(sys.argv[2])
ggml.ggml_get_type_traits.restype = ctypes.POINTER(TypeTraits)
TO_FLOAT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)

BLOCKS = 8
here = os.path.dirname(os.path.abspath(__file__))
rng = np.random.default_rng(34)


def scale():
    return np.float16(rng.uniform(0.2, 1.2) * 2e-3 * (-1 if rng.integers(4) == 0 else 1))


for name, ty, size, d_at in [("TQ1_0", T.TQ1_0, 54, 52), ("TQ2_0", T.TQ2_0, 66, 64)]:
    raw = rng.integers(0, 256, size=(BLOCKS, size), dtype=np.uint8)
    if name == "TQ1_0":  # every byte value in the last five blocks' trit bytes
        raw[3:, :d_at] = np.resize(np.arange(256, dtype=np.uint8), (5, d_at))
    else:  # the stored 3 no quantiser writes
        raw[-1, :d_at] = 0xFF
    for b in raw:
        bits = int(scale().view(np.uint16))
        b[d_at], b[d_at + 1] = bits & 0xFF, bits >> 8
    deq = quants.dequantize(raw.reshape(-1), ty).astype("<f4")
    assert deq.shape == (BLOCKS * 256,) and np.isfinite(deq).all(), name
    theirs = np.zeros(BLOCKS * 256, dtype=np.float32)
    to_float = TO_FLOAT(ggml.ggml_get_type_traits(int(ty)).contents.to_float)
    to_float(raw.ctypes.data, theirs.ctypes.data, BLOCKS * 256)
    assert (theirs.view(np.uint32) == deq.view(np.uint32)).all(), f"{name}: gguf-py and llama.cpp differ"
    raw.tofile(os.path.join(here, f"{name}.raw"))
    deq.tofile(os.path.join(here, f"{name}.f32"))
    print(name, "ok")
