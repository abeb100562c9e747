#!/usr/bin/env python
"""Training step of a model (--model: the reference CNN by default, or
resnet8 / resnet18 / any preset; PyTorch gets the same architecture, built
by bench_step.torch_net) on one GPU: our CUDA kernels (via backend.GpuOps)
vs PyTorch/cuDNN fp32 (TF32 off) and PyTorch with its defaults (cuDNN may
use TF32), 64x64x3 input (--size), batch 64 and 256, side by side;
images/s, ratios (target >= 0.7x cuDNN fp32) and peak GPU memory; then our
step op by op (where its time goes, for the next round of kernel work).
Usage: python benchmarks/bench_gpu_step.py [--model resnet18] [--size 64]
       [--json OUT.json]
"""
import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


# the GpuOps calls a training step makes, timed one by one in the breakdown
TIMED = ("conv2d_forward", "conv2d_backward", "maxpool_forward", "maxpool_backward",
         "relu_forward", "relu_backward", "linear_forward", "linear_backward",
         "batchnorm_forward", "batchnorm_backward", "gap_forward", "gap_backward",
         "add_relu_forward", "softmax_xent_train",
         "sgd_update", "asarray")


def breakdown(ops, step, steps):
    """Where a step's time goes: {op: [calls per step, ms per step]} of the
    outermost GpuOps calls, each between two stream synchronizes (so the
    ops run one at a time: the sum exceeds an unsynchronized step), and
    'outside the ops' (Python and the model's own array expressions)."""
    times, calls, depth = {}, {}, [0]

    def timed(name, fn):
        def call(*a, **k):
            if depth[0]:
                return fn(*a, **k)        # inside another timed op: counted there
            depth[0] += 1
            ops.synchronize()
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                ops.synchronize()
                times[name] = times.get(name, 0.0) + time.perf_counter() - t
                calls[name] = calls.get(name, 0) + 1
                depth[0] -= 1
        return call

    for name in TIMED:
        setattr(ops, name, timed(name, getattr(ops, name)))
    try:
        ops.synchronize()
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        ops.synchronize()
        total = time.perf_counter() - t0
    finally:
        for name in TIMED:
            delattr(ops, name)
    out = {n: [calls[n] / steps, 1e3 * times[n] / steps] for n in sorted(times, key=times.get,
                                                                         reverse=True)}
    out["outside the ops"] = [0, 1e3 * (total - sum(times.values())) / steps]
    out["step (synchronized)"] = [0, 1e3 * total / steps]
    return out


def ours(batch, steps, warmup, split=False, model="reference", size=64):
    from ibtmpi.backend import GpuOps
    from ibtmpi.model import Model
    from ibtmpi.optim import SGD
    ops = GpuOps()
    cupy = ops.cp                       # the backend module is the one cupy importer
    pool = cupy.get_default_memory_pool()
    pool.free_all_blocks()
    m = Model(model, (3, size, size), 5, ops=ops)
    opt = SGD(m.params, lr=0.01, momentum=0.9, weight_decay=5e-4, ops=ops)   # fused step
    rng = np.random.default_rng(0)
    x = cupy.asarray(rng.standard_normal((batch, 3, size, size), dtype=np.float32))
    y = rng.integers(0, 5, batch)
    peak = 0

    stats = m.new_stats(batch)

    def step():
        m.step_grad(x, y, stats)             # as the trainer: no host sync per step
        opt.step(m.grads)

    for i in range(warmup + steps):
        if i == warmup:
            cupy.cuda.Device().synchronize()
            t0 = time.perf_counter()
        step()
        peak = max(peak, pool.total_bytes())
    cupy.cuda.Device().synchronize()
    img_s = batch * steps / (time.perf_counter() - t0)
    return img_s, peak, (breakdown(ops, step, steps) if split else None)


def torch_ref(batch, steps, warmup, model="reference", size=64, fp32=True):
    """PyTorch's step on the same architecture: fp32 (TF32 off), or with
    PyTorch's defaults (fp32=False: cuDNN may use TF32)."""
    import torch
    from bench_step import torch_net
    torch.backends.cudnn.benchmark = True
    defaults = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    if fp32:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    try:
        return _torch_steps(torch, torch_net(model, (3, size, size), 5), batch, steps,
                            warmup, size)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = defaults


def _torch_steps(torch, net, batch, steps, warmup, size):
    nn = torch.nn
    dev = torch.device("cuda")
    net = net.to(dev)
    net.train()
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    x = torch.randn(batch, 3, size, size, device=dev)
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
    ap.add_argument("--model", default="reference", help="a preset: reference, resnet8, ...")
    ap.add_argument("--size", type=int, default=64, help="input height and width")
    ap.add_argument("--no-breakdown", dest="breakdown", action="store_false",
                    help="skip the per-op timing of our step")
    a = ap.parse_args(argv)
    rows, splits = [], []
    print(f"model {a.model}, input {a.size}x{a.size}x3")
    print("| batch | ours img/s | cuDNN fp32 img/s | ours/cuDNN | PyTorch defaults img/s | "
          "ours/defaults | ours peak MiB | torch peak MiB |")
    print("|---|---|---|---|---|---|---|---|")
    for batch in (int(b) for b in a.batches.split(",")):
        o, om, split = ours(batch, a.steps, a.warmup, a.breakdown, a.model, a.size)
        res = {}
        for fp32 in (True, False):
            try:             # a broken PyTorch must not cost our own figures
                res[fp32] = torch_ref(batch, a.steps, a.warmup, a.model, a.size, fp32)
            except Exception as e:
                print(f"PyTorch ({'fp32' if fp32 else 'defaults'}) failed at batch {batch}: "
                      f"{type(e).__name__}: {e}", flush=True)
                res[fp32] = (float("nan"), float("nan"))
        (t, tm), (td, _) = res[True], res[False]
        rows.append({"model": a.model, "size": a.size, "batch": batch, "ours_img_s": o,
                     "torch_img_s": t, "ratio": o / t, "torch_defaults_img_s": td,
                     "ratio_defaults": o / td,
                     "ours_peak_mib": om / 2**20, "torch_peak_mib": tm / 2**20,
                     "ours_ms_per_op": split})
        splits.append((batch, split))
        print(f"| {batch} | {o:,.0f} | {t:,.0f} | {o / t:.2f} | {td:,.0f} | {o / td:.2f} | "
              f"{om / 2**20:.0f} | {tm / 2**20:.0f} |", flush=True)
        if a.json:           # after each batch size: a later failure keeps these
            with open(a.json, "w") as f:
                json.dump(rows, f, indent=1)

    for batch, split in splits if a.breakdown else ():
        print(f"\nour step at batch {batch}, op by op (each between stream synchronizes):")
        print("| op | calls/step | ms/step |")
        print("|---|---|---|")
        for name, (calls, ms) in split.items():
            print(f"| {name} | {calls:g} | {ms:.3f} |")


if __name__ == "__main__":
    main()
