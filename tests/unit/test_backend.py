"""Device selection: explicit errors, never a silent fallback; GPU binding."""
import pytest

from ibtmpi import backend


def test_cpu_is_always_available():
    assert backend.select("cpu") == "cpu"


def test_gpu_request_without_gpu_is_an_explicit_error():
    ok, why = backend.gpu_status()
    if ok:
        pytest.skip("this machine has a GPU")
    with pytest.raises(backend.DeviceError, match="--device gpu was asked for but"):
        backend.select("gpu")
    assert backend.select("auto") == "cpu"


def test_bad_device_name():
    with pytest.raises(backend.DeviceError, match="auto, cpu or gpu"):
        backend.select("tpu")


@pytest.mark.parametrize("local,n,expect", [(0, 1, 0), (3, 1, 0), (3, 4, 3), (5, 4, 1), (7, 8, 7)])
def test_worker_device_binding(local, n, expect):
    assert backend.worker_device(local, n) == expect


def test_no_visible_devices_error():
    with pytest.raises(backend.DeviceError):
        backend.worker_device(0, 0)


# -- run.cuda_aware: where a GPU worker's block buffers live -----------------

AWARE, NOT_AWARE, SILENT = ((True, "MPIX_Query_cuda_support() = 1"),
                            (False, "MPIX_Query_cuda_support() = 0"),
                            (None, "no query"))


@pytest.mark.parametrize("mode,gpu,dist,report,expect", [
    ("auto", True, True, AWARE, True),
    ("auto", True, True, NOT_AWARE, False),
    ("auto", True, True, SILENT, False),        # the library does not say: stage
    ("on", True, True, AWARE, True),
    ("on", True, True, SILENT, True),           # the user's word
    ("off", True, True, AWARE, False),
    ("on", False, True, AWARE, False),          # CPU workers: nothing on a device
    ("on", True, False, AWARE, False),          # one process: no MPI transfer
    ("auto", False, True, NOT_AWARE, False),
])
def test_cuda_aware_resolution(mode, gpu, dist, report, expect):
    got, why = backend.resolve_cuda_aware(mode, gpu, dist, report)
    assert got is expect and why


def test_cuda_aware_on_with_a_library_that_says_no_is_an_error_not_a_crash():
    with pytest.raises(backend.DeviceError, match="reports no CUDA support.*= 0"):
        backend.resolve_cuda_aware("on", True, True, NOT_AWARE)
    with pytest.raises(backend.DeviceError, match="auto, on or off"):
        backend.resolve_cuda_aware("yes", True, True, AWARE)


def test_cuda_support_is_the_librarys_own_report():
    """The query never touches a GPU; the MPICH wheel of CI says 0."""
    from ibtmpi import comm
    aware, how = comm.cuda_support()
    assert aware in (True, False, None) and how
    if "MPICH" in comm.library_version() and not backend.gpu_status()[0]:
        assert (aware, how) == (False, "MPIX_Query_cuda_support() = 0")


def test_cuda_aware_config_key():
    from ibtmpi.config import ConfigError, load
    assert load(None, ["data.path=x"])["run"]["cuda_aware"] == "auto"
    with pytest.raises(ConfigError, match="run.cuda_aware must be auto, on or off"):
        load(None, ["data.path=x", "run.cuda_aware=maybe"])


def test_pinned_staging_helpers_on_the_stand_in():
    import numpy as np
    from ibtmpi.testing.fakecupy import FakeCupy
    ops = backend.GpuOps(cp=FakeCupy())
    buf = ops.pinned_empty(5)
    assert buf.dtype == np.float32 and buf.shape == (5,) and buf.flags.writeable
    assert ops.cp.cuda.log == [("pinned", 20)]
    x = np.arange(5, dtype=np.float32)
    assert ops.to_host(ops.asarray(x), buf) is buf and (buf == x).all()
    d = ops.cp.zeros(5, np.float32)
    assert ops.to_device(buf * 2, d) is d and ops.on_device(d)
    assert (ops.asnumpy(d) == 2 * x).all()
    assert not ops.on_device(buf)
    ops.synchronize()
    assert ops.cp.cuda.log[-1] == "sync"


# -- one device decision for every rank ---------------------------------------
GPU, NONE = (True, "1 CUDA device(s)", "g1"), (False, "CuPy sees no CUDA device", "c1")


@pytest.mark.parametrize("asked", ["gpu", "auto"])
def test_the_master_needs_no_gpu(asked):
    assert backend.workers_device(asked, [NONE, GPU, GPU]) == ("gpu", None)


def test_gpu_asked_where_a_worker_has_none_names_it():
    with pytest.raises(backend.DeviceError,
                       match=r"but rank 2 \(c1\) and 1 more worker rank\(s\): CuPy sees no"):
        backend.workers_device("gpu", [GPU, GPU, NONE, NONE])
    with pytest.raises(backend.DeviceError, match=r"but CuPy sees no CUDA device; use"):
        backend.workers_device("gpu", [NONE])        # one process: it is the worker


def test_auto_on_mixed_workers_computes_on_the_cpu_everywhere_and_says_why():
    """Every rank reaches the same answer from the same gathered list, so no
    rank enters a GPU-only collective (worker_local_rank) alone."""
    got = backend.workers_device("auto", [GPU, GPU, NONE])
    assert got == ("cpu", "--device auto: computing on the CPU "
                          "(rank 2 (c1): CuPy sees no CUDA device)")
    assert backend.workers_device("auto", [NONE]) == (
        "cpu", "--device auto: computing on the CPU (CuPy sees no CUDA device)")


def test_evaluation_counts_every_rank():
    assert backend.workers_device("auto", [NONE, GPU], master=False)[0] == "cpu"
    assert backend.workers_device("cpu", [GPU, GPU]) == ("cpu", None)


def test_device_lines_name_each_device_and_a_broken_one(monkeypatch):
    import sys
    import types
    from ibtmpi.testing.fakecupy import FakeCupy
    from ibtmpi import backend
    fake = FakeCupy()
    monkeypatch.setitem(sys.modules, "cupy", fake)
    assert backend.device_lines() == [
        f"0: CuPy stand-in, compute capability 9.0, 16.0 GiB "
        f"({fake.cuda.Device(0).mem_info[0] / 2**30:.1f} GiB free)"]

    def broken(i):
        raise RuntimeError("cudaErrorECCUncorrectable")
    rt = types.SimpleNamespace(getDeviceCount=lambda: 2, getDeviceProperties=broken)
    monkeypatch.setattr(fake.cuda, "runtime", rt)
    assert backend.device_lines() == [
        f"{i}: cannot be queried (RuntimeError: cudaErrorECCUncorrectable)" for i in (0, 1)]
    monkeypatch.setitem(sys.modules, "cupy", None)     # no CuPy: nothing to list
    assert backend.device_lines() == []
