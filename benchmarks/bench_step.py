#!/usr/bin/env python
"""Training-step throughput of the NumPy engine vs PyTorch CPU, side by side.

One training step = forward + backward + SGD-momentum update of a model
(--model: the reference CNN by default, or resnet8 / resnet18 / any preset:
PyTorch gets the same architecture, built layer by layer from our spec by
torch_net) at batch 64 (configurable), for 64x64x3 and 32x32x3 inputs, at
1 and 2 BLAS threads. Each (engine, size, threads) measurement runs in its own
subprocess (so peak RSS is per engine); every repetition measures sgemm,
ours and PyTorch back to back, so machine noise hits all three alike. The
ratio and the sgemm share are medians of the per-repetition values (with
their min-max range); images/s are medians. GFLOP/s counts the FLOPs from
the layer shapes; sgemm is a 1024^3 single-precision GEMM at the same
thread count.

Usage: python benchmarks/bench_step.py [--model reference] [--reps 3] [--steps 10]
       [--sizes 64,32] [--threads 1,2] [--json out.json]
Needs the 'bench' extra (torch==2.13.0, CPU build) for the PyTorch column.
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time


def torch_net(spec, input_shape, n_classes):
    """The PyTorch twin of our model spec (layers in the same order, convs
    with or without bias as ours, BatchNorm2d with our momentum and eps,
    residual basic blocks as torchvision's), for side-by-side timing."""
    import torch
    from ibtmpi.layers import (AvgPool2d, BatchNorm2d, Conv2d, Dropout, Flatten,
                               GlobalAvgPool, Linear, MaxPool2d, ReLU, Residual)
    from ibtmpi.model import build_layers
    nn = torch.nn

    def twin(layer):
        if isinstance(layer, Conv2d):
            return nn.Conv2d(layer.in_ch, layer.out_ch, layer.k, layer.stride, layer.pad,
                             bias=layer.has_bias)
        if isinstance(layer, BatchNorm2d):
            return nn.BatchNorm2d(layer.channels, layer.eps, layer.momentum)
        if isinstance(layer, ReLU):
            return nn.ReLU(inplace=True)
        if isinstance(layer, MaxPool2d):
            return nn.MaxPool2d(layer.k, layer.stride, layer.pad)
        if isinstance(layer, AvgPool2d):
            return nn.AvgPool2d(layer.k, layer.stride)
        if isinstance(layer, GlobalAvgPool):
            return nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten())
        if isinstance(layer, Flatten):
            return nn.Flatten()
        if isinstance(layer, Linear):
            return nn.Linear(layer.in_features, layer.out_features)
        if isinstance(layer, Dropout):
            return nn.Dropout(layer.p)
        if isinstance(layer, Residual):
            return _Block(nn.Sequential(*map(twin, layer.main)),
                          nn.Sequential(*map(twin, layer.short)))
        raise ValueError(f"no PyTorch twin for {layer.describe()}")

    class _Block(nn.Module):
        def __init__(self, main, short):
            super().__init__()
            self.main, self.short = main, short

        def forward(self, x):
            return torch.relu(self.main(x) + self.short(x))
    layers, _ = build_layers(spec, input_shape, n_classes)
    return nn.Sequential(*map(twin, layers))


def _worker(engine, size, threads, batch, steps, warmup, spec="reference"):
    """Runs in a subprocess: prints one JSON line with img/s and peak RSS."""
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    import numpy as np
    from threadpoolctl import threadpool_limits
    from ibtmpi.model import Model
    from ibtmpi.optim import SGD
    threadpool_limits(threads)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, 3, size, size), dtype=np.float32)
    y = rng.integers(0, 5, batch)
    model = Model(spec, (3, size, size), 5, seed=0)
    if engine == "ours":
        opt = SGD(model.params, lr=0.01, momentum=0.9, weight_decay=5e-4)

        def step():
            model.loss_and_grad(x, y)
            opt.step(model.grads)
    else:
        import torch
        torch.set_num_threads(threads)
        nn = torch.nn
        net = torch_net(spec, (3, size, size), 5)
        net.train()
        opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9,
                              weight_decay=5e-4)
        tx, ty = torch.from_numpy(x), torch.from_numpy(y)

        def step():
            opt.zero_grad(set_to_none=False)
            nn.functional.cross_entropy(net(tx), ty).backward()
            opt.step()
    for _ in range(warmup):
        step()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    dt = time.perf_counter() - t0
    print(json.dumps({
        "img_s": batch * steps / dt,
        "flops_per_img": model.train_flops_per_sample(),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }))


def _sgemm(threads, n=1024, reps=5):
    import numpy as np
    from threadpoolctl import threadpool_limits
    a = np.random.default_rng(0).random((n, n), dtype=np.float32)
    b = a.copy()
    with threadpool_limits(threads):
        a @ b
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            a @ b
            times.append(time.perf_counter() - t0)
    return 2 * n ** 3 / statistics.median(times) / 1e9


def _run(engine, size, threads, args):
    cmd = [sys.executable, __file__, "--worker", engine, str(size),
           str(threads), str(args.batch), str(args.steps), str(args.warmup), args.model]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--sizes", default="64,32")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--model", default="reference",
                    help="a preset (reference, resnet8, resnet18, ...)")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--worker", nargs=7, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        e, s, t, b, n, w, m = args.worker
        return _worker(e, int(s), int(t), int(b), int(n), int(w), m)
    engines = ["ours"] if args.no_torch else ["ours", "torch"]
    sizes = [int(s) for s in args.sizes.split(",")]
    threads = [int(t) for t in args.threads.split(",")]
    rows = []
    for size in sizes:
        for t in threads:
            res = {e: [] for e in engines}
            sgemm = []
            for _ in range(args.reps):
                sgemm.append(_sgemm(t))
                for e in engines:      # back to back: noise hits all alike
                    res[e].append(_run(e, size, t, args))
            fl = res["ours"][0]["flops_per_img"]
            shares = [r["img_s"] * fl / 1e9 / g for r, g in zip(res["ours"], sgemm)]
            row = {"model": args.model, "size": size, "threads": t, "batch": args.batch,
                   "reps": args.reps,
                   "sgemm_gflops": statistics.median(sgemm),
                   "sgemm_share": statistics.median(shares),
                   "sgemm_share_range": [min(shares), max(shares)]}
            for e in engines:
                row[e + "_img_s"] = statistics.median(r["img_s"] for r in res[e])
                row[e + "_rss_mib"] = max(r["peak_rss_mib"] for r in res[e])
            row["gflops"] = row["ours_img_s"] * fl / 1e9
            if "torch" in engines:
                ratios = [a["img_s"] / b["img_s"] for a, b in zip(res["ours"], res["torch"])]
                row["ratio"] = statistics.median(ratios)
                row["ratio_range"] = [min(ratios), max(ratios)]
            rows.append(row)
            print(_fmt(row, "torch" in engines), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "python": sys.version.split()[0]}, f,
                      indent=1)


_header_printed = False


def _fmt(r, torch):
    global _header_printed
    head = ""
    if not _header_printed:
        _header_printed = True
        head = ("| model | input | threads | ours img/s | torch img/s | ours/torch (range) | "
                "GFLOP/s | sgemm GFLOP/s | share (range) | ours RSS MiB | torch RSS MiB |\n"
                "|---|---|---|---|---|---|---|---|---|---|---|\n")
    t = (f"{r['torch_img_s']:.1f} | {r['ratio']:.2f} ({r['ratio_range'][0]:.2f}-"
         f"{r['ratio_range'][1]:.2f})" if torch else "- | -")
    tr = f"{r['torch_rss_mib']:.0f}" if torch else "-"
    lo, hi = r["sgemm_share_range"]
    return (head + f"| {r['model']} | {r['size']}x{r['size']}x3 | {r['threads']} | "
            f"{r['ours_img_s']:.1f} | {t} | {r['gflops']:.1f} | "
            f"{r['sgemm_gflops']:.1f} | {r['sgemm_share']:.0%} ({lo:.0%}-{hi:.0%}) | "
            f"{r['ours_rss_mib']:.0f} | {tr} |")


if __name__ == "__main__":
    main()
