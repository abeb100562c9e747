"""Device backends: the ONLY module that imports cupy.

``workers_device`` resolves ``auto | cpu | gpu`` alike on every rank from
what each rank's CuPy sees (auto = gpu when every worker has a device; the
master needs none) and raises DeviceError, never falls back silently, when
gpu is asked for and a worker has none; ``select`` does it for one
process. ``GpuOps`` launches the hand-written kernels of kernels/*.cu
(compiled once per process by CuPy's RawModule, cached on
disk by CuPy) with the exact signatures of the NumPy reference ops in
ibtmpi/ops/, optim/ and consensus/; GEMMs go through cupy.matmul (cuBLAS).
``worker_device`` binds a worker rank to a GPU: its rank among the workers
of its node, modulo the visible devices. ``resolve_cuda_aware`` decides
where a GPU worker's block buffers live (run.cuda_aware = auto | on | off).
Tests: tests/gpu/test_gpu_ops.py (each launch vs the NumPy reference; skipped
with the reason where no GPU exists), tests/unit/test_backend.py.
"""
from __future__ import annotations

import numpy as np

from .errors import DeviceError

BLOCK = 256


def gpu_status():
    """(available, reason)."""
    try:
        import cupy
    except ImportError as e:
        return False, f"CuPy is not installed ({e}); pip install 'ibtmpi[gpu]'"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:                    # no driver, no device
        return False, f"CuPy sees no CUDA device ({type(e).__name__}: {e})"
    if n < 1:
        return False, "CuPy sees no CUDA device"
    return True, f"{n} CUDA device(s)"


def device_lines():
    """One line per visible CUDA device: ordinal, name, compute capability,
    memory total and free (`ibtmpi info`); [] without CuPy or devices."""
    try:
        import cupy
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception:
        return []
    out = []
    for i in range(n):
        try:
            p = cupy.cuda.runtime.getDeviceProperties(i)
            name = p["name"].decode() if isinstance(p["name"], bytes) else str(p["name"])
            with cupy.cuda.Device(i):
                free, total = cupy.cuda.Device(i).mem_info
            out.append(f"{i}: {name}, compute capability {p['major']}.{p['minor']}, "
                       f"{total / 2**30:.1f} GiB ({free / 2**30:.1f} GiB free)")
        except Exception as e:            # a device that does not answer: say so
            out.append(f"{i}: cannot be queried ({type(e).__name__}: {e})")
    return out


def select(device="auto"):
    """cpu | gpu for this process alone (see workers_device)."""
    if device == "cpu":
        return "cpu"
    return workers_device(device, [(*gpu_status(), "")])[0]


def workers_device(asked, statuses, master=True):
    """The one device every computing rank uses, decided alike on every rank
    from what each rank sees: (cpu | gpu, note or None). `statuses`: one
    (available, reason, host) per rank, rank 0 first. With `master`, rank 0
    of several is the master and needs no GPU: only the workers count. gpu
    where a worker has none is an error naming it; auto computes on the CPU
    unless every worker has one (mixed nodes would leave a collective
    half-entered)."""
    if asked not in ("auto", "cpu", "gpu"):
        raise DeviceError(f"device must be auto, cpu or gpu, got {asked!r}")
    if asked == "cpu":
        return "cpu", None
    workers = list(enumerate(statuses))
    if master and len(workers) > 1:
        workers = workers[1:]
    missing = [(r, why, host) for r, (ok, why, host) in workers if not ok]
    if not missing:
        return "gpu", None
    if len(statuses) == 1:
        where = missing[0][1]
    else:
        r, why, host = missing[0]
        more = f" and {len(missing) - 1} more worker rank(s)" if len(missing) > 1 else ""
        where = f"rank {r} ({host}){more}: {why}"
    if asked == "gpu":
        raise DeviceError(f"--device gpu was asked for but {where}; use --device cpu")
    return "cpu", f"--device auto: computing on the CPU ({where})"


def resolve_cuda_aware(mode, gpu, distributed, report):
    """Where a GPU worker's block buffers live: (device_buffers, why).

    mode: run.cuda_aware (auto | on | off); gpu: the workers compute on a
    GPU; distributed: a real MPI run with more than one rank; report:
    comm.cuda_support()'s (True | False | None, how). ``on`` where the
    library says it is NOT CUDA-aware is an error (a device buffer would
    crash it); ``on`` where it does not say is taken at the user's word."""
    if mode not in ("auto", "on", "off"):
        raise DeviceError(f"run.cuda_aware must be auto, on or off, got {mode!r}")
    if not gpu:
        return False, "workers compute on the CPU: host buffers"
    if not distributed:
        return False, "one process: no MPI transfer, host buffers"
    aware, how = report
    if mode == "off":
        return False, "run.cuda_aware = off: staged through pinned host buffers"
    if mode == "on":
        if aware is False:
            raise DeviceError(
                f"run.cuda_aware = on, but the MPI library reports no CUDA support "
                f"({how}); a device buffer would crash it: use run.cuda_aware = auto "
                f"or off, or an MPI built with CUDA")
        return True, f"run.cuda_aware = on ({how}): device buffers to MPI"
    if aware:
        return True, f"run.cuda_aware = auto, {how}: device buffers to MPI"
    return False, (f"run.cuda_aware = auto, {how}: staged through pinned host "
                   f"buffers")


def worker_device(worker_local_rank, n_visible):
    """GPU index for a worker: its rank among the node's workers mod devices."""
    if n_visible < 1:
        raise DeviceError("no visible CUDA devices for the worker ranks")
    return worker_local_rank % n_visible


def bind_worker_gpu(worker_local_rank):
    """Make this process use GPU (worker's local rank mod visible devices)."""
    import cupy
    n = cupy.cuda.runtime.getDeviceCount()
    dev = worker_device(worker_local_rank, n)
    cupy.cuda.Device(dev).use()
    return dev


def _grid(n):
    return (int(min(max(1, (n + BLOCK - 1) // BLOCK), 65535 * 8)),)


class GpuOps:
    """CuPy launchers with the NumPy references' signatures (NCHW float32)."""

    def __init__(self, cp=None):
        if cp is None:
            import cupy as cp
        self.cp = cp            # tests pass a CuPy stand-in running host-emulated kernels
        self._mods = {}
        self._fns = {}          # (file, kernel) -> function: one driver lookup each

    def _k(self, fname, kname):
        fn = self._fns.get((fname, kname))
        if fn is None:
            if fname not in self._mods:
                from .kernels import source_path
                code = source_path(fname).read_text()
                self._mods[fname] = self.cp.RawModule(code=code, options=("--std=c++14",))
            fn = self._fns[fname, kname] = self._mods[fname].get_function(kname)
        return fn

    def _launch(self, fname, kname, n, *args):
        self._k(fname, kname)(_grid(n), (BLOCK,), args)

    # -- conv --------------------------------------------------------------
    def im2col(self, x, kh, kw, stride, pad, out=None, ws=None):
        from .ops import conv_out_size
        cp = self.cp
        base, cnhw = self._layout(x)       # a (C, N, H, W) buffer is read where it lies
        n, c, h, w = x.shape
        ho, wo = conv_out_size(h, kh, stride, pad), conv_out_size(w, kw, stride, pad)
        col = cp.empty((c * kh * kw, n * ho * wo), x.dtype)
        self._launch("conv.cu", "im2col", col.size, base, col, np.int32(n), np.int32(c),
                     np.int32(h), np.int32(w), np.int32(kh), np.int32(kw),
                     np.int32(stride), np.int32(pad), np.int32(ho), np.int32(wo),
                     np.int32(cnhw))
        return self._into(col, out)

    def col2im(self, col, x_shape, kh, kw, stride, pad, out=None, ws=None):
        from .ops import conv_out_size
        cp = self.cp
        n, c, h, w = x_shape
        ho, wo = conv_out_size(h, kh, stride, pad), conv_out_size(w, kw, stride, pad)
        dx = cp.empty(x_shape, col.dtype)
        self._launch("conv.cu", "col2im", dx.size, cp.ascontiguousarray(col), dx,
                     np.int32(n), np.int32(c), np.int32(h), np.int32(w), np.int32(kh),
                     np.int32(kw), np.int32(stride), np.int32(pad), np.int32(ho),
                     np.int32(wo))
        return self._into(dx, out)

    def conv2d_forward(self, x, w, b, stride=1, pad=0, col=None, out=None, ws=None):
        from .ops import conv_out_size
        cp = self.cp
        f, c, kh, kw = w.shape
        n, _, h, wd = x.shape
        ho, wo = conv_out_size(h, kh, stride, pad), conv_out_size(wd, kw, stride, pad)
        col = self.im2col(x, kh, kw, stride, pad, out=col)
        m = col.shape[1]
        y2 = cp.matmul(w.reshape(f, -1), col)                 # (F, N*Ho*Wo)
        if b is not None:        # None: the pool that follows adds it (fused)
            self._launch("conv.cu", "bias_add_rows", y2.size, y2, cp.ascontiguousarray(b),
                         np.int32(f), np.int64(m))
        # NCHW view of the (F, N, Ho, Wo) result, as the NumPy op returns
        y = y2.reshape(f, n, ho, wo).transpose(1, 0, 2, 3)
        if out is None:
            return y, col
        out[...] = y
        return out, col

    def conv2d_backward(self, dy, col, x_shape, w, stride, pad, dw, db,
                        need_dx=True, ws=None):
        cp = self.cp
        n, f, ho, wo = dy.shape
        kh, kw = w.shape[2], w.shape[3]
        dy2 = cp.ascontiguousarray(dy.transpose(1, 0, 2, 3)).reshape(f, -1)
        if db is not None:                               # None: a conv without bias
            self.bias_grad_rows(dy2, db)
        cp.matmul(dy2, col.T, out=dw.reshape(f, -1))     # straight into the gradient
        if not need_dx:
            return None
        dcol = cp.matmul(w.reshape(f, -1).T, dy2)
        return self.col2im(dcol, x_shape, kh, kw, stride, pad)

    def bias_grad_rows(self, dy2, db):
        """db (F,) = dy2 (F, M) summed over M, without atomics: passes of
        row_partial_sums (widths ops.row_sum_widths), bitwise the same
        every run. The NumPy engine does np.sum(dy2, axis=1, out=db)."""
        from .ops import row_sum_widths
        f, m = dy2.shape
        x = dy2
        for p in row_sum_widths(m):
            out = db if p == 1 else self.cp.empty((f, p), dy2.dtype)
            self._launch("conv.cu", "row_partial_sums", f * p, x, out, np.int32(f),
                         np.int64(m), np.int32(p))
            x, m = out, p
        return db

    # -- pool, relu -----------------------------------------------------------
    def maxpool_forward(self, x, k=2, stride=2, out=None, argmax=None, ws=None,
                        bias=None, relu=False, pad=0):
        """x NCHW, or a conv's output (an NCHW view of a (C, N, H, W)
        buffer, ops.is_cnhw), which the kernel reads where it lies. Fused
        (layers.fuse_for_device): `bias` (C,) is the conv's bias, left out
        of x and added here; `relu` applies the ReLU that follows."""
        from .ops import conv_out_size, is_cnhw
        cp = self.cp
        cnhw = is_cnhw(x)
        base = x.transpose(1, 0, 2, 3) if cnhw else cp.ascontiguousarray(x)
        n, c, h, w = x.shape
        ho, wo = conv_out_size(h, k, stride, pad), conv_out_size(w, k, stride, pad)
        y = cp.empty((n, c, ho, wo), x.dtype)
        am = cp.empty((n, c, ho, wo), cp.uint8)
        self._launch("pool.cu", "maxpool_fwd", y.size, base, y, am,
                     y if bias is None else cp.ascontiguousarray(bias), np.int32(n),
                     np.int32(c), np.int32(h), np.int32(w), np.int32(k),
                     np.int32(stride), np.int32(ho), np.int32(wo), np.int32(cnhw),
                     np.int32(bias is not None), np.int32(bool(relu)), np.int32(pad))
        return self._into(y, out), self._into(am, argmax)

    def maxpool_backward(self, dy, argmax, x_shape, k=2, stride=2, out=None, ws=None,
                         y=None, pad=0):
        """Into `out` where it lies (_grad_target; the layer passes the layout
        a conv's backward reads, see empty4). With `y` (the fused forward's
        output after its ReLU) the ReLU's backward is applied too: dy passes
        only where y > 0."""
        cp = self.cp
        n, c, h, w = x_shape
        ho, wo = dy.shape[2], dy.shape[3]
        dx, cnhw = self._grad_target(out, x_shape, dy.dtype)
        dy = cp.ascontiguousarray(dy)
        self._launch("pool.cu", "maxpool_bwd", dx.size, dy, cp.ascontiguousarray(argmax),
                     dx, dy if y is None else cp.ascontiguousarray(y), np.int32(n),
                     np.int32(c), np.int32(h), np.int32(w), np.int32(k), np.int32(stride),
                     np.int32(ho), np.int32(wo), np.int32(cnhw), np.int32(y is not None),
                     np.int32(pad))
        return out if cnhw else self._into(dx, out)

    def _grad_target(self, out, shape, dtype):
        """(dx, cnhw): `out` where it lies (NCHW or a (C, N, H, W) view), else new NCHW."""
        from .ops import is_cnhw
        if out is not None and is_cnhw(out):
            return out.transpose(1, 0, 2, 3), 1
        if out is not None and out.flags.c_contiguous:
            return out, 0
        return self.cp.empty(shape, dtype), 0

    def avgpool_forward(self, x, k=2, stride=2, out=None, ws=None):
        """x in either layout, read where it lies; y NCHW."""
        from .ops import conv_out_size
        (n, c, h, w), (base, cnhw) = x.shape, self._layout(x)
        ho, wo = conv_out_size(h, k, stride, 0), conv_out_size(w, k, stride, 0)
        y = self.cp.empty((n, c, ho, wo), x.dtype)
        self._launch("pool.cu", "avgpool_fwd", y.size, base, y,
                     *map(np.int32, (n, c, h, w, k, stride, ho, wo, cnhw)))
        return self._into(y, out)

    def avgpool_backward(self, dy, x_shape, k=2, stride=2, out=None):
        """Into `out` where it lies, as maxpool_backward."""
        dx, cnhw = self._grad_target(out, x_shape, dy.dtype)
        self._launch("pool.cu", "avgpool_bwd", dx.size, self.cp.ascontiguousarray(dy), dx,
                     *map(np.int32, (*x_shape, k, stride, *dy.shape[2:], cnhw)))
        return out if cnhw else self._into(dx, out)

    def empty4(self, shape, dtype, cnhw):
        """An (N, C, H, W) device array, physically (C, N, H, W) when cnhw
        (ops._buf4's layout, without a reusable workspace: CuPy's memory
        pool recycles the memory)."""
        if not cnhw:
            return self.cp.empty(shape, dtype)
        n, c, h, w = shape
        return self.cp.empty((c, n, h, w), dtype).transpose(1, 0, 2, 3)

    def _into(self, res, out):
        """Kernels write contiguous arrays: copy into a caller's `out` that is
        another array (or a strided view)."""
        if out is None or out is res:
            return res
        out[...] = res
        return out

    def relu_forward(self, x, out=None):
        """Elementwise, so x is read where it lies: NCHW or a (C, N, H, W)
        buffer (a batchnorm's output), in place when out is x."""
        cp = self.cp
        base, cnhw = self._layout(x)
        inplace = out is x and (cnhw or x.flags.c_contiguous)
        res = base if inplace else cp.empty_like(base)
        self._launch("activation.cu", "relu_fwd", base.size, base, res, np.int64(base.size))
        if inplace:
            return x
        return self._into(res.transpose(1, 0, 2, 3) if cnhw else res, out)

    def relu_backward(self, dy, y, out=None):
        """dy and y in either layout (y is brought to dy's if they differ);
        in place when out is dy."""
        cp = self.cp
        dbase, dcn, ybase = self._pair(dy, y)
        inplace = out is dy and (dcn or dy.flags.c_contiguous)
        res = dbase if inplace else cp.empty_like(dbase)
        self._launch("activation.cu", "relu_bwd", dbase.size, dbase, ybase, res,
                     np.int64(dbase.size))
        if inplace:
            return dy
        return self._into(res.transpose(1, 0, 2, 3) if dcn else res, out)

    # -- batch norm, global average pool, residual sum ----------------------------
    def _layout(self, x):
        """(the memory the kernels read, cnhw): a conv's (C, N, H, W) buffer
        where x is an NCHW view of one, else x as a contiguous NCHW array."""
        from .ops import is_cnhw
        if is_cnhw(x):
            return x.transpose(1, 0, 2, 3), 1
        return self.cp.ascontiguousarray(x), 0

    def _pair(self, a, b):
        """(a's memory, a's cnhw, b's memory in a's layout) for an
        elementwise kernel over both: b is copied only where its layout
        differs."""
        abase, acn = self._layout(a)
        bbase, bcn = self._layout(b)
        if bcn != acn:
            bbase = self.cp.ascontiguousarray(b.transpose(1, 0, 2, 3) if acn else b)
        return abase, acn, bbase

    def _channel_sums(self, x, a, mean, C, M, HW, cnhw, mode, out):
        """out (C,) = per-channel sums of bn_partial's term (mode 0: x, 1:
        (x - mean)^2, 2: x * a), in fixed-order passes: bn_partial, then
        row_partial_sums down to one (no atomics, bitwise repeatable)."""
        from .ops import row_sum_widths
        p = row_sum_widths(M)[0]
        part = out if p == 1 else self.cp.empty((C, p), np.float32)
        self._launch("norm.cu", "bn_partial", C * p, x, a, mean, part, np.int32(C),
                     np.int64(M), np.int64(HW), np.int32(p), np.int32(cnhw),
                     np.int32(mode))
        if p > 1:
            self.bias_grad_rows(part, out)
        return out

    def batchnorm_forward(self, x, gamma, beta, rmean, rvar, train, momentum=0.1,
                          eps=1e-5, ws=None):
        """ops.batchnorm_forward on the device (kernels/norm.cu): x in either
        layout; y and xhat (C, N, H, W); rmean/rvar moved in place (train)."""
        cp = self.cp
        n, c, h, w = x.shape
        M, HW = n * h * w, h * w
        base, cnhw = self._layout(x)
        mean, invstd = cp.empty(c, np.float32), cp.empty(c, np.float32)
        s2 = mean
        if train:
            s1, s2 = cp.empty(c, np.float32), cp.empty(c, np.float32)
            self._channel_sums(base, base, base, c, M, HW, cnhw, 0, s1)
            self._launch("norm.cu", "bn_mean", c, s1, mean, np.int32(c), np.int64(M))
            self._channel_sums(base, base, mean, c, M, HW, cnhw, 1, s2)
        self._launch("norm.cu", "bn_stats", c, s2, mean, invstd, rmean, rvar, np.int32(c),
                     np.int64(M), np.float32(momentum), np.float32(eps),
                     np.int32(bool(train)))
        xhat, y = cp.empty((c, n, h, w), np.float32), cp.empty((c, n, h, w), np.float32)
        self._launch("norm.cu", "bn_apply", xhat.size, base, mean, invstd, gamma, beta,
                     xhat, y, np.int32(c), np.int64(M), np.int64(HW), np.int32(cnhw))
        return y.transpose(1, 0, 2, 3), xhat, invstd

    def batchnorm_backward(self, dy, xhat, invstd, gamma, dgamma, dbeta, need_dx=True,
                           ws=None):
        cp = self.cp
        c, n, h, w = xhat.shape
        M, HW = n * h * w, h * w
        base, cnhw = self._layout(dy)
        self._channel_sums(base, base, base, c, M, HW, cnhw, 0, dbeta)
        self._channel_sums(base, xhat, base, c, M, HW, cnhw, 2, dgamma)
        if not need_dx:
            return None
        dx = cp.empty((c, n, h, w), np.float32)
        self._launch("norm.cu", "bn_bwd_dx", dx.size, base, xhat, dgamma, dbeta, gamma,
                     invstd, dx, np.int32(c), np.int64(M), np.int64(HW), np.int32(cnhw))
        return dx.transpose(1, 0, 2, 3)

    def gap_forward(self, x, out=None):
        n, c, h, w = x.shape
        base, cnhw = self._layout(x)
        y = self.cp.empty((n, c), np.float32)
        self._launch("pool.cu", "gap_fwd", n * c, base, y, np.int32(n), np.int32(c),
                     np.int64(h * w), np.int32(cnhw))
        return self._into(y, out)

    def gap_backward(self, dy, x_shape, out=None):
        n, c, h, w = x_shape
        dx = self.cp.empty(x_shape, np.float32)
        self._launch("pool.cu", "gap_bwd", dx.size, self.cp.ascontiguousarray(dy), dx,
                     np.int64(n * c), np.int64(h * w))
        return self._into(dx, out)

    def add_relu_forward(self, a, b, out):
        """y = max(a + b, 0) (kernels/activation.cu add_relu_fwd) in a's
        layout; in place when out is a; b is brought to a's layout if it
        has another."""
        cp = self.cp
        ab, acn, bb = self._pair(a, b)
        inplace = out is a and (acn or a.flags.c_contiguous)
        y = ab if inplace else cp.empty_like(ab)
        self._launch("activation.cu", "add_relu_fwd", y.size, ab, bb, y, np.int64(y.size))
        if inplace:
            return a
        return self._into(y.transpose(1, 0, 2, 3) if acn else y, out)

    # -- input ----------------------------------------------------------------------
    def normalize_u8(self, x, scale, shift, ids=None):
        """data.normalize on the device (kernels/input.cu, bit for bit): x
        uint8 or uint16 (N, H, W, C), on the host (uploaded as stored: a
        quarter or a half of float32's bytes) or the device; scale, shift
        (C,) float32 on the device; ids: each image's dihedral transform
        (loader.dihedral), applied on the way (normalize_u8_aug / _u16_aug).
        Returns (N, C, H, W) float32."""
        cp = self.cp
        xd = cp.ascontiguousarray(cp.asarray(x))
        kind = {"uint8": "u8", "uint16": "u16"}.get(np.dtype(xd.dtype).name)
        if kind is None:
            raise TypeError(f"stored images are uint8 or uint16, got {xd.dtype}")
        n, h, w, c = xd.shape
        y = cp.empty((n, c, h, w), np.float32)
        aug = () if ids is None else (cp.ascontiguousarray(cp.asarray(ids, dtype=np.int32)),)
        self._launch("input.cu", f"normalize_{kind}{'_aug' if aug else ''}", y.size, xd, y,
                     scale, shift, *aug, np.int32(n), np.int32(h), np.int32(w), np.int32(c))
        return y

    # -- linear, loss -----------------------------------------------------------
    def linear_forward(self, x, w, b, out=None):
        cp = self.cp
        y = cp.matmul(x, w.T)
        self._launch("conv.cu", "bias_add_cols", y.size, y, cp.ascontiguousarray(b),
                     np.int32(y.shape[0]), np.int32(y.shape[1]))
        if out is None:
            return y
        out[...] = y
        return out

    def linear_backward(self, dy, x, w, dw, db, need_dx=True, out=None):
        cp = self.cp
        dy = cp.ascontiguousarray(dy)
        cp.matmul(dy.T, x, out=dw)
        self._launch("conv.cu", "bias_grad_cols", dy.shape[1], dy, db,
                     np.int32(dy.shape[0]), np.int32(dy.shape[1]))
        if not need_dx:
            return None
        dx = cp.matmul(dy, w)
        if out is None:
            return dx
        out[...] = dx
        return out

    def softmax_xent_forward(self, logits, labels):
        cp = self.cp
        logits = cp.ascontiguousarray(logits)
        labels = cp.asarray(labels, dtype=cp.int64)
        n, k = logits.shape
        probs = cp.empty_like(logits)
        nll = cp.empty(n, logits.dtype)
        self._launch("softmax_xent.cu", "softmax_xent_fwd", n, logits, labels, probs, nll,
                     np.int32(n), np.int32(k))
        return float(nll.mean()), probs

    def softmax_xent_train(self, logits, labels, stats):
        """The loss end of a training step in one launch: returns dlogits
        (softmax_xent_forward then softmax_xent_backward, bitwise) and adds
        each row's loss and hit (argmax == label) into stats[0, n] and
        stats[1, n] (stats: (2, cap) float64 on the device, cap >= N, from
        Model.new_stats). Nothing is read back: the caller sums stats once
        per block (Model.read_stats), so no step waits for the GPU."""
        cp = self.cp
        logits = cp.ascontiguousarray(logits)
        labels = cp.asarray(labels, dtype=cp.int64)
        n, k = logits.shape
        if (stats.dtype != np.float64 or stats.ndim != 2 or stats.shape[0] != 2
                or stats.shape[1] < n or not stats.flags.c_contiguous):
            raise ValueError(f"stats must be a contiguous (2, >= {n}) float64 array, got "
                             f"{stats.dtype} {stats.shape}")
        d = cp.empty_like(logits)
        self._launch("softmax_xent.cu", "softmax_xent_train", n, logits, labels, d, stats,
                     np.int32(n), np.int32(k), np.int32(stats.shape[1]))
        return d

    def softmax_xent_backward(self, probs, labels, out=None):
        cp = self.cp
        labels = cp.asarray(labels, dtype=cp.int64)
        n, k = probs.shape
        d = cp.empty_like(probs)
        self._launch("softmax_xent.cu", "softmax_xent_bwd", probs.size,
                     cp.ascontiguousarray(probs), labels, d, np.int32(n), np.int32(k))
        return self._into(d, out)

    # -- optimizer ----------------------------------------------------------------
    def sgd_update(self, w, g, v, c, u, lr, mu, wd, rho, nesterov, has_prox):
        dummy = w if not has_prox else None
        self._launch("optim.cu", "sgd_update", w.size, w, g, v,
                     c if has_prox else dummy, u if has_prox else dummy,
                     np.int64(w.size), np.float32(lr), np.float32(mu), np.float32(wd),
                     np.float32(rho), np.int32(bool(nesterov)), np.int32(bool(has_prox)))

    def adam_update(self, w, g, m, v, c, u, lr, b1, b2, eps, wd, rho, bc1, bc2, decoupled,
                    has_prox):
        """One Adam/AdamW step (optim/adam.py adam_update): the scalars are
        formed here in float64 (adam_scalars), the launch is one pass."""
        from .optim.adam import adam_scalars
        omb1, omb2, step, bc2s, decay = adam_scalars(lr, b1, b2, wd, bc1, bc2)
        dummy = w if not has_prox else None
        f = np.float32
        self._launch("optim.cu", "adam_update", w.size, w, g, m, v,
                     c if has_prox else dummy, u if has_prox else dummy,
                     np.int64(w.size), f(b1), f(omb1), f(b2), f(omb2), f(step), f(bc2s),
                     f(eps), f(wd), f(decay), f(rho), np.int32(bool(decoupled)),
                     np.int32(bool(has_prox)))

    def pool_bytes(self):
        """Bytes CuPy's default memory pool holds on this device (in use or
        cached for reuse): the process's high-water mark of device arrays."""
        return int(self.cp.get_default_memory_pool().total_bytes())

    def device_id(self):
        """Ordinal of the GPU this process computes on."""
        return int(self.cp.cuda.Device().id)

    def asnumpy(self, x):
        return self.cp.asnumpy(x)

    def on_device(self, x):
        """True for a device (CuPy) array, False for a host one."""
        return isinstance(x, self.cp.ndarray)

    def asarray(self, x):
        return self.cp.asarray(x)

    # -- transfers and buffers for MPI ---------------------------------------
    def pinned_empty(self, n, dtype=np.float32):
        """A 1-D NumPy array in page-locked host memory: the staging buffer
        for Allreduce without CUDA-aware MPI (DMA straight from/to it)."""
        dtype = np.dtype(dtype)
        mem = self.cp.cuda.alloc_pinned_memory(max(1, n) * dtype.itemsize)
        return np.frombuffer(mem, dtype, n)

    def to_host(self, x, out):
        """Device -> host into an existing array (pinned: one DMA, no temp);
        blocks until the copy is done."""
        self.cp.asnumpy(x, out=out)
        return out

    def to_device(self, x, out):
        """Host -> device into an existing device array."""
        out.set(np.ascontiguousarray(x, dtype=out.dtype))
        return out

    def synchronize(self):
        """Finish the current stream's work: before MPI reads a device buffer."""
        self.cp.cuda.get_current_stream().synchronize()
