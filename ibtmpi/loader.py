"""A worker's stream of blocks: the schedule's minibatches as normalised
float32 NCHW arrays, read from the HDF5 shards with the next block
prefetched in a background thread while the current one trains.

cache: ``memory`` reads the worker's whole sample range once (contiguous
slices, fast) and serves every block from RAM; ``disk`` reads each split
image by image; ``auto`` picks memory when the range fits in
``cache_limit`` bytes. Augmentation (optional): one of the 8 flips and
90-degree rotations per sample (valid for overhead imagery; rotations only
for square images), drawn from (seed, pass, block, worker).
Tests: tests/unit/test_loader.py; benchmark: benchmarks/bench_reader.py.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .data import normalize


def dihedral(images, ids):
    """Apply transform ids[i] in 0..7 to images[i] (n, H, W, C) in place:
    rotate by 90*(id % 4) degrees, then flip left-right if id >= 4."""
    square = images.shape[1] == images.shape[2]
    for t in range(8):
        sel = np.flatnonzero(ids == t)
        if len(sel) == 0 or t == 0:
            continue
        x = images[sel]
        if t % 4 and square:
            x = np.rot90(x, t % 4, axes=(1, 2))
        if t >= 4:
            x = x[:, :, ::-1]
        images[sel] = x
    return images


class WorkerData:
    def __init__(self, split, schedule, worker, mean, std, augment=False,
                 seed=0, cache="auto", cache_limit=2 * 2**30, prefetch=True,
                 dtype=np.float32, raw=False, device_aug=False, stage=None):
        if cache not in ("auto", "memory", "disk"):
            raise ValueError(f"data.cache must be auto, memory or disk, got {cache!r}")
        self.split, self.sched, self.worker = split, schedule, worker
        self.mean, self.std, self.dtype = mean, std, np.dtype(dtype)
        self.augment, self.seed = augment, seed
        self.raw = raw           # stored (k, H, W, C) minibatches: a GPU normalises them
        # with raw: leave the augmentation to the GPU, which gets each
        # image's transform id (the same ids the host would apply)
        self.device_aug = bool(raw and device_aug and augment)
        self.stage = stage       # block(): each block through it (gpu_feed: pinned memory)
        s, e = schedule.ranges[worker]
        self.base = s
        images = split._open()[0]["images"]
        row_bytes = int(np.prod(images.shape[1:])) * images.dtype.itemsize
        if cache == "auto":
            cache = "memory" if (e - s) * row_bytes <= cache_limit else "disk"
        self.cache = cache
        self._orders = {}
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="prefetch") if prefetch else None
        self._pending = None            # ((pass, block), future)
        # the memory cache fills in the prefetch thread: the start-up's
        # other work (model, GPU kernels, the ranks' agreement) overlaps it,
        # and the first block waits only for what is left
        self._mem = None
        if cache == "memory":
            read = lambda: split.read(np.arange(s, e))           # noqa: E731
            self._mem = self._pool.submit(read) if self._pool else read()

    @property
    def mem(self):
        """The worker's sample range in RAM (cache = memory), else None."""
        if self._mem is not None and not isinstance(self._mem, np.ndarray):
            self._mem = self._mem.result()
        return self._mem

    def _order(self, p):
        if p not in self._orders:
            self._orders = {p: self.sched.order(self.worker, p)}
        return self._orders[p]

    def load(self, p, b):
        """[(x (k, C, H, W) float, y (k,) int64)] for pass p, block b; with
        raw, x is the (augmented) uint8 (k, H, W, C) images instead; with
        device_aug, [(x raw uint8, y, ids (k,) int32)]: the transforms are
        left to the GPU."""
        mbs = self.sched.minibatches(self.worker, p, b, self._order(p))
        idx = np.concatenate(mbs) if mbs else np.zeros(0, np.int64)
        if self.mem is not None:
            imgs = self.mem[idx - self.base]
        else:
            imgs = self.split.read(idx)
        labels = self.split.labels[idx]
        ids = None
        if self.augment:
            rng = np.random.default_rng([self.seed, p, b, self.worker, 17])
            ids = rng.integers(0, 8, len(idx))
            if self.device_aug:
                ids = ids.astype(np.int32)
            else:
                dihedral(imgs, ids)
        out, at = [], 0
        for mb in mbs:
            k = len(mb)
            x = imgs[at:at + k] if self.raw else normalize(imgs[at:at + k], self.mean,
                                                           self.std, dtype=self.dtype)
            out.append((x, labels[at:at + k], ids[at:at + k]) if self.device_aug
                       else (x, labels[at:at + k]))
            at += k
        return out

    def _fetch(self, p, b):
        data = self.load(p, b)
        return data if self.stage is None else self.stage(data)

    def next_key(self, p, b):
        return (p, b + 1) if b + 1 < self.sched.blocks_per_pass else (p + 1, 0)

    def block(self, p, b):
        """This block's minibatches; starts prefetching the next block."""
        if self._pending is not None and self._pending[0] == (p, b):
            data = self._pending[1].result()
        else:
            if self._pending is not None and not self._pending[1].cancel():
                self._pending[1].exception()     # running: let it end (stages in order)
            data = self._fetch(p, b)
        self._pending = None
        if self._pool is not None:
            key = self.next_key(p, b)
            self._pending = (key, self._pool.submit(self._fetch, *key))
        return data

    def close(self):
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
