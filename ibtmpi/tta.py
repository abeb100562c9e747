"""Time to accuracy: T7 of `ibtmpi bench report` and its plot.

The target is a fraction (99%) of the N = 1 run's final validation
accuracy; a run reaches it at its first evaluation at or above it. Its
seconds to the target are, by default, the run's honest block walls summed
up to that evaluation (metrics.jsonl `wall_s`: block end to block end on
the master). A run directory may hold `timing.json` to say how it was
timed otherwise:
  {"how": "..."}                      a label for the table (e.g. the nodes
                                      of a simulated cluster);
  {"how": "...", "block_s": s, ...}   modelled: every block takes s seconds
                                      (ibtmpi.scaling's block model fed with
                                      a measured run's figures: model_block),
                                      so the seconds are blocks x s; the
                                      passes still come from the run itself.
benchmarks/time_to_accuracy.py runs the set and writes the modelled runs'
timing.json. Test: tests/unit/test_tta.py.
"""
import json
import math
import os
import statistics

from .fsutil import save_figure
from .scaling import run_inputs, t_ar

FRAC = 0.99
TIMING = "timing.json"


def timing(run):
    """The run directory's timing.json, {} where there is none."""
    try:
        with open(os.path.join(run["dir"], TIMING)) as f:
            return json.load(f)
    except (OSError, ValueError, KeyError):
        return {}


def target(base, frac=FRAC):
    """frac x the base run's final validation accuracy; None without one."""
    vals = [l["val_acc"] for l in (base or {}).get("metrics", []) if l.get("val_acc") is not None]
    return frac * vals[-1] if vals else None


def how_timed(run):
    t = timing(run)
    if t.get("how"):
        return t["how"]
    if run.get("N") == 1:
        return "measured: one process"
    return "simulated: workers in turn" if run.get("simulated") else "measured: MPI"


def reach(run, goal):
    """The first evaluation with val_acc >= goal: {passes, seconds (honest
    walls, or modelled blocks x block_s), critical_s (slowest worker's
    compute + data wait, summed), cpu_s (a worker's CPU seconds in its
    compute, mean over workers, summed), modelled}; None if never reached.
    critical_s and cpu_s are None for simulated runs (workers in turn)."""
    block_s = timing(run).get("block_s")
    wall = crit = cpu = 0.0
    for line in run["metrics"]:
        wall += line["wall_s"] if block_s is None else block_s
        crit += line["compute_max_s"] + line["data_wait_max_s"]
        cpu += statistics.mean(line.get("compute_cpu_s") or [0.0])
        if line.get("val_acc") is not None and line["val_acc"] >= goal:
            parallel = not run["simulated"] or run["N"] == 1
            return {"passes": (line["block"] + 1) / max(1, line["blocks_total"]) * run["passes"],
                    "seconds": wall, "critical_s": crit if parallel else None,
                    "cpu_s": cpu if parallel else None, "modelled": block_s is not None}
    return None


def _seconds(run):
    """The run's training seconds in all: honest walls, or modelled."""
    block_s = timing(run).get("block_s")
    return sum(l["wall_s"] if block_s is None else block_s for l in run["metrics"])


def _best(run):
    vals = [l["val_acc"] for l in run["metrics"] if l.get("val_acc") is not None]
    return max(vals) if vals else float("nan")


def table(runs, base, frac=FRAC):
    """T7 lines: per run, passes and seconds to frac of N = 1's final."""
    goal = target(base, frac)
    if goal is None:
        return []
    out = [f"## T7: time to {frac:.0%} of N = 1's final validation accuracy ({goal:.4f})", "",
           "| run | algorithm | N | split/block | passes to target | seconds to target | "
           "critical-path s | worker CPU s | how timed |", "|---|" + "---|" * 8]
    for r in sorted(runs, key=lambda r: (r.get("block_size") or 0, r["N"], r["algorithm"],
                                         r["name"])):
        hit = reach(r, goal)
        if hit:
            got = (f"{hit['passes']:.2f} | {hit['seconds']:.1f} | "
                   + " | ".join("-" if hit[k] is None else f"{hit[k]:.1f}"
                                for k in ("critical_s", "cpu_s")))
        else:                   # its whole training: a lower bound on the time to it
            got = (f"not reached in {r['passes']:g} (best {_best(r):.4f}) | "
                   f"> {_seconds(r):.1f} | - | -")
        out.append(f"| {r['name']} | {r['algorithm']} | {r['N']} | "
                   f"{r.get('block_size') or r.get('split_size')} | {got} | {how_timed(r)} |")
    return out + ["", "Seconds: the runs' honest block walls summed up to that evaluation, "
                  "or where modelled the run's blocks times the model's block time (a run "
                  "that never reached the target: its whole training, > that); a "
                  "simulated run without a model computes its N workers one after the "
                  "other (N times a parallel run's compute; its passes compare across "
                  "all). Critical path: the slowest worker's compute and data wait per "
                  "block, summed; worker CPU: a worker's CPU seconds in its compute.", ""]


def plot(runs, out_dir):
    """t7_time_to_accuracy.png: validation accuracy against the training
    seconds so far (modelled runs dashed); [] when nothing to draw."""
    from .outputs import pyplot
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    drawn = 0
    for r in runs:
        block_s = timing(r).get("block_s")
        t, xs, ys = 0.0, [], []
        for line in r["metrics"]:
            t += line["wall_s"] if block_s is None else block_s
            if line.get("val_acc") is not None:
                xs.append(t)
                ys.append(line["val_acc"])
        if xs:
            ax.plot(xs, ys, "--" if block_s is not None else "-", marker=".",
                    label=r["name"] + (" (modelled)" if block_s is not None else ""))
            drawn += 1
    if not drawn:
        plt.close(fig)
        return []
    goal = target(next((r for r in runs if r["N"] == 1), None))
    if goal is not None:
        ax.axhline(goal, color="k", lw=0.8, ls=":", label=f"target {goal:.4f}")
        ax.set_ylim(max(0.0, goal - 0.15), 1.0)
    ax.set_xlabel("training seconds (honest block walls; dashed: modelled)")
    ax.set_ylabel("validation accuracy")
    ax.set_title("T7: time to accuracy")
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    path = os.path.join(out_dir, "t7_time_to_accuracy.png")
    save_figure(fig, path)
    plt.close(fig)
    return [path]


def model_block(ref, n, alpha, beta):
    """The modelled seconds of one block at n workers from a measured MPI
    run ref (a bench.load_run record) with the same split and algorithm:
    max(split x its seconds per sample, its master's own work per block)
    + its Allreduces per block at alpha/beta among n + 1 ranks (what
    tests/multinode/predict.py does per block); and the inputs."""
    t_s, busy, _ = run_inputs(ref["metrics"], ref["N"])
    s = json.load(open(os.path.join(ref["dir"], "summary.json")))
    calls = s["allreduce_calls"] / s["blocks"]
    nbytes = s["allreduce_bytes"] / max(1, s["allreduce_calls"])
    block = max(ref["split_size"] * t_s, busy) + calls * t_ar(n + 1, nbytes, alpha, beta)
    return block, {"from": ref["name"], "t_sample_ms": t_s * 1e3, "master_ms": busy * 1e3,
                   "allreduce_calls_per_block": calls, "allreduce_bytes": nbytes,
                   "alpha_s": alpha, "beta_s_per_byte": beta}


def model_error(ref, alpha, beta):
    """The model's error on ref itself: its modelled block x blocks against
    its honest walls (after its first two blocks, as run_inputs)."""
    block, _ = model_block(ref, ref["N"], alpha, beta)
    lines = ref["metrics"][2:] or ref["metrics"]
    measured = sum(l["wall_s"] for l in lines)
    return block * len(lines) / measured - 1 if measured else math.nan
