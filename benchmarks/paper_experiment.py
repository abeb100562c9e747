#!/usr/bin/env python
"""The paper's experiment: 25,000 images in 5 classes (20,000 train), a
fixed block of 4,960 samples split over N = 10, 20, 40 workers (10 x 496,
20 x 248, 40 x 124), sgd at N = 1 against admm ("traditional"), ibt
("improved") and bmuf at each N, at equal passes with a cosine schedule,
over several seeds; then `ibtmpi bench report --holdout` (test accuracy
mean +- sd, each run's gap to the N = 1 run of its seed on images no run
saw, time to accuracy).

Every N > 1 is simulated in one process (its accuracy equals the MPI
run's; the times are not speedups). Runs go in priority order (seed 0's
whole grid first), --streams at a time; a run already done with the same
command is kept, so a stopped experiment resumes.

  python benchmarks/paper_experiment.py --out runs/paper --size 32            # CPU
  python benchmarks/paper_experiment.py --out runs/paper --size 64 --device gpu --streams 4

The recipe study: each --recipe "NAME=ALGO KEY=VALUE ..." is run at every N
and seed next to the N = 1 run of its seed (at --batch; a recipe gives its
own data.batch, else it gets the default or algorithm.recipe's); a value
in braces is computed for the run's N and passes P (e.g.
optim.lr={0.02*sqrt(N)}); the table gives each recipe's test accuracy and
held-out gap to N = 1 (paired SE):

  python benchmarks/paper_experiment.py --out runs/screen --size 32 --passes 5 \
      --seeds 1 --ns 40 --recipe "b8=ibt data.batch=8 optim.warmup_passes={P/20}" \
      --recipe "auto=ibt algorithm.recipe=auto"
"""
import argparse
import math
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from ibtmpi import bench
from ibtmpi.data_prep.prep import prep_synth


def grid(a):
    """(name, algorithm, N, --set list) in priority order: seed 0's runs
    first, then each further seed's (bmuf only for --bmuf-seeds of them)."""
    common = [f"run.passes={a.passes:g}", f"data.batch={a.batch}",
              f"data.block_size={a.block}", f"optim.schedule={a.schedule}",
              f"run.threads={a.threads}", *a.set]
    jobs = []
    for i, sd in enumerate(a.seed_ids):
        algos = [x for x in a.algos if x != "bmuf" or i < a.bmuf_seeds]
        cells = [("sgd", 1)] + [(x, n) for n in a.ns for x in algos]
        seed = [f"model.seed={sd}", f"data.seed={sd}"] if sd else []
        jobs += [(f"t2-{x}-{n}" + (f"-s{sd}" if sd else ""), x, n, common + seed)
                 for x, n in cells]
    return jobs


def recipe(text):
    """'NAME=ALGO KEY=VALUE ...' -> (name, algo, [KEY=VALUE template, ...])."""
    head, *sets = text.split()
    name, _, algo = head.partition("=")
    if not name or not algo or any("=" not in x for x in sets):
        raise argparse.ArgumentTypeError(f"{text!r}: want NAME=ALGO KEY=VALUE ...")
    return name, algo, sets


def resolve(sets, n, passes):
    """The recipe's settings at N = n: {expr} -> its value (N, P, sqrt, log2)."""
    env = {"N": n, "P": passes, "sqrt": math.sqrt, "log2": math.log2,
           "min": min, "max": max, "__builtins__": {}}

    def value(m):
        v = eval(m.group(1), env)                     # the user's own command line
        return f"{v:.6g}" if isinstance(v, float) else str(v)
    import re
    return [re.sub(r"\{([^}]*)\}", value, s) for s in sets]


def recipe_grid(a):
    """(name, algorithm, N, --set list): per seed the N = 1 run (at --batch),
    then every recipe at every N (at its own data.batch, or the default or
    what algorithm.recipe derives: --batch is not passed to them)."""
    common = [f"run.passes={a.passes:g}", f"data.block_size={a.block}",
              f"optim.schedule={a.schedule}", f"run.threads={a.threads}", *a.set]
    jobs = []
    for sd in a.seed_ids:
        seed = [f"model.seed={sd}", f"data.seed={sd}"] if sd else []
        tail = f"-s{sd}" if sd else ""
        jobs.append((f"base-sgd-1{tail}", "sgd", 1, common + [f"data.batch={a.batch}"] + seed))
        jobs += [(f"{name}-{algo}-{n}{tail}", algo, n,
                  common + resolve(sets, n, a.passes) + seed)
                 for n in a.ns for name, algo, sets in a.recipe]
    return jobs


def recipe_table(a, jobs, hold):
    """Markdown: per recipe and N, the test accuracy (mean over seeds) and
    the held-out gap to the N = 1 run of the same seed +- its paired SE
    (as bench report's; over seeds with its one-sided 95% bound), with the
    runs that diverged or failed."""
    import numpy as np
    from ibtmpi.dataset import Dataset
    sp = Dataset(hold).split("test")
    x, y = sp.read_all(), sp.labels
    right = {}

    def correct(d):
        if d not in right:
            right[d] = bench._right(d, x, y)
        return right[d]
    done = lambda d: os.path.isfile(os.path.join(d, "summary.json"))   # noqa: E731
    md = ["| recipe | algorithm | " + " | ".join(f"N={n}" for n in a.ns) + " |",
          "|---|---|" + "---|" * len(a.ns)]
    bases = {sd: os.path.join(a.out, "base-sgd-1" + (f"-s{sd}" if sd else ""))
             for sd in a.seed_ids}
    b = [correct(d).mean() for d in bases.values() if done(d)]
    md.insert(0, f"N = 1 (sgd): held-out accuracy {np.mean(b):.4f} (n={len(b)})\n"
              if b else "N = 1 (sgd): not finished\n")
    for name, algo, _ in a.recipe:
        cells = []
        for n in a.ns:
            dirs = {sd: os.path.join(a.out, f"{name}-{algo}-{n}" + (f"-s{sd}" if sd else ""))
                    for sd in a.seed_ids}
            ok = [sd for sd, d in dirs.items() if done(d) and done(bases[sd])]
            bad = sum(os.path.isfile(os.path.join(d, f)) for d in dirs.values()
                      for f in ("diverged.json", "failed.json"))
            if not ok:
                cells.append("diverged" if bad else "-")
                continue
            dd = np.stack([correct(bases[sd]) - correct(dirs[sd]) for sd in ok])
            gaps = dd.mean(1) * 100
            se = 100 * dd.mean(0).std(ddof=1) / np.sqrt(dd.shape[1])
            if len(ok) > 1:
                se = float(np.hypot(se, gaps.std(ddof=1) / np.sqrt(len(ok))))
            acc = np.mean([json_acc(dirs[sd]) for sd in ok])
            cells.append(f"{acc:.4f}, {gaps.mean():+.2f} +- {se:.2f} pt"
                         + (f" (n={len(ok)}; bound {gaps.mean() + 1.645 * se:+.2f})"
                            if len(ok) > 1 else "")
                         + (f", {bad} diverged" if bad else ""))
        md.append(f"| {name} | {algo} | " + " | ".join(cells) + " |")
    return "\n".join(md)


def json_acc(d):
    import json
    return json.load(open(os.path.join(d, "summary.json")))["test_acc"]


def data_set(path, size, seed, log):
    if not os.path.isfile(os.path.join(path, "dataset.json")):
        log(f"making {path}: 25,000 synthetic {size}x{size} images (seed {seed})")
        prep_synth(path, n=25000, size=size, seed=seed, quiet=True)
    return path


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--size", type=int, default=64, help="image side of the made data sets")
    p.add_argument("--data", help="the data set (default OUT/data-SIZE, made if missing)")
    p.add_argument("--holdout", help="a set no run sees (default OUT/holdout-SIZE: "
                                     "another seed, made if missing); 'none': without")
    p.add_argument("--ns", default="10,20,40")
    p.add_argument("--algos", default="admm,ibt,bmuf")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--seed-list", metavar="S,S,...",
                   help="these seeds instead of 0 .. --seeds - 1 (e.g. 2: the third "
                        "seed of a grid whose first two ran elsewhere)")
    p.add_argument("--bmuf-seeds", type=int, default=None,
                   help="seeds that run bmuf (default all)")
    p.add_argument("--passes", type=float, default=20)
    p.add_argument("--block", type=int, default=4960)
    p.add_argument("--batch", type=int, default=31, help="31: 496, 248, 124 in whole steps")
    p.add_argument("--schedule", default="cosine")
    p.add_argument("--device", default="cpu", choices=("cpu", "gpu"))
    p.add_argument("--streams", type=int, default=1, help="runs at a time")
    p.add_argument("--threads", type=int, default=None,
                   help="BLAS threads a run (default: cores / streams)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    p.add_argument("--target-pt", type=float, default=0.3,
                   help="ibt's goal: within this many points of N = 1")
    p.add_argument("--report-only", action="store_true")
    p.add_argument("--recipe", action="append", type=recipe, default=[],
                   metavar="'NAME=ALGO KEY=VALUE ...'",
                   help="the recipe study: these recipes at every N and seed, "
                        "each against N = 1 (--algos is then unused)")
    a = p.parse_args(argv)
    a.ns = [int(n) for n in a.ns.split(",") if n]
    a.algos = [x for x in a.algos.split(",") if x]
    try:
        a.seed_ids = ([int(x) for x in a.seed_list.split(",") if x] if a.seed_list
                      else list(range(a.seeds)))
    except ValueError:
        p.error(f"--seed-list: seeds as integers, comma-separated; got {a.seed_list!r}")
    a.seeds = len(a.seed_ids)
    a.bmuf_seeds = a.seeds if a.bmuf_seeds is None else a.bmuf_seeds
    a.threads = a.threads or max(1, (os.cpu_count() or 1) // a.streams)
    bad = [x for x in a.algos + [r[1] for r in a.recipe]
           if x not in bench.ALGORITHMS or bench.ALGORITHMS[x].single_worker]
    if (bad or a.streams < 1 or a.seeds < 1 or min(a.seed_ids) < 0 or not a.ns
            or min(a.ns) < 2):
        p.error(f"--algos: block methods ({bad or 'ok'}); --streams, --seeds >= 1; "
                f"seeds >= 0; --ns >= 2")
    os.makedirs(a.out, exist_ok=True)
    lock = threading.Lock()

    def log(m):                     # whole lines: runs log from several threads
        with lock:
            sys.stdout.write(f"{m}\n")
            sys.stdout.flush()
    data = a.data or data_set(os.path.join(a.out, f"data-{a.size}"), a.size, 0, log)
    hold = (None if a.holdout == "none" else a.holdout
            or data_set(os.path.join(a.out, f"holdout-{a.size}"), a.size, 7, log))
    jobs = recipe_grid(a) if a.recipe else grid(a)
    failed = []
    if not a.report_only:
        t0, done = time.time(), []

        def one(job):
            name, algo, n, sets = job
            log(f"{time.strftime('%H:%M:%S')} {name}: start")
            if not bench.run_one(a.out, name, data, algo, n, sets, False, log=log,
                                 device=a.device):
                failed.append(name)
            done.append(name)
            log(f"{time.strftime('%H:%M:%S')} {len(done)}/{len(jobs)} runs done, "
                f"{(time.time() - t0) / 60:.1f} min")
        log(f"{len(jobs)} runs, {a.streams} at a time, {a.threads} BLAS thread(s) each, "
            f"{a.passes:g} passes, on the {a.device.upper()}")
        with ThreadPoolExecutor(a.streams) as pool:
            list(pool.map(one, jobs))
    if a.recipe:
        if not hold:
            log("the recipe table needs a held-out set")
            return 1
        text = recipe_table(a, jobs, hold)
        os.makedirs(os.path.join(a.out, "report"), exist_ok=True)
        with open(os.path.join(a.out, "report", "recipes.md"), "w") as f:
            f.write(text + "\n")
        log(text)
        return 1 if failed else 0
    # every run directory there is: the report tables the finished ones and
    # names the failed ones (failed.json), also from an earlier invocation
    dirs = [d for d in (os.path.join(a.out, j[0]) for j in jobs) if os.path.isdir(d)]
    if not any(bench.load_run(d) for d in dirs):
        log("no finished runs to report")
        return 1
    text, _ = bench.report(dirs, os.path.join(a.out, "report"), target_pt=a.target_pt,
                           holdout=hold)
    log(text)
    log(f"report: {os.path.join(a.out, 'report', 'report.md')}"
        + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
