#!/usr/bin/env python
"""Measure the Allreduce's alpha and beta on the network the ranks are on:
the median time (slowest rank, all ranks arriving together after a
barrier) of a float32 Allreduce at sizes from 4 KiB to 4 MiB, fitted by
least squares to the scaling model's formula (ibtmpi/scaling.py t_ar):

    t(n bytes, p ranks) = 2 ceil(log2 p) alpha + 2 (p - 1) / p n beta

Prints one line per size and the fit, and with --json writes
{"p", "alpha_s", "beta_s_per_byte", "sizes": [[bytes, seconds], ...],
"fit_error": median relative error of the fit}. tests/multinode/run.sh
runs it across the simulated nodes at each link cap.

Usage: mpiexec -n P python benchmarks/allreduce_alpha_beta.py [--reps 7] [--json OUT]
"""
import argparse
import json
import math
import statistics
import time

import numpy as np

from ibtmpi import comm

SIZES = (4 << 10, 64 << 10, 512 << 10, 1 << 20, 4 << 20)


def fit(p, points):
    """(alpha, beta) minimising the squared error of t_ar over points
    [(bytes, seconds)], both >= 0; and the fit's median relative error."""
    a_col = 2 * math.ceil(math.log2(p))
    rows = np.array([[a_col, 2 * (p - 1) / p * n] for n, _ in points], np.float64)
    t = np.array([s for _, s in points], np.float64)
    (alpha, beta), *_ = np.linalg.lstsq(rows, t, rcond=None)
    alpha, beta = max(alpha, 0.0), max(beta, 0.0)
    err = statistics.median(abs(rows[i] @ (alpha, beta) - t[i]) / t[i] for i in range(len(t)))
    return alpha, beta, err


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--json")
    a = ap.parse_args()
    w = comm.world()                 # the one module that imports mpi4py
    p, rank = w.Get_size(), w.Get_rank()
    points = []
    for nbytes in SIZES:
        send = np.ones(nbytes // 4, np.float32)
        recv = np.empty_like(send)
        times = []
        for _ in range(a.reps + 1):
            w.Barrier()
            t0 = time.perf_counter()
            w.Allreduce(send, recv)                                     # a sum
            dt = max(w.allgather(time.perf_counter() - t0))             # the slowest rank
            times.append(dt)
        sec = statistics.median(times[1:])                            # the first warms up
        points.append((nbytes, sec))
        if rank == 0:
            print(f"allreduce {nbytes / 1024:8.0f} KiB on {p} ranks: {sec * 1e3:9.3f} ms",
                  flush=True)
    if rank == 0:
        alpha, beta, err = fit(p, points)
        print(f"fit: alpha {alpha * 1e6:.1f} us, beta {beta * 1e9:.3f} ns/byte "
              f"({8 / beta / 1e9 if beta else float('inf'):.2f} Gbit/s effective), "
              f"median fit error {err:.0%}")
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"p": p, "alpha_s": alpha, "beta_s_per_byte": beta,
                           "sizes": points, "fit_error": err}, f, indent=1)


if __name__ == "__main__":
    main()
