"""GPU workers' block buffers under MPI (run.cuda_aware), run on the CPU
through the CuPy stand-in (tests/unit/fakecupy.py: NumPy arrays, the CUDA
kernels host-emulated). Workers compute on the "device"; the master stays
on the host. Each worker keeps z, its dual and the packed buffer on the
device and updates z there (device_state); gpu_buffers=True: it hands the
buffer to the Allreduce after a stream synchronize; False: the buffer's
model floats are staged through pinned host buffers. Either way z
must be bitwise identical on every rank, close to the all-host MPI run,
and there is one Allreduce per block. That a real CuPy update is bitwise
equal to NumPy's is checked on a GPU (tests/gpu/test_gpu_ops.py)."""
import hashlib
import os
import sys
import tempfile

import numpy as np
import pytest
from mpi4py import MPI

from ibtmpi import comm
from ibtmpi.backend import GpuOps
from ibtmpi.config import load
from ibtmpi.train import Trainer

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "unit"))
from fakecupy import FakeCupy  # noqa: E402

pytestmark = pytest.mark.mpi(min_size=2)
W = MPI.COMM_WORLD
_OPS = {}


def ops():
    """One stand-in per process (its host-built kernels are reused)."""
    if "ops" not in _OPS:
        _OPS["ops"] = GpuOps(cp=FakeCupy())
    _OPS["ops"].cp.cuda.log.clear()
    return _OPS["ops"]


def cfg(path, algo, extra=(), run_dir=None):
    run_dir = run_dir or W.bcast(tempfile.mkdtemp(prefix="ibtmpi-gpubuf-run-")
                                 if W.Get_rank() == 0 else None)
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
        log = dev.cp.cuda.log
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
    d = W.bcast(tempfile.mkdtemp(prefix="ibtmpi-gpubuf-res-") if rank == 0 else None)
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
