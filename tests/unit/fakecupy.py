"""A CuPy stand-in for tests: NumPy arrays, RawModule functions backed by
the host-emulated CUDA kernels (ibtmpi/kernelcheck.py). Enough of CuPy for
backend.GpuOps and the trainer's device path to run on a CPU."""
import os
import tempfile

import numpy as np

from ibtmpi import kernelcheck


class _Fn:
    def __init__(self, mod, name):
        self.mod, self.name = mod, name

    def __call__(self, grid, block, args):
        conv = [a if isinstance(a, np.ndarray) else
                (int(a) if isinstance(a, (np.integer, int)) else float(a)) for a in args]
        # emulate a bounded grid: grid-stride loops cover the rest
        getattr(self.mod, self.name)(min(int(grid[0]), 64), min(int(block[0]), 64), *conv)


class _RawModule:
    def __init__(self, code, options=()):
        d = tempfile.mkdtemp(prefix="ibtmpi-fakecupy-")
        path = os.path.join(d, "k.cu")
        with open(path, "w") as f:
            f.write(code)
        self.mod = kernelcheck.host_module(path)

    def get_function(self, name):
        return _Fn(self.mod, name)


class FakeCupy:
    """The subset of CuPy that GpuOps uses, on NumPy."""
    RawModule = _RawModule
    int64, uint8, float32 = np.int64, np.uint8, np.float32
    ascontiguousarray = staticmethod(np.ascontiguousarray)
    empty, empty_like, zeros = staticmethod(np.empty), staticmethod(np.empty_like), staticmethod(np.zeros)
    matmul = staticmethod(np.matmul)

    @staticmethod
    def asarray(x, dtype=None):
        return np.ascontiguousarray(np.asarray(x, dtype=dtype))

    @staticmethod
    def asnumpy(x):
        return np.asarray(x)


