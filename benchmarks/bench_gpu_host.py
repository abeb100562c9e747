"""The host side of the GPU training step, measured on any CPU: the
reference CNN's training step (64x64x3; gradient and SGD update) through backend.GpuOps with the CuPy
stand-in (ibtmpi/testing/fakecupy.py), its kernels and GEMMs replaced by
no-ops, so what is timed is the Python that issues the launches (ours plus
the stand-in's bookkeeping: an upper bound on ours; real CuPy adds its own
cost per launch and per matmul). Also counts the launches per step.

    python benchmarks/bench_gpu_host.py [--batches 64,256] [--steps 30]
"""
import argparse
import time

import numpy as np

from ibtmpi.testing import fakecupy


def null_matmul(a, b, out=None):
    """A GEMM that computes nothing: the right shape, from the pool."""
    fakecupy.LAUNCHES["GEMM"] += 1
    if out is not None:
        return out
    shape = np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1])
    return fakecupy.POOL.malloc(np.empty(shape, np.float32))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", default="64,256")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args(argv)
    from ibtmpi.backend import GpuOps
    from ibtmpi.model import Model
    from ibtmpi.optim import SGD
    fakecupy._Fn.__call__ = lambda self, grid, block, a: fakecupy.LAUNCHES.update([self.name])
    fakecupy.FakeCupy.matmul = staticmethod(null_matmul)
    ops = GpuOps(cp=fakecupy.FakeCupy())
    rng = np.random.default_rng(0)
    print("| batch | host us/step (median) | kernel launches/step | GEMMs/step |")
    print("|---|---|---|---|")
    runs = []
    for batch in [int(b) for b in args.batches.split(",")]:
        m = Model("reference", (3, 64, 64), 5, ops=ops)
        x = ops.asarray(rng.standard_normal((batch, 3, 64, 64)).astype(np.float32))
        opt = SGD(m.params, lr=0.01, momentum=0.9, weight_decay=5e-4, ops=ops)
        runs.append((batch, m, opt, x, rng.integers(0, 5, batch), m.new_stats(batch)))
    # every size warmed before any is timed: the process's first large
    # allocations go through mmap until glibc raises its threshold, which
    # would charge the stand-in's host memory to whichever size came first
    def step(m, opt, x, y, stats):          # a training step: gradient, update
        m.step_grad(x, y, stats)
        opt.step(m.grads)
    for batch, *a in runs:
        for _ in range(args.warmup):
            step(*a)
    for batch, *a in runs:
        fakecupy.LAUNCHES.clear()
        ts = []
        for _ in range(args.steps):
            t0 = time.perf_counter()
            step(*a)
            ts.append(time.perf_counter() - t0)
        gemms = fakecupy.LAUNCHES.pop("GEMM", 0)
        print(f"| {batch} | {np.median(ts) * 1e6:.0f} | "
              f"{sum(fakecupy.LAUNCHES.values()) / args.steps:g} | {gemms / args.steps:g} |")

if __name__ == "__main__":
    main()
