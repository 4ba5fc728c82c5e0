#!/usr/bin/python3
"""The transformer example's float64 reference (NumPy).

Computes the block of package block (block/block.go) in float64 on the
weights and inputs that Go's Values draws, and writes
  block/testdata/input.bin     the inputs, float32 little-endian, one S*D block each
  block/testdata/expected.bin  the outputs, float64 little-endian, same layout
Run it from anywhere: /usr/bin/python3 examples/wasm/transformer/reference.py
"""
import os

import numpy as np

S, D, H = 8, 32, 4
DH, F = D // H, 4 * D
EPS = np.float32(1e-5)
SEED = 0x5EED
INPUTS = 3


def values(seed, n, scale):
    """Go's block.Values: a 32-bit LCG, ((state>>8)/2^23 - 1)*scale in float32."""
    out = np.empty(n, dtype=np.float32)
    s = seed & 0xFFFFFFFF
    for i in range(n):
        s = (s * 1664525 + 1013904223) & 0xFFFFFFFF
        out[i] = np.float32((np.float32(s >> 8) / np.float32(1 << 23) - np.float32(1)) * np.float32(scale))
    return out


def params():
    one = lambda v: (np.float32(1) + v).astype(np.float32)
    return dict(
        g1=one(values(SEED + 0, D, 0.25)),
        b1=values(SEED + 1, D, 0.125),
        wqkv=values(SEED + 2, D * 3 * D, 0.25).reshape(D, 3 * D),
        wo=values(SEED + 3, D * D, 0.25).reshape(D, D),
        g2=one(values(SEED + 4, D, 0.25)),
        b2=values(SEED + 5, D, 0.125),
        w1=values(SEED + 6, D * F, 0.25).reshape(D, F),
        c1=values(SEED + 7, F, 0.125),
        w2=values(SEED + 8, F * D, 0.125).reshape(F, D),
        c2=values(SEED + 9, D, 0.125),
    )


def layernorm(x, g, b):
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + float(EPS)) * g + b


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def block(x, p):
    p = {k: v.astype(np.float64) for k, v in p.items()}
    x = x.astype(np.float64).reshape(S, D)
    ln1 = layernorm(x, p["g1"], p["b1"])
    qkv = (ln1 @ p["wqkv"]).reshape(S, 3, H, DH).transpose(1, 2, 0, 3)
    q, k, v = qkv[0], qkv[1], qkv[2]
    scale = float(np.float32(1 / np.sqrt(DH)))  # the stage's affine scale, a float32
    scores = (q @ k.transpose(0, 2, 1)) * scale
    mask = np.triu(np.ones((S, S), dtype=bool), 1)
    scores = np.where(mask, -np.inf, scores)
    scores = scores - scores.max(axis=-1, keepdims=True)
    probs = np.exp(scores)
    probs /= probs.sum(axis=-1, keepdims=True)
    attn = (probs @ v).transpose(1, 0, 2).reshape(S, D)
    h = x + attn @ p["wo"]
    ln2 = layernorm(h, p["g2"], p["b2"])
    m = gelu_tanh(ln2 @ p["w1"] + p["c1"]) @ p["w2"] + p["c2"]
    return h + m


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    out = os.path.join(here, "block", "testdata")
    os.makedirs(out, exist_ok=True)
    p = params()
    xs = [values(1000 + i, S * D, 2.0) for i in range(INPUTS)]
    ys = [block(x, p) for x in xs]
    np.concatenate(xs).astype("<f4").tofile(os.path.join(out, "input.bin"))
    np.concatenate([y.reshape(-1) for y in ys]).astype("<f8").tofile(os.path.join(out, "expected.bin"))


if __name__ == "__main__":
    main()
