"""A CuPy stand-in for tests: device arrays are NumPy memory under CuPy's
rules (DeviceArray: mixing with host arrays, host arrays as kernel
arguments and implicit aliasing fail as on a GPU), RawModule functions are
the host-emulated CUDA kernels (ibtmpi/kernelcheck.py). Enough of CuPy for
backend.GpuOps, the trainer's device path and the gpu-marked tests to run
on a CPU."""
import hashlib
import os
import tempfile
import weakref

import numpy as np

from .. import kernelcheck
from . import fakecupy_async as A


# device-to-device copies of whole arrays, in order: ascontiguousarray of a
# strided array, `a[...] = b` of a device array; and the kernels launched
# (by name; "GEMM" for matmul, "cupy NAME" for a ufunc or reduction CuPy
# would launch); tests clear and read them
COPIES = []
LAUNCHES = A.LAUNCHES      # kernel name -> launches (fakecupy_async's: graphs count too)


class _Fn:
    def __init__(self, mod, name):
        self.mod, self.name = mod, name

    def __call__(self, grid, block, args):
        LAUNCHES[self.name] += 1
        params = self.mod.params(self.name)
        if len(args) != len(params):
            raise TypeError(f"RawKernel {self.name}: {len(args)} arguments for "
                            f"{len(params)} parameters")
        for a, (t, pname) in zip(args, params):
            _host_in(a, f"RawKernel {self.name}")   # CuPy rejects host arrays
            _check_arg(self.name, pname, kernelcheck.base_type(t), a)
        conv = [a if isinstance(a, np.ndarray) else
                (int(a) if isinstance(a, (np.integer, int)) else float(a)) for a in args]
        # emulate a bounded grid: grid-stride loops cover the rest
        fn, g, b = getattr(self.mod, self.name), min(int(grid[0]), 64), min(int(block[0]), 64)
        A.issue(lambda: fn(g, b, *conv), f"kernel {self.name}")


# what CuPy passes for an argument must be what the kernel reads: a device
# array of the pointer's element type, a NumPy scalar of the parameter's
# width (CuPy passes a Python int as 8 bytes and a Python float as a double,
# which shifts every later argument of an `int` or `float` parameter)
_ARG = {"float*": np.float32, "double*": np.float64, "unsigned char*": np.uint8,
        "unsigned short*": np.uint16, "long long*": np.int64,
        "int*": np.int32, "int": np.int32, "long long": np.int64, "float": np.float32}


def _check_arg(kernel, pname, base, a):
    want = _ARG[base]
    if base.endswith("*"):
        ok = isinstance(a, DeviceArray) and a.dtype == want and a.flags.c_contiguous
        got = (f"{type(a).__name__} {getattr(a, 'dtype', '')}"
               f"{'' if getattr(a, 'flags', None) is None or a.flags.c_contiguous else ' (strided)'}")
    else:
        ok, got = type(a) is want, type(a).__name__
    if not ok:
        raise TypeError(f"RawKernel {kernel}: parameter {pname} ({base}) needs "
                        f"{'a contiguous device array of ' if base.endswith('*') else ''}"
                        f"{np.dtype(want).name}, got {got}")


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

    def compile(self):
        """Built in __init__ already (CuPy compiles lazily, here eagerly)."""


class _Stream:
    def __init__(self, log):
        self.log = log

    def synchronize(self):
        A.no_capture("synchronize")
        self.log.append("sync")

    def record(self, event=None):
        """The null stream runs at once: its events are complete."""
        return event if event is not None else A.Event()

    def wait_event(self, event):
        if event.stream is not None:
            event.stream.flush(event.mark)


class _Cuda:
    """cupy.cuda's pinned allocator and current stream; `log` records the
    calls in order (tests check a synchronize precedes each device Allreduce)."""

    Event = A.Event
    MemoryPool = None                        # set below (_MemoryPool)

    def __init__(self):
        self.log = []
        self.runtime = _Runtime()
        log = self.log

        class Stream(A.Stream):
            def __init__(self, null=False, non_blocking=False, ptds=False, priority=None):
                super().__init__(null, non_blocking, ptds, priority, log=log)
        self.Stream = Stream

    @staticmethod
    def using_allocator(allocator=None):
        """Allocations in the block come from allocator (a pool's malloc)."""
        import contextlib

        @contextlib.contextmanager
        def ctx():
            ALLOC.append(allocator or POOL.malloc)
            try:
                yield
            finally:
                ALLOC.pop()
        return ctx()

    def alloc_pinned_memory(self, nbytes):
        self.log.append(("pinned", nbytes))
        return bytearray(nbytes)

    def get_current_stream(self):
        return A.current() or _Stream(self.log)

    def Device(self, index=0):                       # noqa: N802 (CuPy's name)
        return _Device(self.log, index)


class _Runtime:
    """cupy.cuda.runtime: one visible device."""

    @staticmethod
    def getDeviceCount():                            # noqa: N802 (CuPy's name)
        return 1

    @staticmethod
    def getDeviceProperties(index):                  # noqa: N802 (CuPy's name)
        if index != 0:
            raise ValueError(f"invalid device ordinal {index}")
        return {"name": b"CuPy stand-in", "major": 9, "minor": 0,
                "totalGlobalMem": 16 * 2 ** 30}


class _Device(_Stream):
    """cupy.cuda.Device: synchronize (logged like a stream's), its ordinal,
    the compute capability string, use()."""
    compute_capability = "90"

    def __init__(self, log, index=0):
        super().__init__(log)
        self.id = index

    def use(self):
        if self.id != 0:
            raise ValueError(f"invalid device ordinal {self.id} (one visible device)")

    def __enter__(self):
        self.use()
        return self

    def __exit__(self, *exc):
        return False

    @property
    def mem_info(self):
        """(free, total) bytes: a 16 GiB device, less what the pool holds."""
        return 16 * 2 ** 30 - POOL.total_bytes(), 16 * 2 ** 30


class OutOfMemoryError(MemoryError):
    """As cupy.cuda.memory.OutOfMemoryError: a MemoryError, CuPy's message."""

    def __init__(self, size, total, limit=0):
        lim = f", limit set to: {limit:,} bytes" if limit else ""
        super().__init__(f"Out of memory allocating {size:,} bytes (allocated so "
                         f"far: {total:,} bytes{lim}).")


class _MemoryPool:
    """cupy's default pool, without reuse: counts the bytes of the live
    device arrays it made (used_bytes) and their high-water mark
    (total_bytes: what a caching pool holds), and refuses an allocation
    past set_limit(size=) with OutOfMemoryError, as CuPy does."""

    def __init__(self):
        self.used = self.high = self.limit = 0

    def set_limit(self, size=None, fraction=None):
        self.limit = int(size or 0)

    def get_limit(self):
        return self.limit

    def free_all_blocks(self):
        self.high = self.used

    def total_bytes(self):
        return self.high

    def used_bytes(self):
        return self.used

    def malloc(self, arr):
        """A new host array as a device array of this pool."""
        n = arr.nbytes
        if self.limit and self.used + n > self.limit:
            raise OutOfMemoryError(n, self.used, self.limit)
        self.used += n
        self.high = max(self.high, self.used)
        weakref.finalize(arr, self._free, n)
        return arr.view(DeviceArray)

    def _free(self, n):
        self.used -= n


POOL = _MemoryPool()
ALLOC = [POOL.malloc]
COMPUTE = A.ComputeTypes()   # cupy._core._routines_linalg's compute types        # the allocator in use (cupy.cuda.using_allocator)
_Cuda.MemoryPool = _MemoryPool


def _alloc(arr):
    return ALLOC[-1](arr)


def _make(compute, what, pooled=True):
    """A new device array holding compute()'s result: now, or (capturing, or
    on a lazy stream) poisoned until the recorded computation runs. pooled:
    counted by the pool (CuPy's results of elementwise kernels and
    reductions are too, but the stand-in's figures have always left them
    out)."""
    r = np.asarray(compute())
    d = _alloc(r) if pooled else r.view(DeviceArray)
    if A.capturing() is None and A.current() is None:
        return d
    A.poison(d)
    A.issue(lambda: np.copyto(_base(d), compute()), what)
    return d


class DeviceArray(np.ndarray):
    """A stand-in device array: NumPy memory under CuPy's rules, so the
    tests catch what a real GPU would reject. An operation that mixes it
    with a host (NumPy) array raises TypeError, as CuPy does; results stay
    device arrays, reductions give 0-d device arrays (not scalars);
    ``set``/``get`` copy host <-> device; assigning a host array into it
    (``d[...] = h``) is allowed, as in CuPy."""

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        if ufunc is not np.matmul:       # counted as a GEMM by FakeCupy.matmul
            # CuPy launches an elementwise or reduction kernel for each
            LAUNCHES[f"cupy {ufunc.__name__}{'' if method == '__call__' else '.' + method}"] += 1
        out = kwargs.get("out") or ()
        _no_host(inputs + tuple(out), ufunc.__name__)
        args = [_base(a) for a in inputs]
        if out:
            kwargs["out"] = tuple(_base(o) for o in out)
            A.issue(lambda: getattr(ufunc, method)(*args, **kwargs), f"cupy {ufunc.__name__}")
            return out[0] if len(out) == 1 else out
        return _make(lambda: getattr(ufunc, method)(*args, **kwargs), f"cupy {ufunc.__name__}",
                     pooled=False)

    def __array_function__(self, func, types, args, kwargs):
        _no_host(_arrays(args) + _arrays(kwargs), func.__name__)
        a, k = _unwrap(args), _unwrap(kwargs)
        if func is np.copyto:                       # in place
            A.issue(lambda: func(*a, **k), "copyto")
            return None
        if A.capturing() is None and A.current() is None:
            return _device(func(*a, **k))
        return _make(lambda: func(*a, **k), func.__name__, pooled=False)

    def __setitem__(self, key, value):
        if isinstance(value, DeviceArray):
            if key is Ellipsis:
                COPIES.append(("[...] =", self.shape))
            value = _base(value)
        elif isinstance(value, np.ndarray):
            A.no_capture("host -> device copy (setitem)")
        base = _base(self)
        A.issue(lambda: base.__setitem__(key, value), "setitem")

    def fill(self, v):
        base = _base(self)
        A.issue(lambda: base.fill(v), "fill")

    def set(self, host, stream=None):
        """Host -> device as CuPy's set: same shape and dtype, a contiguous
        target (no broadcasting or casting, unlike NumPy's assignment). On
        a lazy stream the copy reads `host` when it runs (a DMA from pinned
        memory)."""
        _same_layout(host, self, "set")
        base = _base(self)
        if stream is None:
            A.no_capture("host -> device copy (set)")
            base[...] = host
            return
        with stream:
            A.issue(lambda: base.__setitem__(Ellipsis, host), "set")

    def get(self):
        A.no_capture("device -> host copy (get)")
        return np.array(_base(self))


def _same_layout(src, dst, what):
    if not isinstance(src, np.ndarray) or src.shape != dst.shape:
        raise ValueError(f"cupy {what}: shape mismatch ({getattr(src, 'shape', type(src))} "
                         f"into {dst.shape})")
    if src.dtype != dst.dtype:
        raise TypeError(f"cupy {what}: {src.dtype} array cannot be set to {dst.dtype} array")
    if not dst.flags.c_contiguous:
        raise RuntimeError(f"cupy {what}: cannot copy into a non-contiguous array")


def _base(a):
    return a.view(np.ndarray) if isinstance(a, DeviceArray) else a


def _device(res):
    if isinstance(res, tuple):
        return tuple(_device(r) for r in res)
    if isinstance(res, (np.ndarray, np.generic)) and not isinstance(res, DeviceArray):
        return np.asarray(res).view(DeviceArray)
    return res


def _arrays(x):
    if isinstance(x, np.ndarray):
        return (x,)
    if isinstance(x, (list, tuple)):
        return tuple(a for v in x for a in _arrays(v))
    if isinstance(x, dict):
        return _arrays(list(x.values()))
    return ()


def _unwrap(x):
    if isinstance(x, DeviceArray):
        return _base(x)
    if isinstance(x, (list, tuple)):
        return type(x)(_unwrap(v) for v in x)
    if isinstance(x, dict):
        return {k: _unwrap(v) for k, v in x.items()}
    return x


def _no_host(arrays, what):
    for a in arrays:
        if isinstance(a, np.ndarray) and not isinstance(a, DeviceArray):
            raise TypeError(f"{what}: a host (NumPy) array mixed with device arrays; "
                            f"CuPy raises here (copy it with cupy.asarray first)")


def _host_in(a, what):
    if isinstance(a, np.ndarray) and not isinstance(a, DeviceArray):
        raise TypeError(f"cupy.{what}: argument must be a cupy.ndarray, got numpy.ndarray")
    return _base(a)


class FakeCupy:
    """The subset of CuPy that GpuOps uses, on NumPy (DeviceArray)."""
    RawModule = _RawModule
    ndarray = DeviceArray

    def __init__(self):
        self.cuda = _Cuda()
        self._core = type("core", (), {"_routines_linalg": COMPUTE})()
    int64, uint8, uint16, float32 = np.int64, np.uint8, np.uint16, np.float32

    @staticmethod
    def get_default_memory_pool():
        return POOL

    @staticmethod
    def ascontiguousarray(x, dtype=None):
        """x itself when it is C-contiguous and of the dtype asked for (as
        CuPy: an in-place launcher writes into the caller's array), else a
        contiguous copy."""
        h = _host_in(x, "ascontiguousarray")
        if h.flags.c_contiguous and (dtype is None or h.dtype == np.dtype(dtype)):
            return x
        COPIES.append(("ascontiguousarray", h.shape))
        return _make(lambda: np.array(h, dtype=dtype, order="C"), "ascontiguousarray")

    @staticmethod
    def empty(shape, dtype=np.float32):
        a = _alloc(np.empty(shape, dtype))
        return A.poison(a) if A.capturing() else a

    @staticmethod
    def zeros(shape, dtype=np.float32):
        return _make(lambda: np.zeros(shape, dtype), "zeros")

    @staticmethod
    def empty_like(x, dtype=None):
        a = _alloc(np.empty_like(_host_in(x, "empty_like"), dtype=dtype))
        return A.poison(a) if A.capturing() else a

    @staticmethod
    def matmul(a, b, out=None):
        LAUNCHES["GEMM"] += 1
        _no_host((a, b), "matmul")
        tf32 = COMPUTE.tf32() and _base(a).dtype == np.float32
        ab, bb = _base(a), _base(b)

        def mm(o=None):
            x, y = (A.to_tf32(ab), A.to_tf32(bb)) if tf32 else (ab, bb)
            return np.matmul(x, y, out=o)
        if out is not None:
            ob = _base(out)
            A.issue(lambda: mm(ob), "GEMM")
            return out
        return _make(mm, "GEMM")

    @staticmethod
    def asarray(x, dtype=None):
        """Host data is copied to the device; a device array of the dtype
        asked for is returned as it is (both as in CuPy)."""
        if isinstance(x, DeviceArray) and (dtype is None or x.dtype == np.dtype(dtype)):
            return x
        if not isinstance(x, DeviceArray):
            A.no_capture("host -> device copy (asarray)")
        else:
            xb = _base(x)
            return _make(lambda: np.array(xb, dtype=dtype, order="C"), "astype")
        return _alloc(np.array(_base(x), dtype=dtype, order="C"))

    @staticmethod
    def asnumpy(x, out=None):
        A.no_capture("asnumpy")
        if out is None:
            return np.array(_base(x))            # a new host array
        _same_layout(x, out, "asnumpy(out=)")    # CuPy neither casts nor broadcasts
        np.copyto(out, _base(x))
        return out
