#!/usr/bin/env python
"""Time to accuracy for N = 1, 2, 4, 8: how long each of ssgd, admm, bmuf
and ibt trains until its validation accuracy first reaches 99% of the
N = 1 run's final one (ibtmpi/tta.py), with one recipe for every run.

  N = 1   sgd, one process: measured (defines the target);
  N = 2   each algorithm under `mpiexec -n 3` (master + 2 workers) on this
          machine: measured, honest block walls (metrics.jsonl wall_s);
  N = 2   across the nodes of a simulated cluster (--net: the run
          directories and ab.json that `tests/multinode/run.sh --keep DIR`
          leaves): measured;
  N = 4, 8  passes to the target from `--simulate N` (the accuracy does not
          depend on timing), seconds modelled: the run's blocks x the
          scaling model's block time (tta.model_block: the N = 2 run's
          seconds per sample and master work per block, and the Allreduce
          at the alpha/beta of --net's ab.json, else measured here with
          benchmarks/allreduce_alpha_beta.py under mpiexec -n 3).

Each run's directory gets `timing.json` where it is not timed by its own
walls, and `ibtmpi bench report` (run at the end) writes the T7 table and
t7_time_to_accuracy.png. Runs already done with the same command are kept.

Usage:
  ibtmpi prep synth DATA --n 4000 --size 32 --shards 2
  python benchmarks/time_to_accuracy.py --data DATA --out OUT [--net DIR --net-label L]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

from ibtmpi import bench, launcher, tta

ALGOS = ("ssgd", "admm", "bmuf", "ibt")


def settings(a, n, n_train):
    """The recipe's --set list for N workers: evaluations a.evals times a
    pass (every k blocks, k from the blocks a pass has at this N); N > 1
    trains a.n_passes (a longer budget, the same schedule over it)."""
    per_pass = max(1, n_train // (n * a.split))
    return [f"run.passes={a.passes if n == 1 else a.n_passes or a.passes}", f"data.batch={a.batch}", f"data.split_size={a.split}",
            f"optim.schedule={a.schedule}", f"run.eval_every={max(1, per_pass // a.evals)}",
            *a.set]


def alpha_beta(a, log):
    """(alpha, beta, label): --net's ab.json, else measured here."""
    path = os.path.join(a.net, "ab.json") if a.net else os.path.join(a.out, "ab-local.json")
    if not a.net and not os.path.isfile(path):
        here = os.path.dirname(os.path.abspath(__file__))
        cmd = launcher.command(3) + ["-n", "3", sys.executable,
                                     os.path.join(here, "allreduce_alpha_beta.py"),
                                     "--json", path]
        log("alpha/beta: " + " ".join(cmd))
        subprocess.run(cmd, check=True, capture_output=True)
    ab = json.load(open(path))
    where = a.net_label if a.net else "this node (shared memory)"
    return ab["alpha_s"], ab["beta_s_per_byte"], f"{where}, alpha/beta of {ab['p']} ranks"


def network_runs(a):
    """Copy --net's cmp-ALGO run directories in as net-ALGO-2, labelled."""
    out = []
    for algo in a.algos:
        src = os.path.join(a.net, f"cmp-{algo}")
        if not os.path.isfile(os.path.join(src, "summary.json")):
            continue
        d = os.path.join(a.out, f"net-{algo}-2")
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(src, d)
        n = json.load(open(os.path.join(d, "summary.json")))["N"]
        with open(os.path.join(d, tta.TIMING), "w") as f:
            json.dump({"how": f"measured: MPI across {n + 1} nodes, {a.net_label}"}, f)
        out.append(d)
    return out


def model(a, sims, log):
    """timing.json of every simulated run: its blocks x the model's block."""
    alpha, beta, where = alpha_beta(a, log)
    for d, algo, n in sims:
        ref_dir = os.path.join(a.out, f"net-{algo}-2" if a.net else f"t1-{algo}-2")
        ref = bench.load_run(ref_dir)
        if ref is None or ref["diverged"]:
            log(f"  {os.path.basename(d)}: no finished {ref_dir} to model from")
            continue
        block, inputs = tta.model_block(ref, n, alpha, beta)
        err = tta.model_error(ref, alpha, beta)
        how = (f"modelled: passes from --simulate {n}; {block * 1e3:.0f} ms a block from "
               f"{ref['name']}'s compute, Allreduce at {where} (model {err:+.0%} on "
               f"{ref['name']})")
        with open(os.path.join(d, tta.TIMING), "w") as f:
            json.dump({"how": how, "block_s": block, "inputs": inputs,
                       "model_error_on_ref": err}, f, indent=1)
        log(f"  {os.path.basename(d)}: {how}")


def finished(out):
    """The run directories in out with a summary.json (not the cluster's
    copies, which network_runs makes again)."""
    return [os.path.join(out, d) for d in sorted(os.listdir(out))
            if not d.startswith("net-") and os.path.isfile(os.path.join(out, d, "summary.json"))]


def simulated(dirs, ns):
    """(dir, algorithm, N) of the simulated runs among dirs with N in ns."""
    out = []
    for d in dirs:
        if not os.path.isfile(os.path.join(d, "summary.json")):
            continue                                   # diverged
        s = json.load(open(os.path.join(d, "summary.json")))
        if s.get("simulated") and s["N"] in ns:
            out.append((d, s["algorithm"], s["N"]))
    return out


def ints(text):
    return [int(x) for x in text.split(",") if x]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--algos", type=lambda s: s.split(","), default=list(ALGOS))
    ap.add_argument("--passes", type=float, default=10)
    ap.add_argument("--split", type=int, default=32)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--n-passes", type=float, default=0,
                    help="passes of the N > 1 runs (default: --passes)")
    ap.add_argument("--base", help="an N = 1 run of this recipe to take the target from "
                    "instead of running one (e.g. OUT/t1-sgd-1 of another --out)")
    ap.add_argument("--schedule", default="cosine")
    ap.add_argument("--evals", type=int, default=4, help="evaluations per pass (default 4)")
    ap.add_argument("--mpi-ns", type=ints, default=[2])
    ap.add_argument("--model-ns", type=ints, default=[4, 8], help="'' for none")
    ap.add_argument("--net", help="tests/multinode/run.sh --keep DIR of the same recipe")
    ap.add_argument("--net-label", default="simulated cluster")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    ap.add_argument("--fresh", action="store_true")
    ap.add_argument("--report-only", action="store_true",
                    help="run nothing: model and report the finished runs OUT holds "
                    "(the set's and any other run directory of the same recipe)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    n_train = json.load(open(os.path.join(a.data, "dataset.json")))["splits"]["train"]["n"]
    jobs = [] if a.base else [("t1-sgd-1", "sgd", 1, False)]
    jobs += [(f"t1-{algo}-{n}", algo, n, True) for n in a.mpi_ns for algo in a.algos]
    jobs += [(f"t1-{algo}-{n}", algo, n, False) for n in a.model_ns for algo in a.algos]
    sets = " ".join(f"--set {x}" for x in settings(a, 2, n_train))
    print(f"the network case (root; not beside other runs): SLURM_PART=0 bash "
          f"tests/multinode/run.sh --nodes 3 --rate 1gbit --algos {','.join(a.algos)} "
          f"--data {a.data} {sets} --keep DIR; then --net DIR", flush=True)
    dirs, failed = [a.base] if a.base else [], []
    if a.report_only:
        dirs += finished(a.out)
        jobs = []
    for name, algo, n, mpi in jobs:
        if bench.run_one(a.out, name, a.data, algo, n, settings(a, n, n_train), mpi,
                         fresh=a.fresh):
            dirs.append(os.path.join(a.out, name))
        else:
            failed.append(name)
    if a.net:
        dirs += network_runs(a)
    model(a, simulated(dirs, a.model_ns), print)
    text, _ = bench.report(dirs, os.path.join(a.out, "report"))
    print(text[text.index("## T7"):].split("\n## ")[0] if "## T7" in text else text)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
