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
