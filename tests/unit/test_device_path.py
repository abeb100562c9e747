"""The trainer's device path (--device gpu) run on the CPU through the CuPy
stand-in: workers compute with the CUDA kernels (host-emulated), the
consensus stays on the host; z must match the NumPy-backend run."""
import numpy as np
import pytest
from fakecupy import FakeCupy

from ibtmpi.backend import GpuOps
from ibtmpi.config import load
from ibtmpi.trainer import Trainer


@pytest.mark.parametrize("algo", ["admm", "ibt", "easgd", "ssgd"])
def test_device_path_matches_host_backend(small_dataset, tmp_path, algo):
    def cfg(d):
        return load(None, [f"data.path={small_dataset}", f"algorithm.name={algo}",
                           "data.split_size=40", "data.batch=16", "model.layers=tiny",
                           "run.passes=0.5", "run.quiet=true", f"run.dir={d}",
                           "run.simulate=2", "run.threads=1"])
    host = Trainer(cfg(tmp_path / "h"), log=lambda m: None)
    host.run()
    dev = Trainer(cfg(tmp_path / "d"), log=lambda m: None, device_ops=GpuOps(cp=FakeCupy()))
    dev.run()
    err = float(np.abs(dev.z - host.z).max() / max(1.0, np.abs(host.z).max()))
    assert err < 1e-4, err
    assert dev.summary["test_acc"] == pytest.approx(host.summary["test_acc"], abs=0.05)
