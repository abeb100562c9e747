"""NumPy reference ops of the CNN engine: the CPU backend and the signature
every CUDA kernel in ``kernels/`` mirrors.

Layout: activations are NCHW, (batch, channels, height, width); conv weights
are (F, C, kh, kw); linear weights are (out, in) so ``y = x @ W.T + b``.
Everything is dtype-generic (float32 in training, float64 in the
finite-difference tests); nothing up-casts silently.

Speed comes from doing ONE large GEMM per conv per pass: ``im2col`` lays the
patches out as ``col`` (C*kh*kw, N*Ho*Wo), so the forward product
``W2 (F, CKK) @ col`` covers the whole batch, and the output is handed on
as an NCHW view of the (F, N, Ho, Wo) result (no transpose copy). ``col2im``
scatters by looping over the kh*kw kernel offsets with strided slice-adds
(never np.add.at).

Host-only refinements (the layers use them; the CUDA kernels mirror the
plain versions, which stay the reference):
- a conv followed by a 2x2/stride-2 max-pool orders its GEMM columns by
  pooling phase (``phase="rows"`` or ``"quads"``, see ``im2col``), so the
  pool reads contiguous blocks instead of stride-2 views;
- a stride-1 conv computes its input gradient on the padded grid
  (``_input_grad_on_grid``): col2im becomes kh*kw shifted adds of long
  contiguous rows.
NumPy's element-wise loops run 5-10x slower on short strided runs than on
contiguous ones on the development machine, and most of these choices
follow from that (measured figures in docs/benchmarks.md).

Callers may pass ``out=``/scratch buffers so a training step allocates
nothing; ``Workspace`` keeps such buffers keyed by name and shape.
Reference oracles (naive loops, scipy, finite differences) live in
tests/unit/test_ops.py.
"""
from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import as_strided


class Workspace:
    """Named scratch buffers reused across steps (no per-step allocation).

    A buffer returned by ``get`` stays valid until ``get`` is called again
    with the same name; a layer owns the names it uses.
    """

    def __init__(self):
        self._bufs: dict[str, np.ndarray] = {}

    def get(self, name, shape, dtype, zero=False):
        shape = tuple(int(s) for s in shape)
        buf = self._bufs.get(name)
        if buf is None or buf.shape != shape or buf.dtype != dtype:
            buf = np.zeros(shape, dtype) if zero else np.empty(shape, dtype)
            self._bufs[name] = buf
        elif zero:
            buf.fill(0)
        return buf

    def shared(self, name, shape, dtype):
        """A buffer of this shape carved from the front of one flat buffer
        that grows to the largest request under this name: callers that
        never need two of its shapes at once share the memory."""
        n = int(np.prod(shape))
        buf = self._bufs.get(name)
        if buf is None or buf.size < n or buf.dtype != dtype:
            buf = np.empty(n, dtype)
            self._bufs[name] = buf
        return buf[:n].reshape(shape)

    def nbytes(self):
        return sum(b.nbytes for b in self._bufs.values())


def _buf(ws, name, shape, dtype, zero=False):
    if ws is None:
        return np.zeros(shape, dtype) if zero else np.empty(shape, dtype)
    return ws.get(name, shape, dtype, zero)


def _shared(ws, name, shape, dtype):
    if ws is None:
        return np.empty(shape, dtype)
    return ws.shared(name, shape, dtype)


def is_cnhw(x):
    """True when x (N, C, H, W) is an NCHW view of a C-contiguous (C, N, H, W)
    buffer: the physical layout conv produces (see the module docstring)."""
    return (x.ndim == 4 and not x.flags.c_contiguous
            and x.transpose(1, 0, 2, 3).flags.c_contiguous)


def _buf4(ws, name, shape, dtype, cnhw, zero=False):
    """(N, C, H, W) buffer, physically (C, N, H, W) when cnhw."""
    if not cnhw:
        return _buf(ws, name, shape, dtype, zero)
    n, c, h, w = shape
    return _buf(ws, name, (c, n, h, w), dtype, zero).transpose(1, 0, 2, 3)


def conv_out_size(size, k, stride, pad):
    """Output length of a conv/pool along one axis; errors on a bad geometry."""
    out = (size + 2 * pad - k) // stride + 1
    if out < 1:
        raise ValueError(
            f"kernel {k} with stride {stride} and padding {pad} does not fit "
            f"an input of size {size}")
    return out


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
    """y (N, F, Ho, Wo) = conv(x (N, C, H, W), w (F, C, kh, kw)) + b (F,).

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
        if ws is not None and stride == 1:
            # reserve room for the input gradient's dcol too (it takes col's
            # memory in backward), so that the buffer never grows mid-step
            ws.shared("col", (c * kh * kw * max(n * ho * wo, _grid_cols(
                x.shape, kh, kw, pad)),), x.dtype)
        col = _shared(ws, "col", (c * kh * kw, n * ho * wo), x.dtype)
    im2col(x, kh, kw, stride, pad, out=col, ws=ws, phase=phase)
    y2 = _buf(ws, "y2", (f, n * ho * wo), x.dtype)
    np.matmul(w.reshape(f, -1), col, out=y2)          # (F, N*Ho*Wo)
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
                    ws=None):
    """Gradients of conv2d_forward.

    dy (N, F, Ho, Wo), or the phase array (5-D "rows", 6-D "quads") when
    forward ran with a phase; col from forward; writes dw (F, C, kh, kw)
    and db (F,) in place (overwrites); returns dx (N, C, H, W) or None.
    With a ws, the input gradient reuses col's memory: one backward per
    forward.
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
    np.sum(dy2, axis=1, out=db)
    # dW^T = col @ dy2^T: OpenBLAS runs this orientation 10-20% faster than
    # dy2 @ col^T on these shapes (measured); the transpose back is tiny.
    dwt = _buf(ws, "dwt", (col.shape[0], f), dy.dtype)
    np.matmul(col, dy2.T, out=dwt)                    # (CKK, F)
    np.copyto(dw.reshape(f, -1), dwt.T)
    if not need_dx:
        return None
    if stride == 1:
        return _input_grad_on_grid(dy, w, x_shape, pad, ws)
    if phase:
        # back to plain column order for col2im
        plain = _buf(ws, "dy2", (f, dy.size // f), dy.dtype)
        n, _, ho, wo = phase_plain_shape(dy)
        np.copyto(_phase_view(plain.reshape(f, n, ho, wo), dy.ndim, ho, wo), dy)
        dy2 = plain
    dcol = _buf(ws, "dcol", col.shape, dy.dtype)
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


def _phase_view(g, ndim, ho, wo):
    """View of the top-left (Ho, Wo) of g (F, N, >=Ho, >=Wo) in the order of
    a ndim-D phase array: copying the phase array into it puts every element
    at its place."""
    sf, sn, sh, sw = g.strides
    f, n = g.shape[:2]
    if ndim == 6:
        return as_strided(g, shape=(f, 2, 2, n, ho // 2, wo // 2),
                          strides=(sf, sh, sw, sn, 2 * sh, 2 * sw))
    return as_strided(g, shape=(f, 2, n, ho // 2, wo),
                      strides=(sf, sh, sn, 2 * sh, sw))


def _grid_cols(x_shape, kh, kw, pad):
    """Padded-grid positions whose kernel window stays inside the grid."""
    n, _, h, w = x_shape
    hp, wp = h + 2 * pad, w + 2 * pad
    return n * hp * wp - ((kh - 1) * wp + (kw - 1))


def _input_grad_on_grid(dy, w, x_shape, pad, ws):
    """dx of a stride-1 conv (what col2im(W^T @ dy) gives), computed on the
    padded grid so that col2im becomes kh*kw shifted adds of long
    contiguous rows.

    dy is placed on the padded input grid (F, N, Hp, Wp), zero outside the
    Ho x Wo outputs. Grid position q = (n*Hp + ho)*Wp + wo then feeds padded
    input cell q + i*Wp + j for kernel offset (i, j), for every n, ho, wo at
    once, so each offset is one 2-D add of (C, ~N*Hp*Wp) contiguous rows
    instead of N*C*Ho strided runs of Wo. The GEMM covers the grid's extra
    border columns (zeros in dy); the adds it saves cost more (measured
    25-35% less time for the input gradient of the reference CNN's convs).
    dy: (N, F, Ho, Wo) any layout, or a phase array (see conv2d_backward).
    Returns dx (N, C, H, W) as a view of the padded (C, N, Hp, Wp) buffer.
    """
    n, c, h, wd = x_shape
    f, _, kh, kw = w.shape
    hp, wp = h + 2 * pad, wd + 2 * pad
    ho, wo = hp - kh + 1, wp - kw + 1
    g = _buf(ws, "dygrid", (f, n, hp, wp), w.dtype)
    g[:, :, ho:, :] = 0
    g[:, :, :ho, wo:] = 0
    if dy.ndim > 4:
        np.copyto(_phase_view(g, dy.ndim, ho, wo), dy)
    else:
        np.copyto(g[:, :, :ho, :wo], dy.transpose(1, 0, 2, 3))
    lq = _grid_cols(x_shape, kh, kw, pad)
    # col is spent once dW is computed: its memory takes dcol
    dcol = _shared(ws, "col", (c * kh * kw, lq), w.dtype)
    np.matmul(w.reshape(f, -1).T, g.reshape(f, -1)[:, :lq], out=dcol)
    dxp = _buf(ws, "dxpadgrid", (c, n, hp, wp), w.dtype)
    d2 = dxp.reshape(c, -1)
    dc3 = dcol.reshape(c, kh * kw, lq)
    np.copyto(d2[:, :lq], dc3[:, 0])     # offset (0, 0) covers [0, lq)
    d2[:, lq:] = 0
    for k in range(1, kh * kw):
        i, j = divmod(k, kw)
        off = i * wp + j
        d2[:, off:off + lq] += dc3[:, k]
    return dxp[:, :, pad:pad + h, pad:pad + wd].transpose(1, 0, 2, 3)


# --------------------------------------------------------------------------
# max-pool
# --------------------------------------------------------------------------

def maxpool_forward(x, k=2, stride=2, out=None, argmax=None, ws=None):
    """y (N, C, Ho, Wo) = max over k x k windows of x (N, C, H, W), no padding.

    argmax (N, C, Ho, Wo) uint8 holds the window offset i*k + j of the
    first maximum in row-major scan order (ties go to the lowest offset);
    k*k <= 256.
    """
    n, c, h, w = x.shape
    if k * k > 256:
        raise ValueError(f"max-pool window {k}x{k} is too large (k*k <= 256)")
    ho = conv_out_size(h, k, stride, 0)
    wo = conv_out_size(w, k, stride, 0)
    cnhw = is_cnhw(x)         # outputs keep the input's physical layout
    if out is None:
        out = _buf4(ws, "y", (n, c, ho, wo), x.dtype, cnhw)
    if argmax is None:
        argmax = _buf4(ws, "argmax", (n, c, ho, wo), np.uint8, cnhw)
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


def maxpool_backward(dy, argmax, x_shape, k=2, stride=2, out=None, ws=None):
    """dx (N, C, H, W): dy routed to the argmax position of each window."""
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
# relu, linear, dropout
# --------------------------------------------------------------------------

def relu_forward(x, out=None):
    """y = max(x, 0); out may be x itself (in place)."""
    return np.maximum(x, 0, out=out)


def relu_backward(dy, y, out=None):
    """dx = dy where y > 0, else 0 (y is the forward output)."""
    if out is None:
        out = np.empty_like(dy)
    np.multiply(dy, y > 0, out=out)
    return out


def linear_forward(x, w, b, out=None):
    """y (N, O) = x (N, I) @ w (O, I).T + b (O,)."""
    out = np.matmul(x, w.T, out=out)
    out += b
    return out


def linear_backward(dy, x, w, dw, db, need_dx=True, out=None):
    """Writes dw (O, I) = dy.T @ x and db (O,) in place; returns dx (N, I)."""
    np.matmul(dy.T, x, out=dw)
    np.sum(dy, axis=0, out=db)
    if not need_dx:
        return None
    return np.matmul(dy, w, out=out)


def dropout_forward(x, p, rng, out=None, mask=None):
    """Inverted dropout: y = x * mask, mask = (u >= p) / (1 - p)."""
    if p <= 0.0:
        return x, None
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability must be in [0, 1), got {p}")
    u = rng.random(x.shape, dtype=np.float32)
    if mask is None:
        mask = np.empty(x.shape, x.dtype)
    np.multiply(u >= p, x.dtype.type(1.0 / (1.0 - p)), out=mask)
    return np.multiply(x, mask, out=out), mask


def dropout_backward(dy, mask, out=None):
    if mask is None:
        return dy
    return np.multiply(dy, mask, out=out)


# --------------------------------------------------------------------------
# softmax cross-entropy
# --------------------------------------------------------------------------

def softmax_xent_forward(logits, labels):
    """Mean cross-entropy of logits (N, K) against integer labels (N,).

    Stable: shifted by the row max before exp. Returns (loss, probs) with
    probs (N, K) the softmax, which backward needs. loss is a Python float
    accumulated in the logits' dtype.
    """
    n = logits.shape[0]
    shifted = logits - logits.max(axis=1, keepdims=True)
    probs = np.exp(shifted)
    s = probs.sum(axis=1, keepdims=True)
    probs /= s
    # -log p[y] = log(sum exp) - shifted[y]
    nll = np.log(s[:, 0]) - shifted[np.arange(n), labels]
    return float(nll.mean(dtype=logits.dtype)), probs


def softmax_xent_backward(probs, labels, out=None):
    """dlogits (N, K) = (probs - onehot(labels)) / N."""
    n = probs.shape[0]
    if out is None:
        out = np.empty_like(probs)
    np.copyto(out, probs)
    out[np.arange(n), labels] -= 1
    out *= probs.dtype.type(1.0 / n)
    return out
