"""Image preprocessing shared by training, evaluation and prediction, and
the [data] section's settings.

Stored images are uint8 (n, H, W, C), or uint16 for 16-bit bands; the model
takes float32 NCHW, normalised per channel with the train split's mean/std
(in the stored units: 0..255, or 0..65535).
Test: tests/unit/test_data.py.
"""
from __future__ import annotations

import math

import numpy as np

from .settings import ENUM_WHY, SEED_WHY, Key, bad, declare, non_negative, rule, seed_range


def _normalize_setting(value, where):
    if value in ("dataset", "imagenet"):
        return value
    if (isinstance(value, list) and len(value) == 2
            and all(isinstance(v, list) and v for v in value)
            and len(value[0]) == len(value[1])
            and all(isinstance(x, (int, float)) and not isinstance(x, bool)
                    and math.isfinite(x) for v in value for x in v)
            and all(x > 0 for x in value[1])):
        return [[float(x) for x in v] for v in value]
    raise bad(where, f"must be \"dataset\", \"imagenet\" or [[means], [stds]] (one per "
                     f"band, on the 0..1 scale, stds > 0), got {value!r}")


SPLITS_WHY = "data.split_size and data.block_size must be >= 0"
declare(
    "data",
    Key("path", "", "dataset directory (ibtmpi prep ...)", hashed=False, legacy=True,
        shown="(required)"),
    Key("split_size", 0, "samples per worker per block; 0: use block_size",
        check=non_negative, why=SPLITS_WHY, shown="512 when neither is given"),
    Key("block_size", 0, "samples per block over all workers (split = block / N)",
        check=non_negative, why=SPLITS_WHY, shown="0 (unused)"),
    Key("batch", 32, "minibatch size of the local SGD steps",
        check=lambda v: v >= 1, why="{where} must be >= 1"),
    Key("augment", False, "random flips / 90-degree rotations"),
    Key("cache", "auto", "auto | memory | disk", choices=("auto", "memory", "disk"),
        why=ENUM_WHY),
    Key("seed", 0, "shuffling and augmentation",
        check=seed_range, why=SEED_WHY),
    Key("normalize", "dataset", "dataset | imagenet | [[means], [stds]] (0..1 scale)",
        parse=_normalize_setting, added=True),
)


@rule("data")
def _one_split_rule(cfg):
    d = cfg["data"]
    if d["split_size"] and d["block_size"]:
        return "give data.split_size or data.block_size, not both"
    return None


def channel_stats(images, chunk=4096):
    """Per-channel mean and std (float64, stored units) of uint8 or uint16 (n,H,W,C)."""
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
    """uint8 or uint16 (n, H, W, C) -> (n, C, H, W) (x - mean) / std in `dtype`
    (both convert to float32 exactly)."""
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
    """(mean, std) float64 (C,), on the stored pixels' scale (0..255; 0..65535
    for a uint16 set, whose 0..1 scale is its full range), that a
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
    top = float(np.iinfo(getattr(ds, "dtype", np.uint8)).max)
    return (np.asarray(mean, np.float64) * top, np.asarray(std, np.float64) * top)
