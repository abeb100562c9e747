#!/usr/bin/env python
"""The consensus update on the host, per block, at the reference CNN's size
(P = 2,191,941 float32): what the master (and a worker whose state is on
the host) spends between the block's Allreduce and its next step. For each
algorithm, the median ms of Consensus.update over --reps calls, with the
residuals' dot products done chunk by chunk (consensus.residual_dots, as
the trainer does) and, interleaved in the same run, over whole float64
copies of the vectors (as before); then the ratio.

On a GPU node the master's update is the critical path once the workers'
blocks take less (docs/benchmarks.md, "On a GPU").

Usage: python benchmarks/bench_consensus.py [--reps 15] [--p 2191941]
"""
import argparse
import statistics
import time

import numpy as np

from ibtmpi import consensus


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--p", type=int, default=2191941)
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    z0 = rng.standard_normal(a.p).astype(np.float32)
    S = (a.workers * z0 + rng.standard_normal(a.p)).astype(np.float32)
    chunked = consensus.residual_dots
    print(f"Consensus.update, P = {a.p:,d}, N = {a.workers}, median of {a.reps} (ms)")
    print("| algorithm | chunked residuals | whole-vector residuals | whole / chunked |")
    print("|---|---|---|---|")
    for algo in ("ma", "admm", "bmuf", "ibt", "easgd"):
        c = consensus.Consensus(algo, z0, a.workers, {"rho": 0.1})
        times = {"chunked": [], "whole": []}
        for rep in range(a.reps + 1):
            for how, f in (("chunked", chunked), ("whole", consensus._dots_whole)):
                consensus.residual_dots = f
                t0 = time.perf_counter()
                c.update(S, 1.0)
                if rep:
                    times[how].append(time.perf_counter() - t0)
        consensus.residual_dots = chunked
        ch, wh = (statistics.median(times[k]) * 1e3 for k in ("chunked", "whole"))
        print(f"| {algo} | {ch:.1f} | {wh:.1f} | {wh / ch:.2f}x |")


if __name__ == "__main__":
    main()
