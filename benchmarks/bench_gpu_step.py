#!/usr/bin/env python
"""Training step of the reference CNN on one GPU: our CUDA kernels (via
backend.GpuOps) vs PyTorch/cuDNN fp32 (TF32 off), 64x64x3 input, batch 64
and 256, side by side; images/s, ratio (target >= 0.7x cuDNN) and peak GPU
memory. Usage: python benchmarks/bench_gpu_step.py [--json OUT.json]
"""
import argparse
import json
import time

import numpy as np


def ours(batch, steps, warmup):
    from ibtmpi.backend import GpuOps
    from ibtmpi.model import Model
    from ibtmpi.optim import SGD
    ops = GpuOps()
    cupy = ops.cp                       # the backend module is the one cupy importer
    pool = cupy.get_default_memory_pool()
    pool.free_all_blocks()
    m = Model("reference", (3, 64, 64), 5, ops=ops)
    opt = SGD(m.params, lr=0.01, momentum=0.9, weight_decay=5e-4, ops=ops)   # fused step
    rng = np.random.default_rng(0)
    x = cupy.asarray(rng.standard_normal((batch, 3, 64, 64), dtype=np.float32))
    y = rng.integers(0, 5, batch)
    peak = 0
    for i in range(warmup + steps):
        if i == warmup:
            cupy.cuda.Device().synchronize()
            t0 = time.perf_counter()
        m.loss_and_grad(x, y, lazy=True)     # as the trainer: no host sync per step
        opt.step(m.grads)
        peak = max(peak, pool.total_bytes())
    cupy.cuda.Device().synchronize()
    return batch * steps / (time.perf_counter() - t0), peak


def torch_ref(batch, steps, warmup):
    import torch
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    nn = torch.nn
    dev = torch.device("cuda")
    net = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(8192, 256), nn.ReLU(), nn.Linear(256, 5)).to(dev)
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    x = torch.randn(batch, 3, 64, 64, device=dev)
    y = torch.randint(0, 5, (batch,), device=dev)
    torch.cuda.reset_peak_memory_stats()
    for i in range(warmup + steps):
        if i == warmup:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
    torch.cuda.synchronize()
    return batch * steps / (time.perf_counter() - t0), torch.cuda.max_memory_allocated()


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batches", default="64,256", help="comma-separated batch sizes")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    rows = []
    print("| batch | ours img/s | cuDNN fp32 img/s | ours/cuDNN | ours peak MiB | torch peak MiB |")
    print("|---|---|---|---|---|---|")
    for batch in (int(b) for b in a.batches.split(",")):
        o, om = ours(batch, a.steps, a.warmup)
        try:                 # a broken PyTorch must not cost our own figures
            t, tm = torch_ref(batch, a.steps, a.warmup)
        except Exception as e:
            print(f"PyTorch/cuDNN failed at batch {batch}: {type(e).__name__}: {e}", flush=True)
            t = tm = float("nan")
        rows.append({"batch": batch, "ours_img_s": o, "torch_img_s": t, "ratio": o / t,
                     "ours_peak_mib": om / 2**20, "torch_peak_mib": tm / 2**20})
        print(f"| {batch} | {o:,.0f} | {t:,.0f} | {o / t:.2f} | {om / 2**20:.0f} | "
              f"{tm / 2**20:.0f} |", flush=True)
        if a.json:           # after each batch size: a later failure keeps these
            with open(a.json, "w") as f:
                json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
