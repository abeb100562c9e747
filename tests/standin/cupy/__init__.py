"""`import cupy` for a rehearsal of benchmarks/gpu_check.sh on a CPU: the
CuPy stand-in of ibtmpi/testing/fakecupy.py (host-emulated kernels, CuPy's
rules on NumPy memory) as a module, with one visible "device". Put
tests/standin on PYTHONPATH; never installed."""
import os

from ibtmpi.testing import fakecupy

__version__ = "stand-in"
_cp = fakecupy.FakeCupy()
# CUPY_GPU_MEMORY_LIMIT=BYTES, CuPy's own variable: the pool refuses more
# (CuPy also takes a percentage of the device; the stand-in has no size)
if os.environ.get("CUPY_GPU_MEMORY_LIMIT"):
    _cp.get_default_memory_pool().set_limit(size=int(os.environ["CUPY_GPU_MEMORY_LIMIT"]))


def __getattr__(name):
    return getattr(_cp, name)
