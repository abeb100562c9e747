"""BatchNorm, global average pooling, the residual block and the resnet
presets on the NumPy engine: each op against naive per-channel loops and
float64 central differences, a whole small residual net's flat gradient
against central differences (train mode), the buffers' consensus rule,
and the presets' shapes (ResNet-18's parameter count is torchvision's)."""
import numpy as np
import pytest

from ibtmpi import ops
from ibtmpi.model import Model
from test_ops import numgrad

RNG = np.random.default_rng(23)


def naive_bn(x, gamma, beta, eps):
    n, c, h, w = x.shape
    y = np.empty_like(x)
    means, vars_ = np.zeros(c), np.zeros(c)
    for ch in range(c):
        vals = [x[a, ch, i, j] for a in range(n) for i in range(h) for j in range(w)]
        mu = sum(vals) / len(vals)
        var = sum((v - mu) ** 2 for v in vals) / len(vals)
        means[ch], vars_[ch] = mu, var
        y[:, ch] = gamma[ch] * (x[:, ch] - mu) / np.sqrt(var + eps) + beta[ch]
    return y, means, vars_


@pytest.mark.parametrize("cnhw", [False, True])
def test_batchnorm_forward_matches_naive_loops_and_moves_the_running_stats(cnhw):
    n, c, h, w = 3, 4, 5, 2
    x = RNG.standard_normal((n, c, h, w)) * 3 + 1
    if cnhw:   # the layout a conv hands over: an NCHW view of (C, N, H, W)
        x = np.ascontiguousarray(x.transpose(1, 0, 2, 3)).transpose(1, 0, 2, 3)
    gamma, beta = RNG.standard_normal(c), RNG.standard_normal(c)
    rm = RNG.standard_normal(c).astype(np.float32)
    rv = RNG.random(c).astype(np.float32) + 0.5
    rm0, rv0 = rm.copy(), rv.copy()
    y, xhat, invstd = ops.batchnorm_forward(x, gamma, beta, rm, rv, True, 0.1, 1e-5)
    ref, mu, var = naive_bn(x, gamma, beta, 1e-5)
    np.testing.assert_allclose(y, ref, rtol=1e-12, atol=1e-12)
    m = n * h * w
    np.testing.assert_allclose(rm, 0.9 * rm0 + 0.1 * mu, rtol=1e-6)
    np.testing.assert_allclose(rv, 0.9 * rv0 + 0.1 * var * m / (m - 1), rtol=1e-6)
    # eval mode: the running statistics, nothing moves
    rm1, rv1 = rm.copy(), rv.copy()
    y, _, _ = ops.batchnorm_forward(x, gamma, beta, rm, rv, False, 0.1, 1e-5)
    ref = gamma[None, :, None, None] * (x - rm1[None, :, None, None]) / \
        np.sqrt(rv1[None, :, None, None].astype(np.float64) + 1e-5) + beta[None, :, None, None]
    np.testing.assert_allclose(y, ref, rtol=1e-6, atol=1e-6)
    assert (rm == rm1).all() and (rv == rv1).all()


def test_batchnorm_backward_matches_central_differences():
    n, c, h, w = 2, 3, 3, 2
    x = RNG.standard_normal((n, c, h, w))
    gamma, beta = RNG.standard_normal(c), RNG.standard_normal(c)
    r = RNG.standard_normal((n, c, h, w))
    rm, rv = np.zeros(c, np.float32), np.ones(c, np.float32)

    def loss():
        y, _, _ = ops.batchnorm_forward(x, gamma, beta, rm, rv, True)
        return float((y * r).sum())
    y, xhat, invstd = ops.batchnorm_forward(x, gamma, beta, rm, rv, True)
    dg, db = np.empty(c), np.empty(c)
    dx = ops.batchnorm_backward(r.copy(), xhat, invstd, gamma, dg, db)
    np.testing.assert_allclose(dx, numgrad(loss, x), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(dg, numgrad(loss, gamma), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(db, numgrad(loss, beta), rtol=1e-5, atol=1e-7)
    assert ops.batchnorm_backward(r, xhat, invstd, gamma, dg, db, need_dx=False) is None


def test_gap_forward_backward():
    x = RNG.standard_normal((2, 3, 4, 5))
    y = ops.gap_forward(x)
    for a in range(2):
        for ch in range(3):
            assert abs(y[a, ch] - sum(x[a, ch].ravel()) / 20) < 1e-12
    r = RNG.standard_normal((2, 3))
    g = numgrad(lambda: float((ops.gap_forward(x) * r).sum()), x)
    np.testing.assert_allclose(ops.gap_backward(r, x.shape), g, rtol=1e-6, atol=1e-9)


def test_batchnorm_consensus_of_the_statistics():
    """mean = avg(mean_i), var = avg(var_i + mean_i^2) - mean^2: the mean
    and variance of the union of equal-sized worker batches."""
    parts = [RNG.standard_normal((50, 3)) * (i + 1) + i for i in range(4)]
    s_mean, s_sq = np.zeros(3, np.float32), np.zeros(3, np.float32)
    for p in parts:
        mu, sq = ops.batchnorm_moments(p.mean(0).astype(np.float32),
                                       p.var(0).astype(np.float32))
        s_mean += mu
        s_sq += sq
    mean, var = ops.batchnorm_from_moments(s_mean, s_sq, 4)
    allx = np.concatenate(parts)
    np.testing.assert_allclose(mean, allx.mean(0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(var, allx.var(0), rtol=1e-5)
    # one worker: its own statistics back (a worker with mean 1.5, var 0.7)
    one = ops.batchnorm_from_moments(*ops.batchnorm_moments(np.float32([1.5]),
                                                            np.float32([0.7])), 1)
    assert one[0][0] == np.float32(1.5)
    assert abs(float(one[1][0]) - 0.7) < 1e-6


SMALL_RES = [
    {"type": "conv", "out": 3, "k": 3, "pad": 1, "bias": False}, "batchnorm", "relu",
    {"type": "residual", "out": 3},                  # identity shortcut
    {"type": "residual", "out": 4, "stride": 2},     # conv1x1 + BN shortcut
    "gap", {"type": "linear"},
]


def test_residual_net_flat_gradient_matches_central_differences():
    """The whole flat gradient of a net with BN (train mode), both kinds of
    residual block, GAP and a linear head, in float64."""
    m = Model(SMALL_RES, (2, 6, 6), 3, dtype=np.float64, seed=3)
    m.params[:] += RNG.standard_normal(m.size) * 0.1      # gamma != 1, beta != 0
    x = RNG.standard_normal((4, 2, 6, 6))
    y = np.array([0, 1, 2, 1])
    m.loss_and_grad(x, y)
    g = m.grads.copy()

    def loss():
        logits = m.forward(x, train=True)
        return ops.softmax_xent_forward(logits, y)[0]
    num = numgrad(loss, m.params)
    np.testing.assert_allclose(g, num, rtol=1e-4, atol=1e-7)
    names = [n for _, n, _ in m.slices]
    assert "conv1.weight" in names and "short_bn.gamma" in names
    assert [n for _, n, _ in m.buffer_slices].count("bn1.running_mean") == 2


def test_eval_mode_uses_the_running_statistics_and_training_moves_them():
    m = Model("resnet8", (3, 16, 16), 4, seed=1)
    rm = m.buffers.copy()
    x = RNG.standard_normal((8, 3, 16, 16)).astype(np.float32)
    a = m.forward(x, train=False).copy()
    assert (m.buffers == rm).all()                  # eval moves nothing
    m.loss_and_grad(x, np.arange(8) % 4)
    assert (m.buffers != rm).any()
    b = m.forward(x, train=False)
    assert not np.allclose(a, b)                    # new statistics, new outputs
    m.load_buffers(rm)
    np.testing.assert_array_equal(m.forward(x, train=False), a)


def test_presets_shapes_and_parameter_counts():
    r8 = Model("resnet8", (3, 32, 32), 5)
    assert r8.shapes[-3] == (64, 8, 8) and r8.shapes[-1] == (5,)
    # BN buffers: stem 16, block1 2x16, block2 2x32 + shortcut 32, block3 2x64 + 64
    assert r8.n_buffers == 2 * (16 + 32 + 96 + 192)
    r18 = Model("resnet18", (3, 64, 64), 5)
    # torchvision's resnet18 (11,689,512 with a 7x7 stem and 1000 classes)
    # with a 3x3 stem and 5 classes
    assert r18.size == 11_689_512 - 3 * 64 * 49 + 3 * 64 * 9 - 513_000 + 5 * 512 + 5
    assert r18.shapes[-3] == (512, 8, 8)


def test_conv_without_bias_has_no_bias_parameter():
    m = Model([{"type": "conv", "out": 4, "bias": False}, "gap", {"type": "linear"}],
              (3, 8, 8), 2)
    assert m.size == 4 * 3 * 9 + 4 * 2 + 2
    with pytest.raises(ValueError, match="bias must be true or false"):
        Model([{"type": "conv", "out": 4, "bias": "no"}, "gap", "linear"], (3, 8, 8), 2)


def test_spec_errors_name_the_entry():
    with pytest.raises(ValueError, match=r"layers\[1\]: batchnorm needs"):
        Model(["flatten", "batchnorm", "linear"], (3, 8, 8), 2)
    with pytest.raises(ValueError, match=r"layers\[0\] \(residual\): missing key 'out'"):
        Model(["residual", "gap", "linear"], (3, 8, 8), 2)
    with pytest.raises(ValueError, match="gap needs"):
        Model(["flatten", "gap", "linear"], (3, 8, 8), 2)


@pytest.mark.parametrize("spec", ["reference", "resnet8", SMALL_RES])
def test_shared_recomputed_columns_give_the_same_bits(spec, monkeypatch):
    """Convs whose columns would exceed COL_SHARE_BYTES share one buffer and
    recompute their columns in backward: forced on every conv here (the
    reference CNN's phase path included), gradients and the moved running
    statistics are bitwise those of per-conv buffers, over two steps with
    two batch sizes; the model then holds one column buffer (convs on the
    taps path, ops/conv_taps.py, store no columns at all)."""
    from ibtmpi.layers import Conv2d
    from ibtmpi.model import _walk
    shape = (2, 6, 6) if spec is SMALL_RES else (3, 16, 16)
    x = RNG.standard_normal((6,) + shape).astype(np.float32)
    y = np.arange(6) % 3
    own = Model(spec, shape, 3, seed=4)
    monkeypatch.setattr(Conv2d, "COL_SHARE_BYTES", 0)
    shared = Model(spec, shape, 3, seed=4)
    for n in (6, 4):
        own.loss_and_grad(x[:n], y[:n])
        shared.loss_and_grad(x[:n], y[:n])
        assert own.grads.tobytes() == shared.grads.tobytes()
        assert own.buffers.tobytes() == shared.buffers.tobytes()
    convs = [l for l in _walk(shared.layers) if isinstance(l, Conv2d) and l.xtaps is None]
    assert convs and all(c.x is not None and "col" not in c.ws._bufs for c in convs)
    assert all("col" not in c.ws._bufs for c in _walk(shared.layers) if isinstance(c, Conv2d))
