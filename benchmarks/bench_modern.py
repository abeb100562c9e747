#!/usr/bin/env python
"""Modern CNNs and optimizers side by side, at equal passes: test accuracy
(and time) of the reference CNN vs resnet8, one process (sgd) and ibt with
N simulated workers, on the synthetic set and on a real image tree nobody
here drew (scikit-learn's 1,797 handwritten digits, 8x8 grey, written out
as PNG files by class and imported with `ibtmpi prep folder`); then ibt
with inner AdamW vs inner SGD and the DiLoCo example (bmuf, inner AdamW,
outer Nesterov) at N = 8. Every run is `ibtmpi train` with the same data,
passes, batch and seed; figures come from each run's summary.json.

Usage: python benchmarks/bench_modern.py [--out DIR] [--passes 4] [--n 6000]
       [--size 32] [--parts synth,digits,optim]
The digits part needs scikit-learn (pip install scikit-learn).
"""
import argparse
import json
import os
import subprocess
import sys
import time

IBTMPI = [sys.executable, "-m", "ibtmpi"]


def train(out, name, data, sets, passes):
    run = os.path.join(out, "runs", name)
    cmd = IBTMPI + ["train", "--quiet", "--set", f"data.path={data}",
                    "--set", f"run.passes={passes}", "--set", f"run.dir={run}",
                    "--set", "run.resume=never"] + [a for s in sets for a in ("--set", s)]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode:
        print(p.stdout[-2000:], p.stderr[-2000:], file=sys.stderr)
        raise SystemExit(f"{name}: exit {p.returncode}")
    s = json.load(open(os.path.join(run, "summary.json")))
    return {"run": name, "test_acc": s.get("test_acc"), "val_acc": s.get("val_acc"),
            "wall_s": round(wall, 1), "passes": passes}


def digits_tree(root):
    """scikit-learn's handwritten digits as a folder tree of PNG files."""
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_digits
    d = load_digits()
    for i, (img, y) in enumerate(zip(d.images, d.target)):
        cls = os.path.join(root, f"digit{y}")
        os.makedirs(cls, exist_ok=True)
        Image.fromarray((img * (255 / 16)).astype(np.uint8), "L").save(
            os.path.join(cls, f"{i:04d}.png"))
    return len(d.images)


def row(r, label):
    return (f"| {label} | {r['passes']:g} | {r['test_acc']:.4f} | "
            f"{r['val_acc'] if r['val_acc'] is None else round(r['val_acc'], 4)} | "
            f"{r['wall_s']:.1f} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="bench-modern")
    ap.add_argument("--passes", type=float, default=4)
    ap.add_argument("--n", type=int, default=6000)
    ap.add_argument("--size", type=int, default=32)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--parts", default="synth,digits,optim")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    parts = a.parts.split(",")
    results = []
    head = "| run | passes | test acc | val acc | wall s |\n|---|---|---|---|---|"
    print(head, flush=True)
    base = ["data.batch=32", "data.split_size=256", "run.threads=1"]
    sets = {}
    if "synth" in parts:
        data = os.path.join(a.out, f"synth{a.size}-{a.n}")
        if not os.path.isdir(data):
            subprocess.run(IBTMPI + ["prep", "synth", data, "--n", str(a.n), "--size",
                                     str(a.size), "--quiet"], check=True)
        sets["synth"] = data
    if "digits" in parts:
        data = os.path.join(a.out, "digits16")
        if not os.path.isdir(data):
            tree = os.path.join(a.out, "digits-png")
            digits_tree(tree)
            subprocess.run(IBTMPI + ["prep", "folder", tree, data, "--size", "16",
                                     "--quiet"], check=True)
        sets["digits"] = data
    for tag, data in sets.items():
        for model in ("reference", "resnet8"):
            for algo, n in (("sgd", 1), ("ibt", a.workers)):
                sim = [f"run.simulate={n}"] if n > 1 else []
                r = train(a.out, f"{tag}-{model}-{algo}{n}", data,
                          base + [f"model.layers={model}", f"algorithm.name={algo}"] + sim,
                          a.passes)
                results.append(r)
                print(row(r, f"{tag}: {model}, {algo} N={n}"), flush=True)
    if "optim" in parts:
        data = sets.get("synth")
        if data is None:
            raise SystemExit("the optim part runs on the synthetic set: add synth to --parts")
        runs = [("ibt-sgd", "ibt, inner SGD (lr 0.01, momentum 0.9)", ["algorithm.name=ibt"]),
                ("ibt-adamw", "ibt, inner AdamW (lr 1e-3, wd 0.01)",
                 ["algorithm.name=ibt", "optim.name=adamw", "optim.lr=0.001",
                  "optim.weight_decay=0.01"]),
                ("diloco", "DiLoCo example (bmuf, inner AdamW, outer Nesterov 0.7/0.9)",
                 _diloco_sets())]
        for name, label, extra in runs:
            r = train(a.out, f"optim-{name}", data,
                      base + ["model.layers=resnet8", "run.simulate=8"] + extra, a.passes)
            results.append(r)
            print(row(r, f"synth: resnet8 N=8, {label}"), flush=True)
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)


def _diloco_sets():
    """The settings of examples/diloco.toml as --set arguments (the data,
    passes and run keys come from this benchmark)."""
    import tomllib
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "..", "examples", "diloco.toml"), "rb") as f:
        cfg = tomllib.load(f)
    out = []
    for sec in ("algorithm", "optim"):
        for k, v in cfg.get(sec, {}).items():
            out.append(f"{sec}.{k}={json.dumps(v) if not isinstance(v, str) else v}")
    return out


if __name__ == "__main__":
    main()
