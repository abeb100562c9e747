"""A uint16 copy of a data set, for tests and the loader benchmark: the
16-bit bands `prep folder` keeps, without needing 16-bit source images.

Each pixel v becomes 257*v + a seeded 0..255 (the whole 16-bit range, with
low bits that matter); dataset.json gets "dtype": "uint16", the bands of
a `prep folder --bands all` set (so predict reads 16-bit TIFFs for it) and
the train split's statistics of the new pixels. Shards keep one image a chunk and
Fletcher-32 checksums, as prep writes them.
"""
from __future__ import annotations

import json
import os
import shutil

import numpy as np


def uint16_copy(src, dst, seed=16):
    import h5py
    shutil.copytree(src, dst)
    rng = np.random.default_rng(seed)
    meta = json.load(open(os.path.join(dst, "dataset.json")))
    c = int(meta["image_shape"][2])
    s = np.zeros(c)
    s2 = np.zeros(c)
    n = 0
    for split, info in meta["splits"].items():
        for f in info["files"]:
            p = os.path.join(dst, f)
            with h5py.File(p, "r") as h:
                im, lb, at = h["images"][:], h["labels"][:], dict(h.attrs)
            im = im.astype(np.uint16) * 257 + rng.integers(0, 256, im.shape).astype(np.uint16)
            if split == "train":
                px = im.reshape(-1, c).astype(np.float64)
                s += px.sum(0)
                s2 += (px * px).sum(0)
                n += len(px)
            with h5py.File(p, "w") as h:
                h.create_dataset("images", data=im, chunks=(1,) + im.shape[1:], fletcher32=True)
                h.create_dataset("labels", data=lb, fletcher32=True)
                for k, v in at.items():
                    h.attrs[k] = v
    mean = s / n
    meta.update(dtype="uint16", bands="all", band_scale=None, mean=mean.tolist(),
                std=np.sqrt(np.maximum(s2 / n - mean * mean, 1e-12)).tolist())
    json.dump(meta, open(os.path.join(dst, "dataset.json"), "w"), indent=1)
    return str(dst)
