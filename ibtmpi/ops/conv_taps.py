"""Host convolution by shifted taps, in cache-sized chunks of images (the
NumPy engine's path for most 3x3 convs, see taps_pay; the CUDA kernels and
the reference ops in conv.py keep the plain im2col order).

The layout. The conv's input is read as one flat row per channel,
(C, N*H*W): a "same" stride-1 conv (k = 2*pad + 1) reads, for output
(n, ho, wo) and kernel offset (i, j), the cell at flat distance
di*W + dj from its own (di = i - pad, dj = j - pad). So the patch-matrix
row (c, i, j) of a run of positions is ONE contiguous slice of the input,
shifted by that distance: im2col becomes k*k long copies per channel
instead of N*C*Ho short runs of Wo. A shift that crosses a row's or an
image's edge reads a neighbour's cell where the padding's zero belongs;
those cells are a few rows and columns of each image (``_fix_edges``:
the first or last |di| rows, the first or last |dj| columns) and are
zeroed in the patch. No padded copy, no positions outside the outputs: the
GEMM writes the conv's output (F, N, Ho, Wo) directly.

Stride 2 (3x3, pad 1, even H and W): output (ho, wo) reads input rows
2*ho - 1, 2*ho, 2*ho + 1, i.e. odd row ho - 1, even row ho, odd row ho of
the input's polyphase components x[:, :, a::2, b::2], which have the
output's size. The input is split once into the four components, and each
tap reads one of them at a shift of 0 or -1 row/column: the same patch
rows and GEMMs.

Backward: the weight gradient is (patch rows) @ dy^T per chunk, summed in
chunk order. The input gradient is the correlation of dy with the
transposed taps, dx cell p = sum over (f, i, j) of W[f, c, i, j] *
dy[f, p - shift(i, j)] (zero where that output does not exist: the same
edge rule with the shifts negated): one GEMM per chunk straight into dx,
per polyphase component at stride 2, which are then interleaved.

Chunks: images are taken a few at a time so that a chunk's patch rows
fill about CHUNK_BYTES; the patches and the GEMM's output stay in the
cache, and no column matrix is stored: forward keeps the input (a view
when it is already (C, N, H, W) in memory, as a conv, BatchNorm or ReLU
writes it). Narrow convs gain most: their GEMMs (16 x 144 by 144 x 65,536
for a 16-channel conv at 32x32, batch 64) are memory-bound when the
columns come from memory.

Threads: with more than one BLAS thread, a conv's chunks run on that
many Python threads (NumPy's copies and GEMMs release the GIL), each GEMM
on one BLAS thread: these GEMMs are too small to split (2 BLAS threads on
them ran resnet8's step 1.6x SLOWER than one). Each thread has its own
chunk buffers; the chunks run in waves of that many, and the weight
gradient's per-chunk parts are added in chunk order after each wave, so
every result is the same bits for any thread count.

Exactness: every output and input-gradient cell sums the same terms as
conv.py's plain ops, so the results agree to float32 rounding. The
forward reduces over the same C*k*k terms in the same order; the input
gradient reduces over (f, i, j) at once and the weight gradient chunk by
chunk, in other orders. The chunk size comes from the shapes alone (never
the thread count), so every result is deterministic.

Tests: tests/unit/test_conv_taps.py (against conv.py's ops, naive loops
and float64 central differences, with chunks forced down to one image).
"""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .. import threads
from .common import Workspace, _buf

CHUNK_BYTES = 2 * 2**20     # measured: 0.5-8 MiB all within noise on a 1 MiB-L2 core

_tls = threading.local()    # each thread's chunk buffers
_state = {"threads": None, "pool": None, "pool_n": 0, "blas": None}


def _threads():
    """The threads a conv's chunks run on: the BLAS thread count that
    threads.configure set; before it, the BLAS's own, read once."""
    n = threads.chosen.get("configured")
    if n is None:
        if _state["threads"] is None:
            _state["threads"] = threads.current_blas_threads() or 1
        n = _state["threads"]
    return max(1, int(n))


def _scratch():
    ws = getattr(_tls, "ws", None)
    if ws is None:
        ws = _tls.ws = Workspace()
    return ws


def _run(tasks):
    """Run the chunk tasks, on _threads() threads with BLAS at one thread
    each when that is more than one."""
    n = min(_threads(), len(tasks))
    if n <= 1:
        for task in tasks:
            task()
        return
    if _state["pool_n"] != n:
        if _state["pool"] is not None:
            _state["pool"].shutdown()
        _state["pool"] = ThreadPoolExecutor(n, thread_name_prefix="conv-taps")
        _state["pool_n"] = n
    if _state["blas"] is None:
        from threadpoolctl import ThreadpoolController
        _state["blas"] = ThreadpoolController().select(user_api="blas").lib_controllers
    before = [lib.get_num_threads() for lib in _state["blas"]]
    for lib in _state["blas"]:
        lib.set_num_threads(1)
    try:
        for fut in [_state["pool"].submit(task) for task in tasks]:
            fut.result()
    finally:
        for lib, k in zip(_state["blas"], before):
            lib.set_num_threads(k)


class Taps:
    """The taps of a conv over input (N, C, H, W): `planes` input planes
    of gh x gw images (the output's size), taps[(i, j) in row-major order]
    = (plane, di, dj): output (ho, wo) reads plane's cell (ho + di, wo + dj)."""

    def __init__(self, x_shape, k, pad, stride=1):
        _, _, h, w = x_shape
        if stride == 1 and k == 2 * pad + 1:
            self.planes, self.gh, self.gw = 1, h, w
            self.taps = [(0, i - pad, j - pad) for i in range(k) for j in range(k)]
        elif stride == 2 and k == 3 and pad == 1 and h % 2 == 0 and w % 2 == 0:
            self.planes, self.gh, self.gw = 4, h // 2, w // 2
            ph = ((1, -1), (0, 0), (1, 0))        # tap index -> (phase, shift)
            self.taps = [(2 * ph[i][0] + ph[j][0], ph[i][1], ph[j][1])
                         for i in range(3) for j in range(3)]
        else:
            raise ValueError(f"no taps layout for a {k}x{k} conv, stride {stride}, "
                             f"pad {pad}, on {h}x{w}")
        self.k, self.stride = k, stride

    def split(self, xt, p):
        """Plane p's share of a (C, N, H, W) array: all of it at stride 1."""
        return xt if self.planes == 1 else xt[:, :, p // 2::2, p % 2::2]


def taps_pay(c, f, k, stride, h, w, pad, phase=None):
    """Whether the host conv takes this module's path: a taps layout exists
    (a "same" stride-1 conv wider than 1x1, or a 3x3 pad-1 stride-2 conv on
    an even input), no pooling-phase output, and either a narrow conv
    (C*k*k*F up to that of a 64 -> 64 3x3 conv) or an output of at least
    16x16. Measured per conv, forward + backward, batch 64, 1 thread,
    against conv.py's im2col path: 128 -> 128 at 32x32 0.93x the time,
    256 -> 256 at 16x16 0.96x, 64 -> 128 stride 2 from 64x64 0.85x; but
    512 -> 512 at 8x8 1.08x and 256 -> 512 stride 2 to 8x8 1.18x (wide
    GEMMs over few positions: one big GEMM beats many chunks), which stay
    on conv.py's path."""
    if k < 2 or phase:
        return False
    try:
        tp = Taps((1, c, h, w), k, pad, stride)
    except ValueError:
        return False
    return c * k * k * f <= 64 * 9 * 64 or tp.gh * tp.gw >= 256


def chunk_images(rows, per_image, itemsize):
    """Images per chunk: a rows x (images * per_image) patch fills about
    CHUNK_BYTES (at least one image)."""
    return max(1, CHUNK_BYTES // (rows * per_image * itemsize))


def _fix_edges(v, di, dj, gh, gw):
    """Zero the patch cells (view (R, m, gh, gw)) whose shifted read crossed
    a row's or an image's edge: there the padding's zero belongs."""
    if di < 0:
        v[:, :, :-di, :] = 0
    elif di > 0:
        v[:, :, gh - di:, :] = 0
    if dj < 0:
        v[:, :, :, :-dj] = 0
    elif dj > 0:
        v[:, :, :, gw - dj:] = 0


def _gather(src, tp, taps, q0, m, out, sign=1):
    """out (R*T, m*gh*gw): rows (r, t) = src[plane_t][r] shifted by sign *
    tap t's (di, dj) over images q0/M .. +m (M = gh*gw), edges zeroed.
    src: (planes, R, N*M), or one plane (dy) that every tap reads."""
    r, total = src.shape[1], src.shape[2]
    length = m * tp.gh * tp.gw
    if len(taps) == tp.k ** 2 and len(src) == 1 and _gather_all(src[0], tp, q0, m, out, sign):
        return out
    out3 = out.reshape(r, len(taps), length)
    for t, (p, di, dj) in enumerate(taps):
        di, dj = sign * di, sign * dj
        start = q0 + di * tp.gw + dj
        lo = min(length, max(0, -start))
        hi = max(lo, min(length, total - start))
        dst = out3[:, t]
        np.copyto(dst[:, lo:hi], src[p if len(src) > 1 else 0, :, start + lo:start + hi])
        if lo:
            dst[:, :lo] = 0
        if hi < length:
            dst[:, hi:] = 0
        _fix_edges(dst.reshape(r, m, tp.gh, tp.gw), di, dj, tp.gh, tp.gw)
    return out


def _gather_all(plane, tp, q0, m, out, sign):
    """The whole k x k stride-1 patch of one plane (R, N*M) in ONE strided
    copy (tap (i, j) at flat shift sign*(di*gw + dj)), then the edges, a
    row or column band per shift: False when the chunk's reads would leave
    the plane (the first and last chunks), for the per-tap path."""
    k, gh, gw = tp.k, tp.gh, tp.gw
    pad = k // 2
    length = m * gh * gw
    first = q0 - sign * pad * (gw + 1)           # the flat start of tap (0, 0)
    lowest, highest = q0 - pad * (gw + 1), q0 + length + pad * (gw + 1)
    if lowest < 0 or highest > plane.shape[1]:
        return False
    it, sr = plane.itemsize, plane.strides[0]
    win = np.lib.stride_tricks.as_strided(
        plane[:, first:], shape=(plane.shape[0], k, k, length),
        strides=(sr, sign * gw * it, sign * it, it), writeable=False)
    o = out.reshape(plane.shape[0], k, k, m, gh, gw)
    np.copyto(o.reshape(win.shape), win)
    for i in range(k):                 # tap row i reads row ho + sign*(i - pad)
        d = sign * (i - pad)
        if d < 0:
            o[:, i, :, :, :-d, :] = 0
        elif d > 0:
            o[:, i, :, :, gh - d:, :] = 0
        if d < 0:
            o[:, :, i, :, :, :-d] = 0
        elif d > 0:
            o[:, :, i, :, :, gw - d:] = 0
    return True


def _rows(buf, rows, length):
    """A (rows, length) view of a flat scratch buffer with rows 16 elements
    longer than length: a row stride that is a multiple of 4 KiB (length
    3,072 = 3 images of 32x32) makes the GEMM's reads of successive rows
    fall into the same cache sets (measured: 16 x 144 by 144 x 3,072 took
    7.2 ms against 5.5 ms padded)."""
    return buf[:rows * (length + 16)].reshape(rows, length + 16)[:, :length]


def _planes(x, tp, ws):
    """The input as (planes, C, N*gh*gw): a view of x when it is a stride-1
    conv's (C, N, H, W) buffer already, else one copy."""
    n, c = x.shape[:2]
    xt = x.transpose(1, 0, 2, 3)
    if tp.planes == 1 and xt.flags.c_contiguous:
        return xt.reshape(1, c, -1)
    buf = _buf(ws, "xplanes", (tp.planes, c, n * tp.gh * tp.gw), x.dtype)
    for p in range(tp.planes):
        np.copyto(buf[p].reshape(c, n, tp.gh, tp.gw), tp.split(xt, p))
    return buf


def conv2d_taps_forward(x, w, b, pad, ws=None, stride=1):
    """y (N, F, Ho, Wo), conv2d_forward's to float32 rounding, as an NCHW
    view of a (F, N, Ho, Wo) buffer in ws, and the input planes that
    conv2d_taps_backward takes."""
    n, c = x.shape[:2]
    f, cw, k, _ = w.shape
    if cw != c:
        raise ValueError(f"conv2d: input has {c} channels, weights expect {cw}")
    tp = Taps(x.shape, k, pad, stride)
    src = _planes(x, tp, ws)
    per, rows = tp.gh * tp.gw, c * k * k
    nb = chunk_images(max(c, f) * k * k, per, x.dtype.itemsize)
    y = _buf(ws, "y2", (f, n, tp.gh, tp.gw), x.dtype)
    y2, w2 = y.reshape(f, -1), w.reshape(f, -1)

    def chunk(n0):
        m = min(nb, n - n0)
        q0, length = n0 * per, m * per
        sc = _scratch()
        col = sc.shared("tapcol", (max(c, f) * k * k * (nb * per + 16),), x.dtype)
        pr = _gather(src, tp, tp.taps, q0, m, _rows(col, rows, length))
        # into a chunk buffer, then one copy: y's rows lie N*Ho*Wo apart, often a
        # power of two, and a GEMM writing F such rows thrashes the cache's sets
        out = sc.shared("tapy", (f * nb * per,), x.dtype)[:f * length].reshape(f, length)
        np.matmul(w2, pr, out=out)
        np.copyto(y2[:, q0:q0 + length], out)
    _run([lambda n0=n0: chunk(n0) for n0 in range(0, n, nb)])
    if b is not None:
        y += b[:, None, None, None]
    return y.transpose(1, 0, 2, 3), src


def conv2d_taps_backward(dy, src, x_shape, w, pad, dw, db, need_dx=True, ws=None,
                         stride=1):
    """Gradients of conv2d_taps_forward (src: the input planes it returned):
    writes dw (F, C, k, k) and db (F,) (None: no bias) in place and returns
    dx (N, C, H, W), an NCHW view of a (C, N, H, W) buffer, or None;
    conv2d_backward's (db bitwise, dw and dx to rounding)."""
    n, f = dy.shape[:2]
    c, k = w.shape[1], w.shape[2]
    tp = Taps(x_shape, k, pad, stride)
    per, kk = tp.gh * tp.gw, k * k
    dyt = dy.transpose(1, 0, 2, 3)
    if not dyt.flags.c_contiguous:
        dyt = _buf(ws, "dyc", dyt.shape, dy.dtype)
        np.copyto(dyt, dy.transpose(1, 0, 2, 3))
    g = dyt.reshape(1, f, -1)
    if db is not None:
        np.sum(g[0], axis=1, out=db)
    nb = chunk_images(max(c, f) * kk, per, dy.dtype.itemsize)
    starts = range(0, n, nb)
    wave = min(_threads(), len(starts))        # chunks in flight; their dW parts
    parts = _buf(ws, "dwparts", (wave, c * kk, f), dy.dtype)
    if need_dx:
        groups = [[t for t, tap in enumerate(tp.taps) if tap[0] == p] for p in range(tp.planes)]
        w3 = w.reshape(f, c, kk)
        wts = [np.ascontiguousarray(w3[:, :, ts].transpose(1, 0, 2)).reshape(c, -1)
               for ts in groups]
        dxp = _buf(ws, "dxplanes", (tp.planes, c, n * per), dy.dtype)

    def chunk(i, n0):
        m = min(nb, n - n0)
        q0, length = n0 * per, m * per
        sc = _scratch()
        col = sc.shared("tapcol", (max(c, f) * kk * (nb * per + 16),), dy.dtype)
        pr = _gather(src, tp, tp.taps, q0, m, _rows(col, c * kk, length))
        gc = _rows(sc.shared("tapg", (f * (nb * per + 16),), dy.dtype), f, length)
        np.copyto(gc, g[0, :, q0:q0 + length])      # dy's rows, padded as _rows says
        np.matmul(pr, gc.T, out=parts[i % wave])
        if not need_dx:
            return
        out = sc.shared("tapy", (c * nb * per,), dy.dtype)[:c * length].reshape(c, length)
        for p, ts in enumerate(groups):
            pg = _gather(g, tp, [tp.taps[t] for t in ts], q0, m,
                         _rows(col, f * len(ts), length), sign=-1)
            np.matmul(wts[p], pg, out=out)                  # see the forward
            np.copyto(dxp[p, :, q0:q0 + length], out)
    dwt = _buf(ws, "dwt", (c * kk, f), dy.dtype)
    for w0 in range(0, len(starts), wave):
        todo = range(w0, min(w0 + wave, len(starts)))
        _run([lambda i=i: chunk(i, starts[i]) for i in todo])
        for i in todo:                      # in chunk order, for any thread count
            if i == 0:
                np.copyto(dwt, parts[0])
            else:
                dwt += parts[i % wave]
    np.copyto(dw.reshape(f, -1), dwt.T)
    if not need_dx:
        return None
    if tp.planes == 1:
        return dxp[0].reshape(c, n, tp.gh, tp.gw).transpose(1, 0, 2, 3)
    dx = _buf(ws, "dx", (c, n) + tuple(x_shape[2:]), dy.dtype)
    for p in range(tp.planes):
        np.copyto(tp.split(dx, p), dxp[p].reshape(c, n, tp.gh, tp.gw))
    return dx.transpose(1, 0, 2, 3)
