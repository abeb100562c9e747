#!/usr/bin/env python
"""Speedup in time per data pass vs N: measured here, modelled beyond.

Model (one block = every worker trains its split while the master does its
own work for the previous block, then ONE Allreduce of the packed buffer of
P floats among N+1 ranks, then the replicated consensus update):

    T_block(N) = max(split(N) * t_sample + u_worker, t_master + u_master)
                 + T_ar(N + 1, 4P bytes)
    T_pass(N)  = blocks(N) * T_block(N)
    T_ar(p, n) = 2*ceil(log2 p)*alpha + 2*(p-1)/p * n * beta      (Rabenseifner)

The master is a stage of the block pipeline: every rank applies the
consensus update after the Allreduce (u_worker on a worker: its GPU's when
it has one; u_master on the master: its host's unless it has a GPU), and
the master's update and its other work between two Allreduces (evaluation
batches, checkpoint, metrics: t_master) run while the workers compute the
next block, so only what exceeds their compute delays the block; the
printed bottleneck says which stage decides each projection.

t_sample: the training time per sample, from a run's own metrics where a
run is given (--runs for the validation, --gpu-run for the GPU scenario:
compute_max_s over the samples a worker trains per block, median over the
blocks), else measured here (CPU) or stated (--gpu-ms). t_master: the
master's median busy time per block of those runs less its update
(metrics master_busy_s), 0 where none is given. alpha, beta: fitted
to an Allreduce sweep measured on this machine (`mpiexec -n 2` and `-n 3`),
and stated for clusters (100 Gb/s InfiniBand, NVLink). The model is
validated against the real MPI runs it can be compared with (time per pass
of finished runs given with --runs), printing the error. In the paper's
fixed-block setting the block is fixed and split = block / N, so compute
per block shrinks as 1/N while the Allreduce grows slowly with N.

Usage:
  mpiexec -n 3 python benchmarks/bench_scaling.py sweep --out runs/scaling/ar.json
  python benchmarks/bench_scaling.py model --sweep runs/scaling/ar.json \\
      [--runs runs/bench/t1-*] [--image-size 64]
"""
import argparse
import glob
import json
import math
import os
import statistics
import sys
import time

import numpy as np

from ibtmpi.scaling import (CLUSTERS, block_stages, block_time, bottleneck, pass_time,
                            run_inputs, t_ar, update_seconds)

def cmd_sweep(a):
    from ibtmpi import comm
    res = comm.allreduce_sweep([2 ** k for k in range(8, 26, 2)], a.reps)   # 256 B .. 32 MiB
    if comm.world_rank() == 0:
        out = {"ranks": comm.world_size(), "mpi": comm.library_version(), "points": res}
        os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
        prev = json.load(open(a.out)) if os.path.exists(a.out) else {"sweeps": []}
        prev["sweeps"] = [s for s in prev["sweeps"] if s["ranks"] != out["ranks"]] + [out]
        json.dump(prev, open(a.out, "w"), indent=1)
        for p in res:
            print(f"p={out['ranks']} {p['bytes']:>10d} B  {p['seconds'] * 1e6:10.1f} us")


def fit(sweeps):
    """Least-squares alpha, beta over every measured (p, bytes, seconds)."""
    rows, ys = [], []
    for s in sweeps:
        p = s["ranks"]
        for pt in s["points"]:
            rows.append([2 * math.ceil(math.log2(p)), 2 * (p - 1) / p * pt["bytes"]])
            ys.append(pt["seconds"])
    A, y = np.array(rows), np.array(ys)
    # relative least squares (weights 1/y): small messages count as much as big
    w = 1 / y
    (alpha, beta), *_ = np.linalg.lstsq(A * w[:, None], y * w, rcond=None)
    pred = A @ [alpha, beta]
    return float(alpha), float(beta), float(np.median(np.abs(pred - y) / y))


def t_sample_cpu(size, batch=64, steps=6, threads=1):
    from threadpoolctl import threadpool_limits
    from ibtmpi.model import Model
    from ibtmpi.optim import SGD
    threadpool_limits(threads)
    m = Model("reference", (3, size, size), 5)
    opt = SGD(m.params, lr=1e-4)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, 3, size, size), dtype=np.float32)
    y = rng.integers(0, 5, batch)
    ts = []
    for i in range(steps + 2):
        t0 = time.perf_counter()
        m.loss_and_grad(x, y)
        opt.step(m.grads)
        if i >= 2:
            ts.append(time.perf_counter() - t0)
    return statistics.median(ts) / batch, m.size


def cmd_model(a):
    sw = json.load(open(a.sweep))["sweeps"]
    alpha, beta, ferr = fit(sw)
    print(f"Allreduce fit on this machine ({', '.join(str(s['ranks']) for s in sw)} ranks, "
          f"{sw[0]['mpi']}): alpha = {alpha * 1e6:.1f} us, beta = {1 / beta / 1e9:.2f} GB/s, "
          f"median fit error {ferr:.0%}")
    t_s, P = t_sample_cpu(a.image_size)
    t_upd = update_seconds(P)
    print(f"consensus update (ibt) of P floats: {t_upd * 1e3:.1f} ms on this CPU")
    print(f"reference CNN {a.image_size}x{a.image_size}: {t_s * 1e3:.2f} ms/sample on 1 CPU "
          f"core, P = {P:,d} parameters ({4 * P / 2**20:.1f} MiB per Allreduce)")
    # validation against real runs (their own image size and P)
    if a.runs:
        print("\nvalidation against finished runs (wall time per pass):")
        print("| run | N | measured s/pass | modelled s/pass | error | bottleneck |\n"
              "|---|---|---|---|---|---|")
        errs = []
        for d in sorted(set(x for pat in a.runs for x in glob.glob(pat))):
            sp, cp = os.path.join(d, "summary.json"), os.path.join(d, "config.toml")
            if not (os.path.exists(sp) and os.path.exists(cp)):
                continue
            s = json.load(open(sp))
            if s.get("simulated") or s.get("diverged"):
                continue
            from ibtmpi.config import load
            from ibtmpi.dataset import Dataset
            cfg = load(cp)
            ds = Dataset(cfg["data"]["path"])
            h = ds.image_shape[0]
            ranks = s["world_size"]
            _, P_run = t_sample_cpu(h, steps=1)
            n_train = ds.split("train").n
            split = cfg["data"]["split_size"] or cfg["data"]["block_size"] // s["N"]
            lines = [json.loads(l) for l in open(os.path.join(d, "metrics.jsonl"))]
            meas = (sum(s["pass_s"]) if s.get("pass_s")          # honest pass times
                    else sum(l["wall_s"] for l in lines)) / s["passes"]
            # measured inputs: the run's own time per sample (cores shared
            # as they were) and its master's own work per block
            ts_run, busy, serial = run_inputs(lines, s["N"])
            upd_run = update_seconds(P_run) if s["N"] > 1 else 0.0
            if s["algorithm"] == "ssgd":   # one Allreduce per minibatch, not per block
                batch = cfg["data"]["batch"]
                steps = n_train // s["N"] // batch
                mod = steps * (batch * ts_run + t_ar(ranks, 4 * P_run, alpha, beta))
                neck = "allreduce per step"
            else:
                per_worker = n_train // s["N"]
                blocks = max(1, per_worker // split)
                # the master's busy time holds its update already
                st = block_stages(s["N"], per_worker / blocks, ts_run, P_run, alpha, beta,
                                  upd_run, busy, 0.0)
                if serial:                   # one process: its own work follows its compute
                    st["compute"], st["master"] = st["compute"] + st["master"], 0.0
                mod, neck = blocks * block_time(st), bottleneck(st)
            errs.append(abs(mod - meas) / meas)
            print(f"| {os.path.basename(d)} | {s['N']} | {meas:.2f} | {mod:.2f} | "
                  f"{(mod - meas) / meas:+.0%} | {neck} |")
        if errs:
            print(f"median |error| {statistics.median(errs):.0%}")
    # projections: paper setting, 20,000 training images, fixed block 4,960
    n_train, block = 20000, 4960
    gpu_ms, gpu_master, gpu_src = a.gpu_ms / 1e3, a.master_ms / 1e3, "stated"
    if a.gpu_run:                            # a real GPU run's own figures
        s = json.load(open(os.path.join(a.gpu_run, "summary.json")))
        lines = [json.loads(l) for l in open(os.path.join(a.gpu_run, "metrics.jsonl"))]
        ts_g, busy_g, _ = run_inputs(lines, s["N"])
        gpu_ms, gpu_master, gpu_src = ts_g, busy_g, f"measured in {a.gpu_run}"
    # (name, alpha, beta, seconds per sample, a worker's update, the master's
    # other work, the master's update)
    u_gpu = 16 * P / 1e12     # a few vector kernels: ~4 passes over 4P bytes at 1 TB/s
    scen = [("this machine's Allreduce, CPU compute", alpha, beta, t_s, t_upd, 0.0, t_upd)]
    for k, c in CLUSTERS.items():
        scen.append((f"{c['what']}, CPU compute", c["alpha"], c["beta"], t_s, t_upd, 0.0,
                     t_upd))
        # a GPU worker updates on its GPU; the master's update is its host's
        # (t_upd, measured here) unless the master has a GPU too
        scen.append((f"{c['what']}, GPU compute {gpu_ms * 1e3:.3g} ms/sample ({gpu_src}), "
                     f"master on the host", c["alpha"], c["beta"], gpu_ms, u_gpu,
                     gpu_master, t_upd))
        scen.append((f"{c['what']}, GPU compute ({gpu_src}), master on a GPU",
                     c["alpha"], c["beta"], gpu_ms, u_gpu, gpu_master, u_gpu))
    ns = [1, 2, 4, 8, 16, 32, 64, 128, 256]
    print(f"\nprojected speedup in time per pass, fixed block {block} (split = block/N), "
          f"{n_train} training images, P = {P:,d}:")
    print("| scenario | " + " | ".join(f"N={n}" for n in ns) + " | bottleneck at N=32 |")
    print("|---|" + "---|" * (len(ns) + 1))
    for name, al, be, ts, uw, tm, um in scen:
        base = n_train * ts                  # one worker, no Allreduce at all
        cells = []
        for n in ns:
            sp_ = (base / pass_time(n_train, n, block // n, ts, P, al, be, uw, tm, um)
                   if n > 1 else 1.0)
            cells.append(f"{sp_:.1f}x")
        st = block_stages(32, block // 32, ts, P, al, be, uw, tm, um)
        print(f"| {name} | " + " | ".join(cells) + f" | {bottleneck(st)} ("
              f"compute {st['compute'] * 1e3:.1f} ms, master {st['master'] * 1e3:.1f} ms, "
              f"Allreduce {st['allreduce'] * 1e3:.2f} ms) |")
    print("\ntarget: >= 30x at 32 workers (paper: > 28x on 32 GPUs)")


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("sweep")
    p.add_argument("--out", default="runs/scaling/allreduce.json")
    p.add_argument("--reps", type=int, default=7)
    p = sub.add_parser("model")
    p.add_argument("--sweep", default="runs/scaling/allreduce.json")
    p.add_argument("--runs", nargs="*")
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--gpu-ms", type=float, default=0.1,
                   help="stated GPU training time per sample (ms) for the GPU scenario "
                        "(0.1: the trainer on an H200, 2026-12-04) unless --gpu-run")
    p.add_argument("--master-ms", type=float, default=0.0,
                   help="stated master's own work per block (ms) for the GPU scenario")
    p.add_argument("--gpu-run", help="a finished GPU run: its time per sample and its "
                   "master's work per block feed the GPU scenarios")
    a = ap.parse_args()
    return cmd_sweep(a) if a.cmd == "sweep" else cmd_model(a)


if __name__ == "__main__":
    sys.exit(main())
