"""The trainer's device path (--device gpu) run on the CPU through the CuPy
stand-in: workers compute with the CUDA kernels (host-emulated), the
consensus stays on the host; z must match the NumPy-backend run."""
import numpy as np
import pytest
from fakecupy import FakeCupy

from ibtmpi.backend import GpuOps
from ibtmpi.config import load
from ibtmpi.trainer import Trainer


def device_vs_host(data, tmp_path, algo, ops, tol):
    """Half a pass of `algo` with 2 simulated workers on `ops` and on the
    NumPy backend: z must agree to `tol` (also run on a real GPU by
    tests/gpu/test_gpu_trainer.py)."""
    def cfg(d):
        return load(None, [f"data.path={data}", f"algorithm.name={algo}",
                           "data.split_size=40", "data.batch=16", "model.layers=tiny",
                           "run.passes=0.5", "run.quiet=true", f"run.dir={d}",
                           "run.simulate=2", "run.threads=1"])
    host = Trainer(cfg(tmp_path / "h"), log=lambda m: None)
    host.run()
    dev = Trainer(cfg(tmp_path / "d"), log=lambda m: None, device_ops=ops)
    dev.run()
    err = float(np.abs(dev.z - host.z).max() / max(1.0, np.abs(host.z).max()))
    assert err < tol, err
    assert dev.summary["test_acc"] == pytest.approx(host.summary["test_acc"], abs=0.05)


@pytest.mark.parametrize("algo", ["admm", "ibt", "easgd", "ssgd"])
def test_device_path_matches_host_backend(small_dataset, tmp_path, algo):
    device_vs_host(small_dataset, tmp_path, algo, GpuOps(cp=FakeCupy()), 1e-4)


def test_block_steps_never_read_the_loss_back_per_step(small_dataset, tmp_path):
    """A worker's local steps keep loss and correct count on the device
    (Model.loss_and_grad(lazy=True)); the eager launcher, which copies the
    loss to the host and so waits for the GPU every step, is not called
    during a block. The per-pass train loss still matches the host run."""
    import json

    def cfg(d):
        return load(None, [f"data.path={small_dataset}", "algorithm.name=ibt",
                           "data.split_size=40", "data.batch=16", "model.layers=tiny",
                           "run.passes=1", "run.quiet=true", f"run.dir={d}",
                           "run.simulate=2", "run.threads=1"])
    ops = GpuOps(cp=FakeCupy())

    def eager(*a, **k):
        raise AssertionError("host read of the loss inside a block")
    ops.softmax_xent_forward = eager
    dev = Trainer(cfg(tmp_path / "d"), log=lambda m: None, device_ops=ops)
    dev.run()
    host = Trainer(cfg(tmp_path / "h"), log=lambda m: None)
    host.run()

    def losses(d):
        return [r["train_loss"] for r in map(json.loads, open(d / "metrics.jsonl"))
                if "train_loss" in r]
    ld, lh = losses(tmp_path / "d"), losses(tmp_path / "h")
    assert ld and len(ld) == len(lh)
    assert np.allclose(ld, lh, rtol=1e-4), (ld, lh)


def test_lazy_loss_and_grad_is_the_eager_one_on_the_device():
    from ibtmpi.model import Model
    ops = GpuOps(cp=FakeCupy())
    rng = np.random.default_rng(1)
    x = rng.standard_normal((8, 3, 16, 16)).astype(np.float32)
    y = rng.integers(0, 5, 8)
    m = Model("tiny", (3, 16, 16), 5, ops=ops)
    loss, c = m.loss_and_grad(x, y)
    g = np.array(m.grads)
    lz, cz = m.loss_and_grad(x, y, lazy=True)
    assert isinstance(loss, float) and isinstance(c, int)
    assert type(lz) is not float and lz.dtype == np.float64   # a device value
    assert float(lz) == loss and int(cz) == c
    assert np.array_equal(np.array(m.grads), g)
