"""The gpu-marked suite (tests/gpu) run here through the CuPy stand-in, so a
mistake in those tests shows up in CI rather than during the scarce run on
a real GPU. The stand-in follows CuPy's rules (fakecupy.DeviceArray: host
arrays rejected where CuPy rejects them, copies on asarray, 0-d device
results), but its arithmetic is the CPU's: this checks the tests, not the
GPU."""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
BOOT = f"""
import sys
sys.path.insert(0, {HERE!r})
import pytest
import fakecupy
from ibtmpi import backend
backend.gpu_status = lambda: (True, "CuPy stand-in")
class StandIn(backend.GpuOps):
    def __init__(self, cp=None):
        super().__init__(cp=fakecupy.FakeCupy())
backend.GpuOps = StandIn
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "-m", "gpu", "-o", "addopts=",
                      {os.path.join(HERE, "..", "gpu")!r}]))
"""


def test_gpu_suite_passes_on_the_stand_in():
    r = subprocess.run([sys.executable, "-c", BOOT], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    last = r.stdout.strip().splitlines()[-1]
    assert "passed" in last and "skipped" not in last and "failed" not in last, last
