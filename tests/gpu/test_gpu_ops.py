"""Each CuPy kernel launch against the NumPy reference, on a real GPU.
Skipped (with the reason shown by -ra) where CuPy or a device is missing.
Run: pytest -m gpu tests/gpu"""
import os
import sys

import numpy as np
import pytest

from ibtmpi import backend, consensus, ops
from ibtmpi.optim import adam_update, sgd_update

OK, WHY = backend.gpu_status()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not OK, reason=f"no GPU: {WHY}")]
RNG = np.random.default_rng(5)


@pytest.fixture(scope="module")
def g():
    return backend.GpuOps()


def close(a, b, g, tol=1e-5):
    np.testing.assert_allclose(g.asnumpy(a), b, rtol=tol, atol=tol)


@pytest.mark.parametrize("geom", [(4, 3, 16, 16, 8, 3, 1, 1), (2, 5, 9, 11, 4, 3, 2, 1),
                                  (3, 2, 8, 8, 6, 5, 1, 2)])
def test_conv(g, geom):
    n, c, h, w, f, k, s, p = geom
    x = RNG.standard_normal((n, c, h, w)).astype(np.float32)
    wt = RNG.standard_normal((f, c, k, k)).astype(np.float32)
    b = RNG.standard_normal(f).astype(np.float32)
    y, col = g.conv2d_forward(g.asarray(x), g.asarray(wt), g.asarray(b), s, p)
    ry, rcol = ops.conv2d_forward(x, wt, b, s, p)
    close(y, ry, g, 1e-4)
    dy = RNG.standard_normal(ry.shape).astype(np.float32)
    dw, db = g.asarray(np.zeros_like(wt)), g.asarray(np.zeros_like(b))
    dx = g.conv2d_backward(g.asarray(dy), col, x.shape, g.asarray(wt), s, p, dw, db)
    rdw, rdb = np.zeros_like(wt), np.zeros_like(b)
    rdx = ops.conv2d_backward(dy, rcol, x.shape, wt, s, p, rdw, rdb)
    close(dx, rdx, g, 1e-4)
    close(dw, rdw, g, 1e-3)
    close(db, rdb, g, 1e-4)


@pytest.mark.parametrize("f,m", [(32, 64 * 64 * 64), (128, 64 * 16 * 16), (3, 5)])
def test_bias_grad_rows_is_deterministic(g, f, m):
    """No atomics: bitwise the NumPy twin of the passes, every run."""
    dy2 = RNG.standard_normal((f, m)).astype(np.float32)
    d = g.asarray(dy2)
    a, b = g.cp.empty(f, g.cp.float32), g.cp.empty(f, g.cp.float32)
    g.bias_grad_rows(d, a)
    g.bias_grad_rows(d, b)
    ref = dy2
    for p in ops.row_sum_widths(m):
        ref = ops.row_partial_sums(ref, p)
    assert g.asnumpy(a).tobytes() == g.asnumpy(b).tobytes() == ref[:, 0].tobytes()


@pytest.mark.parametrize("k,s", [(2, 2), (3, 2), (3, 3)])
def test_pool_relu(g, k, s):
    x = RNG.standard_normal((2, 3, 13, 12)).astype(np.float32)
    y, am = g.maxpool_forward(g.asarray(x), k, s)
    ry, ram = ops.maxpool_forward(x, k, s)
    close(y, ry, g, 0)
    np.testing.assert_array_equal(g.asnumpy(am), ram)
    dy = RNG.standard_normal(ry.shape).astype(np.float32)
    close(g.maxpool_backward(g.asarray(dy), am, x.shape, k, s),
          ops.maxpool_backward(dy, ram, x.shape, k, s), g, 1e-6)
    # padded (torchvision's stem pool: 3x3, stride 2, pad 1): padding never wins
    py, pam = g.maxpool_forward(g.asarray(x - 2.0), k, s, pad=1)
    rpy, rpam = ops.maxpool_forward(x - 2.0, k, s, pad=1)
    close(py, rpy, g, 0)
    np.testing.assert_array_equal(g.asnumpy(pam), rpam)
    pdy = RNG.standard_normal(rpy.shape).astype(np.float32)
    close(g.maxpool_backward(g.asarray(pdy), pam, x.shape, k, s, pad=1),
          ops.maxpool_backward(pdy, rpam, x.shape, k, s, pad=1), g, 1e-6)
    # a conv's output layout: an NCHW view of a (C, N, H, W) buffer, read
    # where it lies; the gradient written into the same layout
    view = g.asarray(np.ascontiguousarray(x.transpose(1, 0, 2, 3))).transpose(1, 0, 2, 3)
    y2, am2 = g.maxpool_forward(view, k, s)
    close(y2, ry, g, 0)
    np.testing.assert_array_equal(g.asnumpy(am2), ram)
    out = g.empty4(x.shape, np.float32, True)
    dx = g.maxpool_backward(g.asarray(dy), am2, x.shape, k, s, out=out)
    assert dx is out and ops.is_cnhw(dx)
    close(dx, ops.maxpool_backward(dy, ram, x.shape, k, s), g, 1e-6)
    # fused (conv bias and the following ReLU inside the pool)
    b = RNG.standard_normal(3).astype(np.float32)
    xb = x + b[None, :, None, None]
    fy, fam = g.maxpool_forward(view, k, s, bias=g.asarray(b), relu=True)
    by, bam = ops.maxpool_forward(xb, k, s)
    close(fy, ops.relu_forward(by), g, 0)
    np.testing.assert_array_equal(g.asnumpy(fam), bam)
    fdx = g.maxpool_backward(g.asarray(dy), fam, x.shape, k, s,
                             out=g.empty4(x.shape, np.float32, True), y=fy)
    close(fdx, ops.maxpool_backward(ops.relu_backward(dy, ops.relu_forward(by)), bam,
                                    x.shape, k, s), g, 1e-6)
    r = g.relu_forward(g.asarray(x))
    close(r, ops.relu_forward(x), g, 0)
    close(g.relu_backward(g.asarray(x), r), ops.relu_backward(x, ops.relu_forward(x)), g, 0)


@pytest.mark.parametrize("k,s", [(2, 2), (3, 2), (2, 1), (3, 3)])
def test_avgpool(g, k, s):
    """Bit for bit the NumPy twin (the same summation order, one multiply,
    nothing a fused multiply-add could contract), from and into a conv's
    (C, N, H, W) layout where it lies."""
    x = RNG.standard_normal((2, 3, 13, 12)).astype(np.float32)
    ry = ops.avgpool_forward(x, k, s)
    close(g.avgpool_forward(g.asarray(x), k, s), ry, g, 0)
    view = g.asarray(np.ascontiguousarray(x.transpose(1, 0, 2, 3))).transpose(1, 0, 2, 3)
    close(g.avgpool_forward(view, k, s), ry, g, 0)
    dy = RNG.standard_normal(ry.shape).astype(np.float32)
    rdx = ops.avgpool_backward(dy, x.shape, k, s)
    close(g.avgpool_backward(g.asarray(dy), x.shape, k, s), rdx, g, 0)
    out = g.empty4(x.shape, np.float32, True)
    dx = g.avgpool_backward(g.asarray(dy), x.shape, k, s, out=out)
    assert dx is out and ops.is_cnhw(dx)
    close(dx, rdx, g, 0)


def test_linear_and_loss(g):
    x = RNG.standard_normal((16, 40)).astype(np.float32)
    w = RNG.standard_normal((5, 40)).astype(np.float32)
    b = RNG.standard_normal(5).astype(np.float32)
    y = g.linear_forward(g.asarray(x), g.asarray(w), g.asarray(b))
    close(y, ops.linear_forward(x, w, b), g, 1e-4)
    labels = RNG.integers(0, 5, 16)
    loss, probs = g.softmax_xent_forward(y, labels)
    rl, rp = ops.softmax_xent_forward(ops.linear_forward(x, w, b), labels)
    assert abs(loss - rl) < 1e-4
    close(probs, rp, g)
    d = g.softmax_xent_backward(probs, labels)
    close(d, ops.softmax_xent_backward(rp, labels), g)
    dw, db = g.asarray(np.zeros_like(w)), g.asarray(np.zeros_like(b))
    dx = g.linear_backward(d, g.asarray(x), g.asarray(w), dw, db)
    rdw, rdb = np.zeros_like(w), np.zeros_like(b)
    rdx = ops.linear_backward(ops.softmax_xent_backward(rp, labels), x, w, rdw, rdb)
    close(dx, rdx, g)
    close(dw, rdw, g)
    close(db, rdb, g)


def test_vector_updates(g):
    P = 10001
    w0, gr, v0, c, u0, S = (RNG.standard_normal(P).astype(np.float32) for _ in range(6))
    for nest, prox in ((0, 0), (1, 1)):
        w, v = g.asarray(w0), g.asarray(v0)
        g.sgd_update(w, g.asarray(gr), v, g.asarray(c), g.asarray(u0), 0.05, 0.9,
                     1e-3, 0.2, nest, prox)
        rw, rv = w0.copy(), v0.copy()
        sgd_update(rw, gr, rv, c, u0, 0.05, 0.9, 1e-3, 0.2, nest, prox)
        close(w, rw, g)
        close(v, rv, g)
    m0 = RNG.standard_normal(P).astype(np.float32)
    a0 = RNG.random(P).astype(np.float32)
    for dec, prox in ((0, 0), (1, 1), (0, 1)):
        args = (2e-3, 0.9, 0.999, 1e-8, 0.01, 0.2, 1 - 0.9 ** 3, 1 - 0.999 ** 3, dec, prox)
        w, m, a = g.asarray(w0), g.asarray(m0), g.asarray(a0)
        g.adam_update(w, g.asarray(gr), m, a, g.asarray(c), g.asarray(u0), *args)
        rw, rm, ra = w0.copy(), m0.copy(), a0.copy()
        adam_update(rw, gr, rm, ra, c, u0, *args)
        close(w, rw, g)
        close(m, rm, g)
        close(a, ra, g)


@pytest.mark.parametrize("algo,acfg", [
    ("ma", {}), ("admm", {"l2": 1e-3}), ("bmuf", {}), ("ibt", {}), ("easgd", {}),
    ("admm", {"adaptive_rho": True, "over_relaxation": 1.5, "rho_mu": 1.01}),
    ("ibt", {"adaptive_rho": True, "rho_mu": 1.01}),
    ("ibt", {"centred_duals": True, "block_lr": 0.7})])
def test_device_consensus_is_bitwise_the_host_consensus(g, algo, acfg):
    """run.cuda_aware = on keeps a worker's consensus on its GPU while the
    master's stays on the host: z must not differ by a single bit (one
    NumPy-API call per elementwise op, no contraction into FMA)."""
    P, n = 4099, 3
    z0 = RNG.standard_normal(P).astype(np.float32)
    host = consensus.make_consensus(algo, z0, n, dict(acfg, rho=0.05))
    dev = consensus.make_consensus(algo, g.asarray(z0), n, dict(acfg, rho=0.05),
                              to_host=g.asnumpy)
    hs = [consensus.WorkerState(P, np.float32, algo) for _ in range(n)]
    ds = [consensus.WorkerState(P, np.float32, algo, g.cp.zeros) for _ in range(n)]
    for blk in range(6):
        S_h, S_d = np.zeros(P, np.float32), g.cp.zeros(P, np.float32)
        q = 0.0
        for i in range(n):
            w_h = np.empty(P, np.float32)
            host.worker_begin(hs[i], w_h)
            w_d = g.cp.empty(P, np.float32)
            dev.worker_begin(ds[i], w_d)
            step = (0.1 * RNG.standard_normal(P)).astype(np.float32)
            w_h += step
            w_d += g.asarray(step)
            out_h, out_d = np.empty(P, np.float32), g.cp.empty(P, np.float32)
            q += host.contribution(hs[i], w_h, out_h)
            dev.contribution(ds[i], w_d, out_d)
            S_h += out_h
            S_d += out_d
        dh = host.update(S_h, q)
        dd = dev.update(S_d, q)
        assert g.asnumpy(dev.z).tobytes() == host.z.tobytes(), f"block {blk}"
        assert dev.rho == host.rho
        if acfg.get("adaptive_rho"):
            assert dd == dh
        for i in range(n):
            host.worker_end(hs[i], None)
            dev.worker_end(ds[i], None)
            if hs[i].u is not None:
                assert g.asnumpy(ds[i].u).tobytes() == hs[i].u.tobytes()


@pytest.mark.parametrize("cnhw", [False, True])
@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (3, 5, 7, 9), (64, 64, 8, 8),
                                   (8, 16, 32, 32)])
def test_batchnorm(g, cnhw, shape):
    """Train and eval forward (running statistics moved in place) and the
    backward against ops.batchnorm_*, for per-channel counts M that take
    one, two and three fixed-order passes; bitwise the same on a second run
    (no atomics). On the CPU this runs through the CuPy stand-in
    (tests/unit/test_gpu_suite_on_stand_in.py)."""
    n, c, h, w = shape
    x = (RNG.standard_normal(shape) * 2 + 0.5).astype(np.float32)
    xd = (g.asarray(np.ascontiguousarray(x.transpose(1, 0, 2, 3))).transpose(1, 0, 2, 3)
          if cnhw else g.asarray(x))
    gamma = RNG.standard_normal(c).astype(np.float32)
    beta = RNG.standard_normal(c).astype(np.float32)
    for train in (True, False):
        rm, rv = np.full(c, 0.2, np.float32), np.full(c, 1.5, np.float32)
        drm, drv = g.asarray(rm), g.asarray(rv)
        y, xhat, inv = g.batchnorm_forward(xd, g.asarray(gamma), g.asarray(beta), drm, drv,
                                           train)
        ry, rxhat, rinv = ops.batchnorm_forward(x, gamma, beta, rm, rv, train)
        close(y, ry, g, 1e-4)
        close(drm, rm, g)
        close(drv, rv, g)
    dy = RNG.standard_normal(shape).astype(np.float32)
    outs = []
    for _ in range(2):
        dg, db = g.cp.empty(c, np.float32), g.cp.empty(c, np.float32)
        dx = g.batchnorm_backward(g.asarray(dy), xhat, inv, g.asarray(gamma), dg, db)
        outs.append(g.asnumpy(dx).tobytes() + g.asnumpy(dg).tobytes())
    assert outs[0] == outs[1]
    rdg, rdb = np.empty(c, np.float32), np.empty(c, np.float32)
    rdx = ops.batchnorm_backward(dy, rxhat, rinv, gamma, rdg, rdb)
    close(dg, rdg, g, 1e-3)
    close(db, rdb, g, 1e-3)
    close(dx, rdx, g, 1e-3)


def test_gap_add_relu_and_input_normalisation(g):
    from ibtmpi.data import normalize
    x = RNG.standard_normal((4, 8, 6, 5)).astype(np.float32)
    close(g.gap_forward(g.asarray(x)), ops.gap_forward(x), g)
    dy = RNG.standard_normal((4, 8)).astype(np.float32)
    close(g.gap_backward(g.asarray(dy), x.shape), ops.gap_backward(dy, x.shape), g)
    b = RNG.standard_normal(x.shape).astype(np.float32)
    a = g.asarray(x)
    g.add_relu_forward(a, g.asarray(b), out=a)
    close(a, ops.add_relu_forward(x, b, np.empty_like(x)), g, 0)
    u8 = RNG.integers(0, 256, (5, 16, 16, 3)).astype(np.uint8)
    mean, std = np.array([110.0, 120.0, 130.0]), np.array([50.0, 60.0, 70.0])
    y = g.normalize_u8(u8, g.asarray((1 / std).astype(np.float32)),
                       g.asarray((-mean / std).astype(np.float32)))
    assert g.asnumpy(y).tobytes() == normalize(u8, mean, std).tobytes()   # no FMA
    u16 = RNG.integers(0, 65536, (5, 16, 16, 3)).astype(np.uint16)      # 16-bit bands
    y = g.normalize_u8(u16, g.asarray((1 / (std * 257)).astype(np.float32)),
                       g.asarray((-mean / std).astype(np.float32)))
    assert g.asnumpy(y).tobytes() == normalize(u16, mean * 257, std * 257).tobytes()


def test_avgpool_model_step_matches_the_numpy_engine(g):
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "unit"))
    from devcheck import AVGPOOL_SPEC, step_matches_numpy
    step_matches_numpy(g, AVGPOOL_SPEC, 16, 8, 4, 1e-3, 1e-4)


def test_resnet8_step_matches_the_numpy_engine(g):
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "unit"))
    from devcheck import step_matches_numpy       # the stand-in tests' check
    _, dev, _, _ = step_matches_numpy(g, "resnet8", 32, 16, 3, 1e-3, 1e-4)
    del dev                    # later tests read the pool's figure: leave it as found
    g.cp.get_default_memory_pool().free_all_blocks()
