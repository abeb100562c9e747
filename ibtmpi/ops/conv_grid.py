"""The input gradient of conv.py's stride-1 conv (the NumPy engine; the
CUDA kernels keep col2im) on the padded grid, in cache-sized chunks of
images: what col2im(W^T @ dy) gives, with col2im's sums in col2im's order.
conv.py's convs that take it are those the host's taps path
(conv_taps.py) leaves to conv.py: wide ones, other geometries, and the
reference CNN's convs that hand a max-pool its pooling-phase array.

The grid. The input gradient is laid out per channel as one flat row of
zero-padded images: image n's row r, column c sits at
``base + (n*Hi + r)*Wp + c``. Grid position ``q = (n*Hi + ho)*Wp + wo``
is output (n, ho, wo) (when ho < Ho and wo < Wo; dy is zero elsewhere),
and it feeds cell ``q + i*Wp + j`` for kernel offset (i, j). So a chunk's
input gradient is one GEMM to C*kh*kw rows and kh*kw shifted adds of long
contiguous rows, instead of N*C*Ho strided runs of Wo. For a "same" conv
(k = 2*pad + 1) the grid is packed: a row's right padding is the next
row's left padding (Wp = W + pad) and an image's bottom padding the next
image's top padding (Hi = H + pad); other geometries pad each image on all
sides. A chunk's windows reach past its block only into the next image's
padding and, from positions outside the outputs, as zeros into its first
rows, which the next chunk's first (copying) offset then overwrites.

Exactness: every cell adds its kh*kw terms in col2im's order and the GEMM
reduces over the F terms as the whole-batch GEMM does, so the reference
CNN's results are unchanged bit for bit (the bitwise regression checks).
Tests: tests/unit/test_conv_taps.py.
"""
from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import as_strided

from .common import _buf, _shared

GRID_CHUNK_BYTES = 2 * 2**20   # measured: 0.5-4 MiB all within noise on a 1 MiB-L2 core


class Grid:
    """The flat grid of a stride-1 conv over input (N, C, H, W): row period
    wp, image period hi rows, first data cell at base, ho x wo outputs,
    spill: how far past its image block a position's window reaches,
    length: the flat row's size (positions and spill)."""

    def __init__(self, x_shape, k, pad):
        n, _, h, w = x_shape
        self.n, self.h, self.w = n, h, w
        packed = k - 1 == 2 * pad
        self.wp = w + (pad if packed else 2 * pad)
        self.hi = h + (pad if packed else 2 * pad)
        self.ho, self.wo = h + 2 * pad - k + 1, w + 2 * pad - k + 1
        self.base = pad * self.wp + pad
        self.block = self.hi * self.wp               # positions per image
        self.spill = (k - 1) * (self.wp + 1)
        self.length = n * self.block + max(self.spill, self.base)
        self.offsets = [i * self.wp + j for i in range(k) for j in range(k)]

    def data(self, flat):
        """The (C, N, H, W) view of the data cells of a flat (C, length) grid."""
        c = flat.shape[0]
        main = flat[:, self.base:self.base + self.n * self.block]
        return main.reshape(c, self.n, self.hi, self.wp)[:, :, :self.h, :self.w]


def _phase_view(g, ndim, ho, wo):
    """View of the top-left (Ho, Wo) of g (F, N, >=Ho, >=Wo) in the order of
    a ndim-D phase array (conv.py conv2d_forward): copying the phase array
    into it puts every element at its place."""
    sf, sn, sh, sw = g.strides
    f, n = g.shape[:2]
    if ndim == 6:
        return as_strided(g, shape=(f, 2, 2, n, ho // 2, wo // 2),
                          strides=(sf, sh, sw, sn, 2 * sh, 2 * sw))
    return as_strided(g, shape=(f, 2, n, ho // 2, wo),
                      strides=(sf, sh, sn, 2 * sh, sw))


def _dy_images(dy, n0, n1):
    """Images n0..n1 of dy: (N, F, Ho, Wo), or a phase array (the image
    axis is 2 of a 5-D "rows" array, 3 of a 6-D "quads" array)."""
    if dy.ndim == 4:
        return dy[n0:n1]
    return dy[(slice(None),) * (dy.ndim - 3) + (slice(n0, n1),)]


def input_grad_on_grid(dy, w, x_shape, pad, ws=None, scratch=None):
    """dx (N, C, H, W) of a stride-1 conv, a view of a flat grid buffer in
    ws. dy: (N, F, Ho, Wo) any layout, or a phase array (see conv.py
    conv2d_backward). scratch: the chunk buffers, which any conv may share."""
    n, c = x_shape[:2]
    f, _, k, _ = w.shape
    gd = Grid(x_shape, k, pad)
    rows, blk = c * k * k, gd.block
    nb = max(1, GRID_CHUNK_BYTES // (rows * blk * w.dtype.itemsize))
    g = _shared(scratch, "gridg", (f * nb * blk,), w.dtype)
    dcol = _shared(scratch, "gridcol", (rows * nb * blk,), w.dtype)
    d2 = _buf(ws, "dxgrid", (c, gd.length), w.dtype)
    w2t = w.reshape(f, -1).T
    for n0 in range(0, n, nb):
        m = min(nb, n - n0)
        q0, length = n0 * blk, m * blk
        gc = g[:f * length].reshape(f, m, gd.hi, gd.wp)
        gc[:, :, gd.ho:, :] = 0
        gc[:, :, :gd.ho, gd.wo:] = 0
        src = _dy_images(dy, n0, n0 + m)
        if dy.ndim > 4:
            np.copyto(_phase_view(gc, dy.ndim, gd.ho, gd.wo), src)
        else:
            np.copyto(gc[:, :, :gd.ho, :gd.wo], src.transpose(1, 0, 2, 3))
        dc = dcol[:rows * length].reshape(rows, length)
        np.matmul(w2t, gc.reshape(f, length), out=dc)
        dc3 = dc.reshape(c, k * k, length)
        np.copyto(d2[:, q0:q0 + length], dc3[:, 0])   # offset (0, 0) covers the block
        d2[:, q0 + length:q0 + length + gd.spill] = 0
        for t in range(1, k * k):
            off = q0 + gd.offsets[t]
            d2[:, off:off + length] += dc3[:, t]
    return gd.data(d2).transpose(1, 0, 2, 3)
