"""A GPU worker's pipeline on a real GPU: CUDA graphs of the step bitwise
the launched step, the feed (pinned slots, a copy stream, augmentation on
the device) bitwise the host-augmented run, and TF32's deviation. Skipped
where CuPy or a device is missing (CI runs this file on the CuPy stand-in:
test_gpu_suite_on_stand_in.py). Run: pytest -m gpu tests/gpu"""
import os
import sys

import numpy as np
import pytest

from ibtmpi import backend

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "unit"))
import conftest as _unit  # noqa: E402

small_dataset = _unit.small_dataset     # the unit suite's data set fixture

OK, WHY = backend.gpu_status()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not OK, reason=f"no GPU: {WHY}")]
RNG = np.random.default_rng(5)


def _model(g, spec):
    from ibtmpi.model import Model
    m = Model(spec, (3, 16, 16), 5, ops=g, seed=2)
    m.set_input_norm(np.array([120.0, 110, 100]), np.array([60.0, 55, 50]))
    return m


@pytest.mark.parametrize("spec", ["reference", "resnet8"])
def test_graph_replay_equals_launched_steps_bitwise(spec):
    g = backend.GpuOps()
    a, b = _model(g, spec), _model(g, spec)
    a.use_graphs("on")
    sa, sb = a.new_stats(32), b.new_stats(32)
    for k in (32, 32, 32, 32, 7, 7, 7):
        x = RNG.integers(0, 256, (k, 16, 16, 3)).astype(np.uint8)
        y = RNG.integers(0, 5, k)
        ids = RNG.integers(0, 8, k).astype(np.int32)
        a.step_grad(x, y, sa, ids)
        b.step_grad(x, y, sb, ids)
        assert g.asnumpy(a.grads).tobytes() == g.asnumpy(b.grads).tobytes()
        assert g.asnumpy(a.buffers).tobytes() == g.asnumpy(b.buffers).tobytes()
    assert a.read_stats(sa) == b.read_stats(sb)
    assert a.graphs.captures == 2 and a.graphs.replays == 5


def test_feed_and_graphs_run_equals_host_augmented_run(small_dataset, tmp_path):
    from ibtmpi.config import load
    from ibtmpi.train import Trainer

    def cfg(name, *extra):
        return load(None, [f"data.path={small_dataset}", "algorithm.name=ibt", "data.split_size=40",
                           "data.batch=16", "model.layers=tiny", "run.passes=1",
                           "run.quiet=true", f"run.dir={tmp_path / name}", "run.simulate=2",
                           "run.threads=1", "data.augment=true", *extra])
    t = Trainer(cfg("a"), log=lambda m: None, device_ops=backend.GpuOps())
    t.run()
    assert t.model.graphs.replays > 0 and all(f.uploads for f in t.workers.feeds.values())
    t2 = Trainer(cfg("b", "run.cuda_graphs=off"), log=lambda m: None,
                 device_ops=backend.GpuOps())
    for ld in t2.workers.loaders.values():
        ld.raw = ld.device_aug = False
        ld.stage = None
    t2.run()
    assert t.z.tobytes() == t2.z.tobytes()


def test_tf32_moves_a_step_by_little():
    from ibtmpi.gpu_graphs import set_gpu_math
    g = backend.GpuOps()
    x = RNG.integers(0, 256, (32, 16, 16, 3)).astype(np.uint8)
    y = RNG.integers(0, 5, 32)
    out = {}
    try:
        for math in ("fp32", "tf32"):
            set_gpu_math(g.cp, math)
            m = _model(g, "reference")
            m.step_grad(x, y, m.new_stats(32))
            out[math] = g.asnumpy(m.grads).copy()
    finally:
        set_gpu_math(g.cp, "fp32")
    dev = np.abs(out["tf32"] - out["fp32"]).max() / np.abs(out["fp32"]).max()
    print(f"tf32: the step's gradients deviate from fp32 by {dev:.2e} (max, relative)")
    assert dev < 5e-2          # the stand-in's emulation: about 1e-2 for this net
