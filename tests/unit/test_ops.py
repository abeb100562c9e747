"""ibtmpi/ops/ against independent oracles: naive loops, scipy.signal, and
central finite differences in float64."""
import numpy as np
import pytest
from scipy import signal

from ibtmpi import ops

RNG = np.random.default_rng(1234)


def numgrad(f, x, eps=1e-6):
    """Central differences of scalar f() w.r.t. every entry of x (in place)."""
    g = np.zeros_like(x)
    it = np.nditer(x, flags=["multi_index"])
    for _ in it:
        i = it.multi_index
        old = x[i]
        x[i] = old + eps
        fp = f()
        x[i] = old - eps
        fm = f()
        x[i] = old
        g[i] = (fp - fm) / (2 * eps)
    return g


# -- naive oracles --------------------------------------------------------

def conv_naive(x, w, b, s, p):
    n, c, h, wd = x.shape
    f, _, kh, kw = w.shape
    xp = np.zeros((n, c, h + 2 * p, wd + 2 * p), x.dtype)
    xp[:, :, p:p + h, p:p + wd] = x
    ho = (h + 2 * p - kh) // s + 1
    wo = (wd + 2 * p - kw) // s + 1
    y = np.zeros((n, f, ho, wo), x.dtype)
    for nn in range(n):
        for ff in range(f):
            for i in range(ho):
                for j in range(wo):
                    acc = b[ff]
                    for cc in range(c):
                        for a in range(kh):
                            for bb in range(kw):
                                acc += xp[nn, cc, i * s + a, j * s + bb] * w[ff, cc, a, bb]
                    y[nn, ff, i, j] = acc
    return y


def pool_naive(x, k, s):
    return pool_naive_padded(x, k, s, 0)


CONV_CASES = [
    # (N, C, H, W, F, k, stride, pad)
    (2, 3, 7, 7, 4, 3, 1, 1),
    (2, 3, 8, 6, 5, 3, 2, 1),
    (1, 2, 9, 9, 3, 3, 2, 0),
    (2, 2, 6, 7, 2, 5, 1, 2),
    (3, 1, 5, 5, 2, 1, 1, 0),
    (1, 4, 11, 10, 3, 3, 3, 2),
    (2, 3, 4, 4, 2, 2, 2, 0),
]


@pytest.mark.parametrize("case", CONV_CASES)
def test_conv_forward_matches_naive_loops(case):
    n, c, h, w, f, k, s, p = case
    x = RNG.standard_normal((n, c, h, w)).astype(np.float32)
    wt = RNG.standard_normal((f, c, k, k)).astype(np.float32)
    b = RNG.standard_normal(f).astype(np.float32)
    y, _ = ops.conv2d_forward(x, wt, b, s, p)
    ref = conv_naive(x.astype(np.float64), wt.astype(np.float64),
                     b.astype(np.float64), s, p)
    assert y.dtype == np.float32
    assert y.shape == ref.shape
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)


def test_conv_forward_matches_scipy_correlate():
    x = RNG.standard_normal((2, 3, 12, 10))
    w = RNG.standard_normal((4, 3, 3, 3))
    b = RNG.standard_normal(4)
    y, _ = ops.conv2d_forward(x, w, b, 1, 1)
    for n in range(2):
        for f in range(4):
            ref = b[f] + sum(signal.correlate2d(x[n, c], w[f, c], mode="same")
                             for c in range(3))
            np.testing.assert_allclose(y[n, f], ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("case", CONV_CASES)
def test_conv_backward_matches_finite_differences(case):
    n, c, h, w, f, k, s, p = case
    x = RNG.standard_normal((n, c, h, w))
    wt = RNG.standard_normal((f, c, k, k))
    b = RNG.standard_normal(f)
    y, col = ops.conv2d_forward(x, wt, b, s, p)
    r = RNG.standard_normal(y.shape)

    def loss():
        return float((ops.conv2d_forward(x, wt, b, s, p)[0] * r).sum())

    dw, db = np.zeros_like(wt), np.zeros_like(b)
    dx = ops.conv2d_backward(r, col, x.shape, wt, s, p, dw, db).copy()
    np.testing.assert_allclose(dx, numgrad(loss, x), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(dw, numgrad(loss, wt), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(db, numgrad(loss, b), rtol=1e-6, atol=1e-7)
    # need_dx=False still fills the parameter gradients
    dw2, db2 = np.zeros_like(wt), np.zeros_like(b)
    assert ops.conv2d_backward(r, col, x.shape, wt, s, p, dw2, db2,
                               need_dx=False) is None
    np.testing.assert_array_equal(dw2, dw)


def test_conv_with_workspace_reuses_buffers_and_stays_correct():
    ws = ops.Workspace()
    wt = RNG.standard_normal((3, 2, 3, 3))
    b = RNG.standard_normal(3)
    for _ in range(3):
        x = RNG.standard_normal((2, 2, 6, 6))
        y, _ = ops.conv2d_forward(x, wt, b, 1, 1, ws=ws)
        np.testing.assert_allclose(y, conv_naive(x, wt, b, 1, 1), atol=1e-12)
    nbytes = ws.nbytes()
    ops.conv2d_forward(x, wt, b, 1, 1, ws=ws)
    assert ws.nbytes() == nbytes


def test_im2col_col2im_are_adjoint():
    # <im2col(x), c> == <x, col2im(c)> for every geometry
    for (n, c, h, w, f, k, s, p) in CONV_CASES:
        x = RNG.standard_normal((n, c, h, w))
        col = ops.im2col(x, k, k, s, p)
        cc = RNG.standard_normal(col.shape)
        lhs = float((col * cc).sum())
        rhs = float((x * ops.col2im(cc, x.shape, k, k, s, p)).sum())
        assert abs(lhs - rhs) <= 1e-10 * max(1.0, abs(lhs))


def _unphase(a):
    """Phase array ((F, 2, N, Ho/2, Wo) "rows" or (F, 2, 2, N, Ho/2, Wo/2)
    "quads") -> plain (N, F, Ho, Wo), by index arithmetic."""
    if a.ndim == 5:
        f, _, n, h2, w = a.shape
        return a.transpose(2, 0, 3, 1, 4).reshape(n, f, 2 * h2, w)
    f, _, _, n, h2, w2 = a.shape
    return a.transpose(3, 0, 4, 1, 5, 2).reshape(n, f, 2 * h2, 2 * w2)


PHASES = {"rows": (ops.maxpool2_rows_forward, ops.maxpool2_rows_backward),
          "quads": (ops.maxpool2_quads_forward, ops.maxpool2_quads_backward)}


@pytest.mark.parametrize("phase", sorted(PHASES))
def test_phase_im2col_is_a_column_permutation(phase):
    for (n, c, h, w, k, s, p) in [(2, 3, 8, 8, 3, 1, 1), (1, 2, 9, 9, 3, 2, 2),
                                  (2, 2, 8, 12, 2, 2, 0), (1, 1, 4, 4, 1, 1, 0)]:
        x = RNG.standard_normal((n, c, h, w))
        plain = ops.im2col(x, k, k, s, p)
        ph = ops.im2col(x, k, k, s, p, phase=phase)
        ho, wo = ops.conv_out_size(h, k, s, p), ops.conv_out_size(w, k, s, p)
        shape = ((-1, 2, n, ho // 2, wo) if phase == "rows"
                 else (-1, 2, 2, n, ho // 2, wo // 2))
        np.testing.assert_array_equal(
            _unphase(ph.reshape(shape)).transpose(1, 0, 2, 3).reshape(plain.shape),
            plain)
    with pytest.raises(ValueError, match="even output"):
        ops.im2col(np.zeros((1, 1, 5, 5)), 3, 3, 1, 1, phase=phase)
    with pytest.raises(ValueError, match="phase must be"):
        ops.im2col(np.zeros((1, 1, 4, 4)), 3, 3, 1, 1, phase="cols")


@pytest.mark.parametrize("phase", sorted(PHASES))
@pytest.mark.parametrize("ties", [False, True])
def test_phase_conv_and_pool_match_the_plain_ops(phase, ties):
    x = RNG.standard_normal((3, 2, 8, 6)).astype(np.float32)
    w = RNG.standard_normal((4, 2, 3, 3)).astype(np.float32)
    b = RNG.standard_normal(4).astype(np.float32)
    if ties:      # whole windows and pairs of equal values
        x = np.round(x)
        w = np.ones_like(w)
        x[:, :, :4, :] = 1.0
    fwd, bwd = PHASES[phase]
    y, col = ops.conv2d_forward(x, w, b, 1, 1)
    yp, colp = ops.conv2d_forward(x, w, b, 1, 1, ws=ops.Workspace(), phase=phase)
    assert yp.shape == ((4, 2, 3, 4, 6) if phase == "rows" else (4, 2, 2, 3, 4, 3))
    np.testing.assert_allclose(_unphase(yp), y, rtol=1e-5, atol=1e-5)
    y = _unphase(yp)      # the same numbers as the phase path pools
    ref_y, ref_am = ops.maxpool_forward(y, 2, 2)
    got_y, got_am = fwd(yp, ws=ops.Workspace())
    np.testing.assert_array_equal(got_y, ref_y)
    np.testing.assert_array_equal(got_am.transpose(1, 0, 2, 3), ref_am)
    _, naive_am = pool_naive(y, 2, 2)
    np.testing.assert_array_equal(ref_am, naive_am)
    if ties:
        assert (ref_am[:, :, :2] == 0).sum() > 0
    dy = RNG.standard_normal(ref_y.shape).astype(np.float32)
    ref_dx = ops.maxpool_backward(dy, ref_am, y.shape, 2, 2)
    dp = bwd(dy, got_am, ws=ops.Workspace())
    np.testing.assert_array_equal(_unphase(dp), ref_dx)
    dw1, db1 = np.empty_like(w), np.empty_like(b)
    dw2, db2 = np.empty_like(w), np.empty_like(b)
    dx1 = ops.conv2d_backward(ref_dx, col, x.shape, w, 1, 1, dw1, db1)
    dx2 = ops.conv2d_backward(dp, colp, x.shape, w, 1, 1, dw2, db2)
    np.testing.assert_allclose(dw2, dw1, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(db2, db1, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dx2, dx1, rtol=1e-5, atol=1e-5)
    # a stride-2 conv takes the col2im route back from a phase array
    x2 = RNG.standard_normal((2, 2, 9, 9)).astype(np.float32)
    y2, c2 = ops.conv2d_forward(x2, w, b, 2, 2)
    y2p, c2p = ops.conv2d_forward(x2, w, b, 2, 2, ws=ops.Workspace(), phase=phase)
    g = RNG.standard_normal(y2.shape).astype(np.float32)
    gp = np.empty_like(y2p)
    idx = _unphase(np.arange(y2p.size).reshape(y2p.shape))
    gp.reshape(-1)[idx.reshape(-1)] = g.reshape(-1)
    np.testing.assert_array_equal(_unphase(gp), g)
    d1 = ops.conv2d_backward(g, c2, x2.shape, w, 2, 2, dw1, db1)
    d2 = ops.conv2d_backward(gp, c2p, x2.shape, w, 2, 2, dw2, db2)
    np.testing.assert_allclose(d2, d1, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dw2, dw1, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("phase", sorted(PHASES))
def test_phase_pool_breaks_every_tie_like_the_naive_loop(phase):
    # every 2x2 window over the values {0, 1, 2}: 81 windows side by side
    import itertools
    wins = np.array(list(itertools.product(range(3), repeat=4)), np.float32)
    x = np.zeros((1, 1, 2, 2 * len(wins)), np.float32)
    x[0, 0, 0, 0::2], x[0, 0, 0, 1::2] = wins[:, 0], wins[:, 1]
    x[0, 0, 1, 0::2], x[0, 0, 1, 1::2] = wins[:, 2], wins[:, 3]
    if phase == "rows":
        yp = x.transpose(1, 2, 0, 3)[:, :, :, None, :]          # (C, 2, N, 1, W)
    else:
        yp = x.reshape(1, 1, 2, -1, 2).transpose(1, 2, 4, 0, 3)[:, :, :, :, None, :]
    yp = np.ascontiguousarray(yp)
    np.testing.assert_array_equal(_unphase(yp), x)
    y, am = PHASES[phase][0](yp)
    ref, ref_am = pool_naive(x, 2, 2)
    np.testing.assert_array_equal(y, ref)
    np.testing.assert_array_equal(am.transpose(1, 0, 2, 3), ref_am)


def test_conv_geometry_errors():
    x = np.zeros((1, 1, 2, 2), np.float32)
    with pytest.raises(ValueError, match="does not fit"):
        ops.conv2d_forward(x, np.zeros((1, 1, 5, 5), np.float32),
                           np.zeros(1, np.float32), 1, 0)
    with pytest.raises(ValueError, match="channels"):
        ops.conv2d_forward(x, np.zeros((1, 2, 1, 1), np.float32),
                           np.zeros(1, np.float32), 1, 0)


POOL_CASES = [(2, 2, 8, 8), (2, 2, 7, 9), (3, 2, 9, 9), (3, 3, 9, 7),
              (2, 1, 5, 6), (4, 4, 8, 8)]


@pytest.mark.parametrize("k,s,h,w", POOL_CASES)
def test_maxpool_forward_matches_naive_loops(k, s, h, w):
    x = RNG.standard_normal((2, 3, h, w)).astype(np.float32)
    y, am = ops.maxpool_forward(x, k, s)
    ref, ref_am = pool_naive(x, k, s)
    np.testing.assert_array_equal(y, ref)
    np.testing.assert_array_equal(am, ref_am)
    assert am.dtype == np.uint8


@pytest.mark.parametrize("k,s", [(2, 2), (3, 2), (3, 3)])
def test_maxpool_ties_go_to_first_offset(k, s):
    x = np.zeros((1, 2, 6, 6), np.float32)
    x[0, 1, :, :] = 3.0
    x[0, 1, 1, 1] = 3.0
    y, am = ops.maxpool_forward(x, k, s)
    assert (am == 0).all()
    _, ref_am = pool_naive(x, k, s)
    np.testing.assert_array_equal(am, ref_am)
    # the gradient of a tied window reaches exactly one input cell
    dx = ops.maxpool_backward(np.ones_like(y), am, x.shape, k, s)
    assert dx.sum() == y.size


def pool_naive_padded(x, k, s, pad):
    """The max over each window of x with `pad` cells around it that never
    win (PyTorch's MaxPool2d padding); argmax in the padded window."""
    n, c, h, w = x.shape
    ho, wo = (h + 2 * pad - k) // s + 1, (w + 2 * pad - k) // s + 1
    y = np.zeros((n, c, ho, wo), x.dtype)
    am = np.zeros((n, c, ho, wo), np.int64)
    for nn in range(n):
        for cc in range(c):
            for i in range(ho):
                for j in range(wo):
                    best, arg = None, -1
                    for a in range(k):
                        for bb in range(k):
                            r, q = i * s + a - pad, j * s + bb - pad
                            if 0 <= r < h and 0 <= q < w and (best is None or x[nn, cc, r, q] > best):
                                best, arg = x[nn, cc, r, q], a * k + bb
                    y[nn, cc, i, j], am[nn, cc, i, j] = best, arg
    return y, am


PADDED_CASES = [(3, 2, 1, 9, 9), (3, 2, 1, 8, 7), (2, 2, 1, 6, 6), (3, 1, 1, 5, 6),
                (5, 2, 2, 11, 9)]


@pytest.mark.parametrize("k,s,pad,h,w", PADDED_CASES)
def test_padded_maxpool_matches_naive_loops_and_finite_differences(k, s, pad, h, w):
    """torchvision's stem pool (k 3, stride 2, pad 1) and others: the
    padding never wins, all-negative windows included."""
    x = RNG.standard_normal((2, 3, h, w)).astype(np.float32) - 3.0
    y, am = ops.maxpool_forward(x, k, s, pad=pad)
    ref, ref_am = pool_naive_padded(x, k, s, pad)
    np.testing.assert_array_equal(y, ref)
    np.testing.assert_array_equal(am, ref_am)
    xd = RNG.permutation(2 * 2 * h * w).reshape(2, 2, h, w).astype(np.float64) * 0.01
    yd, amd = ops.maxpool_forward(xd, k, s, pad=pad)
    r = RNG.standard_normal(yd.shape)

    def loss():
        return float((ops.maxpool_forward(xd, k, s, pad=pad)[0] * r).sum())
    dx = ops.maxpool_backward(r, amd, xd.shape, k, s, pad=pad)
    np.testing.assert_allclose(dx, numgrad(loss, xd, eps=1e-5), atol=1e-8)
    with pytest.raises(ValueError, match="padding"):
        ops.maxpool_forward(x, k, s, pad=k)


@pytest.mark.parametrize("k,s,h,w", POOL_CASES)
def test_maxpool_backward_matches_finite_differences(k, s, h, w):
    # distinct values spaced far more than eps, so the argmax is stable
    x = RNG.permutation(2 * 2 * h * w).reshape(2, 2, h, w).astype(np.float64) * 0.01
    y, am = ops.maxpool_forward(x, k, s)
    r = RNG.standard_normal(y.shape)

    def loss():
        return float((ops.maxpool_forward(x, k, s)[0] * r).sum())

    dx = ops.maxpool_backward(r, am, x.shape, k, s)
    np.testing.assert_allclose(dx, numgrad(loss, x, eps=1e-5), atol=1e-8)


def test_maxpool_on_conv_layout_view_matches_contiguous():
    base = RNG.standard_normal((3, 2, 8, 8)).astype(np.float32)   # (C, N, H, W)
    view = base.transpose(1, 0, 2, 3)                              # NCHW view
    assert ops.is_cnhw(view)
    ws = ops.Workspace()
    y1, a1 = ops.maxpool_forward(view, 2, 2, ws=ws)
    y2, a2 = ops.maxpool_forward(np.ascontiguousarray(view), 2, 2)
    np.testing.assert_array_equal(y1, y2)
    np.testing.assert_array_equal(a1, a2)
    dy = RNG.standard_normal(y1.shape).astype(np.float32)
    out = ops._buf4(None, "dx", view.shape, np.float32, True)
    d1 = ops.maxpool_backward(dy, a1, view.shape, 2, 2, out=out)
    d2 = ops.maxpool_backward(dy, a2, view.shape, 2, 2)
    np.testing.assert_array_equal(d1, d2)


def avgpool_naive(x, k, s):
    n, c, h, w = x.shape
    ho, wo = (h - k) // s + 1, (w - k) // s + 1
    y = np.zeros((n, c, ho, wo), np.float64)
    for nn in range(n):
        for cc in range(c):
            for i in range(ho):
                for j in range(wo):
                    y[nn, cc, i, j] = sum(float(x[nn, cc, i * s + a, j * s + bb])
                                          for a in range(k) for bb in range(k)) / (k * k)
    return y


AVGPOOL_CASES = [(2, 2, 8, 6), (2, 2, 7, 9), (3, 2, 9, 8), (2, 1, 5, 7), (3, 3, 10, 7),
                 (2, 3, 8, 9)]


@pytest.mark.parametrize("cnhw", [False, True])
@pytest.mark.parametrize("k,s,h,w", AVGPOOL_CASES)
def test_avgpool_forward_matches_naive_loops(k, s, h, w, cnhw):
    """Non-square inputs, overlapping (stride < k), tiling and ragged
    windows; cnhw: the NCHW view of a (C, N, H, W) buffer a conv hands
    over, whose output keeps that layout."""
    x = RNG.standard_normal((2, 3, h, w)).astype(np.float32)
    src = np.ascontiguousarray(x.transpose(1, 0, 2, 3)).transpose(1, 0, 2, 3) if cnhw else x
    assert ops.is_cnhw(src) == cnhw
    y = ops.avgpool_forward(src, k, s, ws=ops.Workspace())
    assert y.dtype == np.float32 and ops.is_cnhw(y) == cnhw
    np.testing.assert_allclose(y, avgpool_naive(x, k, s), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(y, ops.avgpool_forward(x, k, s))    # same bits


@pytest.mark.parametrize("cnhw", [False, True])
@pytest.mark.parametrize("k,s,h,w", AVGPOOL_CASES)
def test_avgpool_backward_matches_finite_differences(k, s, h, w, cnhw):
    """float64 central differences; the gradient written into `out` in
    either layout (a conv's backward reads (C, N, H, W))."""
    x = RNG.standard_normal((2, 2, h, w))
    r = RNG.standard_normal(ops.avgpool_forward(x, k, s).shape)

    def loss():
        return float((ops.avgpool_forward(x, k, s) * r).sum())
    num = numgrad(loss, x)
    out = ops._buf4(None, "dx", x.shape, np.float64, cnhw)
    out[...] = np.nan                              # every cell must be written
    dx = ops.avgpool_backward(r, x.shape, k, s, out=out)
    assert dx is out
    np.testing.assert_allclose(dx, num, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(ops.avgpool_backward(r, x.shape, k, s), num,
                               rtol=1e-7, atol=1e-9)


def test_relu_forward_backward():
    x = RNG.standard_normal((4, 5)).astype(np.float32)
    y = ops.relu_forward(x)
    np.testing.assert_array_equal(y, np.where(x > 0, x, 0))
    dy = RNG.standard_normal(x.shape).astype(np.float32)
    np.testing.assert_array_equal(ops.relu_backward(dy, y),
                                  np.where(x > 0, dy, 0))
    # finite differences away from the kink
    x64 = RNG.standard_normal((3, 4)) + np.sign(RNG.standard_normal((3, 4))) * 0.1
    r = RNG.standard_normal(x64.shape)
    g = numgrad(lambda: float((ops.relu_forward(x64) * r).sum()), x64)
    np.testing.assert_allclose(ops.relu_backward(r, ops.relu_forward(x64)), g,
                               atol=1e-8)


def test_linear_forward_naive_and_backward_fd():
    x = RNG.standard_normal((4, 6))
    w = RNG.standard_normal((3, 6))
    b = RNG.standard_normal(3)
    y = ops.linear_forward(x, w, b)
    ref = np.array([[b[o] + sum(x[n, i] * w[o, i] for i in range(6))
                     for o in range(3)] for n in range(4)])
    np.testing.assert_allclose(y, ref, rtol=1e-12)
    r = RNG.standard_normal(y.shape)

    def loss():
        return float((ops.linear_forward(x, w, b) * r).sum())

    dw, db = np.zeros_like(w), np.zeros_like(b)
    dx = ops.linear_backward(r, x, w, dw, db)
    np.testing.assert_allclose(dx, numgrad(loss, x), atol=1e-8)
    np.testing.assert_allclose(dw, numgrad(loss, w), atol=1e-8)
    np.testing.assert_allclose(db, numgrad(loss, b), atol=1e-8)


def test_softmax_xent_matches_formula_and_is_stable():
    z = RNG.standard_normal((6, 5))
    y = RNG.integers(0, 5, 6)
    loss, probs = ops.softmax_xent_forward(z, y)
    p_ref = np.exp(z) / np.exp(z).sum(1, keepdims=True)
    np.testing.assert_allclose(probs, p_ref, rtol=1e-12)
    assert abs(loss - float(-np.log(p_ref[np.arange(6), y]).mean())) < 1e-12
    # huge logits: no overflow, exact answer
    big = np.array([[1e4, 0.0, -1e4], [0.0, 1e4, 1e4]], np.float32)
    l2, p2 = ops.softmax_xent_forward(big, np.array([0, 2]))
    assert np.isfinite(l2) and np.isfinite(p2).all()
    assert abs(l2 - np.log(2) / 2) < 1e-6
    # backward vs finite differences
    zz = z.copy()
    g = numgrad(lambda: ops.softmax_xent_forward(zz, y)[0], zz)
    np.testing.assert_allclose(ops.softmax_xent_backward(probs, y), g, atol=1e-8)


def test_dropout_mask_and_backward():
    rng = np.random.default_rng(0)
    x = np.ones((200, 100), np.float32)
    y, mask = ops.dropout_forward(x, 0.3, rng)
    kept = mask > 0
    assert abs(kept.mean() - 0.7) < 0.01
    np.testing.assert_allclose(y[kept], 1 / 0.7, rtol=1e-6)
    assert (y[~kept] == 0).all()
    dy = RNG.standard_normal(x.shape).astype(np.float32)
    np.testing.assert_array_equal(ops.dropout_backward(dy, mask), dy * mask)
    same, none = ops.dropout_forward(x, 0.0, rng)
    assert same is x and none is None
    with pytest.raises(ValueError):
        ops.dropout_forward(x, 1.0, rng)
