"""GPU workers' block buffers under MPI (run.cuda_aware), run on the CPU
through the CuPy stand-in (ibtmpi/testing/fakecupy.py: NumPy arrays, the CUDA
kernels host-emulated). Workers compute on the "device"; the master stays
on the host. Each worker keeps z, its dual and the packed buffer on the
device and updates z there (device_state); gpu_buffers=True: it hands the
buffer to the Allreduce after a stream synchronize; False: the buffer's
model floats are staged through pinned host buffers. Either way z
must be bitwise identical on every rank, close to the all-host MPI run,
and there is one Allreduce per block. That a real CuPy update is bitwise
equal to NumPy's is checked on a GPU (tests/gpu/test_gpu_ops.py).

A master of its own with a GPU (master_ops, run.master_device) keeps its
consensus state and packed buffer on that device the same way: its z must
be bitwise the host master's (run.master_device = cpu), and its
evaluation, checkpoints, resume and model files must not tell the two
apart."""
import hashlib
import os
import shutil
import tempfile

import numpy as np
import pytest
from mpi4py import MPI

from ibtmpi import checkpoint as ckpt
from ibtmpi import comm
from ibtmpi.backend import GpuOps
from ibtmpi.config import load
from ibtmpi.train import Trainer

from ibtmpi.testing.fakecupy import FakeCupy

pytestmark = pytest.mark.mpi(min_size=2)
W = MPI.COMM_WORLD
_OPS = {}


def ops():
    """One stand-in per process (its host-built kernels are reused)."""
    if "ops" not in _OPS:
        _OPS["ops"] = GpuOps(cp=FakeCupy())
    _OPS["ops"].cp.cuda.log.clear()
    return _OPS["ops"]


_DIRS = []


def tmpdir(prefix):
    """A directory every rank sees, removed when the module's tests end."""
    d = W.bcast(tempfile.mkdtemp(prefix=prefix) if W.Get_rank() == 0 else None)
    _DIRS.append(d)
    return d


@pytest.fixture(scope="module", autouse=True)
def _remove_dirs():
    yield
    W.Barrier()
    if W.Get_rank() == 0:
        for d in _DIRS:
            shutil.rmtree(d, ignore_errors=True)


def cfg(path, algo, extra=(), run_dir=None):
    run_dir = run_dir or tmpdir("ibtmpi-gpubuf-run-")
    return load(None, [f"data.path={path}", f"algorithm.name={algo}",
                       "data.split_size=30", "data.batch=10", "model.layers=tiny",
                       "run.passes=1.5", "run.quiet=true", f"run.dir={run_dir}",
                       "run.threads=1", "algorithm.rho=0.05", *extra])


def digest(z):
    return hashlib.sha256(np.ascontiguousarray(z).tobytes()).hexdigest()


CASES = [(True, "ibt", ()), (True, "bmuf", ("algorithm.warmup_steps=2",)),
         (True, "admm", ("algorithm.adaptive_rho=true", "algorithm.over_relaxation=1.5")),
         (True, "easgd", ()), (True, "ssgd", ()), (False, "ibt", ()), (False, "ssgd", ())]


@pytest.mark.parametrize("gpu_buffers,algo,extra", CASES)
def test_gpu_worker_buffers(dataset, gpu_buffers, algo, extra):
    rank = W.Get_rank()
    dev = ops() if rank else None
    comm.STATS.update(allreduce=0, bytes=0)
    t = Trainer(cfg(dataset, algo, extra), log=lambda m: None, device_ops=dev,
                gpu_buffers=gpu_buffers)
    assert t.gpu_buffers == (gpu_buffers and rank > 0)
    assert t.device_state == (rank > 0)
    s = t.run()
    z = np.asarray(t.z).copy()
    expect = (sum(t.sched.steps_in_block(t.sched.locate(k)[1]) for k in range(t.total_blocks))
              if algo == "ssgd" else t.total_blocks + t.cfg["algorithm"]["warmup_steps"])
    assert s["allreduce_calls"] == expect
    assert len(set(W.allgather(digest(z)))) == 1, "z differs between ranks"
    if rank:
        # the feed's pinned slots (gpu_feed: two per worker, each images,
        # labels and augmentation ids) are the minibatches', not the block's
        feed = [("pinned", n) for f in t.workers.feeds.values() for _ in f.slots
                for n in (f.cap * int(np.prod(f.shape)), 8 * f.cap, 4 * f.cap)]
        assert (algo == "ssgd") == (not feed)
        log = list(dev.cp.cuda.log)
        for e in feed:
            log.remove(e)                  # ValueError: a slot was not allocated
        if gpu_buffers:
            # the stream is synchronized before every device Allreduce
            assert log.count("sync") >= expect - t.cfg["algorithm"]["warmup_steps"]
            assert not [e for e in log if e != "sync"], "pinned buffers with gpu_buffers"
        else:
            # the packed buffer's pinned host copies, nothing else (no host
            # image of w: the consensus state stays on the device)
            assert [e for e in log if e != "sync"] == [("pinned", 4 * t.packet.size)] * 2
            if algo != "ssgd":
                assert isinstance(t.cons.z, dev.cp.ndarray)
    host = Trainer(cfg(dataset, algo, extra), log=lambda m: None)
    host.run()
    err = float(np.abs(host.z - z).max() / max(1.0, np.abs(host.z).max()))
    assert err < 1e-4, f"device-worker run vs all-host run: {err:.2e}"


@pytest.mark.parametrize("gpu_buffers", [True, False])
def test_gpu_buffers_resume_equals_uninterrupted(dataset, gpu_buffers):
    """Checkpoint and resume move the worker's device state through the
    host, whichever way its Allreduce buffer goes."""
    rank = W.Get_rank()
    extra = ("run.checkpoint_every=2",)
    straight = Trainer(cfg(dataset, "ibt", extra), log=lambda m: None,
                       device_ops=ops() if rank else None, gpu_buffers=gpu_buffers)
    straight.run()
    d = tmpdir("ibtmpi-gpubuf-res-")
    first = Trainer(cfg(dataset, "ibt", extra + ("run.passes=0.5",), run_dir=d),
                    log=lambda m: None, device_ops=ops() if rank else None,
                    gpu_buffers=gpu_buffers)
    first.run()
    again = Trainer(cfg(dataset, "ibt", extra, run_dir=d), log=lambda m: None,
                    device_ops=ops() if rank else None, gpu_buffers=gpu_buffers)
    comm.STATS.update(allreduce=0, bytes=0)
    s = again.run()
    assert s["allreduce_calls"] == again.total_blocks - first.total_blocks   # resumed
    assert digest(np.asarray(again.z)) == digest(np.asarray(straight.z))


def master_run(path, algo, extra, where, gpu_buffers, workers_gpu, run_dir=None):
    """A Trainer whose master has a (stand-in) GPU; run.master_device=where."""
    rank = W.Get_rank()
    return Trainer(cfg(path, algo, (*extra, f"run.master_device={where}",
                                    "run.checkpoint_every=2", "run.eval_every=2"), run_dir),
                   log=lambda m: None, device_ops=ops() if rank and workers_gpu else None,
                   gpu_buffers=gpu_buffers, master_ops=ops() if rank == 0 else None)


def master_files(t):
    """The master's files that hold z: model.npz, model-best.npz and its
    newest checkpoint file, as {name: bytes}."""
    out = {}
    for name in ("model.npz", "model-best.npz"):
        with np.load(os.path.join(t.run_dir, name)) as f:
            out[name] = f["z"].tobytes()
    k = ckpt.complete(t.run_dir)[-1]
    got = ckpt.read_rank(os.path.join(ckpt.ckpt_dir(t.run_dir, k), ckpt.rank_file(0)),
                         t.ckpt.state_spec())
    out.update({f"ckpt {k} {name}": np.asarray(a).tobytes() for name, a in got.items()})
    return out


MASTER_CASES = [(False, "admm", ("algorithm.adaptive_rho=true",
                                 "algorithm.over_relaxation=1.5"), False),
                (True, "ibt", (), True), (False, "bmuf", ("algorithm.warmup_steps=2",), False),
                (True, "easgd", (), False), (False, "ma", (), True)]


@pytest.mark.parametrize("gpu_buffers,algo,extra,workers_gpu", MASTER_CASES)
def test_master_on_its_gpu_matches_the_host_master(dataset, gpu_buffers, algo, extra,
                                                   workers_gpu):
    rank = W.Get_rank()
    runs, bad = {}, []        # bad: what failed here, asserted on every rank at once
    for where in ("gpu", "cpu"):
        t = master_run(dataset, algo, extra, where, gpu_buffers, workers_gpu)
        on = rank > 0 and workers_gpu or rank == 0 and where == "gpu"
        if (t.device_state, t.gpu_buffers) != (on, gpu_buffers and on):
            bad.append(f"rank {rank} {where}: device_state {t.device_state}, "
                       f"gpu_buffers {t.gpu_buffers}")
        cp = _OPS["ops"].cp if rank == 0 else None
        if rank == 0 and where == "gpu":     # the master's consensus state: on its GPU
            bad += [f"{name} is on the host" for name in t.cons.vectors
                    if not isinstance(getattr(t.cons, name), cp.ndarray)]
        s = t.run()
        assert s["allreduce_calls"] == t.total_blocks + t.cfg["algorithm"]["warmup_steps"]
        if rank == 0:
            log = [e for e in cp.cuda.log if e != "sync"]
            # a synchronize before each device Allreduce, or the packed
            # buffer's pinned host copies
            if on and (log or cp.cuda.log.count("sync") < t.total_blocks if gpu_buffers
                       else log != [("pinned", 4 * t.packet.size)] * 2):
                bad.append(f"{where}: the stand-in's log {cp.cuda.log[:6]}")
            if (s.get("master_consensus"), isinstance(t.z, cp.ndarray)) != (where, on):
                bad.append(f"{where}: summary says {s.get('master_consensus')}, z is "
                           f"{type(t.z).__name__}")
        runs[where] = t
    assert not sum(W.allgather(bad), [])
    g, c = runs["gpu"], runs["cpu"]
    assert len(set(W.allgather(digest(g.z)))) == 1, "z differs between ranks"
    assert digest(g.z) == digest(c.z), "z of the master's GPU update is not the host's"
    if rank:
        return
    # evaluation (on the GPU in both, from the device z in one), the best
    # model, model.npz and the checkpoints (host copies; every checkpoint
    # confirmed: the master's flags reached the Allreduce) alike
    for key in ("val_loss", "val_acc", "train_loss", "rho"):
        assert [h.get(key) for h in g.history] == [h.get(key) for h in c.history], key
    for key in ("primal_residual", "dual_residual"):   # device sums: float64 rounding
        np.testing.assert_allclose([h[key] for h in g.history],
                                   [h[key] for h in c.history], rtol=1e-9)
    assert any("val_loss" in h for h in g.history)
    assert ckpt.complete(g.run_dir) == ckpt.complete(c.run_dir) != []
    assert master_files(g) == master_files(c)
    assert g.summary["test_acc"] == c.summary["test_acc"]


@pytest.mark.parametrize("gpu_buffers,first,again", [(False, "gpu", "gpu"),
                                                     (True, "cpu", "gpu")])
def test_master_gpu_resume_equals_uninterrupted(dataset, gpu_buffers, first, again):
    """A checkpoint of the master's device state resumes bitwise, also
    across run.master_device (the files hold host copies)."""
    rank = W.Get_rank()
    straight = master_run(dataset, "ibt", (), "gpu", gpu_buffers, False)
    straight.run()
    d = tmpdir("ibtmpi-mastergpu-")
    master_run(dataset, "ibt", ("run.passes=0.5",), first, gpu_buffers, False, d).run()
    t = master_run(dataset, "ibt", (), again, gpu_buffers, False, d)
    assert t.run()["resumed_at_block"] > 0
    assert digest(t.z) == digest(straight.z)
    if rank == 0:
        assert isinstance(t.cons.z, t.sdev.cp.ndarray)
