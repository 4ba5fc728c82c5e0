#!/usr/bin/python3
"""The CNN example's float64 reference (NumPy).

Computes the network of package net (net/net.go) in float64 on the
weights and inputs that Go's Values draws, and writes
  net/testdata/input.bin     the images, float32 little-endian, H*W each
  net/testdata/expected.bin  the probabilities, float64 little-endian
Run it from anywhere: /usr/bin/python3 examples/wasm/cnn/reference.py
"""
import os

import numpy as np

H, W, K, R, CLASSES = 12, 12, 4, 3, 10
FLAT = K * (H // 2) * (W // 2)
SEED = 0xC22
INPUTS = 4


def values(seed, n, scale):
    """Go's net.Values: a 32-bit LCG, ((state>>8)/2^23 - 1)*scale in float32."""
    out = np.empty(n, dtype=np.float32)
    s = seed & 0xFFFFFFFF
    for i in range(n):
        s = (s * 1664525 + 1013904223) & 0xFFFFFFFF
        out[i] = np.float32((np.float32(s >> 8) / np.float32(1 << 23) - np.float32(1)) * np.float32(scale))
    return out


def network(x):
    w = values(SEED + 0, K * R * R, 0.5).astype(np.float64).reshape(K, R, R)
    b = values(SEED + 1, K, 0.125).astype(np.float64)
    wd = values(SEED + 2, FLAT * CLASSES, 0.125).astype(np.float64).reshape(FLAT, CLASSES)
    bd = values(SEED + 3, CLASSES, 0.125).astype(np.float64)
    img = np.pad(x.astype(np.float64).reshape(H, W), 1)
    conv = np.zeros((K, H, W))
    for k in range(K):
        for i in range(H):
            for j in range(W):
                conv[k, i, j] = (img[i:i + R, j:j + R] * w[k]).sum() + b[k]
    conv = np.maximum(conv, 0)
    pool = conv.reshape(K, H // 2, 2, W // 2, 2).max(axis=(2, 4))
    logits = pool.reshape(FLAT) @ wd + bd
    e = np.exp(logits - logits.max())
    return e / e.sum()


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    out = os.path.join(here, "net", "testdata")
    os.makedirs(out, exist_ok=True)
    xs = [values(2000 + i, H * W, 1.0) for i in range(INPUTS)]
    ys = [network(x) for x in xs]
    np.concatenate(xs).astype("<f4").tofile(os.path.join(out, "input.bin"))
    np.concatenate(ys).astype("<f8").tofile(os.path.join(out, "expected.bin"))


if __name__ == "__main__":
    main()
