#!/usr/bin/python3
"""Trains the digits example's CNN and writes its artefacts.

Data: scikit-learn's bundled digits (sklearn.datasets.load_digits: 1,797
8x8 images, pixel values 0..16). The model sees pixel/16 (exact in
float32). Split: sklearn.model_selection.train_test_split(test_size=0.2,
random_state=0) over the image indices: 1,437 images train, 360 are the
held-out test set (reference.json lists their indices); the training
order is shuffled with NumPy's default_rng(0).

Network (NCHW, every layer an op of the device library):
  conv1  1->8,  3x3, pad 1   [N,8,8,8]   relu, maxpool 2x2 -> [N,8,4,4]
  conv2  8->16, 3x3, pad 1   [N,16,4,4]  relu, maxpool 2x2 -> [N,16,2,2]
  dense  64->10 (y = x.W^T + b, W stored [10,64] as in PyTorch), softmax

Training: float64, hand-written backprop, Adam, cross-entropy, fixed
seed, one BLAS thread. Then, in float32 with the weights as stored:

  digits.safetensors         the weights (written here, no library)
  digits.safetensors.sha256  its sha256, in sha256sum's format
  reference.json             the test set: inputs, labels, the float32
                             forward pass's logits and probabilities,
                             predictions, accuracy
  digits.png                 16 test digits with their predicted labels
  sample.bin                 the first 4 test images (the manifests' input)

The float32 forward pass follows the op library's exact tier order
(docs/kernels.md): conv2d sums c, then r, then s ascending from 0 with
each product rounded, then adds the bias; gemm sums k ascending from 0;
bias add, relu and max pooling are per element. So its logits are what
the stage computes, bit for bit. Softmax is float64 (exp of x - max, the
sum in column order) rounded once to float32, as the simulator does.

Run: /usr/bin/python3 examples/wasm/digits/train.py   (about 20 s, 1 core)
"""
import hashlib
import json
import os
import struct
import sys

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import numpy as np  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

SEED = 0
EPOCHS = 40
BATCH = 32
LR = 1e-2
HERE = os.path.dirname(os.path.abspath(__file__))


# ---- training (float64) ----

def im2col(x, r=3, pad=1):
    """x [N,C,H,W] -> cols [N, C*r*r, H*W] (stride 1, 'same' padding)."""
    n, c, h, w = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    cols = np.empty((n, c, r, r, h, w), dtype=x.dtype)
    for i in range(r):
        for j in range(r):
            cols[:, :, i, j] = xp[:, :, i:i + h, j:j + w]
    return cols.reshape(n, c * r * r, h * w)


def col2im(cols, shape, r=3, pad=1):
    n, c, h, w = shape
    cols = cols.reshape(n, c, r, r, h, w)
    xp = np.zeros((n, c, h + 2 * pad, w + 2 * pad), dtype=cols.dtype)
    for i in range(r):
        for j in range(r):
            xp[:, :, i:i + h, j:j + w] += cols[:, :, i, j]
    return xp[:, :, pad:pad + h, pad:pad + w]


def conv_fwd(x, w, b):
    n, c, h, ww = x.shape
    k = w.shape[0]
    cols = im2col(x)
    y = np.einsum("kq,nqp->nkp", w.reshape(k, -1), cols) + b[None, :, None]
    return y.reshape(n, k, h, ww), cols


def conv_bwd(dy, x_shape, cols, w):
    n, k, h, ww = dy.shape
    dy = dy.reshape(n, k, h * ww)
    dw = np.einsum("nkp,nqp->kq", dy, cols).reshape(w.shape)
    db = dy.sum(axis=(0, 2))
    dcols = np.einsum("kq,nkp->nqp", w.reshape(k, -1), dy)
    return col2im(dcols, x_shape), dw, db


def pool_fwd(x):
    n, c, h, w = x.shape
    v = x.reshape(n, c, h // 2, 2, w // 2, 2)
    y = v.max(axis=(3, 5))
    mask = v == y[:, :, :, None, :, None]
    # one winner per window (the first), so ties do not double the gradient
    flat = mask.transpose(0, 1, 2, 4, 3, 5).reshape(n, c, h // 2, w // 2, 4)
    first = np.zeros_like(flat)
    idx = flat.argmax(axis=-1)
    np.put_along_axis(first, idx[..., None], True, axis=-1)
    mask = first.reshape(n, c, h // 2, w // 2, 2, 2).transpose(0, 1, 2, 4, 3, 5)
    return y, mask


def pool_bwd(dy, mask):
    n, c, h2, w2 = dy.shape
    return (mask * dy[:, :, :, None, :, None]).reshape(n, c, h2 * 2, w2 * 2)


def forward64(p, x):
    c1, cols1 = conv_fwd(x, p["conv1.weight"], p["conv1.bias"])
    r1 = np.maximum(c1, 0)
    p1, m1 = pool_fwd(r1)
    c2, cols2 = conv_fwd(p1, p["conv2.weight"], p["conv2.bias"])
    r2 = np.maximum(c2, 0)
    p2, m2 = pool_fwd(r2)
    flat = p2.reshape(len(x), -1)
    logits = flat @ p["dense.weight"].T + p["dense.bias"]
    return logits, (x, c1, cols1, p1, m1, c2, cols2, m2, flat)


def backward64(p, cache, dlogits):
    x, c1, cols1, p1, m1, c2, cols2, m2, flat = cache
    g = {}
    g["dense.weight"] = dlogits.T @ flat
    g["dense.bias"] = dlogits.sum(axis=0)
    dflat = dlogits @ p["dense.weight"]
    dr2 = pool_bwd(dflat.reshape(len(x), 16, 2, 2), m2) * (c2 > 0)
    dp1, g["conv2.weight"], g["conv2.bias"] = conv_bwd(dr2, p1.shape, cols2, p["conv2.weight"])
    dr1 = pool_bwd(dp1, m1) * (c1 > 0)
    _, g["conv1.weight"], g["conv1.bias"] = conv_bwd(dr1, x.shape, cols1, p["conv1.weight"])
    return g


SHAPES = {
    "conv1.weight": (8, 1, 3, 3),
    "conv1.bias": (8,),
    "conv2.weight": (16, 8, 3, 3),
    "conv2.bias": (16,),
    "dense.weight": (10, 64),
    "dense.bias": (10,),
}


def init(rng):
    p = {}
    for name, shape in SHAPES.items():
        if name.endswith(".bias"):
            p[name] = np.zeros(shape)
        else:
            fan_in = int(np.prod(shape[1:]))
            p[name] = rng.normal(0.0, np.sqrt(2.0 / fan_in), size=shape)
    return p


def train(x, y, rng):
    p = init(rng)
    m = {k: np.zeros_like(v) for k, v in p.items()}
    v = {k: np.zeros_like(v) for k, v in p.items()}
    b1, b2, eps, step = 0.9, 0.999, 1e-8, 0
    for epoch in range(EPOCHS):
        order = rng.permutation(len(x))
        lr = LR * (0.5 * (1 + np.cos(np.pi * epoch / EPOCHS)))  # cosine decay
        total = 0.0
        for i in range(0, len(x), BATCH):
            idx = order[i:i + BATCH]
            logits, cache = forward64(p, x[idx])
            z = logits - logits.max(axis=1, keepdims=True)
            prob = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
            total += -np.log(prob[np.arange(len(idx)), y[idx]]).sum()
            d = prob
            d[np.arange(len(idx)), y[idx]] -= 1
            g = backward64(p, cache, d / len(idx))
            step += 1
            for k in p:
                m[k] = b1 * m[k] + (1 - b1) * g[k]
                v[k] = b2 * v[k] + (1 - b2) * g[k] ** 2
                mh = m[k] / (1 - b1 ** step)
                vh = v[k] / (1 - b2 ** step)
                p[k] -= lr * mh / (np.sqrt(vh) + eps)
        if epoch % 10 == 9 or epoch == EPOCHS - 1:
            print(f"epoch {epoch + 1}: train loss {total / len(x):.4f}", file=sys.stderr)
    return p


# ---- the float32 forward pass in the op library's order ----

def conv32(x, w, b):
    """conv2d, 3x3, pad 1, stride 1: the exact tier's order."""
    n, c, h, ww = x.shape
    k, _, r, s = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    acc = np.zeros((n, k, h, ww), dtype=np.float32)
    for ci in range(c):
        for ri in range(r):
            for si in range(s):
                xs = xp[:, ci, ri:ri + h, si:si + ww][:, None]  # [N,1,H,W]
                acc = acc + xs * w[None, :, ci, ri, si, None, None]
    return acc + b[None, :, None, None]


def maxpool32(x):
    n, c, h, w = x.shape
    return x.reshape(n, c, h // 2, 2, w // 2, 2).max(axis=(3, 5))


def forward32(p, x):
    """float32 logits and probabilities, as the stage computes them."""
    a = np.maximum(conv32(x, p["conv1.weight"], p["conv1.bias"]), np.float32(0))
    a = maxpool32(a)
    a = np.maximum(conv32(a, p["conv2.weight"], p["conv2.bias"]), np.float32(0))
    a = maxpool32(a).reshape(len(x), 64)
    wd = p["dense.weight"]
    acc = np.zeros((len(x), 10), dtype=np.float32)
    for k in range(64):
        acc = acc + a[:, k, None] * wd[None, :, k]
    logits = acc + p["dense.bias"][None, :]
    assert logits.dtype == np.float32
    l64 = logits.astype(np.float64)
    mx = l64.max(axis=1, keepdims=True)
    e = np.exp(l64 - mx)
    total = np.zeros((len(x), 1))
    for j in range(10):  # the column order, not NumPy's pairwise sum
        total = total + e[:, j:j + 1]
    probs = (e / total).astype(np.float32)
    return logits, probs


# ---- artefacts ----

def write_safetensors(path, tensors, metadata):
    """safetensors: u64 LE header length, JSON header, the data (f32 LE)."""
    header = {"__metadata__": metadata}
    data = bytearray()
    for name, arr in tensors.items():
        raw = np.ascontiguousarray(arr, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(arr.shape),
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)  # pad the header to 8 bytes, as the format allows
    blob = struct.pack("<Q", len(h)) + h + bytes(data)
    with open(path, "wb") as f:
        f.write(blob)
    return hashlib.sha256(blob).hexdigest()


def f32s(a):
    """float32 values as the shortest decimal strings that read back exactly."""
    return [float(np.format_float_positional(v, unique=True, trim="-")) for v in np.asarray(a, np.float32).ravel()]


def picture(path, x, labels, preds):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(2, 8, figsize=(8, 2.5), dpi=100)
    for i, ax in enumerate(axes.ravel()):
        ax.imshow(x[i].reshape(8, 8), cmap="gray_r", vmin=0, vmax=1, interpolation="nearest")
        ok = preds[i] == labels[i]
        ax.set_title(f"{preds[i]}" if ok else f"{preds[i]} (is {labels[i]})",
                     fontsize=10, color="black" if ok else "red")
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle("stagehost digits: the first 16 test images, predicted labels", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, metadata={"Software": None})
    plt.close(fig)


def main():
    d = load_digits()
    x = (d.data / 16.0).reshape(-1, 1, 8, 8)
    y = d.target
    itr, ite = train_test_split(np.arange(len(x)), test_size=0.2, random_state=0)
    xtr, ytr, xte, yte = x[itr], y[itr], x[ite], y[ite]
    rng = np.random.default_rng(SEED)
    p = train(xtr, ytr, rng)

    p32 = {k: v.astype(np.float32) for k, v in p.items()}
    x32 = xte.astype(np.float32)
    logits, probs = forward32(p32, x32)
    preds = probs.argmax(axis=1)
    if not np.array_equal(preds, logits.argmax(axis=1)):
        print("note: argmax of probabilities and of logits differ", file=sys.stderr)
    correct = int((preds == yte).sum())
    acc = correct / len(yte)
    l64, _ = forward64(p, xte)
    acc64 = float((l64.argmax(axis=1) == yte).mean())
    print(f"test accuracy: {correct}/{len(yte)} = {acc * 100:.2f}% "
          f"(float32 forward pass; float64 training weights: {acc64 * 100:.2f}%)")

    meta = {"model": "stagehost digits CNN", "data": "sklearn load_digits, pixel/16",
            "split": "train_test_split(test_size=0.2, random_state=0)",
            "test_accuracy": f"{correct}/{len(yte)}"}
    sha = write_safetensors(os.path.join(HERE, "digits.safetensors"), p32, meta)
    with open(os.path.join(HERE, "digits.safetensors.sha256"), "w") as f:
        f.write(f"{sha}  digits.safetensors\n")
    print(f"digits.safetensors sha256 {sha}")

    ref = {
        "description": "the digits test set (sklearn load_digits, train_test_split(test_size=0.2, "
                       "random_state=0), pixel/16) "
                       "through the float32 forward pass of train.py",
        "weights_sha256": sha,
        "indices": [int(v) for v in ite],
        "count": len(yte),
        "correct": correct,
        "accuracy": acc,
        "labels": [int(v) for v in yte],
        "predictions": [int(v) for v in preds],
        "inputs": [f32s(v) for v in x32],
        "logits": [f32s(v) for v in logits],
        "probabilities": [f32s(v) for v in probs],
    }
    with open(os.path.join(HERE, "reference.json"), "w") as f:
        json.dump(ref, f, separators=(",", ":"))
        f.write("\n")
    picture(os.path.join(HERE, "digits.png"), x32[:16], yte[:16], preds[:16])
    # the manifests' sample input: the first 4 test images
    x32[:4].astype("<f4").tofile(os.path.join(HERE, "sample.bin"))


if __name__ == "__main__":
    main()
