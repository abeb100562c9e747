#!/usr/bin/env python
"""Per-worker compute rate with N ranks on one node: does a worker slow down
as more share the node, and why?

Measured on a 16-core host (2026-12-04): 490 img/s per worker at N = 1, 308
at N = 8, 226 at N = 15, one BLAS thread per rank. This runs N = 1, 2, 4, ...
processes of pure compute (the reference CNN's training step at batch 32 on
in-memory 32x32 data, no MPI, no data reading) side by side, one BLAS
thread each, and reports each worker's img/s (median over workers), so
the causes can be told apart:

  placement  none: the kernel places the processes; cores: process i
             pinned to physical core i (first hardware thread of each
             core, lscpu's CORE column); threads: to hardware thread i
             (SMT siblings shared once N passes the core count)
  prefetch   a second thread in each process normalises the next block's
             256 images while the block's 8 steps compute, as the loader's
             prefetch does (off: none)

It prints the node's layout (CPUs, cores, sockets, threads per core) and
each process's CPU set, and a table per setting: img/s per worker, the
slowdown against N = 1 and the aggregate. Memory bandwidth shows as a
slowdown that pinning does not remove; SMT as one that starts when N
passes the core count under `threads`; the prefetch as the difference
between its rows.

Usage: python benchmarks/bench_node_scaling.py [--ns 1,2,4,8,15] [--seconds 4]
       [--placements none,cores] [--prefetch off,on]
"""
import argparse
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import time


def layout():
    """[(cpu, core, socket)] from lscpu, or one core per CPU."""
    try:
        out = subprocess.run(["lscpu", "-p=CPU,CORE,SOCKET"], capture_output=True,
                             text=True, timeout=10).stdout
        rows = [tuple(int(x) for x in line.split(",")) for line in out.splitlines()
                if line and not line.startswith("#")]
        allowed = os.sched_getaffinity(0)
        rows = [r for r in rows if r[0] in allowed]
        if rows:
            return rows
    except (OSError, ValueError, subprocess.SubprocessError):
        pass
    return [(c, c, 0) for c in sorted(os.sched_getaffinity(0))]


def cpu_for(i, placement, rows):
    """The CPU process i is pinned to, or None."""
    if placement == "none":
        return None
    if placement == "threads":
        return rows[i % len(rows)][0]
    firsts = {}
    for cpu, core, sock in rows:            # the first hardware thread of each core
        firsts.setdefault((sock, core), cpu)
    cores = sorted(firsts.values())
    seconds = [c for c, _, _ in rows if c not in cores]
    order = cores + seconds                 # SMT siblings only once the cores are used
    return order[i % len(order)]


BLOCK = 256        # images a worker trains on per block (a split of 256, batch 32)


def worker(i, cpu, prefetch, seconds, start, out):
    os.environ["OMP_NUM_THREADS"] = os.environ["OPENBLAS_NUM_THREADS"] = "1"
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    import threading
    import numpy as np
    from threadpoolctl import threadpool_limits
    from ibtmpi.model import Model
    from ibtmpi.optim import SGD
    threadpool_limits(1)
    rng = np.random.default_rng(i)
    x = rng.standard_normal((32, 3, 32, 32), dtype=np.float32)
    y = rng.integers(0, 5, 32)
    model = Model("reference", (3, 32, 32), 5, seed=0)
    opt = SGD(model.params, lr=0.01, momentum=0.9)
    go, stop = threading.Event(), threading.Event()
    if prefetch:                            # what the loader's thread does per block:
        raw = rng.integers(0, 256, (BLOCK, 32, 32, 3), dtype=np.uint8)

        def fetch():                        # the next block's images, normalised NCHW
            while not stop.is_set():
                if go.wait(0.1):
                    go.clear()
                    np.ascontiguousarray(((raw.astype(np.float32) / 255.0 - 0.5) / 0.25)
                                         .transpose(0, 3, 1, 2))
        threading.Thread(target=fetch, daemon=True).start()
    for _ in range(2):
        model.loss_and_grad(x, y)
        opt.step(model.grads)
    while time.time() < start:              # all processes measure the same span
        time.sleep(0.001)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        if n % BLOCK == 0:
            go.set()                        # a block starts: fetch the next one meanwhile
        model.loss_and_grad(x, y)
        opt.step(model.grads)
        n += len(y)
    rate = n / (time.perf_counter() - t0)
    stop.set()
    out.put((i, rate, sorted(os.sched_getaffinity(0))))


def run(n, placement, prefetch, seconds, rows):
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    start = time.time() + 3.0 + 0.2 * n     # after every process has warmed up
    procs = [ctx.Process(target=worker, args=(i, cpu_for(i, placement, rows), prefetch,
                                              seconds, start, q)) for i in range(n)]
    for p in procs:
        p.start()
    got = [q.get(timeout=120 + seconds) for _ in procs]
    for p in procs:
        p.join()
    return sorted(got)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ns", default=None, help="process counts (default 1,2,4,... up to "
                    "the CPUs less one)")
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--placements", default="none,cores")
    ap.add_argument("--prefetch", default="off,on")
    ap.add_argument("--json", help="also write the results here")
    a = ap.parse_args()
    rows = layout()
    cpus, cores = len(rows), len({(s, c) for _, c, s in rows})
    sockets = len({s for _, _, s in rows})
    if a.ns:
        ns = [int(x) for x in a.ns.split(",") if x]
    else:
        ns, k = [], 1                       # 1, 2, 4, ... and the CPUs less one (the
        while k < cpus:                     # master's) and all of them
            ns.append(k)
            k *= 2
        ns += [m for m in (cpus - 1, cpus) if m > 0 and m not in ns]
    print(f"node: {cpus} CPUs usable, {cores} cores, {sockets} socket(s), "
          f"{cpus / cores:g} hardware threads per core")
    results = []
    for placement in a.placements.split(","):
        for prefetch in a.prefetch.split(","):
            print(f"\n## placement {placement}, prefetch thread {prefetch}\n")
            print("| N | img/s per worker (median) | min-max | vs N = 1 | aggregate img/s | "
                  "CPU sets |")
            print("|---|---|---|---|---|---|")
            base = None
            for n in ns:
                got = run(n, placement, prefetch == "on", a.seconds, rows)
                rates = [r for _, r, _ in got]
                med = statistics.median(rates)
                base = base or med
                sets = "; ".join(",".join(map(str, c)) if len(c) < 4 else f"{len(c)} CPUs"
                                 for _, _, c in got[:4]) + ("; ..." if n > 4 else "")
                print(f"| {n} | {med:.0f} | {min(rates):.0f}-{max(rates):.0f} | "
                      f"{med / base:.2f} | {sum(rates):.0f} | {sets} |", flush=True)
                results.append({"placement": placement, "prefetch": prefetch, "n": n,
                                "rates": rates})
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"cpus": cpus, "cores": cores, "sockets": sockets,
                       "results": results}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
