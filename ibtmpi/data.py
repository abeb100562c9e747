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


# torchvision's ImageNet statistics, on the 0..1 scale of a pixel
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def input_norm(cfg, ds):
    """(mean, std) float64 (C,), on the stored pixels' scale (0..255), that a
    run normalises its inputs with: data.normalize = "dataset" (the train
    split's own per-band statistics, dataset.json), "imagenet" (what
    ImageNet-pretrained weights were trained on; 3 bands) or [[means],
    [stds]] on the 0..1 scale, as torchvision's Normalize takes them. The
    model file records the result, so evaluate, predict, export and ONNX
    use the same. ValueError where the band count does not fit."""
    spec = cfg.get("data", {}).get("normalize", "dataset")
    if spec == "dataset":
        return np.asarray(ds.mean, np.float64), np.asarray(ds.std, np.float64)
    c = int(ds.image_shape[2])
    if spec == "imagenet":
        if c != 3:
            raise ValueError(f"data.normalize = \"imagenet\" takes 3 bands (RGB); "
                             f"{ds.path} has {c}: use \"dataset\" or give [[means], [stds]]")
        mean, std = IMAGENET_MEAN, IMAGENET_STD
    else:
        mean, std = spec
        if len(mean) != c or len(std) != c:
            raise ValueError(f"data.normalize gives {len(mean)} means and {len(std)} stds; "
                             f"{ds.path} has {c} band(s)")
    return (np.asarray(mean, np.float64) * 255.0, np.asarray(std, np.float64) * 255.0)
