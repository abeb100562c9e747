"""Host convolution on the padded grid, in cache-sized chunks of images
(the NumPy engine only; the CUDA kernels and the reference ops in conv.py
keep the plain im2col order).

The grid. A stride-1 conv's input is laid out per channel as one flat row
of zero-padded images: image n's row r, column c sits at
``base + (n*Hi + r)*Wp + c``; everything else is zero. Grid position
``q = (n*Hi + ho)*Wp + wo`` is output (n, ho, wo) (when ho < Ho and
wo < Wo; the others are computed and never read), and it reads cell
``q + i*Wp + j`` for kernel offset (i, j). So the row (c, i, j) of the
patch matrix is one CONTIGUOUS run of the flat grid (im2col becomes kh*kw
long copies per channel instead of N*C*Ho short runs of Wo), and col2im
becomes kh*kw shifted adds of long rows. For a "same" conv (k = 2*pad+1,
every 3x3 pad-1 conv) the grid is packed: a row's right padding is the
next row's left padding (Wp = W + pad) and an image's bottom padding the
next image's top padding (Hi = H + pad), so the positions nobody reads
are 6% of a 32x32 output, 13% at 16x16, 27% at 8x8. Other geometries pad
each image on all sides (Wp = W + 2*pad, Hi = H + 2*pad).

Chunks: images are taken a few at a time (``chunk_images``: the chunk's
patch rows fill about GRID_CHUNK_BYTES), so the patch rows, the GEMM's
output and the gradient's scratch are written and read while they are in
the cache, and no (C*kh*kw, N*Ho*Wo) column matrix is ever stored: the
forward keeps the padded input instead (about kh*kw times smaller). Narrow
convs gain most: their GEMMs (16 x 144 by 144 x 65,536 for a 16-channel
conv at 32x32, batch 64) are memory-bound when the columns come from
memory.

Stride 2 (3x3, pad 1, even images; ``Grid``): the input is split once
into its four polyphase components, each laid out as a packed grid of the
output's size, and every tap reads one of them at a fixed offset: the
same chunked patch rows and GEMMs, and the input gradient's adds land in
the four planes, which are interleaved back at the end.

The input gradient of a stride-1 conv on this path is a correlation of
dy's grid with the transposed taps (``_grads_by_correlation``: one GEMM
per chunk straight into the dx grid); the stride-2 one, and the stride-1
one of conv.py's pooling-phase convs (the reference CNN), are a GEMM to
C*kh*kw rows and kh*kw shifted adds (``input_grad_on_grid``), col2im's
sums in col2im's order.

Exactness: every output and input-gradient cell sums the same terms as
conv.py's plain ops, so the results agree to float32 rounding. The forward
reduces over the same C*kh*kw terms as the whole-batch GEMM (bit for bit
at the sizes measured; OpenBLAS may order a small GEMM's sums differently
from a large one's), the shifted-add input gradient adds its taps in
col2im's order (the reference CNN's results are unchanged bit for bit, as
the bitwise regression checks), while the correlation reduces over
(f, i, j) at once and the weight gradient is summed chunk by chunk, in
another order. The chunk size comes from the shapes alone (never the
thread count), so every result is deterministic.

Tests: tests/unit/test_conv_grid.py (against conv.py's ops, naive loops
and float64 central differences, with chunks forced down to one image).
"""
from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import as_strided

from .common import _buf, _shared

GRID_CHUNK_BYTES = 2 * 2**20   # measured: 0.5-4 MiB all within noise on a 1 MiB-L2 core


class Grid:
    """The flat grid of a conv over input (N, C, H, W): `planes` flat rows
    per channel, row period wp, image period hi rows, first data cell at
    base, ho x wo outputs; taps[(i, j) in row-major order] = (plane,
    offset): grid position q reads plane's cell q + offset; spill: the
    largest offset (how far past its image block a position's window
    reads); length: a plane's size (positions and spill, zero outside the
    data).

    Stride 1: one plane, the padded images (packed for a "same" conv,
    see the module docstring), offset i*wp + j. Stride 2 (3x3, pad 1, even
    H and W): the four polyphase components x[:, :, a::2, b::2] as four
    packed planes of (H/2, W/2) images, each with one shared row and
    column of zeros; tap i reads phase 1 shifted up one row (i = 0),
    phase 0 (i = 1) or phase 1 (i = 2), likewise for j, so a stride-2 conv
    is a stride-1 pass over the four planes with the grid of its output."""

    def __init__(self, x_shape, k, pad, stride=1):
        n, _, h, w = x_shape
        self.n, self.h, self.w, self.k, self.pad, self.stride = n, h, w, k, pad, stride
        if stride == 1:
            packed = k - 1 == 2 * pad
            self.gh, self.gw = h, w                       # a plane's images
            self.wp = w + (pad if packed else 2 * pad)
            self.hi = h + (pad if packed else 2 * pad)
            self.ho, self.wo = h + 2 * pad - k + 1, w + 2 * pad - k + 1
            self.base = pad * self.wp + pad
            self.planes = 1
            self.taps = [(0, i * self.wp + j) for i in range(k) for j in range(k)]
        elif stride == 2 and k == 3 and pad == 1 and h % 2 == 0 and w % 2 == 0:
            self.gh, self.gw = h // 2, w // 2
            self.wp, self.hi = self.gw + 1, self.gh + 1
            self.ho, self.wo = self.gh, self.gw
            self.base = self.wp + 1
            self.planes = 4
            ph = ((1, -1), (0, 0), (1, 0))                # tap index -> (phase, shift)
            self.taps = [(2 * ph[i][0] + ph[j][0], (1 + ph[i][1]) * self.wp + 1 + ph[j][1])
                         for i in range(3) for j in range(3)]
        else:
            raise ValueError(f"no grid for a {k}x{k} conv, stride {stride}, pad {pad}, "
                             f"on {h}x{w}")
        self.block = self.hi * self.wp               # positions per image
        self.spill = max(off for _, off in self.taps)
        self.length = n * self.block + max(self.spill, self.base)

    def data(self, flat):
        """The (C, N, gh, gw) view of the data cells of one plane (C, length)."""
        c = flat.shape[0]
        main = flat[:, self.base:self.base + self.n * self.block]
        return main.reshape(c, self.n, self.hi, self.wp)[:, :, :self.gh, :self.gw]

    def phase(self, a, p):
        """Plane p's share of a (C, N, H, W) array: all of it at stride 1."""
        return a if self.planes == 1 else a[:, :, p // 2::2, p % 2::2]

    def zero_pad(self, flat):
        """Zero every cell of one plane (C, length) outside the data."""
        c = flat.shape[0]
        end = self.base + self.n * self.block
        flat[:, :self.base] = 0
        flat[:, end:] = 0
        main = flat[:, self.base:end].reshape(c, self.n, self.hi, self.wp)
        main[:, :, self.gh:, :] = 0
        main[:, :, :self.gh, self.gw:] = 0


def chunk_images(rows, block, itemsize):
    """Images per chunk: the chunk's `rows` x (images * block) patch matrix
    fills about GRID_CHUNK_BYTES (at least one image)."""
    return max(1, GRID_CHUNK_BYTES // (rows * block * itemsize))


def grid_pays(c, f, k, stride, h, w, pad, phase=None):
    """Whether the host conv takes this module's path: a grid exists
    (stride 1 with a kernel wider than 1, or a 3x3 pad-1 stride-2 conv on
    an even input), no pooling-phase output, at most 30% more grid
    positions than outputs, and a narrow conv (C*k*k*F up to that of a
    64 -> 64 3x3 conv; wider ones run efficient GEMMs on conv.py's path,
    and its shared recomputed columns bound their memory)."""
    if k < 2 or phase or stride not in (1, 2):
        return False
    try:
        g = Grid((1, c, h, w), k, pad, stride)
    except ValueError:
        return False
    if g.ho < 1 or g.wo < 1:
        return False
    return g.block <= 1.3 * g.ho * g.wo and c * k * k * f <= 64 * 9 * 64


def _patch_rows(xf, gd, q0, length, out):
    """out (C*k*k, length) = rows (c, i, j) of the grid's patch matrix for
    positions q0 .. q0+length: tap (i, j)'s plane from q0 + its offset."""
    c = xf.shape[1]
    out3 = out.reshape(c, len(gd.taps), length)
    for t, (p, off) in enumerate(gd.taps):
        np.copyto(out3[:, t], xf[p, :, q0 + off:q0 + off + length])
    return out


def conv2d_grid_forward(x, w, b, pad, ws=None, scratch=None, stride=1):
    """y (N, F, Ho, Wo) of a conv (stride 1, or 2 where Grid has one),
    conv2d_forward's to float32 rounding, and the input grid
    (planes, C, length) that conv2d_grid_backward takes.
    y is an NCHW view of a (F, N, Ho, Wo) buffer (the layout conv.py's
    forward returns). ws: this conv's buffers (y, the input grid);
    scratch: chunk buffers any conv may share."""
    n, c, h, wd = x.shape
    f, cw, k, _ = w.shape
    if cw != c:
        raise ValueError(f"conv2d: input has {c} channels, weights expect {cw}")
    gd = Grid(x.shape, k, pad, stride)
    xf = _buf(ws, "xgrid", (gd.planes, c, gd.length), x.dtype)
    xt = x.transpose(1, 0, 2, 3)
    for p in range(gd.planes):
        gd.zero_pad(xf[p])
        np.copyto(gd.data(xf[p]), gd.phase(xt, p))
    rows, blk = c * k * k, gd.block
    nb = chunk_images(rows, blk, x.dtype.itemsize)
    col = _shared(scratch, "gridcol", (rows * nb * blk,), x.dtype)
    yc = _shared(scratch, "gridy", (f * nb * blk,), x.dtype)
    y = _buf(ws, "y2", (f, n, gd.ho, gd.wo), x.dtype)
    w2 = w.reshape(f, -1)
    for n0 in range(0, n, nb):
        m = min(nb, n - n0)
        length = m * blk
        cb = _patch_rows(xf, gd, n0 * blk, length, col[:rows * length].reshape(rows, length))
        out = yc[:f * length].reshape(f, length)
        np.matmul(w2, cb, out=out)
        np.copyto(y[:, n0:n0 + m],
                  out.reshape(f, m, gd.hi, gd.wp)[:, :, :gd.ho, :gd.wo])
    if b is not None:
        y += b[:, None, None, None]
    return y.transpose(1, 0, 2, 3), xf


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


def input_grad_on_grid(dy, w, x_shape, pad, ws=None, scratch=None, xf=None, dwt=None,
                       need_dx=True, stride=1):
    """dx of a conv on a Grid (what col2im(W^T @ dy) gives) and,
    given the input grid xf from conv2d_grid_forward, dW^T (C*k*k, F)
    into dwt, in one pass over chunks of images.

    dy is placed on the grid one chunk at a time (zero outside the Ho x Wo
    outputs); a chunk's input gradient is then one GEMM and k*k shifted
    adds of long contiguous rows. A chunk's windows reach past its block
    only into the next image's padding and, from positions outside the
    outputs, as zeros into its first rows, which the next chunk's first
    (copying) offset then overwrites. dy: (N, F, Ho, Wo) any layout, or a
    phase array (see conv.py conv2d_backward). Returns dx (N, C, H, W), a
    view of a flat grid buffer in ws, or None without need_dx. scratch:
    the chunk buffers, which any conv may share."""
    n, c, h, wd = x_shape
    f, _, k, _ = w.shape
    gd = Grid(x_shape, k, pad, stride)
    rows, blk = c * k * k, gd.block
    nb = chunk_images(rows, blk, w.dtype.itemsize)
    g = _shared(scratch, "gridg", (f * nb * blk,), w.dtype)
    dcol = _shared(scratch, "gridcol", (rows * nb * blk,), w.dtype)
    part = _shared(scratch, "griddw", (rows * f,), w.dtype).reshape(rows, f) \
        if dwt is not None else None
    if need_dx:
        d2 = _buf(ws, "dxgrid", (gd.planes, c, gd.length), w.dtype)
    w2t = w.reshape(f, -1).T
    for n0 in range(0, n, nb):
        m = min(nb, n - n0)
        length = m * blk
        gc = g[:f * length].reshape(f, m, gd.hi, gd.wp)
        gc[:, :, gd.ho:, :] = 0
        gc[:, :, :gd.ho, gd.wo:] = 0
        src = _dy_images(dy, n0, n0 + m)
        if dy.ndim > 4:
            np.copyto(_phase_view(gc, dy.ndim, gd.ho, gd.wo), src)
        else:
            np.copyto(gc[:, :, :gd.ho, :gd.wo], src.transpose(1, 0, 2, 3))
        g2 = gc.reshape(f, length)
        if dwt is not None:
            cb = _patch_rows(xf, gd, n0 * blk, length, dcol[:rows * length].reshape(rows, length))
            np.matmul(cb, g2.T, out=dwt if n0 == 0 else part)
            if n0:
                dwt += part
        if not need_dx:
            continue
        dc = dcol[:rows * length].reshape(rows, length)
        np.matmul(w2t, g2, out=dc)
        dc3 = dc.reshape(c, k * k, length)
        q0 = n0 * blk
        if gd.planes == 1:       # tap (0, 0) has offset 0: it covers [q0, q0 + length)
            np.copyto(d2[0, :, q0:q0 + length], dc3[:, 0])
            d2[0, :, q0 + length:q0 + length + gd.spill] = 0
            first = 1
        else:                    # every cell's taps, in tap order, onto zeros (col2im's sum)
            d2[:, :, q0:q0 + length + gd.spill] = 0
            first = 0
        for t in range(first, k * k):
            p, off = gd.taps[t]
            d2[p, :, q0 + off:q0 + off + length] += dc3[:, t]
    if not need_dx:
        return None
    if gd.planes == 1:
        return gd.data(d2[0]).transpose(1, 0, 2, 3)
    dx = _buf(ws, "dxphases", (c, n, h, wd), w.dtype)
    for p in range(gd.planes):
        np.copyto(gd.phase(dx, p), gd.data(d2[p]))
    return dx.transpose(1, 0, 2, 3)


def _grads_by_correlation(dy, xf, w, gd, ws, scratch, dwt, need_dx):
    """dW^T into dwt and dx of a stride-1 conv on the grid path, with the
    input gradient as a correlation of dy's grid with the transposed taps:
    dx cell p = sum over (f, i, j) of W[f, c, i, j] * g[f, p - offset(i, j)],
    one GEMM (C x F*k*k by F*k*k x positions) per chunk straight into the
    dx grid, instead of a GEMM to C*k*k rows and k*k shifted adds (a third
    of the memory traffic, and the GEMM reduces over F*k*k instead of F).
    dy is placed once on its own flat grid, led by `spill` zeros so the
    first cells' taps read zeros. Returns dx (N, C, H, W) or None."""
    n, f = dy.shape[:2]
    c, k = w.shape[1], w.shape[2]
    kk, blk, sp = k * k, gd.block, gd.spill
    positions = n * blk + gd.base              # every data cell of dx
    g = _shared(scratch, "gridgfull", (f * (sp + positions + sp),), w.dtype)
    g = g.reshape(f, -1)
    g[:, :sp] = 0
    g[:, sp + n * blk:] = 0
    gv = g[:, sp:sp + n * blk].reshape(f, n, gd.hi, gd.wp)
    gv[:, :, gd.ho:, :] = 0
    gv[:, :, :gd.ho, gd.wo:] = 0
    np.copyto(gv[:, :, :gd.ho, :gd.wo], dy.transpose(1, 0, 2, 3))
    rows = max(c, f) * kk
    nb = chunk_images(rows, blk, w.dtype.itemsize)
    col = _shared(scratch, "gridcol", (rows * (nb * blk + gd.base),), w.dtype)
    part = _shared(scratch, "griddw", (c * kk * f,), w.dtype).reshape(c * kk, f)
    if need_dx:
        d2 = _buf(ws, "dxgrid", (1, c, gd.length), w.dtype)[0]
        wt = _buf(ws, "wtaps", (c, f * kk), w.dtype)
        np.copyto(wt.reshape(c, f, kk), w.reshape(f, c, kk).transpose(1, 0, 2))
    for n0 in range(0, n, nb):
        m = min(nb, n - n0)
        q0, length = n0 * blk, m * blk
        cb = _patch_rows(xf, gd, q0, length, col[:c * kk * length].reshape(c * kk, length))
        np.matmul(cb, g[:, sp + q0:sp + q0 + length].T, out=dwt if n0 == 0 else part)
        if n0:
            dwt += part
        if not need_dx:
            continue
        if n0 + m == n:
            length = positions - q0                 # the last data cells too
        pr = col[:f * kk * length].reshape(f, kk, length)
        for t, (_, off) in enumerate(gd.taps):
            np.copyto(pr[:, t], g[:, q0 + sp - off:q0 + sp - off + length])
        np.matmul(wt, pr.reshape(f * kk, length), out=d2[:, q0:q0 + length])
    if not need_dx:
        return None
    # one copy out of the grid: the ReLU and BatchNorm backward passes that
    # read dx run several times faster on a contiguous (C, N, H, W) buffer
    # than on rows of W between the grid's padding
    dx = _buf(ws, "dx", (c, n, gd.h, gd.w), w.dtype)
    np.copyto(dx, gd.data(d2))
    return dx.transpose(1, 0, 2, 3)


def conv2d_grid_backward(dy, xf, x_shape, w, pad, dw, db, need_dx=True, ws=None,
                         scratch=None, stride=1):
    """Gradients of conv2d_grid_forward (xf: the input grid it returned):
    writes dw (F, C, k, k) and db (F,) (None: no bias) in place and
    returns dx (N, C, H, W) or None: conv2d_backward's (db bitwise; dx and
    dw to rounding: see the module docstring)."""
    n, f, ho, wo = dy.shape
    if db is not None:
        dyt = dy.transpose(1, 0, 2, 3)
        if dyt.flags.c_contiguous:
            np.sum(dyt.reshape(f, -1), axis=1, out=db)
        else:
            dy2 = _buf(ws, "dy2", (f, n * ho * wo), dy.dtype)
            np.copyto(dy2.reshape(f, n, ho, wo), dyt)
            np.sum(dy2, axis=1, out=db)
    dwt = _buf(ws, "dwt", (w[0].size, f), dy.dtype)
    if stride == 1:
        dx = _grads_by_correlation(dy, xf, w, Grid(x_shape, w.shape[2], pad), ws, scratch,
                                   dwt, need_dx)
    else:
        dx = input_grad_on_grid(dy, w, x_shape, pad, ws, scratch, xf=xf, dwt=dwt,
                                need_dx=need_dx, stride=stride)
    np.copyto(dw.reshape(f, -1), dwt.T)
    return dx
