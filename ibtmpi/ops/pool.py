"""NumPy reference of the pools (kernels/pool.cu): ``maxpool_forward`` /
``maxpool_backward`` over k x k windows with stride s and `pad` cells of
padding that never win (torchvision's stem: k 3, stride 2, pad 1; argmax =
the first maximum's offset in the padded window, ties to the lowest), the
host-only 2x2/stride-2 variants that read a conv's pooling-phase array
(``maxpool2_rows_*``, ``maxpool2_quads_*``; see ops/conv.py im2col), the
average pool ``avgpool_forward`` / ``avgpool_backward`` over the same
windows and the global average pool ``gap_forward`` / ``gap_backward``.
Tests: tests/unit/test_ops.py (naive loops, finite differences),
tests/unit/test_ops_modern.py (gap), tests/gpu/test_gpu_ops.py.
"""
from __future__ import annotations

import numpy as np

from .common import _buf, _buf4, conv_out_size, is_cnhw


def _padded(x, pad, ws):
    """x (N, C, H, W) inside a -inf border of `pad` cells (NCHW): padding
    never wins a window, as in PyTorch's MaxPool2d."""
    n, c, h, w = x.shape
    xp = _buf(ws, "xpad", (n, c, h + 2 * pad, w + 2 * pad), x.dtype)
    xp.fill(-np.inf)
    xp[:, :, pad:pad + h, pad:pad + w] = x
    return xp


def maxpool_forward(x, k=2, stride=2, out=None, argmax=None, ws=None, pad=0):
    """y (N, C, Ho, Wo) = max over k x k windows of x (N, C, H, W) with `pad`
    cells of -inf around it (pad < k, so every window holds a real cell).

    argmax (N, C, Ho, Wo) uint8 holds the offset i*k + j in the padded
    window of the first maximum in row-major scan order (ties go to the
    lowest offset); k*k <= 256.
    """
    n, c, h, w = x.shape
    if k * k > 256:
        raise ValueError(f"max-pool window {k}x{k} is too large (k*k <= 256)")
    if not 0 <= pad < k:
        raise ValueError(f"max-pool padding {pad} must be in [0, k) for k = {k}")
    ho = conv_out_size(h, k, stride, pad)
    wo = conv_out_size(w, k, stride, pad)
    cnhw = is_cnhw(x)         # outputs keep the input's physical layout
    if out is None:
        out = _buf4(ws, "y", (n, c, ho, wo), x.dtype, cnhw)
    if argmax is None:
        argmax = _buf4(ws, "argmax", (n, c, ho, wo), np.uint8, cnhw)
    if pad:
        x = _padded(x, pad, ws)
    span_h = stride * (ho - 1) + 1
    span_w = stride * (wo - 1) + 1

    def view(i, j):   # (N, C, Ho, Wo): element (i, j) of every window
        return x[:, :, i:i + span_h:stride, j:j + span_w:stride]

    shp = (n, c, ho, wo)
    if k == 2:
        # Comparison tree over a=(0,0) b=(0,1) c=(1,0) d=(1,1). Strict '>'
        # keeps the earlier offset on ties at every level.
        a, b, cc, d = view(0, 0), view(0, 1), view(1, 0), view(1, 1)
        m_ab = np.greater(b, a, out=_buf4(ws, "m_ab", shp, np.bool_, cnhw))
        m_cd = np.greater(d, cc, out=_buf4(ws, "m_cd", shp, np.bool_, cnhw))
        ab = np.maximum(a, b, out=_buf4(ws, "ab", shp, x.dtype, cnhw))
        cd = np.maximum(cc, d, out=out)
        m = np.greater(cd, ab, out=_buf4(ws, "m", shp, np.bool_, cnhw))
        np.maximum(ab, cd, out=out)
        # offset = 2*m + (m ? m_cd : m_ab)
        not_m = np.logical_not(m, out=_buf4(ws, "not_m", shp, np.bool_, cnhw))
        np.logical_and(not_m, m_ab, out=m_ab)
        np.logical_and(m, m_cd, out=m_cd)
        np.logical_or(m_ab, m_cd, out=m_ab)
        np.left_shift(m.view(np.uint8), 1, out=argmax)
        argmax += m_ab.view(np.uint8)
        return out, argmax
    better = _buf4(ws, "better", shp, np.bool_, cnhw)
    for i in range(k):
        for j in range(k):
            v = view(i, j)
            if i == 0 and j == 0:
                np.copyto(out, v)
                argmax.fill(0)
                continue
            np.greater(v, out, out=better)    # strict: first max wins ties
            np.maximum(out, v, out=out)
            np.copyto(argmax, i * k + j, where=better)
    return out, argmax


def maxpool_backward(dy, argmax, x_shape, k=2, stride=2, out=None, ws=None, pad=0):
    """dx (N, C, H, W): dy routed to the argmax position of each window
    (with `pad`: routed in the padded frame, whose border is dropped)."""
    if pad:
        n, c, h, w = x_shape
        full = maxpool_backward(dy, argmax, (n, c, h + 2 * pad, w + 2 * pad), k, stride,
                                out=_buf(ws, "dxpad", (n, c, h + 2 * pad, w + 2 * pad),
                                         dy.dtype), ws=ws)
        if out is None:
            out = _buf(ws, "dx", x_shape, dy.dtype)
        out[...] = full[:, :, pad:pad + h, pad:pad + w]
        return out
    n, c, ho, wo = dy.shape
    if out is None:
        out = _buf(ws, "dx", x_shape, dy.dtype)
    span_h = stride * (ho - 1) + 1
    span_w = stride * (wo - 1) + 1
    hit = _buf4(ws, "hit", dy.shape, np.bool_, is_cnhw(argmax))
    if stride >= k:
        # Windows do not overlap: each input cell is written at most once,
        # and exactly once when the windows tile the input.
        tiles = (stride == k and x_shape[2] == ho * k and x_shape[3] == wo * k)
        if not tiles:
            out.fill(0)
        for i in range(k):
            for j in range(k):
                dst = out[:, :, i:i + span_h:stride, j:j + span_w:stride]
                np.equal(argmax, i * k + j, out=hit)
                np.multiply(dy, hit.view(np.uint8), out=dst)
        return out
    out.fill(0)
    for i in range(k):
        for j in range(k):
            dst = out[:, :, i:i + span_h:stride, j:j + span_w:stride]
            np.equal(argmax, i * k + j, out=hit)
            dst += dy * hit
    return out


def maxpool2_rows_forward(y5, ws=None):
    """2x2/stride-2 max-pool of a row-phase array (C, 2, N, Ho, W) (see
    conv2d_forward): the window's two rows come as two contiguous blocks,
    so the vertical half of the pool runs on contiguous arrays and only
    the horizontal half (on half as many elements) reads stride-2 views.

    Returns (out, argmax) with maxpool_forward's meaning: out (N, C, Ho, W/2)
    as an NCHW view of a (C, N, Ho, W/2) buffer, argmax (C, N, Ho, W/2) uint8
    holding the offset i*2 + j of the first maximum in row-major order.
    """
    c, _, n, ho, w = y5.shape
    wo = w // 2
    half, quarter = (c, n, ho, w), (c, n, ho, wo)
    top, bot = y5[:, 0], y5[:, 1]
    vm = np.greater(bot, top, out=_buf(ws, "vm", half, np.bool_))   # row 1 wins
    v = np.maximum(top, bot, out=_buf(ws, "v", half, y5.dtype))
    vl, vr, ml, mr = v[..., 0::2], v[..., 1::2], vm[..., 0::2], vm[..., 1::2]
    out = np.maximum(vl, vr, out=_buf(ws, "y", quarter, y5.dtype))
    hm = np.greater(vr, vl, out=_buf(ws, "hm", quarter, np.bool_))   # column 1 wins
    # On a tie between the columns the first maximum in row-major order is
    # in column 1 only when that column's winner is offset 1 (row 0) and
    # column 0's is offset 2 (row 1).
    eq = np.equal(vr, vl, out=_buf(ws, "eq", quarter, np.bool_))
    t = np.greater(ml, mr, out=_buf(ws, "t", quarter, np.bool_))     # ml and not mr
    np.logical_and(eq, t, out=eq)
    np.logical_or(hm, eq, out=hm)
    # winner's row: hm ? mr : ml
    np.logical_xor(ml, mr, out=t)
    np.logical_and(t, hm, out=t)
    np.logical_xor(t, ml, out=t)
    argmax = _buf(ws, "argmax", quarter, np.uint8)
    np.add(t.view(np.uint8), t.view(np.uint8), out=argmax)
    argmax += hm.view(np.uint8)
    return out.transpose(1, 0, 2, 3), argmax


def _route_to_phases(dy, argmax, out, ws):
    """out[i][j] = dy where argmax == 2*i + j else 0, for a phase array's
    four (C, N, Ho, Wo)-shaped window-member views out[i][j]."""
    dyt = dy.transpose(1, 0, 2, 3)
    if not dyt.flags.c_contiguous:       # one strided pass, then contiguous reads
        tmp = _buf(ws, "dyt", argmax.shape, dy.dtype)
        np.copyto(tmp, dyt)
        dyt = tmp
    hit = _buf(ws, "hit", argmax.shape, np.bool_)
    for i in range(2):
        for j in range(2):
            np.equal(argmax, 2 * i + j, out=hit)
            # float * uint8 runs about twice as fast as float * bool
            np.multiply(dyt, hit.view(np.uint8), out=out[i][j])


def maxpool2_rows_backward(dy, argmax, ws=None):
    """dy (N, C, Ho, Wo), any layout -> the row-phase array (C, 2, N, Ho, 2*Wo)
    of the gradient with respect to the pool's input."""
    c, n, ho, wo = argmax.shape
    d5 = _buf(ws, "d5", (c, 2, n, ho, 2 * wo), dy.dtype)
    _route_to_phases(dy, argmax, [[d5[:, i, ..., j::2] for j in range(2)]
                                  for i in range(2)], ws)
    return d5


def maxpool2_quads_forward(y6, ws=None):
    """2x2/stride-2 max-pool of a quads phase array (C, 2, 2, N, Ho, Wo) (see
    conv2d_forward): every pass is contiguous.

    Returns (out, argmax) with maxpool_forward's meaning: out (N, C, Ho, Wo)
    as an NCHW view of a (C, N, Ho, Wo) buffer, argmax (C, N, Ho, Wo) uint8
    holding the offset i*2 + j of the first maximum in row-major order.
    """
    c, _, _, n, ho, wo = y6.shape
    shp = (c, n, ho, wo)
    a, b, cc, d = y6[:, 0, 0], y6[:, 0, 1], y6[:, 1, 0], y6[:, 1, 1]
    m_ab = np.greater(b, a, out=_buf(ws, "m_ab", shp, np.bool_))
    m_cd = np.greater(d, cc, out=_buf(ws, "m_cd", shp, np.bool_))
    ab = np.maximum(a, b, out=_buf(ws, "ab", shp, y6.dtype))
    out = np.maximum(cc, d, out=_buf(ws, "y", shp, y6.dtype))
    m = np.greater(out, ab, out=_buf(ws, "m", shp, np.bool_))
    np.maximum(ab, out, out=out)
    # offset = 2*m + (m ? m_cd : m_ab); strict '>' keeps the earlier offset
    argmax = _buf(ws, "argmax", shp, np.uint8)
    np.logical_and(m, m_cd, out=m_cd)
    np.greater(m_ab, m, out=m_ab)                 # m_ab and not m
    np.logical_or(m_ab, m_cd, out=m_ab)
    np.add(m.view(np.uint8), m.view(np.uint8), out=argmax)
    argmax += m_ab.view(np.uint8)
    return out.transpose(1, 0, 2, 3), argmax


def maxpool2_quads_backward(dy, argmax, ws=None):
    """dy (N, C, Ho, Wo), any layout -> the quads phase array (C, 2, 2, N, Ho, Wo)
    of the gradient with respect to the pool's input."""
    c, n, ho, wo = argmax.shape
    d6 = _buf(ws, "d6", (c, 2, 2, n, ho, wo), dy.dtype)
    _route_to_phases(dy, argmax, [[d6[:, i, j] for j in range(2)]
                                  for i in range(2)], ws)
    return d6


# --------------------------------------------------------------------------
# average pooling over k x k windows (kernels/pool.cu avgpool_fwd / avgpool_bwd)
# --------------------------------------------------------------------------

def avgpool_forward(x, k=2, stride=2, out=None, ws=None):
    """y (N, C, Ho, Wo) = mean over k x k windows of x (N, C, H, W), no
    padding; x of any strides, y in x's physical layout (NCHW, or (C, N,
    H, W) for a conv's output). The window is summed in row-major order
    (one strided view per offset), then scaled by 1 / (k*k): the kernel's
    order, bit for bit."""
    n, c, h, w = x.shape
    ho = conv_out_size(h, k, stride, 0)
    wo = conv_out_size(w, k, stride, 0)
    if out is None:
        out = _buf4(ws, "y", (n, c, ho, wo), x.dtype, is_cnhw(x))
    span_h = stride * (ho - 1) + 1
    span_w = stride * (wo - 1) + 1
    for i in range(k):
        for j in range(k):
            v = x[:, :, i:i + span_h:stride, j:j + span_w:stride]
            if i == 0 and j == 0:
                np.copyto(out, v)
            else:
                out += v
    out *= x.dtype.type(1.0 / (k * k))
    return out


def avgpool_backward(dy, x_shape, k=2, stride=2, out=None):
    """dx (N, C, H, W): each input cell gets the sum of dy over the windows
    that contain it, times 1 / (k*k) (cells no window covers get 0). One
    strided slice-add of dy per window offset, in row-major offset order
    (the kernel's gather takes the windows in that order); `out` may have
    any strides (a conv's (C, N, H, W) layout)."""
    n, c, ho, wo = dy.shape
    if out is None:
        out = np.empty(x_shape, dy.dtype)
    inv = dy.dtype.type(1.0 / (k * k))
    span_h = stride * (ho - 1) + 1
    span_w = stride * (wo - 1) + 1
    tiles = stride == k and x_shape[2] == ho * k and x_shape[3] == wo * k
    if not tiles:
        out.fill(0)
    for i in range(k):
        for j in range(k):
            dst = out[:, :, i:i + span_h:stride, j:j + span_w:stride]
            if stride >= k:           # no overlaps: each cell gets one window
                np.multiply(dy, inv, out=dst)
            else:
                dst += dy
    if stride < k:
        out *= inv
    return out


# --------------------------------------------------------------------------
# global average pooling (kernels/pool.cu gap_fwd / gap_bwd)
# --------------------------------------------------------------------------

def gap_forward(x, out=None):
    """y (N, C) = mean of x (N, C, H, W) over H and W (any strides)."""
    n, c, h, w = x.shape
    if out is None:
        out = np.empty((n, c), x.dtype)
    np.sum(x, axis=(2, 3), out=out)
    out *= x.dtype.type(1.0 / (h * w))
    return out


def gap_backward(dy, x_shape, out=None):
    """dx (N, C, H, W) = dy (N, C) / (H * W) at every position."""
    n, c, h, w = x_shape
    if out is None:
        out = np.empty(x_shape, dy.dtype)
    out[...] = (dy * dy.dtype.type(1.0 / (h * w)))[:, :, None, None]
    return out
