#!/usr/bin/env python3
"""Median / max KL divergence, top-1 agreement and max |diff| of two logits
files (llama.cpp's raw f32 from llama-logits.c, Pocket's .npy), 16 positions."""
import sys

import numpy as np


def load(p):
    return np.load(p) if p.endswith(".npy") else np.fromfile(p, dtype="<f4").reshape(16, -1)


def log_softmax(x):
    x = x - x.max(1, keepdims=True)
    return x - np.log(np.exp(x).sum(1, keepdims=True))


a, b = load(sys.argv[1]).astype(np.float64), load(sys.argv[2]).astype(np.float64)
pa, pb = log_softmax(a), log_softmax(b)
kl = (np.exp(pa) * (pa - pb)).sum(1)
top1 = (a.argmax(1) == b.argmax(1)).sum()
print(f"median KL {np.median(kl):.2e}, max KL {kl.max():.2e}, top-1 {top1}/16, max |d| {np.abs(a - b).max():.3e}")
ok = np.median(kl) <= 5e-3 and top1 >= 12
sys.exit(0 if ok else 1)
