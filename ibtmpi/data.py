"""Image preprocessing shared by training, evaluation and prediction.

Stored images are uint8 (n, H, W, C); the model takes float32 NCHW,
normalised per channel with the train split's mean/std (in 0..255 units).
Test: tests/unit/test_data.py.
"""
from __future__ import annotations

import numpy as np


def channel_stats(images, chunk=4096):
    """Per-channel mean and std (float64, 0..255 units) of uint8 (n,H,W,C)."""
    c = images.shape[-1]
    s = np.zeros(c)
    s2 = np.zeros(c)
    n = 0
    for i in range(0, len(images), chunk):
        x = images[i:i + chunk].reshape(-1, c).astype(np.float64)
        s += x.sum(0)
        s2 += (x * x).sum(0)
        n += len(x)
    mean = s / max(n, 1)
    std = np.sqrt(np.maximum(s2 / max(n, 1) - mean * mean, 1e-12))
    return mean, std


def normalize(images, mean, std, out=None, dtype=np.float32):
    """uint8 (n, H, W, C) -> (n, C, H, W) (x - mean) / std in `dtype`."""
    n, h, w, c = images.shape
    if out is None:
        out = np.empty((n, c, h, w), dtype)
    scale = (1.0 / np.asarray(std, np.float64)).astype(dtype)
    shift = (-np.asarray(mean, np.float64) / np.asarray(std, np.float64)).astype(dtype)
    # One pass: transpose-copy with the cast, then an in-place affine map.
    np.copyto(out, images.transpose(0, 3, 1, 2), casting="unsafe")
    out *= scale[None, :, None, None]
    out += shift[None, :, None, None]
    return out
