#!/usr/bin/env python
"""The figures of benchmarks/gpu_e2e.sh side by side with their targets:
reads the step microbenchmark's JSON (bench_gpu_step.py --json) and
training run directories (summary.json, metrics.jsonl, config.toml and,
where the script wrote it, process_wall_s: the process's wall time
measured from outside, launch to exit), writes a text report and the
same figures as JSON.

Per run: images/s over its passes (every pass's images over the sum of the
pass times) and per pass, startup_s, the pass times, the final test
evaluation, the share of the blocks' wall time the slowest worker waited
for data, and the whole run's wall time against the sum of its passes.
Targets (each printed with its figure and "met" / "NOT met"; "not
measured" where a figure is missing):
- a one-worker run (sgd, N = 1) trains at >= 90% of the step
  microbenchmark's images/s at the same batch, in the step's mode the run
  used (CUDA graphs unless run.cuda_graphs = off; tf32 when run.gpu_math =
  tf32); the run's figure is the median over its passes after the first
  (the first carries the warm-up: graph captures, CuPy's first launches);
- a one-process run's whole wall time is <= 1.2x the sum of its passes;
- our step is >= 1.5x PyTorch's defaults at batch 32 and >= 1.0x at 64
  (each of our step's modes listed).
Usage: python benchmarks/e2e_summary.py --step STEP.json --out E2E.txt
       NAME=RUN_DIR [NAME=RUN_DIR ...]
Tests: tests/unit/test_gpu_e2e.py.
"""
import argparse
import json
import math
import os
import statistics
import sys

STEP_SHARE = 0.9          # trainer img/s over a pass / the step's, at least
WALL_RATIO = 1.2          # whole-run wall / the sum of its passes, at most
VS_DEFAULTS = {32: 1.5, 64: 1.0}   # our step / PyTorch's defaults, at least


def _read_toml(path):
    from ibtmpi.config import tomllib
    with open(path, "rb") as f:
        return tomllib.load(f)


def run_figures(run_dir):
    """One run's figures from its directory."""
    with open(os.path.join(run_dir, "summary.json")) as f:
        s = json.load(f)
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        blocks = [json.loads(line) for line in f if line.strip()]
    cfg = _read_toml(os.path.join(run_dir, "config.toml"))
    pass_s = [float(p) for p in s["pass_s"]]
    images = [0] * len(pass_s)
    for b in blocks:
        images[b["pass"]] += b["samples"]
    blocks_wall = sum(b["wall_s"] for b in blocks)
    out = {"algorithm": s["algorithm"], "N": s["N"], "world_size": s["world_size"],
           "simulated": s["simulated"], "batch": cfg["data"]["batch"],
           "step_mode": step_mode(cfg["run"]), "startup_s": s["startup_s"],
           "pass_s": pass_s, "pass_img_s": [n / t for n, t in zip(images, pass_s)],
           "img_s": sum(images) / sum(pass_s), "final_eval_s": s.get("final_eval_s", 0.0),
           "train_wall_s": s["wall_s"], "master_busy_s": s["master_busy_s"],
           "data_wait_share": (sum(b["data_wait_max_s"] for b in blocks) / blocks_wall
                               if blocks_wall else 0.0)}
    later = out["pass_img_s"][1:] or out["pass_img_s"]
    out["steady_img_s"] = statistics.median(later)
    wall = os.path.join(run_dir, "process_wall_s")
    if os.path.exists(wall):
        with open(wall) as f:
            out["wall_s"], out["wall_from"] = float(f.read()), "process"
    else:       # launch to the end of the test evaluation
        out["wall_s"] = out["startup_s"] + s["wall_s"] + out["final_eval_s"]
        out["wall_from"] = "summary.json"
    out["wall_ratio"] = out["wall_s"] / sum(pass_s)
    return out


def step_mode(run):
    """The step microbenchmark's mode that does the work a run's steps do."""
    graphs = run.get("cuda_graphs", "auto") != "off"
    tf32 = run.get("gpu_math", "fp32") == "tf32"
    return {(False, False): "fp32", (True, False): "graphs", (False, True): "tf32",
            (True, True): "graphs+tf32"}[graphs, tf32]


def step_img_s(step, batch, mode):
    """The step JSON's images/s at a batch in a mode, or None."""
    for row in step:
        if row["batch"] == batch:
            m = row.get("modes", {}).get(mode)
            if m is not None:
                return m["img_s"]
            return row["ours_img_s"] if mode == "fp32" else None
    return None


def _finite(x):
    return x is not None and not (isinstance(x, float) and math.isnan(x))


def verdict(value, target, at_least):
    if not _finite(value):
        return "not measured"
    return "met" if (value >= target if at_least else value <= target) else "NOT met"


def targets(runs, step):
    """[(what, figure text, value, target text, verdict)] of every target."""
    out = []
    for name, r in runs.items():
        if r["N"] == 1:
            ref = step_img_s(step, r["batch"], r["step_mode"])
            v = r["steady_img_s"] / ref if _finite(ref) else None
            out.append((f"{name}: trainer img/s over a pass / step ({r['step_mode']}) at "
                        f"batch {r['batch']}",
                        f"{r['steady_img_s']:,.0f} / {_n(ref)}",
                        v, f">= {STEP_SHARE:.2f}x", verdict(v, STEP_SHARE, True)))
        if r["world_size"] == 1:
            out.append((f"{name}: whole-run wall / sum of passes",
                        f"{r['wall_s']:.2f} s / {sum(r['pass_s']):.2f} s", r["wall_ratio"],
                        f"<= {WALL_RATIO:.2f}x", verdict(r["wall_ratio"], WALL_RATIO, False)))
    for batch, want in sorted(VS_DEFAULTS.items()):
        row = next((x for x in step if x["batch"] == batch), None)
        if row is None:
            out.append((f"step / PyTorch defaults at batch {batch}", "-", None,
                        f">= {want:.2f}x", "not measured"))
            continue
        for mode, m in (row.get("modes") or {"fp32": {"img_s": row["ours_img_s"]}}).items():
            t = row["torch_defaults_img_s"]
            v = m["img_s"] / t if _finite(t) else None
            out.append((f"step ({mode}) / PyTorch defaults at batch {batch}",
                        f"{m['img_s']:,.0f} / {_n(t)}", v,
                        f">= {want:.2f}x", verdict(v, want, True)))
    return out


def _x(v):
    return f"{v:.2f}x" if _finite(v) else "-"


def _n(v, fmt=",.0f"):
    return format(v, fmt) if _finite(v) else "-"


def render(runs, step, missing=()):
    lines = ["# GPU end to end (benchmarks/gpu_e2e.sh)", "",
             "## The step microbenchmark (bench_gpu_step.py), images/s", ""]
    mode_names = list(dict.fromkeys(m for r in step for m in r.get("modes", {})))
    lines.append("| batch | " + " | ".join(f"ours {m}" for m in mode_names)
                 + " | PyTorch fp32 (TF32 off) | PyTorch defaults |")
    lines.append("|---" * (len(mode_names) + 3) + "|")
    for r in step:
        cells = [f"{r['modes'][m]['img_s']:,.0f}" if m in r.get("modes", {}) else "-"
                 for m in mode_names]
        lines.append(f"| {r['batch']} | " + " | ".join(cells)
                     + f" | {_n(r['torch_img_s'])} | {_n(r['torch_defaults_img_s'])} |")
    for r in step:
        if "tf32_grad_dev" in r:
            d = r["tf32_grad_dev"]
            lines.append(f"batch {r['batch']}: tf32 gradients vs fp32: max |difference| / "
                         f"max |gradient| {d['max_rel']:.2e}, relative 2-norm {d['l2_rel']:.2e}")
    lines += ["", "## Training runs", "",
              "| run | algorithm | N | processes | batch | step mode | startup s | passes | "
              "pass s (first, median of the rest) | img/s over passes | final eval s | "
              "data-wait share | whole-run wall s | wall / sum of passes | img/s / step |",
              "|---" * 15 + "|"]
    for name, r in runs.items():
        ref = step_img_s(step, r["batch"], r["step_mode"])
        p = r["pass_s"]
        rest = statistics.median(p[1:]) if len(p) > 1 else None
        lines.append(
            f"| {name} | {r['algorithm']} | {r['N']}{' (simulated)' if r['simulated'] else ''} "
            f"| {r['world_size']} | {r['batch']} | {r['step_mode']} | {r['startup_s']:.2f} "
            f"| {len(p)} | {p[0]:.2f}, {_n(rest, '.2f')} | {r['img_s']:,.0f} | {r['final_eval_s']:.2f} "
            f"| {r['data_wait_share']:.1%} | {r['wall_s']:.2f} ({r['wall_from']}) "
            f"| {_x(r['wall_ratio'])} | {_x(r['steady_img_s'] / ref if _finite(ref) else None)} |")
    for name in missing:
        lines.append(f"{name}: no summary.json (the run did not finish)")
    for name, r in runs.items():
        lines.append(f"{name}: pass s " + ", ".join(f"{t:.3f}" for t in r["pass_s"])
                     + "; img/s " + ", ".join(f"{v:,.0f}" for v in r["pass_img_s"]))
    lines += ["", "## Targets", ""]
    for what, fig, v, want, how in targets(runs, step):
        lines.append(f"{what}: {fig} = {_x(v)} (target {want}): {how}")
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--step", required=True, help="bench_gpu_step.py --json output")
    ap.add_argument("--out", required=True, help="the text report (FILE.json beside it too)")
    ap.add_argument("runs", nargs="*", help="NAME=RUN_DIR")
    a = ap.parse_args(argv)
    try:
        with open(a.step) as f:
            step = json.load(f)
        runs, missing = {}, []
        for spec in a.runs:
            name, _, d = spec.partition("=")
            if os.path.exists(os.path.join(d, "summary.json")):
                runs[name] = run_figures(d)
            else:
                missing.append(name)
    except (OSError, ValueError, KeyError) as e:
        sys.exit(f"e2e_summary: {type(e).__name__}: {e}")
    text = render(runs, step, missing)
    with open(a.out, "w") as f:
        f.write(text)
    with open(os.path.splitext(a.out)[0] + ".json", "w") as f:
        json.dump({"runs": runs, "targets": [dict(zip(("what", "figure", "value", "target",
                                                       "verdict"), t))
                                             for t in targets(runs, step)]}, f, indent=1)
    print(text, end="")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
