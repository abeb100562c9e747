#!/usr/bin/env python
"""The consensus update on the host, per block, at the reference CNN's size
(P = 2,191,941 float32): what the master spends between the block's
Allreduce and its next wait (with GPU workers, the block's critical path:
docs/benchmarks.md, "On a GPU"). For each algorithm, the median ms of
its update over --reps calls, three ways interleaved in one run:

  whole      every op over the whole vectors, the residuals' dot products
             over whole float64 copies (how the update ran before, and how
             it still runs on a GPU worker's device arrays)
  chunked    every op of the update on one 64K-element chunk while it is in
             cache, chunk after chunk (1 thread)
  threads    the same chunks shared over --threads threads (default: this
             process's usable cores; the trainer uses run.threads)

  gpu        (--gpu) the same update on CuPy arrays, as a GPU worker's and,
             under run.master_device, a master's of its own on its GPU
             (whole vectors, synchronized after each call)

Usage: python benchmarks/bench_consensus.py [--reps 15] [--p 2191941] [--threads T] [--gpu]
"""
import argparse
import os
import statistics
import time

import numpy as np

from ibtmpi import consensus


class Whole(np.ndarray):
    """A host array that update() treats as a device array: the whole-vector
    path."""


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--p", type=int, default=2191941)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--gpu", action="store_true",
                    help="also time the update on the GPU (CuPy)")
    a = ap.parse_args(argv)
    g = None
    if a.gpu:                       # CuPy through the backend, its only importer
        from ibtmpi.backend import GpuOps
        g = GpuOps()
    rng = np.random.default_rng(0)
    z0 = rng.standard_normal(a.p).astype(np.float32)
    S = (a.workers * z0 + rng.standard_normal(a.p)).astype(np.float32)
    print(f"the consensus update, P = {a.p:,d}, N = {a.workers}, median of {a.reps} (ms)")
    gpu_col = " gpu |" if g is not None else ""
    print(f"| algorithm | whole | chunked | chunked, {a.threads} threads | whole / threads "
          f"|{gpu_col}")
    print("|---|---|---|---|---|" + ("---|" if g is not None else ""))
    for algo in ("ma", "admm", "bmuf", "ibt", "easgd"):
        ways = {"whole": consensus.make_consensus(algo, z0.view(Whole), a.workers, {"rho": 0.1}),
                "chunked": consensus.make_consensus(algo, z0, a.workers, {"rho": 0.1}),
                "threads": consensus.make_consensus(algo, z0, a.workers, {"rho": 0.1},
                                               threads=a.threads)}
        if g is not None:
            ways["gpu"] = consensus.make_consensus(algo, g.asarray(z0), a.workers, {"rho": 0.1},
                                              to_host=g.asnumpy)
        sums = {how: S if how != "gpu" else g.asarray(S) for how in ways}
        times = {k: [] for k in ways}
        for rep in range(a.reps + 1):
            for how, c in ways.items():
                t0 = time.perf_counter()
                c.update(sums[how], 1.0)
                if how == "gpu":
                    g.synchronize()
                if rep:
                    times[how].append(time.perf_counter() - t0)
        zs = [(g.asnumpy(c.z) if how == "gpu" else np.asarray(c.z)).tobytes()
              for how, c in ways.items()]
        assert len(set(zs)) == 1, f"{algo}: z differs between the ways"
        m = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        print(f"| {algo} | {m['whole']:.1f} | {m['chunked']:.1f} | {m['threads']:.1f} "
              f"| {m['whole'] / m['threads']:.2f}x |"
              + (f" {m['gpu']:.2f} |" if "gpu" in m else ""))


if __name__ == "__main__":
    main()
