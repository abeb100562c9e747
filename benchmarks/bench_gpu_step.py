#!/usr/bin/env python
"""Training step of a model (--model: the reference CNN by default, or
resnet8 / resnet18 / any preset; PyTorch gets the same architecture, built
by bench_step.torch_net) on one GPU: our CUDA kernels (via backend.GpuOps)
vs PyTorch/cuDNN fp32 (TF32 off) and PyTorch with its defaults (cuDNN may
use TF32), 64x64x3 input (--size), batch 32, 64 and 256, side by side;
images/s, ratios (target >= 0.7x cuDNN fp32) and peak GPU memory; with
--graphs and --gpu-math tf32 also our step replayed from CUDA graphs and
under TF32 GEMMs (and the TF32 gradients' deviation from fp32); then our
step op by op (where its time goes, for the next round of kernel work).
Usage: python benchmarks/bench_gpu_step.py [--model resnet18] [--size 64]
       [--graphs] [--gpu-math tf32] [--json OUT.json]
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


def ours(batch, steps, warmup, split=False, model="reference", size=64, mode="fp32"):
    """Our step in a mode (MODES): Model.step_grad + the fused SGD update, as
    the trainer runs it (labels on the device, no host sync per step);
    graphs: Model.use_graphs("on"), the first step ordinary, the second
    captured, the timed ones replayed (at least 2 warm-up steps); tf32:
    set_gpu_math(cp, "tf32") for the step (fp32 again after)."""
    from ibtmpi.backend import GpuOps
    from ibtmpi.gpu_graphs import set_gpu_math
    from ibtmpi.model import Model
    from ibtmpi.optim import SGD
    ops = GpuOps()
    cupy = ops.cp                       # the backend module is the one cupy importer
    pool = cupy.get_default_memory_pool()
    pool.free_all_blocks()
    m = Model(model, (3, size, size), 5, ops=ops)
    graphs = m.use_graphs("on") if "graphs" in mode else None
    warmup = max(warmup, 2) if graphs else warmup
    opt = SGD(m.params, lr=0.01, momentum=0.9, weight_decay=5e-4, ops=ops)   # fused step
    rng = np.random.default_rng(0)
    x = cupy.asarray(rng.standard_normal((batch, 3, size, size), dtype=np.float32))
    y = cupy.asarray(rng.integers(0, 5, batch))
    peak = 0

    stats = m.new_stats(batch)

    def step():
        m.step_grad(x, y, stats)             # as the trainer: no host sync per step
        opt.step(m.grads)

    set_gpu_math(cupy, "tf32" if "tf32" in mode else "fp32")
    try:
        for i in range(warmup + steps):
            if i == warmup:
                cupy.cuda.Device().synchronize()
                t0 = time.perf_counter()
            step()
            peak = max(peak, pool.total_bytes() + (graphs.pool_bytes() if graphs else 0))
        cupy.cuda.Device().synchronize()
        img_s = batch * steps / (time.perf_counter() - t0)
        if graphs is not None and graphs.replays < steps:
            raise RuntimeError(f"CUDA graphs: {graphs.replays} of {steps} timed steps replayed")
        return img_s, peak, (breakdown(ops, step, steps) if split else None)
    finally:
        set_gpu_math(cupy, "fp32")


def tf32_deviation(batch, model="reference", size=64):
    """Our step's gradients under run.gpu_math = tf32 against fp32, same
    model, same batch: max |g_tf32 - g_fp32| / max |g_fp32| (the largest
    deviation relative to the largest gradient) and the relative 2-norm of
    the difference."""
    from ibtmpi.backend import GpuOps
    from ibtmpi.gpu_graphs import set_gpu_math
    from ibtmpi.model import Model
    ops = GpuOps()
    cupy = ops.cp
    m = Model(model, (3, size, size), 5, ops=ops)
    rng = np.random.default_rng(1)
    x = cupy.asarray(rng.standard_normal((batch, 3, size, size), dtype=np.float32))
    y = cupy.asarray(rng.integers(0, 5, batch))
    grads = []
    try:
        for math in ("fp32", "tf32"):
            set_gpu_math(cupy, math)
            m.step_grad(x, y, m.new_stats(batch))
            grads.append(ops.asnumpy(m.grads).astype(np.float64))
    finally:
        set_gpu_math(cupy, "fp32")
    g, d = grads[0], grads[1] - grads[0]
    return {"max_rel": float(np.abs(d).max() / np.abs(g).max()),
            "l2_rel": float(np.linalg.norm(d) / np.linalg.norm(g))}


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


def modes(graphs, math):
    """Our step's modes to time: fp32 always (the first table), then
    --graphs and --gpu-math tf32, and both together when both are given."""
    out = ["fp32"] + (["graphs"] if graphs else []) + (["tf32"] if math == "tf32" else [])
    return out + (["graphs+tf32"] if graphs and math == "tf32" else [])


def torch_both(batch, a):
    """{fp32: (img/s, peak bytes)} of PyTorch fp32 (True) and its defaults
    (False); NaN where PyTorch fails (a broken PyTorch must not cost our
    own figures)."""
    res = {}
    for fp32 in (True, False):
        try:
            res[fp32] = torch_ref(batch, a.steps, a.warmup, a.model, a.size, fp32)
        except Exception as e:
            print(f"PyTorch ({'fp32' if fp32 else 'defaults'}) failed at batch {batch}: "
                  f"{type(e).__name__}: {e}", flush=True)
            res[fp32] = (float("nan"), float("nan"))
    return res


def print_modes(rows):
    print("\nour step's modes (graphs: Model.use_graphs('on'), the replayed steps; "
          "tf32: run.gpu_math = tf32):")
    print("| batch | mode | img/s | x ours fp32 | x cuDNN fp32 | x PyTorch defaults | peak MiB |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        for mode, m in r["modes"].items():
            print(f"| {r['batch']} | {mode} | {m['img_s']:,.0f} | {m['img_s'] / r['ours_img_s']:.2f} "
                  f"| {m['ratio']:.2f} | {m['ratio_defaults']:.2f} | {m['peak_mib']:.0f} |")
    for r in rows:
        if "tf32_grad_dev" in r:
            d = r["tf32_grad_dev"]
            print(f"batch {r['batch']}: tf32 gradients vs fp32, max |difference| / max |gradient| "
                  f"{d['max_rel']:.2e}, relative 2-norm {d['l2_rel']:.2e}")


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batches", default="32,64,256", help="comma-separated batch sizes")
    ap.add_argument("--json", help="the figures per batch (and per mode of ours) as JSON")
    ap.add_argument("--model", default="reference", help="a preset: reference, resnet8, ...")
    ap.add_argument("--size", type=int, default=64, help="input height and width")
    ap.add_argument("--no-breakdown", dest="breakdown", action="store_false",
                    help="skip the per-op timing of our step")
    ap.add_argument("--graphs", action="store_true",
                    help="also time our step replayed from CUDA graphs (Model.use_graphs)")
    ap.add_argument("--gpu-math", choices=("fp32", "tf32"), default="fp32",
                    help="tf32: also time our step under run.gpu_math = tf32 and report its "
                         "gradients' deviation from fp32")
    a = ap.parse_args(argv)
    rows, splits = [], []
    print(f"model {a.model}, input {a.size}x{a.size}x3")
    print("| batch | ours img/s | cuDNN fp32 img/s | ours/cuDNN | PyTorch defaults img/s | "
          "ours/defaults | ours peak MiB | torch peak MiB |")
    print("|---|---|---|---|---|---|---|---|")
    for batch in (int(b) for b in a.batches.split(",")):
        o, om, split = ours(batch, a.steps, a.warmup, a.breakdown, a.model, a.size)
        res = torch_both(batch, a)
        (t, tm), (td, _) = res[True], res[False]
        row = {"model": a.model, "size": a.size, "batch": batch, "ours_img_s": o,
               "torch_img_s": t, "ratio": o / t, "torch_defaults_img_s": td,
               "ratio_defaults": o / td,
               "ours_peak_mib": om / 2**20, "torch_peak_mib": tm / 2**20,
               "ours_ms_per_op": split, "modes": {}}
        for mode in modes(a.graphs, a.gpu_math):
            mo, mm, _ = (o, om, None) if mode == "fp32" else ours(
                batch, a.steps, a.warmup, False, a.model, a.size, mode)
            row["modes"][mode] = {"img_s": mo, "ratio": mo / t, "ratio_defaults": mo / td,
                                  "peak_mib": mm / 2**20}
        if a.gpu_math == "tf32":
            row["tf32_grad_dev"] = tf32_deviation(batch, a.model, a.size)
        rows.append(row)
        splits.append((batch, split))
        print(f"| {batch} | {o:,.0f} | {t:,.0f} | {o / t:.2f} | {td:,.0f} | {o / td:.2f} | "
              f"{om / 2**20:.0f} | {tm / 2**20:.0f} |", flush=True)
        if a.json:           # after each batch size: a later failure keeps these
            with open(a.json, "w") as f:
                json.dump(rows, f, indent=1)
    if len(modes(a.graphs, a.gpu_math)) > 1:
        print_modes(rows)

    for batch, split in splits if a.breakdown else ():
        print(f"\nour step at batch {batch}, op by op (each between stream synchronizes):")
        print("| op | calls/step | ms/step |")
        print("|---|---|---|")
        for name, (calls, ms) in split.items():
            print(f"| {name} | {calls:g} | {ms:.3f} |")


if __name__ == "__main__":
    main()
