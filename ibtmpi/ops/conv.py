"""NumPy reference of the convolution (kernels/conv.cu; the GEMMs run
through cuBLAS on a GPU): ``im2col`` / ``col2im``, ``conv2d_forward`` /
``conv2d_backward``, the deterministic row sum the GPU's bias gradient uses
(``row_sum_widths``, ``row_partial_sums``) and the host fast paths. ONE
large GEMM per conv per pass: ``im2col`` lays the patches out as ``col``
(C*kh*kw, N*Ho*Wo), so ``W2 (F, CKK) @ col`` covers the whole batch and the
output is an NCHW view of the (F, N, Ho, Wo) result (no transpose copy);
``col2im`` scatters with strided slice-adds over the kh*kw kernel offsets
(never np.add.at). Host-only refinements (the layers use them; the CUDA
kernels mirror the plain versions, which stay the reference): a conv
followed by a 2x2/stride-2 max-pool orders its GEMM columns by pooling
phase (``phase="rows"`` or ``"quads"``, see ``im2col``), so the pool reads
contiguous blocks; a stride-1 conv computes its input gradient on the
padded grid (conv_grid.py ``input_grad_on_grid``); most 3x3 convs
take the host's taps path instead (conv_taps.py taps_pay, layers/conv.py).
NumPy's element-wise loops run 5-10x slower on short strided runs than on
contiguous ones, and most of these choices follow from that (docs/benchmarks.md). Tests: tests/unit/test_ops.py
(naive loops, scipy.signal, finite differences), tests/gpu/test_gpu_ops.py.
"""
from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import as_strided

from .common import _buf, _buf4, _shared, conv_out_size
from .conv_grid import _phase_view, input_grad_on_grid


# --------------------------------------------------------------------------
# im2col / col2im
# --------------------------------------------------------------------------

def _padded(x, pad, ws=None, name="xpad"):
    """x (N, C, H, W) -> (N, C, H+2p, W+2p) with zero borders."""
    if pad == 0:
        return x
    n, c, h, w = x.shape
    # Physically (C, N, Hp, Wp), so the im2col rows read long runs.
    xp = _buf4(ws, name, (n, c, h + 2 * pad, w + 2 * pad), x.dtype, True)
    # Only the border strips are zeroed (cheap); the interior is overwritten.
    xp[:, :, :pad, :] = 0
    xp[:, :, -pad:, :] = 0
    xp[:, :, pad:-pad, :pad] = 0
    xp[:, :, pad:-pad, -pad:] = 0
    xp[:, :, pad:pad + h, pad:pad + w] = x
    return xp


def _col_geometry(xp, kh, kw, stride, ho, wo, phase):
    """(shape, strides) of the view (C, kh, kw, <columns>) over the padded
    input (N, C, Hp, Wp) whose C-order copy is col. The columns are
    (N, Ho, Wo); (2, N, Ho/2, Wo) for phase "rows"; (2, 2, N, Ho/2, Wo/2)
    for phase "quads"."""
    n, c = xp.shape[:2]
    sn, sc, sh, sw = xp.strides
    if phase:
        if ho % 2 or wo % 2:
            raise ValueError(f"phase order needs an even output, got {ho}x{wo}")
        if phase == "quads":
            return ((c, kh, kw, 2, 2, n, ho // 2, wo // 2),
                    (sc, sh, sw, sh * stride, sw * stride, sn,
                     2 * sh * stride, 2 * sw * stride))
        if phase != "rows":
            raise ValueError(f"phase must be None, 'rows' or 'quads', got {phase!r}")
        return ((c, kh, kw, 2, n, ho // 2, wo),
                (sc, sh, sw, sh * stride, sn, 2 * sh * stride, sw * stride))
    return ((c, kh, kw, n, ho, wo),
            (sc, sh, sw, sn, sh * stride, sw * stride))


def im2col(x, kh, kw, stride, pad, out=None, ws=None, phase=None):
    """Patches of x (N, C, H, W) as col (C*kh*kw, N*Ho*Wo).

    Row r = (c*kh + i)*kw + j holds x[n, c, ho*s + i - p, wo*s + j - p]
    at column (n*Ho + ho)*Wo + wo (zero where the index falls in the padding).
    Pooling-phase orders (for a 2x2/stride-2 max-pool after the conv, with
    ho = 2*ho2 + ph, wo = 2*wo2 + pw): phase="rows" orders the columns
    (ph, n, ho2, wo), even and odd output rows in two blocks; phase="quads"
    orders them (ph, pw, n, ho2, wo2), the four members of every pooling
    window in four blocks (see maxpool2_rows_forward, maxpool2_quads_forward).
    """
    n, c, h, w = x.shape
    ho = conv_out_size(h, kh, stride, pad)
    wo = conv_out_size(w, kw, stride, pad)
    xp = _padded(x, pad, ws)
    # View (C, kh, kw, <columns>) over the padded input, then one copy.
    shape, strides = _col_geometry(xp, kh, kw, stride, ho, wo, phase)
    win = as_strided(xp, shape=shape, strides=strides, writeable=False)
    if out is None:
        out = np.empty((c * kh * kw, n * ho * wo), x.dtype)
    np.copyto(out.reshape(shape), win)
    return out


def col2im(col, x_shape, kh, kw, stride, pad, out=None, ws=None):
    """Adjoint of im2col: col (C*kh*kw, N*Ho*Wo) summed back to (N, C, H, W)."""
    n, c, h, w = x_shape
    ho = conv_out_size(h, kh, stride, pad)
    wo = conv_out_size(w, kw, stride, pad)
    # Physically (C, N, Hp, Wp) like col's rows, so the adds stream.
    dxp = _buf4(ws, "dxpad", (n, c, h + 2 * pad, w + 2 * pad), col.dtype,
                True, zero=True)
    shape, strides = _col_geometry(dxp, kh, kw, stride, ho, wo, False)
    cols = col.reshape(shape)
    for i in range(kh):
        for j in range(kw):
            # Offset (i, j) touches each padded cell at most once.
            dst = as_strided(dxp[:, :, i:, j:], shape=(c,) + shape[3:],
                             strides=(strides[0],) + strides[3:])
            dst += cols[:, i, j]
    if pad == 0 and out is None:
        return dxp
    if out is None:
        out = _buf4(ws, "dx", x_shape, col.dtype, True)
    np.copyto(out, dxp[:, :, pad:pad + h, pad:pad + w])
    return out


# --------------------------------------------------------------------------
# conv2d
# --------------------------------------------------------------------------

def conv2d_forward(x, w, b, stride=1, pad=0, col=None, out=None, ws=None,
                   phase=None):
    """y (N, F, Ho, Wo) = conv(x (N, C, H, W), w (F, C, kh, kw)) + b (F,)
    (b None: no bias).

    Returns (y, col); col (C*kh*kw, N*Ho*Wo) is what backward needs.
    phase (host fast path for a conv followed by a 2x2/stride-2 max-pool;
    see im2col) returns y as a phase array instead: (F, 2, N, Ho/2, Wo) for
    "rows", which maxpool2_rows_forward takes, or (F, 2, 2, N, Ho/2, Wo/2)
    for "quads", which maxpool2_quads_forward takes.
    """
    n, c, h, wd = x.shape
    f, cw, kh, kw = w.shape
    if cw != c:
        raise ValueError(f"conv2d: input has {c} channels, weights expect {cw}")
    ho = conv_out_size(h, kh, stride, pad)
    wo = conv_out_size(wd, kw, stride, pad)
    if col is None:
        col = _shared(ws, "col", (c * kh * kw, n * ho * wo), x.dtype)
    im2col(x, kh, kw, stride, pad, out=col, ws=ws, phase=phase)
    y2 = _buf(ws, "y2", (f, n * ho * wo), x.dtype)
    np.matmul(w.reshape(f, -1), col, out=y2)          # (F, N*Ho*Wo)
    if b is not None:                                 # None: no bias (before a BN)
        y2 += b[:, None]
    if phase:
        if phase == "quads":
            return y2.reshape(f, 2, 2, n, ho // 2, wo // 2), col
        return y2.reshape(f, 2, n, ho // 2, wo), col
    y = y2.reshape(f, n, ho, wo).transpose(1, 0, 2, 3)
    if out is None:
        # Zero-copy: an NCHW view of the (F, N, Ho, Wo) buffer. Downstream
        # ops take any strides; conv2d_backward recognises this layout in
        # dy and skips its transpose.
        return y, col
    np.copyto(out, y)
    return out, col


def conv2d_backward(dy, col, x_shape, w, stride, pad, dw, db, need_dx=True,
                    ws=None, colws=None, scratch=None):
    """Gradients of conv2d_forward.

    dy (N, F, Ho, Wo), or the phase array (5-D "rows", 6-D "quads") when
    forward ran with a phase; col from forward; writes dw (F, C, kh, kw)
    and db (F,) in place (overwrites; db None: a conv without bias); returns dx (N, C, H, W) or None.
    With a ws, the input gradient reuses col's memory: one backward per
    forward. colws: where col lives when it is one buffer shared by the
    model's convs (layers/conv.py: recomputed in backward); the input
    gradient's columns take it too. scratch: where a stride-1 conv's input
    gradient keeps its chunk buffers (conv_grid.py; default ws).
    """
    kh, kw = w.shape[2], w.shape[3]
    phase = dy.ndim > 4
    if phase:
        f = dy.shape[0]
        dy2 = dy.reshape(f, -1)
    else:
        n, f, ho, wo = dy.shape
        dyt = dy.transpose(1, 0, 2, 3)                # (F, N, Ho, Wo)
        if dyt.flags.c_contiguous:
            dy2 = dyt.reshape(f, n * ho * wo)         # no copy needed
        else:
            dy2 = _buf(ws, "dy2", (f, n * ho * wo), dy.dtype)
            np.copyto(dy2.reshape(f, n, ho, wo), dyt)
    if db is not None:
        np.sum(dy2, axis=1, out=db)
    # dW^T = col @ dy2^T: OpenBLAS runs this orientation 10-20% faster than
    # dy2 @ col^T on these shapes (measured); the transpose back is tiny.
    dwt = _buf(ws, "dwt", (col.shape[0], f), dy.dtype)
    np.matmul(col, dy2.T, out=dwt)                    # (CKK, F)
    np.copyto(dw.reshape(f, -1), dwt.T)
    if not need_dx:
        return None
    if stride == 1:
        return input_grad_on_grid(dy, w, x_shape, pad, ws,
                                  scratch if scratch is not None else ws)
    if phase:
        # back to plain column order for col2im
        plain = _buf(ws, "dy2", (f, dy.size // f), dy.dtype)
        n, _, ho, wo = phase_plain_shape(dy)
        np.copyto(_phase_view(plain.reshape(f, n, ho, wo), dy.ndim, ho, wo), dy)
        dy2 = plain
    # col is spent once dW is computed: a shared col's memory takes dcol
    dcol = (_shared(colws, "col", col.shape, dy.dtype) if colws is not None
            else _buf(ws, "dcol", col.shape, dy.dtype))
    np.matmul(w.reshape(f, -1).T, dy2, out=dcol)      # (CKK, N*Ho*Wo)
    return col2im(dcol, x_shape, kh, kw, stride, pad, ws=ws)


def row_sum_widths(m, per_thread=64):
    """The P of each pass of the GPU's deterministic row sum over M columns
    (kernels/conv.cu row_partial_sums): ceil(M / 64) partial sums per row,
    again on those, down to 1."""
    widths = []
    while True:
        p = -(-m // per_thread) if m > per_thread else 1
        widths.append(p)
        if p == 1:
            return widths
        m = p


def row_partial_sums(x, p):
    """NumPy twin of one row_partial_sums pass, with the kernel's order of
    additions (so float32 results are bitwise equal): out[f, q] = sum of
    x[f, m] for m = q, q + p, ... in increasing m."""
    f, m = x.shape
    k = -(-m // p)
    padded = np.zeros((f, k * p), x.dtype)      # + 0.0 leaves a sum unchanged
    padded[:, :m] = x
    padded = padded.reshape(f, k, p)
    acc = np.zeros((f, p), x.dtype)
    for j in range(k):
        acc += padded[:, j, :]
    return acc


def phase_plain_shape(dy):
    """(N, F, Ho, Wo) of a phase array (see conv2d_forward)."""
    if dy.ndim == 6:
        f, _, _, n, ho2, wo2 = dy.shape
        return n, f, 2 * ho2, 2 * wo2
    f, _, n, ho2, wo = dy.shape
    return n, f, 2 * ho2, wo
