"""The trainer's device path (--device gpu) run on the CPU through the CuPy
stand-in: workers compute with the CUDA kernels (host-emulated), the
consensus stays on the host; z must match the NumPy-backend run."""
import numpy as np
import pytest
from ibtmpi.testing.fakecupy import FakeCupy

from ibtmpi.backend import GpuOps
from ibtmpi.config import load
from ibtmpi.train import Trainer


def device_vs_host(data, tmp_path, algo, ops, tol, layers="tiny", extra=()):
    """Half a pass of `algo` with 2 simulated workers on `ops` and on the
    NumPy backend: z must agree to `tol` (also run on a real GPU by
    tests/gpu/test_gpu_trainer.py)."""
    def cfg(d):
        return load(None, [f"data.path={data}", f"algorithm.name={algo}",
                           "data.split_size=40", "data.batch=16", f"model.layers={layers}",
                           "run.passes=0.5", "run.quiet=true", f"run.dir={d}",
                           "run.simulate=2", "run.threads=1", *extra])
    host = Trainer(cfg(tmp_path / "h"), log=lambda m: None)
    host.run()
    dev = Trainer(cfg(tmp_path / "d"), log=lambda m: None, device_ops=ops)
    dev.run()
    err = float(np.abs(dev.z - host.z).max() / max(1.0, np.abs(host.z).max()))
    assert err < tol, err
    assert dev.summary["test_acc"] == pytest.approx(host.summary["test_acc"], abs=0.05)
    if host.zbuf.size:                   # BatchNorm's running statistics
        np.testing.assert_allclose(dev.zbuf, host.zbuf, rtol=tol * 10, atol=tol * 10)


@pytest.mark.parametrize("algo", ["admm", "ibt", "easgd", "ssgd"])
def test_device_path_matches_host_backend(small_dataset, tmp_path, algo):
    device_vs_host(small_dataset, tmp_path, algo, GpuOps(cp=FakeCupy()), 1e-4)


@pytest.mark.parametrize("algo", ["ibt", "ssgd"])
def test_device_path_of_resnet8_matches_host_backend(small_dataset, tmp_path, algo):
    """BatchNorm, residual blocks and GAP through the kernels: z and the
    running statistics agree with the NumPy engine. One step's gradients
    agree to 1e-7 (test_launchers_host.py); over ssgd's steps the runs
    drift further than the tiny model's because BatchNorm centres every
    pre-activation on the ReLU's kink: a last-bit difference in a sum
    flips a few of them, and each flip changes a gradient entry by O(1)
    (float32 against float64 NumPy shows the same, measured 6e-3 on one
    batch of 8)."""
    # AdamW moves every weight by about lr whatever its gradient's size, so
    # a weight whose gradient is rounding noise moves by a noise-signed lr
    device_vs_host(small_dataset, tmp_path, algo, GpuOps(cp=FakeCupy()), 2e-3, "resnet8",
                   # the command: resnet8 with inner AdamW
                   extra=["optim.name=adamw", "optim.lr=0.003"] if algo == "ibt" else [])


@pytest.mark.parametrize("name", ["adam", "adamw"])
def test_device_path_with_adam_matches_host_backend(small_dataset, tmp_path, name):
    """Adam/AdamW on the device path: m and v on the device, the step count
    on the host, swapped between the two simulated workers each block."""
    device_vs_host(small_dataset, tmp_path, "ibt", GpuOps(cp=FakeCupy()), 1e-4,
                   extra=[f"optim.name={name}", "optim.lr=3e-3", "optim.weight_decay=0.01"])


def test_block_steps_never_read_the_loss_back_per_step(small_dataset, tmp_path):
    """A worker's local steps keep loss and correct count on the device
    (Model.step_grad); the eager launcher, which copies the
    loss to the host and so waits for the GPU every step, is not called
    during a block. The per-pass train loss still matches the host run."""
    import json

    def cfg(d):
        return load(None, [f"data.path={small_dataset}", "algorithm.name=ibt",
                           "data.split_size=40", "data.batch=16", "model.layers=tiny",
                           "run.passes=1", "run.quiet=true", f"run.dir={d}",
                           "run.simulate=2", "run.threads=1",
                           "run.eval_device=cpu"])   # evaluation reads its loss: not a step
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


def test_step_grad_is_loss_and_grad_without_reading_back():
    """step_grad (one launch for the loss end, stats left on the device)
    gives loss_and_grad's gradient bit for bit, and its stats read at the
    end are the eager losses and counts summed; on the host the same API
    gives the same sums."""
    from ibtmpi.model import Model
    ops = GpuOps(cp=FakeCupy())
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal((n, 3, 16, 16)).astype(np.float32) for n in (8, 8, 5)]
    ys = [rng.integers(0, 5, len(x)) for x in xs]
    for dev in (True, False):
        m = Model("tiny", (3, 16, 16), 5, ops=ops if dev else None)
        stats = m.new_stats(8)
        loss_sum, correct = 0.0, 0
        for x, y in zip(xs, ys):
            loss, c = m.loss_and_grad(x, y)
            g = np.array(m.grads)
            assert isinstance(loss, float) and isinstance(c, int)
            loss_sum, correct = loss_sum + loss * len(y), correct + c
            m.step_grad(x, y, stats)
            assert np.array_equal(np.array(m.grads), g)
        assert isinstance(stats, ops.cp.ndarray) == dev
        got = m.read_stats(stats)
        assert got[1] == correct and got[0] == pytest.approx(loss_sum, rel=1e-6)
    with pytest.raises(ValueError, match=r"\(2, >= 8\) float64"):
        Model("tiny", (3, 16, 16), 5, ops=ops).step_grad(xs[0], ys[0], ops.cp.zeros((2, 4)))


@pytest.mark.parametrize("where", ["auto", "cpu"])
def test_eval_device_auto_evaluates_on_the_workers_gpu(small_dataset, tmp_path, where):
    """run.eval_device: a one-process GPU run evaluates z on its GPU under
    auto (the stand-in plays it), on the host under cpu; the evaluations
    agree with the host run's to float32 rounding, and model-best.npz is
    written from the device model."""
    def cfg(d, *more):
        return load(None, [f"data.path={small_dataset}", "algorithm.name=ibt",
                           "data.split_size=40", "data.batch=16", "model.layers=resnet8",
                           "run.passes=1", "run.quiet=true", f"run.dir={d}",
                           "run.simulate=2", "run.threads=1", "run.eval_every=2",
                           "run.keep_best=true", *more])
    host = Trainer(cfg(tmp_path / "h"), log=lambda m: None)
    host.run()
    dev = Trainer(cfg(tmp_path / "d", f"run.eval_device={where}"), log=lambda m: None,
                  device_ops=GpuOps(cp=FakeCupy()))
    assert (dev.evaluator.eval_model.device_ops is not None) == (where == "auto")
    dev.run()
    hv = [(h["block"], h["val_loss"]) for h in host.history if "val_loss" in h]
    dv = [(h["block"], h["val_loss"]) for h in dev.history if "val_loss" in h]
    assert [b for b, _ in hv] == [b for b, _ in dv] and len(hv) >= 2
    np.testing.assert_allclose([v for _, v in dv], [v for _, v in hv], rtol=2e-3)
    assert (tmp_path / "d" / "model-best.npz").exists()


def test_eval_device_gpu_without_one_is_refused(small_dataset, tmp_path):
    from ibtmpi.config import ConfigError
    c = load(None, [f"data.path={small_dataset}", "model.layers=tiny", "run.quiet=true",
                    f"run.dir={tmp_path / 'r'}", "run.eval_device=gpu"])
    with pytest.raises(ConfigError, match="run.eval_device = gpu, but the evaluating rank"):
        Trainer(c, log=lambda m: None)
    with pytest.raises(ConfigError, match="run.eval_device must be auto, cpu or gpu"):
        load(None, [f"data.path={small_dataset}", "run.eval_device=tpu"])


@pytest.mark.parametrize("dt", ["uint8", "uint16"])
def test_gpu_workers_upload_uint8_minibatches(small_dataset, tmp_path, dt):
    """GPU workers get their minibatches as the stored uint8 images (a
    quarter of the float32 bytes to upload; uint16 for 16-bit bands, with
    the augmentation on the device too) and normalise them on the device:
    every local step's batch goes through normalize_u8 (normalize_u16[_aug]
    for uint16), and the run equals the one whose minibatches were
    augmented and normalised on the host (bit for bit: the kernel is
    data.normalize's arithmetic)."""
    from ibtmpi.testing.data16 import uint16_copy
    data = small_dataset if dt == "uint8" else uint16_copy(small_dataset, tmp_path / "d16")
    aug = ["data.augment=true"] if dt == "uint16" else []
    ops = GpuOps(cp=FakeCupy())
    calls = []
    real = ops.normalize_u8
    ops.normalize_u8 = lambda x, *a, **k: (calls.append(x.dtype), real(x, *a, **k))[1]
    c = load(None, [f"data.path={data}", "algorithm.name=ibt", "data.split_size=40",
                    "data.batch=16", "model.layers=tiny", "run.passes=0.5", "run.quiet=true",
                    f"run.dir={tmp_path / 'u8'}", "run.simulate=2", "run.threads=1",
                    "run.eval_device=cpu", "run.cuda_graphs=off"] + aug)   # every step from Python
    t = Trainer(c, log=lambda m: None, device_ops=ops)
    assert all(ld.raw for ld in t.workers.loaders.values())
    t.run()
    steps = sum(len(mb) for ld in t.workers.loaders.values() for mb in [ld.load(0, 0)])
    assert calls and set(calls) == {np.dtype(dt)} and len(calls) >= steps
    c2 = load(None, [f"data.path={data}", "algorithm.name=ibt", "data.split_size=40",
                     "data.batch=16", "model.layers=tiny", "run.passes=0.5", "run.quiet=true",
                     f"run.dir={tmp_path / 'f32'}", "run.simulate=2", "run.threads=1",
                     "run.eval_device=cpu"] + aug)
    t2 = Trainer(c2, log=lambda m: None, device_ops=GpuOps(cp=FakeCupy()))
    for ld in t2.workers.loaders.values():
        ld.raw = False                       # the float32 batches of before
        ld.device_aug = False                # (augmented on the host)
        ld.stage = None                      # (host batches, not through the feed)
    t2.run()
    assert t.z.tobytes() == t2.z.tobytes()
    if dt == "uint16":                       # and it trained on the low bits too
        assert t.ds.dtype == np.uint16 and t.workers.feeds[0].slots[0].x.dtype == np.uint16


def test_master_device_is_validated_and_one_process_keeps_the_host_state(small_dataset,
                                                                          tmp_path):
    """run.master_device: a bad value is one line; a process with workers
    (here two simulated ones) keeps its consensus state on the host
    whatever it says, so gpu is not refused there and z is the host's."""
    from ibtmpi.config import ConfigError
    with pytest.raises(ConfigError, match=r"^run.master_device must be auto, cpu or gpu, "
                                          r"got 'tpu' \(did you mean 'gpu'\?\)$"):
        load(None, [f"data.path={small_dataset}", "run.master_device=tpu"])
    ops = GpuOps(cp=FakeCupy())
    zs = []
    for where in ("gpu", "cpu"):
        t = Trainer(load(None, [f"data.path={small_dataset}", "model.layers=tiny",
                                "data.split_size=40", "data.batch=16", "run.passes=0.25",
                                "run.quiet=true", f"run.dir={tmp_path / where}",
                                "run.simulate=2", "run.threads=1",
                                f"run.master_device={where}"]),
                    log=lambda m: None, device_ops=ops, master_ops=ops)
        assert not t.device_state and t.sdev is None and type(t.cons.z) is np.ndarray
        t.run()
        assert t.summary["master_consensus"] == "cpu"
        zs.append(t.z.tobytes())
    assert zs[0] == zs[1]
