#!/usr/bin/env python
"""Accuracy and communication of every algorithm vs the number of workers.

T1: test accuracy after the same number of passes for N in --ns, every
    algorithm (sgd only at N = 1), on a synthetic set; real MPI
    (`mpiexec -n N+1`) for N <= --mpi-max, simulation (`--simulate N`,
    which the tests show equals the MPI run to 1e-6) beyond.
T2: the paper's fixed-block experiment by simulation: block size fixed,
    N in --fixed-ns with split = block / N, admm vs ibt vs N = 1 (sgd).
T3: Allreduce calls and bytes per pass per algorithm; rank 0 CPU share and
    mean per-block compute vs communication seconds of the MPI runs.

Each run is a subprocess of the installed CLI; results go to --out as
JSON and markdown.
Usage: python benchmarks/bench_algorithms.py [--n 10000 --size 32 --passes 3]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

ALGOS = ["sgd", "ssgd", "ma", "admm", "bmuf", "ibt", "easgd"]


def run(args, name, algo, n, sets, mpi):
    run_dir = os.path.join(args.work, name)
    shutil.rmtree(run_dir, ignore_errors=True)
    base = [sys.executable, "-m", "ibtmpi", "train", "--quiet",
            "--set", f"data.path={args.data}", "--set", f"algorithm.name={algo}",
            "--set", f"run.passes={args.passes}", "--set", f"run.dir={run_dir}",
            "--set", f"data.batch={args.batch}"] + [x for s in sets for x in ("--set", s)]
    if mpi and n > 1:
        mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
        cmd = [mpiexec, "-n", str(n + 1)] + base
    elif n > 1:
        cmd = base + ["--simulate", str(n)]
    else:
        cmd = base
    t0 = time.time()
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode == 4:                 # diverged: a result, not a crash
        msg = next((l for l in out.stdout.splitlines() if "diverged" in l), "diverged")
        print(f"  {name}: DIVERGED ({msg})", flush=True)
        return {"diverged": True, "message": msg, "test_acc": float("nan"),
                "mode": "mpi" if (mpi and n > 1) else "sim", "passes": args.passes}
    if out.returncode:
        print(out.stdout + out.stderr, file=sys.stderr)
        raise SystemExit(f"run {name} failed")
    s = json.load(open(os.path.join(run_dir, "summary.json")))
    lines = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))]
    s["compute_mean_s"] = sum(l["compute_max_s"] for l in lines) / len(lines)
    s["comm_mean_s"] = sum(l["comm_s"] for l in lines) / len(lines)
    s["wall_block_s"] = sum(l["wall_s"] for l in lines) / len(lines)
    s["mode"] = "mpi" if (mpi and n > 1) else ("sim" if n > 1 else "1 proc")
    s["elapsed_s"] = time.time() - t0
    print(f"  {name}: test acc {s['test_acc']:.4f} ({s['mode']}, {s['elapsed_s']:.0f} s)",
          flush=True)
    return s


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="data/bench32")
    ap.add_argument("--n", type=int, default=10000)
    ap.add_argument("--size", type=int, default=32)
    ap.add_argument("--passes", type=float, default=3)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--split", type=int, default=256)
    ap.add_argument("--ns", default="1,2,4,8")
    ap.add_argument("--mpi-max", type=int, default=2)
    ap.add_argument("--algos", default=",".join(ALGOS))
    ap.add_argument("--fixed-block", type=int, default=1240)
    ap.add_argument("--fixed-ns", default="10,20,40")
    ap.add_argument("--work", default="runs/bench")
    ap.add_argument("--out", default="runs/bench/algorithms")
    a = ap.parse_args()
    if not os.path.exists(a.data):
        from ibtmpi.data_prep.prep import prep_synth
        prep_synth(a.data, n=a.n, size=a.size, shards=2, quiet=True)
    os.makedirs(a.work, exist_ok=True)
    res = {"t1": {}, "t2": {}, "config": vars(a)}
    ns = [int(x) for x in a.ns.split(",")]
    algos = a.algos.split(",")
    print("T1: accuracy vs N", flush=True)
    for algo in algos:
        for n in ns:
            if (algo == "sgd") != (n == 1):
                continue
            res["t1"][f"{algo}/{n}"] = run(a, f"t1-{algo}-{n}", algo, n,
                                           [f"data.split_size={a.split}"], n <= a.mpi_max)
    print("T2: fixed block", flush=True)
    fns = [int(x) for x in a.fixed_ns.split(",")]
    res["t2"]["sgd/1"] = run(a, "t2-sgd-1", "sgd", 1, [f"data.block_size={a.fixed_block}"], False)
    for algo in ("admm", "ibt"):
        for n in fns:
            res["t2"][f"{algo}/{n}"] = run(a, f"t2-{algo}-{n}", algo, n,
                                           [f"data.block_size={a.fixed_block}"], False)
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out + ".json", "w") as f:
        json.dump(res, f, indent=1)
    md = report(res, ns, algos, fns, a)
    with open(a.out + ".md", "w") as f:
        f.write(md)
    print("\n" + md)


def report(res, ns, algos, fns, a):
    t1 = res["t1"]
    out = [f"### T1: test accuracy after {a.passes:g} passes ({a.data}, split {a.split}, "
           f"batch {a.batch}; MPI for N <= {a.mpi_max}, simulation beyond)", "",
           "| algorithm | " + " | ".join(f"N={n}" for n in ns) + " |",
           "|---|" + "---|" * len(ns)]
    for algo in algos:
        cells = []
        for n in ns:
            s = t1.get(f"{algo}/{n}")
            cells.append("-" if not s else ("diverged" if s.get("diverged")
                                             else f"{s['test_acc']:.4f}"))
        out.append(f"| {algo} | " + " | ".join(cells) + " |")
    out += ["", f"### T2: fixed block of {a.fixed_block} samples, split = block / N "
            f"(simulation)", "", "| algorithm | " + " | ".join(
                f"N={n} ({a.fixed_block // n}/split)" for n in fns) + " |",
            "|---|" + "---|" * len(fns)]
    for algo in ("admm", "ibt"):
        out.append(f"| {algo} | " + " | ".join(
            "diverged" if res["t2"][f"{algo}/{n}"].get("diverged")
            else f"{res['t2'][f'{algo}/{n}']['test_acc']:.4f}" for n in fns) + " |")
    out.append(f"| sgd, N=1 | {res['t2']['sgd/1']['test_acc']:.4f} (all columns) |" +
               " |" * (len(fns) - 1))
    out += ["", "### T3: communication per pass and rank 0 CPU", "",
            "| run | mode | Allreduce calls / pass | MiB / pass (per rank) | rank 0 CPU "
            "(total / outside eval) | compute s / block | comm+imbalance s / block |",
            "|---|---|---|---|---|---|---|"]
    for key, s in t1.items():
        if s.get("diverged"):
            out.append(f"| {key} | {s['mode']} | diverged | | | | |")
            continue
        p = s["passes"]
        if s["mode"] == "sim":       # one process computes every worker
            out.append(f"| {key} | sim | {s['allreduce_calls'] / p:.0f} | "
                       f"{s['allreduce_bytes'] / p / 2**20:.1f} | n/a (simulated) | "
                       f"{s['compute_mean_s']:.3f} | n/a |")
            continue
        out.append(f"| {key} | {s['mode']} | {s['allreduce_calls'] / p:.0f} | "
                   f"{s['allreduce_bytes'] / p / 2**20:.1f} | "
                   f"{s['rank0_cpu_share']:.1%} / {s.get('rank0_other_cpu_share', 0):.1%} | "
                   f"{s['compute_mean_s']:.3f} | {s['comm_mean_s']:.3f} |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    main()
