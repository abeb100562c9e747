#!/usr/bin/env python
"""How the block's Allreduce waits, side by side: the time of one float32
Allreduce of the packed buffer's size, all ranks arriving together, done
three ways in the same run:

  blocking    comm.Allreduce: the library's own algorithm; busy-polls while
              it waits for late ranks (the floor for the data movement)
  nonblocking Iallreduce, then Test with a sleep back-off (0.2 ms doubling
              to 5 ms, the master's nap): how ibtmpi waited before. The
              library moves a large message in many rounds, and a round
              advances only inside an MPI call, so every nap can stall it
  arrival+blocking  Ibarrier with the same back-off, then the blocking
              Allreduce once every rank is there (ibtmpi before 2026-12-07;
              a rank stopped inside it left the others spinning a core)
  arrival     Ibarrier with the same back-off, then an Iallreduce driven by
              back-to-back Tests, naps only past 4x the longest reduction
              seen: ibtmpi's comm.allreduce_sum

Each figure is the median over reps of the slowest rank's wall time, plus
rank 0's CPU seconds per call for the same calls. Sizes: 4 KiB, 1 MiB, the
reference CNN's packed buffer (2,191,941 parameters + the tail for 2
workers, 8.8 MB) and 32 MiB.

Usage: mpiexec -n 3 python benchmarks/bench_allreduce_wait.py [--reps 9]
"""
import argparse
import statistics
import sys
import time

import numpy as np

from ibtmpi import comm

MPI = comm.MPI           # the one module that imports mpi4py

NAP_MAX = 0.005          # the master's longest nap in the trainer


def nonblocking(w, send, recv):
    req = w.Iallreduce(send, recv, op=MPI.SUM)
    nap = 0.0002
    while not req.Test():
        time.sleep(nap)
        nap = min(nap * 2, NAP_MAX)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=9)
    a = ap.parse_args(argv)
    if MPI is None:
        raise SystemExit(f"bench_allreduce_wait.py needs MPI: {comm.MISSING}")
    w = MPI.COMM_WORLD
    comm.node_rank_size(w)        # as the trainer does at start: do ranks share cores?
    ways = {
        "blocking": lambda s, r: w.Allreduce(s, r, op=MPI.SUM),
        "nonblocking": lambda s, r: nonblocking(w, s, r),
        "arrival+blocking": lambda s, r: (comm.quiet_arrival(w, NAP_MAX),
                                          w.Allreduce(s, r, op=MPI.SUM)),
        "arrival": lambda s, r: comm.allreduce_sum(s, r, w, sleep_max=NAP_MAX, count=False),
    }
    sizes = [4096, 2 ** 20, (2191941 + 6 + 5 * 2 + 1 + 2) * 4, 32 * 2 ** 20]
    rows = []
    for nbytes in sizes:
        send = np.ones(nbytes // 4, np.float32)
        recv = np.empty_like(send)
        times = {k: [] for k in ways}
        cpus = {k: [] for k in ways}
        for rep in range(a.reps + 1):
            for name, f in ways.items():        # interleaved: noise hits all alike
                w.Barrier()
                t0, c0 = time.perf_counter(), time.process_time()
                f(send, recv)
                dt, dc = time.perf_counter() - t0, time.process_time() - c0
                assert recv[0] == w.Get_size()
                dt = w.allreduce(dt, op=MPI.MAX)
                if rep:                          # the first round warms up
                    times[name].append(dt)
                    cpus[name].append(dc)
        rows.append((nbytes, {k: (statistics.median(times[k]), statistics.median(cpus[k]))
                              for k in ways}))
    if w.Get_rank() == 0:
        lib = MPI.Get_library_version().strip().splitlines()[0][:60]
        shared = "sharing cores" if comm.cores_shared() else "a core each"
        print(f"{lib}; {w.Get_size()} ranks ({shared}); median of {a.reps}, ms (rank 0 CPU ms)")
        print("| bytes | " + " | ".join(ways) + " | nonblocking / arrival | "
              "arrival / arrival+blocking |")
        print("|---|" + "---|" * (len(ways) + 2))
        for nbytes, r in rows:
            cells = " | ".join(f"{r[k][0] * 1e3:.2f} ({r[k][1] * 1e3:.1f})" for k in ways)
            ratio = r["nonblocking"][0] / r["arrival"][0]
            new = r["arrival"][0] / r["arrival+blocking"][0]
            print(f"| {nbytes:,d} | {cells} | {ratio:.1f}x | {new:.2f}x |")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
