#!/usr/bin/env python
"""Reader throughput vs the reference CNN's consumption rate.

Measures, on one dataset directory (made if missing: the default synthetic
64x64 set), images/s delivered as normalised float32 NCHW minibatches by
WorkerData for cache=disk (per-image HDF5 reads) and cache=memory, each with
the background prefetch, plus the training-step rate of the reference CNN
at the same batch size, and prints the ratios (target >= 10x). Then it runs
a few real blocks of training with prefetch on and reports the time the
training loop spent waiting for data.

With --checksums it instead measures what the shards' Fletcher-32 chunk
checksums cost: the same rows written with and without them (h5py, one
row a chunk, as ibtmpi prep writes), then read back whole (cache=memory's
fill) and row by row in random order (cache=disk), alternating the two
variants over --reps repetitions; medians and the ratio.

With --uint16 it compares a uint16 set (16-bit bands kept by prep folder)
with the same images as uint8: a uint16 copy of the data set (each pixel
257*v + 0..255, ibtmpi/testing/data16.py), then the loader's images/s for
both, alternated over --reps repetitions: normalised float32 batches (what
a CPU worker gets) and raw stored batches (what a GPU worker uploads and
normalises on the device), cache=disk and cache=memory; medians and the
uint16/uint8 ratio.

Usage: python benchmarks/bench_reader.py [--data DIR] [--split 496] [--batch 64]
       python benchmarks/bench_reader.py --checksums [--rows 5000] [--reps 5]
       python benchmarks/bench_reader.py --uint16 [--data DIR] [--reps 5]
"""
import argparse
import os
import statistics
import time

import numpy as np
from threadpoolctl import threadpool_limits

from ibtmpi.dataset import Dataset
from ibtmpi.loader import WorkerData
from ibtmpi.model import Model
from ibtmpi.optim import SGD
from ibtmpi.schedule import Schedule


def reader_rate(tr, sched, ds, cache, blocks, raw=False):
    t_open = time.perf_counter()
    wd = WorkerData(tr, sched, 0, ds.mean, ds.std, cache=cache, prefetch=True, raw=raw)
    t_ready = time.perf_counter()
    wd.block(0, 0)
    n, t0 = 0, time.perf_counter()
    for b in range(1, blocks + 1):
        p, bb = sched.locate(b)
        n += sum(len(y) for _, y in wd.block(p, bb))
    rate = n / (time.perf_counter() - t0)
    wd.close()
    return rate, t_ready - t_open


def checksum_cost(rows, size, reps):
    """(write s, read-all s, random-row read s) medians, without and with
    Fletcher-32, over alternated repetitions."""
    import tempfile
    import h5py
    rng = np.random.default_rng(0)
    imgs = rng.integers(0, 256, (rows, size, size, 3), dtype=np.uint8)
    order = rng.permutation(rows)[:2000]
    res = {False: [], True: []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(reps):
            for fl in (False, True):
                path = os.path.join(tmp, f"{fl}-{r}.h5")
                t0 = time.perf_counter()
                with h5py.File(path, "w", rdcc_nbytes=0) as f:
                    d = f.create_dataset("images", imgs.shape, np.uint8,
                                         chunks=(1, size, size, 3), fletcher32=fl)
                    for lo in range(0, rows, 512):
                        d[lo:lo + 512] = imgs[lo:lo + 512]
                t1 = time.perf_counter()
                with h5py.File(path, "r") as f:
                    f["images"][:]
                    t2 = time.perf_counter()
                    for i in order:
                        f["images"][int(i)]
                    t3 = time.perf_counter()
                os.remove(path)
                res[fl].append((t1 - t0, t2 - t1, t3 - t2))
    return {fl: [statistics.median(x[k] for x in v) for k in range(3)]
            for fl, v in res.items()}


def main_checksums(a):
    res = checksum_cost(a.rows, a.size, a.reps)
    mib = a.rows * a.size * a.size * 3 / 2**20
    print(f"{a.rows} rows of {a.size}x{a.size}x3 ({mib:.0f} MiB), one row a chunk, "
          f"medians of {a.reps} alternated repetitions (page cache warm)")
    print("| operation | no checksums | Fletcher-32 | ratio |")
    print("|---|---|---|---|")
    for k, what in enumerate(("write (512-row slices)", "read all rows",
                              "read 2,000 random rows one by one")):
        a0, a1 = res[False][k], res[True][k]
        print(f"| {what} | {a0:.3f} s | {a1:.3f} s | {a1 / a0:.2f}x |")


def main_uint16(a):
    from ibtmpi.testing.data16 import uint16_copy
    wide = a.data.rstrip("/") + "-u16"
    if not os.path.exists(wide):
        print(f"making {wide}: {a.data} as uint16")
        uint16_copy(a.data, wide)
    threadpool_limits(a.threads)
    sets = {"uint8": Dataset(a.data), "uint16": Dataset(wide)}
    res = {}
    for _ in range(a.reps):
        for raw in (False, True):
            for cache in ("disk", "memory"):
                for name, ds in sets.items():
                    tr = ds.split("train")
                    sched = Schedule(tr.n, 1, a.split, a.batch)
                    rate, _ = reader_rate(tr, sched, ds, cache, a.blocks, raw)
                    res.setdefault((raw, cache, name), []).append(rate)
    ds = sets["uint8"]
    h, w, c = ds.image_shape
    print(f"{a.data}: {ds.split('train').n} train images {h}x{w}x{c}, split {a.split}, "
          f"batch {a.batch}, {a.blocks} blocks a measurement, medians of {a.reps} "
          f"alternated repetitions, {a.threads} BLAS thread(s)")
    print("| batches | cache | uint8 images/s | uint16 images/s | uint16 / uint8 |")
    print("|---|---|---|---|---|")
    for raw in (False, True):
        for cache in ("disk", "memory"):
            u8, u16 = (statistics.median(res[(raw, cache, n)]) for n in ("uint8", "uint16"))
            what = "raw stored (a GPU worker's)" if raw else "normalised float32 (a CPU worker's)"
            print(f"| {what} | {cache} | {u8:,.0f} | {u16:,.0f} | {u16 / u8:.2f}x |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--checksums", action="store_true",
                    help="measure the Fletcher-32 checksums' write and read cost instead")
    ap.add_argument("--uint16", action="store_true",
                    help="the loader's rate on a uint16 copy of --data against --data")
    ap.add_argument("--rows", type=int, default=5000)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--data", default="data/synth64")
    ap.add_argument("--split", type=int, default=496)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--blocks", type=int, default=12)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    if a.checksums:
        return main_checksums(a)
    if not os.path.exists(a.data):
        from ibtmpi.data_prep.prep import prep_synth
        print(f"making {a.data} (25,000 synthetic 64x64 images)...")
        prep_synth(a.data, quiet=True)
    if a.uint16:
        return main_uint16(a)
    threadpool_limits(a.threads)
    ds = Dataset(a.data)
    tr = ds.split("train")
    sched = Schedule(tr.n, 1, a.split, a.batch)
    disk, _ = reader_rate(tr, sched, ds, "disk", a.blocks)
    mem, t_cache = reader_rate(tr, sched, ds, "memory", a.blocks)

    h, w, c = ds.image_shape
    model = Model("reference", (c, h, w), ds.n_classes)
    opt = SGD(model.params, lr=1e-4)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((a.batch, c, h, w), dtype=np.float32)
    y = rng.integers(0, ds.n_classes, a.batch)
    times = []
    for i in range(8):
        t0 = time.perf_counter()
        model.loss_and_grad(x, y)
        opt.step(model.grads)
        if i >= 2:
            times.append(time.perf_counter() - t0)
    cnn = a.batch / statistics.median(times)

    # real loop: time spent waiting on data with prefetch on (disk cache)
    wd = WorkerData(tr, sched, 0, ds.mean, ds.std, cache="disk", prefetch=True)
    wait = compute = 0.0
    for b in range(4):
        t0 = time.perf_counter()
        mbs = wd.block(*sched.locate(b))
        t1 = time.perf_counter()
        for xb, yb in mbs[:3]:
            model.loss_and_grad(xb, yb)
            opt.step(model.grads)
        t2 = time.perf_counter()
        if b:                       # block 0 has nothing to overlap with
            wait += t1 - t0
            compute += t2 - t1
    wd.close()
    print(f"dataset {a.data}: {tr.n} train images {h}x{w}x{c}, split {a.split}, batch {a.batch}, "
          f"{a.threads} BLAS thread(s)")
    print("| source | images/s | x CNN consumption |")
    print("|---|---|---|")
    print(f"| reader, cache=disk (per-image HDF5 reads) + prefetch | {disk:,.0f} | {disk / cnn:.0f}x |")
    print(f"| reader, cache=memory + prefetch | {mem:,.0f} | {mem / cnn:.0f}x |")
    print(f"| reference CNN training step (consumer) | {cnn:,.0f} | 1x |")
    print(f"memory cache fill for {tr.n} images: {t_cache:.2f} s")
    print(f"training loop with disk reads + prefetch: waited {wait * 1e3:.1f} ms for data "
          f"vs {compute * 1e3:.0f} ms computing ({wait / max(compute, 1e-9):.2%})")


if __name__ == "__main__":
    main()
