#!/usr/bin/env python
"""Fine-tuning through safetensors, on data no one here made: pretrain
torchvision's ResNet-18 (`resnet18_imagenet`) on the synthetic set (5
classes), export it with `ibtmpi export --safetensors`, then train on
scikit-learn's 1,797 handwritten digits (10 classes, imported with `ibtmpi
prep folder`) from it (`model.init`: the 5-class head is initialised anew)
and from scratch, at equal passes and over several seeds: one process
(sgd), the backbone at the full and at a tenth of the rate
(`optim.backbone_lr_scale`), and ibt with N simulated workers.

Pretrained ImageNet weights cannot be downloaded here; the path is the same
for them (README, "Resume or continue a run": save torchvision's
state_dict with safetensors.torch and pass the file as model.init).

Usage: python benchmarks/finetune_demo.py [--out DIR] [--passes 5]
       [--pretrain-passes 4] [--n 3000] [--size 32] [--seeds 3] [--workers 4]
Needs scikit-learn and safetensors (the test extra has both).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_modern import IBTMPI, digits_tree  # noqa: E402

LAYERS = "model.layers=resnet18_imagenet"
BASE = ["data.batch=32", "data.split_size=256", "run.threads=1", LAYERS]


def prepared(out, size, n):
    """(synthetic set, digits set), made where missing."""
    syn = os.path.join(out, f"synth{size}-{n}")
    if not os.path.isdir(syn):
        subprocess.run(IBTMPI + ["prep", "synth", syn, "--n", str(n), "--size", str(size),
                                 "--quiet"], check=True)
    dig = os.path.join(out, f"digits{size}")
    if not os.path.isdir(dig):
        tree = os.path.join(out, "digits-png")
        if not os.path.isdir(tree):
            digits_tree(tree)
        subprocess.run(IBTMPI + ["prep", "folder", tree, dig, "--size", str(size),
                                 "--quiet"], check=True)
    return syn, dig


def train(out, name, data, sets, passes):
    """One `ibtmpi train` run in OUT/runs/NAME, its output in NAME.out;
    its test accuracy and wall seconds."""
    run = os.path.join(out, "runs", name)
    cmd = IBTMPI + ["train", "--set", f"data.path={data}", "--set", f"run.passes={passes}",
                    "--set", f"run.dir={run}", "--set", "run.resume=never",
                    "--set", "run.quiet=true"] + [a for s in sets for a in ("--set", s)]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True)
    os.makedirs(os.path.join(out, "runs"), exist_ok=True)
    with open(run + ".out", "w") as f:
        f.write(p.stdout + p.stderr)
    if p.returncode:
        raise SystemExit(f"{name}: exit {p.returncode}; its output: {run}.out")
    s = json.load(open(os.path.join(run, "summary.json")))
    return {"test_acc": s["test_acc"], "wall_s": round(time.perf_counter() - t0, 1)}


def pretrained(out, syn, passes):
    """The synthetic-set model as a safetensors file (torchvision's names)."""
    f = os.path.join(out, "pretrained.safetensors")
    if not os.path.exists(f):
        r = train(out, "pretrain", syn, BASE, passes)
        print(f"pretrained on the synthetic set: test accuracy {r['test_acc']:.4f} "
              f"after {passes:g} passes, {r['wall_s']:.0f} s", flush=True)
        subprocess.run(IBTMPI + ["export", os.path.join(out, "runs", "pretrain"),
                                 "--safetensors", f], check=True, capture_output=True)
    return f


def head_note(out, name):
    """The start line that says the head was initialised anew, if any."""
    p = os.path.join(out, "runs", name + ".out")
    for line in open(p) if os.path.exists(p) else ():
        if "initialised anew" in line:
            return line.strip()
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="finetune-demo")
    ap.add_argument("--passes", type=float, default=5)
    ap.add_argument("--pretrain-passes", type=float, default=4)
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--size", type=int, default=32)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=4)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    syn, dig = prepared(a.out, a.size, a.n)
    pre = pretrained(a.out, syn, a.pretrain_passes)
    init = f"model.init={os.path.abspath(pre)}"
    ibt = ["algorithm.name=ibt", f"run.simulate={a.workers}"]
    cases = [("scratch", "from scratch, sgd N=1", []),
             ("ft", "fine-tuned, sgd N=1", [init]),
             ("ft-bb01", "fine-tuned, sgd N=1, backbone_lr_scale 0.1",
              [init, "optim.backbone_lr_scale=0.1"]),
             (f"scratch-ibt{a.workers}", f"from scratch, ibt N={a.workers}", ibt),
             (f"ft-ibt{a.workers}", f"fine-tuned, ibt N={a.workers}", ibt + [init])]
    results = {}
    for name, _label, extra in cases:
        for s in range(a.seeds):
            run = f"{name}-s{s}"
            done = os.path.join(a.out, "runs", run + ".json")
            if os.path.exists(done):
                r = json.load(open(done))
            else:
                r = train(a.out, run, dig, BASE + extra + [f"model.seed={s}",
                                                           f"data.seed={s}"], a.passes)
                json.dump(r, open(done, "w"))
            results.setdefault(name, []).append(r)
            print(f"  {run}: test accuracy {r['test_acc']:.4f}", flush=True)
    note = head_note(a.out, "ft-s0")
    if note:
        print(f"the fine-tuning run's start line: {note}")
    print(f"\ndigits (1,797 images, 10 classes, {a.size}x{a.size}), resnet18_imagenet, "
          f"{a.passes:g} passes, {a.seeds} seeds; pretrained: {a.pretrain_passes:g} passes "
          f"on {a.n} synthetic images (5 classes)\n")
    print("| run | test accuracy (mean +- sd) | per seed | wall s (mean) |\n|---|---|---|---|")
    for name, label, _extra in cases:
        accs = [r["test_acc"] for r in results[name]]
        sd = statistics.stdev(accs) if len(accs) > 1 else 0.0
        print(f"| {label} | {statistics.mean(accs):.4f} +- {sd:.4f} | "
              f"{' / '.join(f'{x:.4f}' for x in accs)} | "
              f"{statistics.mean(r['wall_s'] for r in results[name]):.0f} |")
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
