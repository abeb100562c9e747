"""The CuPy launchers of ibtmpi/backend.py, run on the CPU: a minimal CuPy
stand-in keeps arrays in NumPy and backs RawModule functions with the
host-emulated kernels (ibtmpi/kernelcheck.py). This checks what the kernel
tests cannot: each launcher's argument order and types, shapes, grid
arithmetic and the GEMM/bias composition, against the NumPy reference ops.
The gpu tests (tests/gpu) repeat the same checks with real CuPy."""
import numpy as np
import pytest
from fakecupy import FakeCupy

from ibtmpi import consensus, ops
from ibtmpi.backend import GpuOps
from ibtmpi.optim import sgd_update

RNG = np.random.default_rng(17)


@pytest.fixture(scope="module")
def g():
    return GpuOps(cp=FakeCupy())


def test_row_sum_widths():
    # conv1, conv2, conv3 of the reference CNN at batch 64, 64x64 input
    assert ops.row_sum_widths(64 * 64 * 64) == [4096, 64, 1]
    assert ops.row_sum_widths(64 * 32 * 32) == [1024, 16, 1]
    assert ops.row_sum_widths(64 * 16 * 16) == [256, 4, 1]
    assert ops.row_sum_widths(65) == [2, 1] and ops.row_sum_widths(64) == [1]
    assert ops.row_sum_widths(1) == [1]


@pytest.mark.parametrize("f,m", [(3, 1), (4, 64), (5, 65), (3, 4100), (2, 70001)])
def test_bias_grad_rows_is_the_fixed_order_sum(g, f, m):
    """No atomics: the passes' additions come in an order fixed by the
    shape, so the result is bitwise the NumPy twin's (and the same every
    run), and close to the float64 sum."""
    dy2 = RNG.standard_normal((f, m)).astype(np.float32)
    db = np.full(f, np.nan, np.float32)
    g.bias_grad_rows(dy2, db)
    ref = dy2
    for p in ops.row_sum_widths(m):
        ref = ops.row_partial_sums(ref, p)
    assert db.tobytes() == ref[:, 0].tobytes()
    np.testing.assert_allclose(db, dy2.astype(np.float64).sum(1), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("geom", [(2, 3, 8, 8, 4, 3, 1, 1), (2, 2, 9, 7, 3, 3, 2, 1)])
def test_conv_launchers(g, geom):
    n, c, h, w, f, k, s, p = geom
    x = RNG.standard_normal((n, c, h, w)).astype(np.float32)
    wt = RNG.standard_normal((f, c, k, k)).astype(np.float32)
    b = RNG.standard_normal(f).astype(np.float32)
    y, col = g.conv2d_forward(x, wt, b, s, p)
    ry, rcol = ops.conv2d_forward(x, wt, b, s, p)
    np.testing.assert_allclose(y, ry, rtol=1e-5, atol=1e-5)
    dy = RNG.standard_normal(ry.shape).astype(np.float32)
    dw, db = np.zeros_like(wt), np.zeros_like(b)
    dx = g.conv2d_backward(dy, col, x.shape, wt, s, p, dw, db)
    rdw, rdb = np.zeros_like(wt), np.zeros_like(b)
    rdx = ops.conv2d_backward(dy, rcol, x.shape, wt, s, p, rdw, rdb)
    np.testing.assert_allclose(dx, rdx, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dw, rdw, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(db, rdb, rtol=1e-5, atol=1e-5)


def test_pool_relu_linear_loss_launchers(g):
    x = RNG.standard_normal((2, 3, 9, 8)).astype(np.float32)
    y, am = g.maxpool_forward(x, 3, 2)
    ry, ram = ops.maxpool_forward(x, 3, 2)
    np.testing.assert_array_equal(y, ry)
    np.testing.assert_array_equal(am, ram)
    dy = RNG.standard_normal(y.shape).astype(np.float32)
    np.testing.assert_allclose(g.maxpool_backward(dy, am, x.shape, 3, 2),
                               ops.maxpool_backward(dy, ram, x.shape, 3, 2), atol=1e-6)
    r = g.relu_forward(x)
    np.testing.assert_array_equal(r, ops.relu_forward(x))
    np.testing.assert_array_equal(g.relu_backward(x, r), ops.relu_backward(x, r))
    a = RNG.standard_normal((6, 10)).astype(np.float32)
    w = RNG.standard_normal((4, 10)).astype(np.float32)
    b = RNG.standard_normal(4).astype(np.float32)
    z = g.linear_forward(a, w, b)
    np.testing.assert_allclose(z, ops.linear_forward(a, w, b), rtol=1e-5, atol=1e-6)
    labels = np.array([0, 3, 1, 2, 2, 0])
    loss, probs = g.softmax_xent_forward(z, labels)
    rl, rp = ops.softmax_xent_forward(ops.linear_forward(a, w, b), labels)
    assert abs(loss - rl) < 1e-5
    d = g.softmax_xent_backward(probs, labels)
    np.testing.assert_allclose(d, ops.softmax_xent_backward(rp, labels), atol=1e-6)
    dw, db = np.zeros_like(w), np.zeros_like(b)
    dx = g.linear_backward(d, a, w, dw, db)
    rdw, rdb = np.zeros_like(w), np.zeros_like(b)
    rdx = ops.linear_backward(d, a, w, rdw, rdb)
    for u, v in ((dx, rdx), (dw, rdw), (db, rdb)):
        np.testing.assert_allclose(u, v, rtol=1e-5, atol=1e-6)


def test_vector_launchers(g):
    P = 300
    w0, gr, v0, c, u0, S = (RNG.standard_normal(P).astype(np.float32) for _ in range(6))
    w, v = w0.copy(), v0.copy()
    g.sgd_update(w, gr, v, c, u0, 0.05, 0.9, 1e-3, 0.2, 1, 1)
    rw, rv = w0.copy(), v0.copy()
    sgd_update(rw, gr, rv, c, u0, 0.05, 0.9, 1e-3, 0.2, True, True)
    np.testing.assert_allclose(w, rw, rtol=1e-6, atol=1e-7)
    w = w0.copy()
    g.sgd_update(w, gr, v0.copy(), None, None, 0.05, 0.9, 1e-3, 0.0, 0, 0)   # no prox
    rw = w0.copy()
    sgd_update(rw, gr, v0.copy(), None, None, 0.05, 0.9, 1e-3, 0.0, False, False)
    np.testing.assert_allclose(w, rw, rtol=1e-6, atol=1e-7)
    zg, v, z = c.copy(), v0.copy(), np.zeros(P, np.float32)
    g.block_momentum(S, zg, v, z, 0.25, 0.75, 1.0, True)
    rzg, rv, rz = c.copy(), v0.copy(), np.zeros(P, np.float32)
    consensus.block_momentum(S, rzg, rv, rz, 0.25, 0.75, 1.0, True)
    np.testing.assert_allclose(z, rz, rtol=1e-6, atol=1e-6)
    out = np.empty(P, np.float32)
    g.axpby(out, 2.0, w0, -1.0, c)
    np.testing.assert_allclose(out, 2 * w0 - c, rtol=1e-6, atol=1e-6)
    u, ru = u0.copy(), u0.copy()
    g.dual_update(u, w0, c, 0.5)
    consensus.dual_update(ru, w0, c, 0.5)
    np.testing.assert_allclose(u, ru, rtol=1e-6, atol=1e-7)
