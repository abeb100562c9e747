"""A CuPy stand-in for tests: NumPy arrays, RawModule functions backed by
the host-emulated CUDA kernels (ibtmpi/kernelcheck.py). Enough of CuPy for
backend.GpuOps and the trainer's device path to run on a CPU."""
import hashlib
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
        # content-addressed, so the host build is cached across tests and ranks
        d = os.path.join(tempfile.gettempdir(), f"ibtmpi-fakecupy-{os.getuid()}")
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, hashlib.sha256(code.encode()).hexdigest()[:16] + ".cu")
        if not os.path.exists(path):
            tmp = f"{path}.{os.getpid()}"
            with open(tmp, "w") as f:
                f.write(code)
            os.replace(tmp, path)
        self.mod = kernelcheck.host_module(path)

    def get_function(self, name):
        return _Fn(self.mod, name)


class _Stream:
    def __init__(self, log):
        self.log = log

    def synchronize(self):
        self.log.append("sync")


class _Cuda:
    """cupy.cuda's pinned allocator and current stream; `log` records the
    calls in order (tests check a synchronize precedes each device Allreduce)."""

    def __init__(self):
        self.log = []

    def alloc_pinned_memory(self, nbytes):
        self.log.append(("pinned", nbytes))
        return bytearray(nbytes)

    def get_current_stream(self):
        return _Stream(self.log)


class FakeCupy:
    """The subset of CuPy that GpuOps uses, on NumPy."""
    RawModule = _RawModule

    def __init__(self):
        self.cuda = _Cuda()
    int64, uint8, float32 = np.int64, np.uint8, np.float32
    ascontiguousarray = staticmethod(np.ascontiguousarray)
    empty, empty_like, zeros = staticmethod(np.empty), staticmethod(np.empty_like), staticmethod(np.zeros)
    matmul = staticmethod(np.matmul)

    @staticmethod
    def asarray(x, dtype=None):
        return np.ascontiguousarray(np.asarray(x, dtype=dtype))

    @staticmethod
    def asnumpy(x, out=None):
        if out is None:
            return np.array(x)            # CuPy returns a new host array
        np.copyto(out, x)
        return out


