"""A GPU worker's pipeline on the CuPy stand-in: the feed (pinned staging,
a copy stream, the augmentation on the device), CUDA graphs of the step,
and run.gpu_math. The stand-in's copy stream is lazy and its capture
records without running (ibtmpi/testing/fakecupy_async.py), so a missing wait,
an early overwrite or a host read inside a capture gives wrong numbers or
an error here, as on a GPU."""
import numpy as np
import pytest

from ibtmpi.testing import fakecupy
from ibtmpi.testing.fakecupy import FakeCupy
from ibtmpi.backend import GpuOps
from ibtmpi.config import ConfigError, load
from ibtmpi.gpu_feed import DeviceFeed
from ibtmpi.gpu_graphs import StepGraphs, set_gpu_math
from ibtmpi.model import Model
from ibtmpi.train import Trainer

RNG = np.random.default_rng(11)


def _cfg(data, tmp_path, name, *extra):
    return load(None, [f"data.path={data}", "algorithm.name=ibt", "data.split_size=40",
                       "data.batch=16", "model.layers=tiny", "run.passes=1", "run.quiet=true",
                       f"run.dir={tmp_path / name}", "run.simulate=2", "run.threads=1",
                       "run.eval_device=cpu", "data.augment=true", *extra])


def _batches(n_mb, k, shape=(8, 8, 3)):
    return [(RNG.integers(0, 256, (k,) + shape).astype(np.uint8),
             RNG.integers(0, 5, k).astype(np.int64),
             RNG.integers(0, 8, k).astype(np.int32)) for _ in range(n_mb)]


def test_feed_graphs_and_device_augmentation_equal_the_plain_device_run(small_dataset,
                                                                         tmp_path):
    """ibt, 2 simulated GPU workers, augmentation on: the run through the
    feed (pinned slots, copy stream, flips/rotations on the device) with
    the steps replayed from CUDA graphs ends at the z of the run whose
    batches were augmented and normalised on the host and launched op by
    op, bit for bit; and the feed and the graphs were really used."""
    logs = []
    t = Trainer(_cfg(small_dataset, tmp_path, "a"), log=logs.append,
                device_ops=GpuOps(cp=FakeCupy()))
    assert all(ld.device_aug and ld.stage for ld in t.workers.loaders.values())
    t.run()
    g = t.model.graphs
    assert g.captures >= 1 and g.replays > 0
    assert all(f.uploads > 0 for f in t.workers.feeds.values())
    t2 = Trainer(_cfg(small_dataset, tmp_path, "b", "run.cuda_graphs=off"),
                 log=lambda m: None, device_ops=GpuOps(cp=FakeCupy()))
    for ld in t2.workers.loaders.values():
        ld.raw = ld.device_aug = False          # host augmentation and normalisation
        ld.stage = None
    t2.run()
    assert t2.model.graphs is None
    assert t.z.tobytes() == t2.z.tobytes()
    assert not any("CUDA graphs off" in m for m in logs)


def test_feed_waits_for_each_minibatch_and_never_overwrites_a_slot_early():
    ops = GpuOps(cp=FakeCupy())
    feed = DeviceFeed(ops, 32, (8, 8, 3))
    blocks = [_batches(2, 16) for _ in range(3)]
    staged = [feed.stage(blocks[0])]
    items = feed.upload(staged[0])
    # the copies are queued on the copy stream: nothing is there yet
    assert not np.array_equal(ops.asnumpy(feed.slots[0].dx[:16]), blocks[0][0][0])
    cur = ops.cp.cuda.get_current_stream()
    for (x, y, ids, ev), (hx, hy, hids) in zip(items, blocks[0]):
        cur.wait_event(ev)                 # what _run_steps does before each step
        assert ops.asnumpy(x).tobytes() == hx.tobytes()
        assert ops.asnumpy(y).tobytes() == hy.tobytes()
        assert ops.asnumpy(ids).tobytes() == hids.tobytes()
    feed.consumed(staged[0])
    # slot 1, then slot 0 again while slot 0's copies are still queued:
    # stage waits for them, so the device gets block 1 then block 2
    s1 = feed.stage(blocks[1])
    it1 = feed.upload(s1)
    s2 = feed.stage(blocks[2])
    assert s2.slot is staged[0].slot
    it2 = feed.upload(s2)
    for ev in (it1[-1][3], it2[-1][3]):
        cur.wait_event(ev)
    assert ops.asnumpy(it2[0][0]).tobytes() == blocks[2][0][0].tobytes()
    assert ops.asnumpy(it1[1][0]).tobytes() == blocks[1][1][0].tobytes()


def test_the_stand_in_shows_a_missing_wait():
    """The negative control: overwrite a pinned slot before its copies ran
    (as a feed without `uploaded` would) and the device gets the new
    bytes: the stand-in's copy stream really reads at run time."""
    ops = GpuOps(cp=FakeCupy())
    feed = DeviceFeed(ops, 16, (8, 8, 3))
    a, b = _batches(1, 16), _batches(1, 16)
    sa = feed.stage(a)
    it = feed.upload(sa)
    sa.slot.x[...] = b[0][0]                     # too early
    ops.cp.cuda.get_current_stream().wait_event(it[0][3])
    assert ops.asnumpy(it[0][0]).tobytes() == b[0][0].tobytes() != a[0][0].tobytes()


def _model(ops, spec="resnet8"):
    m = Model(spec, (3, 8, 8), 5, ops=ops, seed=3)
    m.set_input_norm(np.array([120.0, 110, 100]), np.array([60.0, 55, 50]))
    return m


@pytest.mark.parametrize("spec", ["tiny", "resnet8"])
def test_graph_replay_is_the_eager_step_bitwise(spec):
    """Steps of two batch sizes, through graphs and op by op: the same
    gradients, loss/hit sums and BatchNorm statistics after every step; a
    replayed step is one graph launch and no kernel launch from Python."""
    ops_a, ops_b = GpuOps(cp=FakeCupy()), GpuOps(cp=FakeCupy())
    ma, mb = _model(ops_a, spec), _model(ops_b, spec)
    ma.use_graphs("on")
    batches = _batches(4, 16) + _batches(3, 5)
    sa, sb = ma.new_stats(16), mb.new_stats(16)
    for i, (x, y, ids) in enumerate(batches):
        fakecupy.LAUNCHES.clear()
        ma.step_grad(x, y, sa, ids)
        launches = dict(fakecupy.LAUNCHES)
        mb.step_grad(x, y, sb, ids)
        assert ops_a.asnumpy(ma.grads).tobytes() == ops_b.asnumpy(mb.grads).tobytes()
        assert ops_a.asnumpy(ma.buffers).tobytes() == ops_b.asnumpy(mb.buffers).tobytes()
        if i in (2, 3, 6):                        # replays (after warm-up and capture)
            assert launches == {"graph launch": 1}, launches
    assert ma.read_stats(sa) == mb.read_stats(sb)
    assert ma.graphs.captures == 2 and ma.graphs.replays == 5   # all but the warm-ups


def test_a_capture_that_reads_back_falls_back_under_auto_and_fails_under_on(monkeypatch):
    """A host read inside the step cannot be captured: auto says so once
    and goes on op by op (still the right numbers), on stops."""
    ops = GpuOps(cp=FakeCupy())
    real = ops.softmax_xent_train

    def reads_back(logits, labels, stats):
        ops.asnumpy(logits)                      # a synchronous read
        return real(logits, labels, stats)
    monkeypatch.setattr(ops, "softmax_xent_train", reads_back)
    logs = []
    m, ref = _model(ops, "tiny"), _model(GpuOps(cp=FakeCupy()), "tiny")
    m.use_graphs("auto", logs.append)
    s, sr = m.new_stats(16), ref.new_stats(16)
    for x, y, ids in _batches(4, 16):
        m.step_grad(x, y, s, ids)
        ref.step_grad(x, y, sr, ids)
    assert m.graphs.off and len([l for l in logs if "CUDA graphs off" in l]) == 1
    assert ops.asnumpy(m.grads).tobytes() == ref.device_ops.asnumpy(ref.grads).tobytes()
    m2 = _model(ops, "tiny")
    m2.use_graphs("on")
    s2 = m2.new_stats(16)
    with pytest.raises(RuntimeError, match="run.cuda_graphs = on"):
        for x, y, ids in _batches(2, 16):
            m2.step_grad(x, y, s2, ids)


def test_gpu_math_tf32_rounds_the_gemm_inputs(small_dataset):
    """tf32: the stand-in's GEMMs round their inputs to TF32 as cuBLAS'
    tensor-core mode does: a step's gradients move by a small relative
    amount (not zero, far below 1e-2) and fp32 restores them exactly."""
    cp = FakeCupy()
    ops = GpuOps(cp=cp)
    x, y, ids = _batches(1, 16)[0]
    grads = {}
    for math in ("fp32", "tf32", "fp32"):
        set_gpu_math(cp, math)
        m = _model(ops, "tiny")
        m.use_graphs("off")
        m.step_grad(x, y, m.new_stats(16), ids)
        grads.setdefault(math, []).append(ops.asnumpy(m.grads).copy())
    set_gpu_math(cp, "fp32")
    f, t = grads["fp32"][0], grads["tf32"][0]
    assert grads["fp32"][1].tobytes() == f.tobytes()
    dev = np.abs(t - f).max() / np.abs(f).max()
    assert 1e-7 < dev < 1e-2
    with pytest.raises(ValueError, match="fp32 or tf32"):
        set_gpu_math(cp, "fp16")
    for key, bad in (("run.gpu_math", "fp16"), ("run.cuda_graphs", "yes")):
        with pytest.raises(ConfigError, match=key):
            load(None, [f"data.path={small_dataset}", f"{key}={bad}"])


def test_step_graphs_refuse_an_unknown_mode():
    with pytest.raises(ValueError, match="auto, on or off"):
        StepGraphs(_model(GpuOps(cp=FakeCupy()), "tiny"), "maybe")
