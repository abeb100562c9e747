"""``ibtmpi bench``: run the comparison experiments and report on them.

``run`` trains every algorithm for N in a list (real ``mpiexec -n N+1`` where
the machine has the cores, ``--simulate N`` beyond; both give the same z to
1e-6) plus the paper's fixed-block experiment (split = block / N), each into
its own run directory.
``report`` collects finished run directories (from ``run``, slurm/sweep.sh,
anything) into ``report.md``, ``report.json`` and PNG plots:
  T1 test accuracy vs N per algorithm; T2 fixed block; T3 time per pass
  and speedup vs N = 1 (wall, and critical path = slowest worker's compute
  + data wait), Allreduce calls/bytes per pass, rank 0 CPU; Horovod-style
  images/s per worker, mean +- 1.96 sigma after 2 warm-up blocks;
  T4 validation accuracy vs pass; T5 residuals and rho; T6 time breakdown;
  T7 time to 99% of N = 1's final validation accuracy (ibtmpi/tta.py);
  the targets, and the machine, MPI library, git commit and configs.
Test: tests/unit/test_bench.py."""
from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time

from . import launcher, runlock
from .consensus import ALGORITHMS
from .fsutil import read_jsonl, save_figure
from .monitor import STARVED_SHARE, starved_workers
from .tta import how_timed, plot as tta_plot, table as tta_table, timing

ALGOS = tuple(ALGORITHMS)          # every registered algorithm, in registration order
BASELINE = "sgd"                   # the N = 1 run every speedup and target is against
METHOD = "ibt"                     # the paper's improved method: the targets are its
FIXED_BLOCK_PAIR = ("admm", "ibt")  # T2, the paper's "traditional" vs "improved" ADMM


# -- run ---------------------------------------------------------------------
MARK = "bench.json"          # in each run directory: what made it


def run_one(out_dir, name, data, algo, n, sets, mpi, log=print, fresh=False, device="cpu"):
    """Train one comparison run into out_dir/name (on `device`: train's
    --device); returns True when it finished or diverged (a result), False
    when it failed. A run directory that already holds a result of the same
    command is kept, not redone, so a bench that was stopped (a crash, a
    time limit) resumes where it was; fresh=True redoes it."""
    d = os.path.join(out_dir, name)
    base = ["train", "--quiet"] + (["--device", device] if device != "cpu" else []) + [
            "--set", f"data.path={data}", "--set", f"algorithm.name={algo}",
            "--set", f"run.dir={d}", "--set", "run.resume=never"]
    for s in sets:
        base += ["--set", s]
    how = "mpi" if mpi and n > 1 else "sim" if n > 1 else "1 process"
    sig = {"args": base, "N": n, "mode": how}
    done = [f for f in ("summary.json", "diverged.json") if os.path.isfile(os.path.join(d, f))]
    if not fresh and done:
        try:
            same = json.load(open(os.path.join(d, MARK))) == sig
        except (OSError, ValueError):
            same = False
        if same:
            acc = (json.load(open(os.path.join(d, "summary.json"))).get("test_acc")
                   if done[0] == "summary.json" else None)
            log(f"  {name}: done earlier ("
                + (f"test accuracy {acc:.4f}" if acc is not None else "diverged") + "), kept")
            return True
    try:                          # never clear a directory a live run holds
        runlock.probe(d)
    except runlock.RunDirBusy as e:
        log(f"  {name}: not run: {e}")
        return False
    shutil.rmtree(d, ignore_errors=True)
    base = [sys.executable, "-m", "ibtmpi"] + base
    if n > 1 and mpi:
        cmd = launcher.command(n + 1) + ["-n", str(n + 1)] + base
    elif n > 1:
        cmd = base + ["--simulate", str(n)]
    else:
        cmd = base
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True)
    os.makedirs(d, exist_ok=True)
    if r.returncode == 4:
        with open(os.path.join(d, "diverged.json"), "w") as f:
            json.dump({"algorithm": algo, "N": n, "message": r.stdout.strip()[-500:]}, f)
        log(f"  {name}: diverged")
    elif r.returncode or not os.path.isfile(os.path.join(d, "summary.json")):
        with open(os.path.join(d, "failed.json"), "w") as f:
            json.dump({"algorithm": algo, "N": n, "exit": r.returncode,
                       "command": cmd, "stdout": r.stdout[-2000:],
                       "stderr": r.stderr[-4000:]}, f, indent=1)
        log(f"  {name}: FAILED (exit {r.returncode}); output in "
            f"{os.path.join(d, 'failed.json')}; the other runs go on")
        return False
    else:
        s = json.load(open(os.path.join(d, "summary.json")))
        log(f"  {name}: test accuracy {s.get('test_acc', float('nan')):.4f} "
            f"({how}, {time.time() - t0:.0f} s)")
    with open(os.path.join(d, MARK), "w") as f:
        json.dump(sig, f)
    return True


def run(out_dir, data, ns=(1, 2, 4, 8), algos=ALGOS, passes=3.0, split=256, batch=32,
        mpi_max=None, fixed_block=1240, fixed_ns=(10, 20, 40), extra=(), log=print,
        fresh=False, seeds=1):
    """Every comparison run; returns the names of those that failed. seeds
    > 1 repeats each run with model.seed = data.seed = s for s = 1 ..
    seeds-1 (run NAME-sS; seed 0 is the run NAME), so the report can give
    each cell a mean and a standard deviation."""
    mpi_max = (os.cpu_count() or 1) if mpi_max is None else mpi_max
    try:
        launcher.find_mpiexec()
    except launcher.LauncherError as e:
        log(f"{e}; every N > 1 runs in simulation")
        mpi_max = 0
    common = [f"run.passes={passes}", f"data.batch={batch}", *extra]
    jobs = []
    for algo in algos:
        for n in ns:
            if ALGORITHMS[algo].single_worker != (n == 1):
                continue
            jobs.append((f"t1-{algo}-{n}", algo, n, common + [f"data.split_size={split}"],
                         n <= mpi_max))
    if fixed_block:
        fixed = common + [f"data.block_size={fixed_block}"]
        jobs.append((f"t2-{BASELINE}-1", BASELINE, 1, fixed, False))
        jobs += [(f"t2-{algo}-{n}", algo, n, fixed, False)
                 for algo in FIXED_BLOCK_PAIR for n in fixed_ns]
    jobs = [(name + (f"-s{sd}" if sd else ""), algo, n,
             sets + ([f"model.seed={sd}", f"data.seed={sd}"] if sd else []), mpi)
            for name, algo, n, sets, mpi in jobs for sd in range(seeds)]
    failed = []
    for i, (name, algo, n, sets, mpi) in enumerate(jobs):
        if i == 0:
            log("T1: every algorithm vs N")
        if name == "t2-sgd-1":
            log(f"T2: fixed block of {fixed_block} samples, split = block / N")
        if not run_one(out_dir, name, data, algo, n, sets, mpi, log, fresh):
            failed.append(name)
    return failed


# -- report ------------------------------------------------------------------

def load_run(d):
    """One finished (or diverged) run directory as a record."""
    from .config import load
    if os.path.isfile(os.path.join(d, "diverged.json")):
        r = json.load(open(os.path.join(d, "diverged.json")))
        return {"dir": d, "name": os.path.basename(d.rstrip("/")), "diverged": True,
                "seed": _seed_of(d), **r}
    sp = os.path.join(d, "summary.json")
    if not os.path.isfile(sp):
        return None
    s = json.load(open(sp))
    cfg = load(os.path.join(d, "config.toml"))
    lines = read_jsonl(os.path.join(d, "metrics.jsonl"))
    passes = s["passes"]
    # Horovod-style training throughput per worker: a worker's samples over
    # its compute seconds, per block after 2 warm-up blocks
    worker_ips = [l["samples"] / s["N"] / l["compute_mean_s"] for l in lines[2:]
                  if l["compute_mean_s"] > 0]
    return {
        "dir": d, "name": os.path.basename(d.rstrip("/")), "diverged": False,
        "algorithm": s["algorithm"], "N": s["N"], "simulated": s.get("simulated", False),
        "seed": (cfg["model"]["seed"], cfg["data"]["seed"]),
        "world_size": s.get("world_size"), "test_acc": s.get("test_acc"),
        "passes": passes, "block_size": cfg["data"]["block_size"],
        "batch": cfg["data"]["batch"],
        "split_size": cfg["data"]["split_size"],
        # honest: block end to block end on the master, the last block's tail
        # in (summary pass_s); older runs: their blocks' walls
        "wall_per_pass": (sum(s["pass_s"]) if s.get("pass_s") else
                          sum(l["wall_s"] for l in lines)) / passes,
        "critical_per_pass": sum(l["compute_max_s"] + l["data_wait_max_s"]
                                 for l in lines) / passes,
        # a worker's compute wall and its process's CPU time in it, mean
        # over workers (runs from before compute_cpu_s: None)
        "worker_compute_per_pass": sum(l["compute_mean_s"] for l in lines) / passes,
        "worker_cpu_per_pass": (sum(statistics.mean(l["compute_cpu_s"]) for l in lines) / passes
                                if lines and all("compute_cpu_s" in l for l in lines) else None),
        "starved": starved_workers(s),
        "parameters": s.get("parameters"),
        "allreduce_calls_per_pass": s["allreduce_calls"] / passes,
        "allreduce_mib_per_pass": s["allreduce_bytes"] / passes / 2 ** 20,
        "rank0_cpu_share": s.get("rank0_cpu_share"),
        "rank0_other_cpu_share": s.get("rank0_other_cpu_share"),
        "ips_worker_mean": statistics.mean(worker_ips) if worker_ips else None,
        "ips_worker_ci": 1.96 * statistics.stdev(worker_ips) if len(worker_ips) > 1 else None,
        "metrics": lines, "config": cfg,
    }


def machine():
    info = {"python": sys.version.split()[0], "platform": platform.platform(),
            "cpus": os.cpu_count(), "processor": platform.processor()}
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                info["processor"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        from . import comm
        info["mpi"] = comm.library_version()
    except Exception as e:             # reporting must not need a working MPI
        info["mpi"] = f"unknown ({e})"
    try:
        info["git_commit"] = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True,
            cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip() or None
    except OSError:
        info["git_commit"] = None
    from . import __version__
    info["ibtmpi"] = __version__
    return info


def _seed_of(d):
    """(model.seed, data.seed) of a run directory from its config.toml;
    (0, 0) where there is none (a run that diverged before writing one)."""
    from .config import ConfigError, load
    try:
        c = load(os.path.join(d, "config.toml"))
        return (c["model"]["seed"], c["data"]["seed"])
    except ConfigError:
        return (0, 0)


def _stats(rows):
    """(mean, sd, n) of the finished runs' test accuracy; sd None for n < 2."""
    accs = [r["test_acc"] for r in rows if not r["diverged"] and r["test_acc"] is not None]
    if not accs:
        return None, None, 0
    return (statistics.mean(accs), statistics.stdev(accs) if len(accs) > 1 else None,
            len(accs))


def _cell(rows):
    """A table cell for the runs of one (algorithm, N): the accuracy of a
    single run, or mean +- sd over seeds (n), and how many diverged."""
    if not rows:
        return "-"
    div = sum(r["diverged"] for r in rows)
    mean, sd, n = _stats(rows)
    if n == 0:
        return "diverged" if div == 1 else f"diverged ({div}/{len(rows)})"
    cell = f"{mean:.4f}" if len(rows) == 1 else (
        f"{mean:.4f} +- {sd:.4f} (n={n})" if sd is not None else f"{mean:.4f} (n=1)")
    return cell + (f", {div} diverged" if div else "")


def _first_seed(runs):
    """One run per (algorithm, N, block size, how timed): the lowest seed,
    for the tables of times and the plots (a run on a simulated cluster
    and one on this node, or a modelled one, stay apart)."""
    out = {}
    for r in sorted(runs, key=lambda r: tuple(r.get("seed") or (0, 0))):
        out.setdefault((r["algorithm"], r["N"], r.get("block_size"), how_timed(r)), r)
    return list(out.values())


def _one_per_seed(runs):
    """One run per (algorithm, N, block size, seed) for the accuracy tables
    and targets: a repeat of a run elsewhere (a timing.json label, e.g. on
    the simulated cluster: the same z) is in T7 only."""
    out = {}
    for r in sorted(runs, key=lambda r: ("how" in timing(r), r["name"])):
        out.setdefault((r.get("algorithm"), r.get("N"), r.get("block_size"),
                        tuple(r.get("seed") or (0, 0))), r)
    keep = {id(r) for r in out.values()}
    return [r for r in runs if id(r) in keep]


def paired_gap(base_dir, other_dir, data, split="test"):
    """Accuracy of two trained runs on the same held-out images and the gap
    base - other in points with its paired standard error (per-image
    differences, so the images' common difficulty cancels)."""
    from .dataset import Dataset
    sp = Dataset(data).split(split)
    x, y = sp.read_all(), sp.labels
    a, b = _right(base_dir, x, y), _right(other_dir, x, y)
    d = a - b
    se = d.std(ddof=1) / len(y) ** 0.5 * 100 if len(y) > 1 else float("nan")
    return {"n": int(len(y)), "base_acc": float(a.mean()), "other_acc": float(b.mean()),
            "gap_pt": float(d.mean() * 100), "se_pt": float(se)}


def _right(run_dir, x, y):
    """1.0 where the run's trained model classifies an image right, else 0.0."""
    from .outputs import load_trained
    tm = load_trained(run_dir)
    tm.check_data(x.dtype, f"the held-out set (for {run_dir})")
    return (tm.probs(x).argmax(1) == y).astype(float)


def report(run_dirs, out_dir, target_pt=0.5, holdout=None):
    """report.md (tables T1-T3, targets, failed runs, plots) and report.json."""
    runs = [r for r in (load_run(d) for d in run_dirs) if r is not None]
    if not runs:
        raise ValueError("no finished run directories given (each needs summary.json)")
    os.makedirs(out_dir, exist_ok=True)
    once = _one_per_seed(runs)
    t1 = [r for r in once if r["diverged"] or not r["block_size"]]
    t2 = [r for r in once if not r["diverged"] and r["block_size"]]
    t2 += [r for r in once if r["diverged"] and r["name"].startswith("t2-")]
    t1 = [r for r in t1 if not r["name"].startswith("t2-")]
    md = ["# ibtmpi benchmark report", ""]
    m = machine()
    md += [f"machine: {m['processor']}, {m['cpus']} CPUs; {m['platform']}; Python "
           f"{m['python']}; MPI: {m['mpi']}; ibtmpi {m['ibtmpi']}, commit "
           f"{m['git_commit']}", ""]
    md += _accuracy_table(t1, "T1: test accuracy vs N") if t1 else []
    if t2:
        md += _accuracy_table(t2, f"T2: fixed block of {t2[0].get('block_size', '?')} "
                                  f"samples, split = block / N")
    if t2 and holdout:
        md += _holdout_table(t2, holdout, target_pt)
    if len(_first_seed(runs)) < len(runs):             # some cell has several seeds
        md += ["Cells with n: mean +- standard deviation over seeds (model.seed = "
               "data.seed = s: another initialisation and another data order).", ""]
    # T3: times from one seed per cell
    every = [r for r in t1 if not r["diverged"]]
    ok = _first_seed(every)
    base = next((r for r in ok if r["N"] == 1), None)
    md += _time_table(ok, base) if ok else []          # none: the fixed block's alone
    tta = _first_seed([r for r in runs if not r["diverged"]])
    md += tta_table(tta, next((r for r in tta if r["N"] == 1), None))
    md += _targets(ok, every, base, target_pt, holdout)
    md += _failed_runs(run_dirs)
    from .outputs import NoPlotting
    try:
        # T4/T5 from T1's runs, or the fixed-block runs' when there are none
        files = (_plots(ok or _first_seed([r for r in t2 if not r["diverged"]]), out_dir)
                 + tta_plot(tta, out_dir))
        md += ["", "## Plots", ""] + [f"![{os.path.basename(f)}]({os.path.basename(f)})"
                                      for f in files]
    except NoPlotting as e:
        files = []
        md += ["", f"(no plots: {e})"]
    text = "\n".join(md) + "\n"
    with open(os.path.join(out_dir, "report.md"), "w") as f:
        f.write(text)
    slim = [{k: v for k, v in r.items() if k not in ("metrics", "config")} for r in runs]
    with open(os.path.join(out_dir, "report.json"), "w") as f:
        json.dump({"machine": m, "runs": slim,
                   "configs": {r["name"]: r.get("config") for r in runs}}, f, indent=1,
                  default=str)
    return text, files


def _accuracy_table(rows, title):
    """Test accuracy: one row per algorithm, one column per N."""
    ns = sorted({r["N"] for r in rows})
    algos = [a for a in ALGOS if any(r["algorithm"] == a for r in rows)]
    out = [f"## {title}", "", "| algorithm | " + " | ".join(f"N={n}" for n in ns) + " |",
           "|---|" + "---|" * len(ns)]
    for a in algos:
        cells = [_cell([r for r in rows if r["algorithm"] == a and r["N"] == n])
                 for n in ns]
        out.append(f"| {a} | " + " | ".join(cells) + " |")
    return out + [""]


def _holdout_table(t2, holdout, target_pt):
    """T2 on a held-out set: every run against the N = 1 run of its seed on
    the same unseen images. Over k seeds the gap's SE adds the images'
    (per-image differences averaged over the seeds) and the seeds' (sd of the
    per-seed gaps / sqrt k)."""
    import numpy as np
    from .dataset import Dataset
    sp = Dataset(holdout).split("test")
    x, y = sp.read_all(), sp.labels
    right = {}

    def correct(r):
        if r["dir"] not in right:
            right[r["dir"]] = _right(r["dir"], x, y)
        return right[r["dir"]]

    seed = lambda r: tuple(r.get("seed") or (0, 0))             # noqa: E731
    ok = [r for r in t2 if not r["diverged"]]
    bases = {seed(r): r for r in ok if r["N"] == 1}
    ns = sorted({r["N"] for r in ok if r["N"] > 1})
    md = [f"## T2 on the held-out set {holdout} ({len(y):,} images): accuracy, gap to "
          f"N = 1 of the same seed +- its SE", "",
          "| algorithm | N=1 | " + " | ".join(f"N={n}" for n in ns) + " |",
          "|---|---|" + "---|" * len(ns)]
    b = [correct(r).mean() for r in bases.values()]
    if b:
        md.append(f"| {BASELINE} | {np.mean(b):.4f}" + (f" (n={len(b)})" if len(b) > 1 else "")
                  + " |" + " - |" * len(ns))
    verdicts = []
    for a in [a for a in ALGOS if any(r["algorithm"] == a and r["N"] > 1 for r in ok)]:
        cells = []
        for n in ns:
            rs = [r for r in ok if r["algorithm"] == a and r["N"] == n and seed(r) in bases]
            if not rs:
                cells.append("-")
                continue
            d = np.stack([correct(bases[seed(r)]) - correct(r) for r in rs])
            gaps = d.mean(1) * 100
            se = 100 * d.mean(0).std(ddof=1) / np.sqrt(d.shape[1])
            if len(rs) > 1:
                se = float(np.hypot(se, gaps.std(ddof=1) / np.sqrt(len(rs))))
            acc = np.mean([correct(r).mean() for r in rs])
            cells.append(f"{acc:.4f}, {gaps.mean():+.2f} +- {se:.2f} pt"
                         + (f" (n={len(rs)})" if len(rs) > 1 else ""))
            if a == METHOD:
                hi = gaps.mean() + 1.645 * se
                verdicts.append(f"N = {n} {'MET' if gaps.mean() <= target_pt else 'NOT MET'}"
                                f" (one-sided 95% bound {hi:+.2f} pt)")
        md.append(f"| {a} | - | " + " | ".join(cells) + " |")
    if verdicts:
        md += ["", f"{METHOD} within {target_pt} pt of N = 1 on these images: "
               + "; ".join(verdicts)]
    return md + [""]


def _time_table(ok, base):
    """T3: time per pass, speedups against the N = 1 run, throughput, traffic."""
    md = ["## T3: time per pass, throughput, communication", "",
          "| run | mode | wall s/pass | speedup (wall; efficiency) | critical-path s/pass | speedup "
          "(critical path) | worker compute s/pass: wall, CPU (share) | "
          "worker img/s in compute (mean +- 1.96 sd) | Allreduce calls/pass | "
          "MiB/pass | rank 0 CPU (outside eval) |", "|---|" + "---|" * 10]
    for r in sorted(ok, key=lambda r: (r["algorithm"], r["N"])):
        mode = "sim" if r["simulated"] else ("1 proc" if r["N"] == 1 else "mpi")
        if r.get("starved"):
            mode += " (oversubscribed)"
        sp = base['wall_per_pass'] / r['wall_per_pass'] if base else None
        sp_w = (f"{sp:.2f}x ({sp / r['N']:.0%})" if sp and not r["simulated"] else "n/a")
        sp_c = (f"{base['critical_per_pass'] / r['critical_per_pass']:.2f}x"
                if base and not r["simulated"] else "n/a")
        ips = (f"{r['ips_worker_mean']:.0f} +- {r['ips_worker_ci']:.0f}"
               if r["ips_worker_mean"] and r["ips_worker_ci"] is not None and not r["simulated"]
               else "n/a")
        cpu = (f"{r['rank0_cpu_share']:.1%} ({r['rank0_other_cpu_share']:.1%})"
               if not r["simulated"] and r["rank0_cpu_share"] is not None else "n/a")
        wc, cc = r.get("worker_compute_per_pass"), r.get("worker_cpu_per_pass")
        work = (f"{wc:.2f}, {cc:.2f} ({cc / wc:.0%})" if wc and cc is not None
                else f"{wc:.2f}, n/a" if wc else "n/a")
        # one process has no collective: its packet is summed in place
        comm = ("none | none" if r.get("world_size") == 1 and not r["simulated"] else
                f"{r['allreduce_calls_per_pass']:.0f} | {r['allreduce_mib_per_pass']:.1f}")
        md.append(f"| {r['name']} | {mode} | {r['wall_per_pass']:.2f} | {sp_w} | "
                  f"{r['critical_per_pass']:.2f} | {sp_c} | {work} | {ips} | "
                  f"{comm} | {cpu} |")
    if any(r.get("starved") for r in ok):
        md += ["", f"Oversubscribed: its CPU workers had a core for under {STARVED_SHARE:.0%} "
                   f"of their compute time in half the blocks or more (more worker threads "
                   f"than cores): its times are the wait for cores, not the algorithm's."]
    md += ["", "Simulated runs compute every worker in one process: their times are "
           "not speedups (n/a); their accuracy equals the MPI run's (tested to 1e-6).", ""]
    return md


def _targets(ok, every, base, target_pt, holdout):
    """The paper's targets: the method's accuracy at the largest N against N = 1."""
    md = ["## Targets", ""]
    ibt = sorted([r for r in ok if r["algorithm"] == METHOD], key=lambda r: r["N"])
    if ibt and base:
        bm, bsd, bn = _stats([r for r in every if r["N"] == 1])
        im, isd, i_n = _stats([r for r in every if r["algorithm"] == METHOD
                               and r["N"] == ibt[-1]["N"]])
        gap = (bm - im) * 100
        spread = ""
        if bsd is not None or isd is not None:
            se = 100 * ((bsd or 0.0) ** 2 / bn + (isd or 0.0) ** 2 / i_n) ** 0.5
            spread = (f", SE {se:.2f} pt over seeds ({i_n} and {bn} runs): the gap is "
                      f"{abs(gap) / se if se else float('inf'):.1f} SE")
        md.append(f"- ibt at N = {ibt[-1]['N']} within {target_pt} pt of N = 1: "
                  f"{'MET' if gap <= target_pt else 'NOT MET'} ({im:.4f} vs "
                  f"{bm:.4f}, {gap:+.2f} pt{spread}; {ibt[-1]['passes']:g} vs "
                  f"{base['passes']:g} passes, local batch {ibt[-1]['batch']} vs "
                  f"{base['batch']})")
        if holdout:
            g = paired_gap(base["dir"], ibt[-1]["dir"], holdout)
            hi = g["gap_pt"] + 1.645 * g["se_pt"]
            md.append(f"  - on the held-out set {holdout} ({g['n']:,} images): "
                      f"{g['other_acc']:.4f} vs {g['base_acc']:.4f}, gap "
                      f"{g['gap_pt']:+.2f} pt, paired SE {g['se_pt']:.2f} pt: "
                      f"{'MET' if g['gap_pt'] <= target_pt else 'NOT MET'} by the "
                      f"estimate, {'MET' if hi <= target_pt else 'not shown'} at 95% "
                      f"(one-sided bound {hi:+.2f} pt)")
    md.append(_projection_line(ibt))
    return md


def _projection_line(ibt):
    """The paper's fixed block at 32 workers, projected by ibtmpi.scaling
    from the method's MPI run with the most workers (its own time per
    sample and master's work per block), over a stated interconnect."""
    from .scaling import paper_projection
    runs = [r for r in ibt if not r["simulated"] and r.get("parameters") and r["N"] > 1]
    if not runs:
        return ("- projected speedup at 32 workers >= 30x: no MPI run of the method with "
                "its parameter count (summary.json from 2026-12-06 on) to take the inputs "
                "from; benchmarks/bench_scaling.py projects from a measured Allreduce sweep")
    r = runs[-1]
    sp, neck, x = paper_projection(r)
    st = x["stages_ms"]
    return (f"- projected speedup at 32 workers >= 30x (paper: > 28x): "
            f"{'MET' if sp >= 30 else 'NOT MET'} by the model, {sp:.1f}x for the paper's fixed "
            f"block (4,960 of 20,000 images, split 155) over {x['net']} (stated), "
            f"bottleneck {neck} (a block: compute {st['compute']:.1f} ms, master "
            f"{st['master']:.1f} ms, Allreduce {st['allreduce']:.2f} ms); inputs from "
            f"{r['name']}: {x['t_sample_ms']:.3f} ms per sample, master {x['master_ms']:.1f} "
            f"ms per block, update {x['update_ms']:.1f} ms here, P = {x['P']:,d}")


def _failed_runs(run_dirs):
    """Runs that wrote failed.json and no summary.json, with their exit status."""
    failed = []
    for d in run_dirs:
        fp = os.path.join(d, "failed.json")
        if os.path.isfile(fp) and not os.path.isfile(os.path.join(d, "summary.json")):
            try:
                code = json.load(open(fp)).get("exit")
            except (OSError, ValueError):
                code = "?"
            failed.append(f"- {os.path.basename(d.rstrip('/'))}: exit {code} "
                          f"(its output: {fp})")
    return ["", "## Failed runs (not in the tables)", ""] + failed if failed else []


def _plots(runs, out_dir):
    from .outputs import pyplot
    plt = pyplot()
    files = []
    ns = sorted({r["N"] for r in runs if r["N"] > 1})
    n_show = ns[len(ns) // 2] if ns else 1
    sel = [r for r in runs if r["N"] == n_show or r["algorithm"] == BASELINE]
    # T4 validation accuracy vs pass
    fig, ax = plt.subplots(figsize=(7, 4))
    for r in sel:
        bpp = max(l["block_in_pass"] for l in r["metrics"]) + 1
        pts = [((l["block"] + 1) / bpp, l["val_acc"]) for l in r["metrics"] if "val_acc" in l]
        if pts:
            ax.plot(*zip(*pts), "o-", label=f"{r['algorithm']} (N={r['N']})")
    ax.set_xlabel("pass")
    ax.set_ylabel("validation accuracy")
    ax.set_title(f"T4: validation accuracy vs pass (N = {n_show}, and N = 1)")
    if ax.get_legend_handles_labels()[0]:            # some run evaluated on val
        ax.legend()
        fig.tight_layout()
        files.append(os.path.join(out_dir, "t4_val_accuracy.png"))
        save_figure(fig, files[-1])
    plt.close(fig)
    # T5 residuals and rho
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for r in sel:
        if not getattr(ALGORITHMS.get(r["algorithm"]), "dual", False):
            continue                 # residuals and rho: the ADMM algorithms
        b = [l["block"] for l in r["metrics"]]
        axes[0].semilogy(b, [max(l["primal_residual"], 1e-12) for l in r["metrics"]],
                         label=f"{r['algorithm']} primal")
        axes[0].semilogy(b, [max(l["dual_residual"], 1e-12) for l in r["metrics"]], "--",
                         label=f"{r['algorithm']} dual")
        axes[1].plot(b, [l["rho"] for l in r["metrics"]], label=r["algorithm"])
    axes[0].set_xlabel("block")
    axes[0].set_ylabel("residual")
    axes[0].set_title(f"T5: ADMM residuals (N = {n_show})")
    axes[1].set_xlabel("block")
    axes[1].set_ylabel("rho")
    axes[1].set_title("rho per block")
    if axes[0].get_legend_handles_labels()[0]:       # only with admm or ibt runs
        axes[0].legend()
        axes[1].legend()
        fig.tight_layout()
        files.append(os.path.join(out_dir, "t5_residuals_rho.png"))
        save_figure(fig, files[-1])
    plt.close(fig)
    # T6 time breakdown (real MPI runs)
    mpi = [r for r in runs if not r["simulated"] and r["N"] > 1]
    if mpi:
        fig, ax = plt.subplots(figsize=(8, 4))
        names = [r["name"] for r in mpi]
        comp = [statistics.mean(l["compute_max_s"] for l in r["metrics"]) for r in mpi]
        wait = [statistics.mean(l["data_wait_max_s"] for l in r["metrics"]) for r in mpi]
        comm = [statistics.mean(l["comm_s"] for l in r["metrics"]) for r in mpi]
        ax.bar(names, comp, label="compute (slowest worker)")
        ax.bar(names, wait, bottom=comp, label="data wait")
        ax.bar(names, comm, bottom=[c + w for c, w in zip(comp, wait)],
               label="communication + imbalance")
        ax.set_ylabel("seconds per block (mean)")
        ax.set_title("T6: time per block, real MPI runs")
        ax.legend()
        plt.setp(ax.get_xticklabels(), rotation=30, ha="right")
        fig.tight_layout()
        files.append(os.path.join(out_dir, "t6_time_breakdown.png"))
        save_figure(fig, files[-1])
        plt.close(fig)
    return files
