#!/usr/bin/env python
"""Speed of this tree against an older commit, side by side: step and block overhead.

A refactor must not slow the hot paths. This measures two of them with the
working tree's ibtmpi and with the ibtmpi of COMMIT (checked out with
`git worktree add --detach` into a temporary directory, removed at the end),
alternating the two sides repetition by repetition so that the machine's
noise hits both alike:

  step      one training step of the reference CNN (forward, backward,
            SGD-momentum update) at batch 64 on 32x32x3 inputs, 1 BLAS
            thread: images/s over --steps steps after 3 warm-up steps
  block     a real `mpiexec -n 3` run (master + 2 workers) of the tiny
            model with one minibatch per split, so a block is almost all
            overhead (packet, Allreduce, consensus update, metrics): the
            median of the blocks' wall_s in metrics.jsonl, and the whole
            command's wall time

It prints the median of each side and the median of the per-repetition
ratios current/old (step: >1 is faster; block: <1 is faster) with their
min-max range. Usage:

  python benchmarks/bench_vs_commit.py --against 7c6fd14 [--reps 5]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
from worktree import Checkout  # noqa: E402  (tools/worktree.py, as regression_z's)

STEP = r"""
import json, time, numpy as np
from threadpoolctl import threadpool_limits
from ibtmpi.model import Model
from ibtmpi.optim import SGD
threadpool_limits(1)
rng = np.random.default_rng(0)
x = rng.standard_normal((64, 3, 32, 32), dtype=np.float32)
y = rng.integers(0, 5, 64)
m = Model("reference", (3, 32, 32), 5, seed=0)
opt = SGD(m.params, lr=0.01, momentum=0.9, weight_decay=5e-4)
def step():
    m.loss_and_grad(x, y)
    opt.step(m.grads)
for _ in range(3):
    step()
t0 = time.perf_counter()
for _ in range(STEPS):
    step()
print(json.dumps({"img_s": 64 * STEPS / (time.perf_counter() - t0)}))
"""


def env_for(tree):
    env = dict(os.environ, PYTHONPATH=tree, OMP_NUM_THREADS="1",
               OPENBLAS_NUM_THREADS="1")
    return env


def step_rate(tree, steps):
    out = subprocess.run([sys.executable, "-c", STEP.replace("STEPS", str(steps))],
                         env=env_for(tree), cwd=tree, check=True, capture_output=True,
                         text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["img_s"]


def block_time(tree, data, run_dir):
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    cmd = [mpiexec, "-n", "3", sys.executable, "-m", "ibtmpi", "train",
           "--set", f"data.path={data}", "--set", "data.split_size=8",
           "--set", "data.batch=8", "--set", "model.layers=tiny",
           "--set", "run.passes=2", "--set", "run.threads=1",
           "--set", "run.quiet=true", "--set", "run.progress_s=0",
           "--set", f"run.dir={run_dir}"]
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env_for(tree), cwd=tree, check=True, capture_output=True)
    total = time.perf_counter() - t0
    walls = [json.loads(l)["wall_s"] for l in open(os.path.join(run_dir, "metrics.jsonl"))]
    return statistics.median(walls), total, len(walls)


def summary(name, cur, old, higher_is_better):
    ratios = [c / o for c, o in zip(cur, old)]
    better = "higher" if higher_is_better else "lower"
    print(f"{name:26s} current {statistics.median(cur):10.4g}   old {statistics.median(old):10.4g}"
          f"   ratio {statistics.median(ratios):.3f} (range {min(ratios):.3f}-"
          f"{max(ratios):.3f}; {better} is better)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--against", required=True, metavar="COMMIT")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="bench_vs_commit-")
    checkout = Checkout(ROOT, a.against, os.path.join(tmp, "old-tree"))
    old_tree = checkout.path
    try:
        checkout.add()
        data = os.path.join(tmp, "data")
        subprocess.run([sys.executable, "-m", "ibtmpi", "prep", "synth", data, "--n", "600",
                        "--size", "16", "--shards", "2", "--quiet"], env=env_for(ROOT),
                       check=True, capture_output=True)
        res = {k: ([], []) for k in ("step", "block", "total")}
        for rep in range(a.reps):
            for side, tree in enumerate((ROOT, old_tree)):
                res["step"][side].append(step_rate(tree, a.steps))
                med, total, n = block_time(tree, data, os.path.join(tmp, f"run-{side}-{rep}"))
                res["block"][side].append(med)
                res["total"][side].append(total)
            print(f"rep {rep + 1}/{a.reps}: step img/s {res['step'][0][-1]:.0f} vs "
                  f"{res['step'][1][-1]:.0f}; block wall {res['block'][0][-1] * 1e3:.1f} vs "
                  f"{res['block'][1][-1] * 1e3:.1f} ms ({n} blocks)", flush=True)
        print(f"\ncurrent = working tree {ROOT}; old = {a.against}; medians of {a.reps} reps")
        summary("step img/s (1 thread)", *res["step"], True)
        summary("block wall_s (median)", *res["block"], False)
        summary("mpiexec command wall s", *res["total"], False)
    finally:
        checkout.remove()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
