"""The CuPy launchers of ibtmpi/backend.py, run on the CPU: a minimal CuPy
stand-in keeps arrays in NumPy and backs RawModule functions with the
host-emulated kernels (ibtmpi/kernelcheck.py). This checks what the kernel
tests cannot: each launcher's argument order and types, shapes, grid
arithmetic and the GEMM/bias composition, against the NumPy reference ops.
The gpu tests (tests/gpu) repeat the same checks with real CuPy."""
import numpy as np
import pytest
from ibtmpi.testing.fakecupy import FakeCupy

from ibtmpi import ops
from ibtmpi.backend import GpuOps
from ibtmpi.optim import Adam, AdamW, Prox, adam_update, sgd_update

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
    db = g.cp.empty(f, np.float32)
    g.bias_grad_rows(g.asarray(dy2), db)
    ref = dy2
    for p in ops.row_sum_widths(m):
        ref = ops.row_partial_sums(ref, p)
    db = g.asnumpy(db)
    assert db.tobytes() == ref[:, 0].tobytes()
    np.testing.assert_allclose(db, dy2.astype(np.float64).sum(1), rtol=1e-5, atol=1e-4)


def _close(dev, host, g, **tol):
    np.testing.assert_allclose(g.asnumpy(dev), host, **tol)


@pytest.mark.parametrize("geom", [(2, 3, 8, 8, 4, 3, 1, 1), (2, 2, 9, 7, 3, 3, 2, 1)])
def test_conv_launchers(g, geom):
    n, c, h, w, f, k, s, p = geom
    D = g.asarray
    x = RNG.standard_normal((n, c, h, w)).astype(np.float32)
    wt = RNG.standard_normal((f, c, k, k)).astype(np.float32)
    b = RNG.standard_normal(f).astype(np.float32)
    y, col = g.conv2d_forward(D(x), D(wt), D(b), s, p)
    ry, rcol = ops.conv2d_forward(x, wt, b, s, p)
    _close(y, ry, g, rtol=1e-5, atol=1e-5)
    dy = RNG.standard_normal(ry.shape).astype(np.float32)
    dw, db = g.cp.zeros(wt.shape, np.float32), g.cp.zeros(b.shape, np.float32)
    dx = g.conv2d_backward(D(dy), col, x.shape, D(wt), s, p, dw, db)
    rdw, rdb = np.zeros_like(wt), np.zeros_like(b)
    rdx = ops.conv2d_backward(dy, rcol, x.shape, wt, s, p, rdw, rdb)
    _close(dx, rdx, g, rtol=1e-5, atol=1e-5)
    _close(dw, rdw, g, rtol=1e-4, atol=1e-4)
    _close(db, rdb, g, rtol=1e-5, atol=1e-5)


def test_pool_relu_linear_loss_launchers(g):
    D, H = g.asarray, g.asnumpy
    x = RNG.standard_normal((2, 3, 9, 8)).astype(np.float32)
    y, am = g.maxpool_forward(D(x), 3, 2)
    ry, ram = ops.maxpool_forward(x, 3, 2)
    np.testing.assert_array_equal(H(y), ry)
    np.testing.assert_array_equal(H(am), ram)
    dy = RNG.standard_normal(ry.shape).astype(np.float32)
    _close(g.maxpool_backward(D(dy), am, x.shape, 3, 2),
           ops.maxpool_backward(dy, ram, x.shape, 3, 2), g, atol=1e-6)
    r = g.relu_forward(D(x))
    np.testing.assert_array_equal(H(r), ops.relu_forward(x))
    np.testing.assert_array_equal(H(g.relu_backward(D(x), r)),
                                  ops.relu_backward(x, ops.relu_forward(x)))
    a = RNG.standard_normal((6, 10)).astype(np.float32)
    w = RNG.standard_normal((4, 10)).astype(np.float32)
    b = RNG.standard_normal(4).astype(np.float32)
    z = g.linear_forward(D(a), D(w), D(b))
    rz = ops.linear_forward(a, w, b)
    _close(z, rz, g, rtol=1e-5, atol=1e-6)
    labels = np.array([0, 3, 1, 2, 2, 0])
    loss, probs = g.softmax_xent_forward(z, labels)      # host labels: copied up
    rl, rp = ops.softmax_xent_forward(rz, labels)
    assert isinstance(loss, float) and abs(loss - rl) < 1e-5
    d = g.softmax_xent_backward(probs, D(labels))
    rd = ops.softmax_xent_backward(rp, labels)
    _close(d, rd, g, atol=1e-6)
    dw, db = g.cp.zeros(w.shape, np.float32), g.cp.zeros(b.shape, np.float32)
    dx = g.linear_backward(d, D(a), D(w), dw, db)
    rdw, rdb = np.zeros_like(w), np.zeros_like(b)
    rdx = ops.linear_backward(rd, a, w, rdw, rdb)
    for u, v in ((dx, rdx), (dw, rdw), (db, rdb)):
        _close(u, v, g, rtol=1e-5, atol=1e-6)


def test_vector_launchers(g):
    D = g.asarray
    P = 300
    w0, gr, v0, c, u0, S = (RNG.standard_normal(P).astype(np.float32) for _ in range(6))
    w, v = D(w0), D(v0)
    g.sgd_update(w, D(gr), v, D(c), D(u0), 0.05, 0.9, 1e-3, 0.2, 1, 1)
    rw, rv = w0.copy(), v0.copy()
    sgd_update(rw, gr, rv, c, u0, 0.05, 0.9, 1e-3, 0.2, True, True)
    _close(w, rw, g, rtol=1e-6, atol=1e-7)
    _close(v, rv, g, rtol=1e-6, atol=1e-7)
    w = D(w0)
    g.sgd_update(w, D(gr), D(v0), None, None, 0.05, 0.9, 1e-3, 0.0, 0, 0)   # no prox
    rw = w0.copy()
    sgd_update(rw, gr, v0.copy(), None, None, 0.05, 0.9, 1e-3, 0.0, False, False)
    _close(w, rw, g, rtol=1e-6, atol=1e-7)


def test_the_stand_in_rejects_what_cupy_rejects(g):
    """The stand-in's device arrays follow CuPy's rules, so a host array
    where a device one belongs fails here as it would on a GPU."""
    h = np.ones(4, np.float32)
    d = g.asarray(h)
    assert d is not h and g.asarray(d) is d
    d += 1
    assert h[0] == 1.0                              # a copy, not an alias
    with pytest.raises(TypeError, match="host"):
        d + h
    with pytest.raises(TypeError, match="host"):
        np.copyto(h, d)
    with pytest.raises(TypeError, match="cupy.ndarray"):
        g.relu_forward(h)
    s = d.sum()
    assert isinstance(s, g.cp.ndarray) and s.ndim == 0 and float(s) == 8.0
    d[...] = h                                      # host -> device assignment: allowed
    assert g.asnumpy(d).tolist() == [1.0] * 4


def test_the_stand_in_checks_each_kernel_argument_against_the_cu_signature(g):
    """A Python int or float, a scalar of the wrong width or a device array of
    the wrong dtype shifts or misreads arguments on a GPU: each fails here.
    relu_fwd(const float* x, float* y, long long n)."""
    k = g._k("activation.cu", "relu_fwd")
    x, y = g.asarray(np.ones(4, np.float32)), g.cp.empty(4, np.float32)
    k((1,), (32,), (x, y, np.int64(4)))                     # as the launcher passes them
    assert g.asnumpy(y).tolist() == [1.0] * 4
    for bad, what in [((x, y, 4), "long long.*int"),
                      ((x, y, np.int32(4)), "long long.*int32"),
                      ((g.asarray(np.ones(4)), y, np.int64(4)), "float32, got .*float64"),
                      ((x, y[::2], np.int64(2)), "strided"),
                      ((x, y), "2 arguments for 3")]:
        with pytest.raises(TypeError, match=what):
            k((1,), (32,), bad)


def test_the_stand_in_copies_as_cupy_does(g):
    """set() and asnumpy(out=) neither cast nor broadcast (NumPy's copyto
    does both), and set() needs a contiguous target."""
    d = g.cp.zeros(4, np.float32)
    with pytest.raises(TypeError, match="float64 array cannot be set to float32"):
        d.set(np.ones(4))
    with pytest.raises(ValueError, match="shape mismatch"):
        d.set(np.ones(1, np.float32))
    with pytest.raises(RuntimeError, match="non-contiguous"):
        d[::2].set(np.ones(2, np.float32))
    with pytest.raises(TypeError, match="cannot be set"):
        g.cp.asnumpy(d, out=np.empty(4))
    assert g.to_host(d + 1, np.empty(4, np.float32)).tolist() == [1.0] * 4


@pytest.mark.parametrize("k,s,pad", [(3, 2, 1), (2, 2, 1), (5, 2, 2)])
def test_padded_maxpool_kernel_is_its_twin_plain_fused_and_in_the_conv_layout(g, k, s, pad):
    """kernels/pool.cu's pad against ops.maxpool_forward/backward(pad=):
    the same bits forward, the same routing backward; fused with the conv's
    bias and the ReLU; reading a conv's (C, N, H, W) layout where it lies."""
    D, H = g.asarray, g.asnumpy
    x = RNG.standard_normal((2, 3, 9, 8)).astype(np.float32) - 1.0
    y, am = g.maxpool_forward(D(x), k, s, pad=pad)
    ry, ram = ops.maxpool_forward(x, k, s, pad=pad)
    np.testing.assert_array_equal(H(y), ry)
    np.testing.assert_array_equal(H(am), ram)
    dy = RNG.standard_normal(ry.shape).astype(np.float32)
    _close(g.maxpool_backward(D(dy), am, x.shape, k, s, pad=pad),
           ops.maxpool_backward(dy, ram, x.shape, k, s, pad=pad), g, atol=1e-6)
    b = RNG.standard_normal(3).astype(np.float32)
    fy, fam = g.maxpool_forward(D(x), k, s, bias=D(b), relu=True, pad=pad)
    by, bam = ops.maxpool_forward(x + b[None, :, None, None], k, s, pad=pad)
    np.testing.assert_array_equal(H(fy), ops.relu_forward(by))
    np.testing.assert_array_equal(H(fam), bam)
    fdx = g.maxpool_backward(D(dy), fam, x.shape, k, s, y=fy, pad=pad)
    _close(fdx, ops.maxpool_backward(dy * (ops.relu_forward(by) > 0), bam, x.shape, k, s,
                                     pad=pad), g, atol=1e-6)
    view = g.asarray(np.ascontiguousarray(x.transpose(1, 0, 2, 3))).transpose(1, 0, 2, 3)
    vy, vam = g.maxpool_forward(view, k, s, pad=pad)
    np.testing.assert_array_equal(H(vy), ry)
    out = g.empty4(x.shape, np.float32, True)
    vdx = g.maxpool_backward(g.asarray(dy), vam, x.shape, k, s, out=out, pad=pad)
    _close(vdx, ops.maxpool_backward(dy, ram, x.shape, k, s, pad=pad), g, atol=1e-6)


def test_maxpool_reads_and_writes_the_conv_layout_where_it_lies(g):
    """A conv's output is an NCHW view of a (C, N, H, W) buffer, and its
    backward wants the gradient in that layout: the pool launchers read x
    and write dx there (no transpose copy), with the contiguous results."""
    from ibtmpi.testing import fakecupy
    x = RNG.standard_normal((3, 4, 9, 8)).astype(np.float32)       # (N, C, H, W)
    view = g.asarray(np.ascontiguousarray(x.transpose(1, 0, 2, 3))).transpose(1, 0, 2, 3)
    assert ops.is_cnhw(view)
    fakecupy.COPIES.clear()
    y, am = g.maxpool_forward(view, 3, 2)
    ry, ram = ops.maxpool_forward(x, 3, 2)
    np.testing.assert_array_equal(g.asnumpy(y), ry)
    np.testing.assert_array_equal(g.asnumpy(am), ram)
    dy = RNG.standard_normal(ry.shape).astype(np.float32)
    out = g.empty4(x.shape, np.float32, True)
    dx = g.maxpool_backward(g.asarray(dy), am, x.shape, 3, 2, out=out)
    assert dx is out and ops.is_cnhw(dx)
    assert fakecupy.COPIES == []
    _close(dx, ops.maxpool_backward(dy, ram, x.shape, 3, 2), g, atol=1e-6)
    plain = g.cp.empty(x.shape, np.float32)                     # NCHW out: written in place
    assert g.maxpool_backward(g.asarray(dy), am, x.shape, 3, 2, out=plain) is plain
    assert fakecupy.COPIES == []
    _close(plain, ops.maxpool_backward(dy, ram, x.shape, 3, 2), g, atol=1e-6)


def test_a_reference_cnn_step_copies_no_activation(g):
    """One training step of the reference CNN (64x64x3, batch 4) on the
    device: our kernels and the GEMMs, no other CuPy kernel (the loss and
    correct count are added up by the fused loss kernel), and no copy of an
    activation or gradient (a conv hands the pool its (C, N, H, W) output, the pool hands
    the conv's backward its gradient in that layout, the weight-gradient
    GEMMs write into the flat gradient vector). The launch counts are the
    docs/engine.md's; a fusion that lowers them updates both. The gradients are
    the NumPy engine's."""
    from ibtmpi.testing import fakecupy
    from ibtmpi.model import Model
    from ibtmpi.optim import SGD
    x = RNG.standard_normal((4, 3, 64, 64)).astype(np.float32)
    y = RNG.integers(0, 5, 4)
    host = Model("reference", (3, 64, 64), 5)
    dev = Model("reference", (3, 64, 64), 5, ops=g)
    opt = SGD(dev.params, lr=0.01, momentum=0.9, weight_decay=5e-4, ops=g)
    stats = dev.new_stats(4)
    dev.step_grad(g.asarray(x), y, stats)                # warm: kernels built
    fakecupy.COPIES.clear()
    fakecupy.LAUNCHES.clear()
    dev.step_grad(g.asarray(x), y, stats)
    host.loss_and_grad(x, y)
    np.testing.assert_allclose(g.asnumpy(dev.grads), host.grads, rtol=1e-4, atol=1e-5)
    opt.step(dev.grads)
    assert fakecupy.COPIES == []
    assert not [k for k in fakecupy.LAUNCHES if k.startswith("cupy ")], fakecupy.LAUNCHES
    gemms = fakecupy.LAUNCHES.pop("GEMM")
    assert (sum(fakecupy.LAUNCHES.values()), gemms) == (26, 14), str(dict(fakecupy.LAUNCHES))
    assert fakecupy.LAUNCHES["sgd_update"] == 1


def test_fused_pool_is_bitwise_the_unfused_layers(g):
    """fuse_for_device folds conv bias and ReLU into the max-pool: logits,
    gradients and evaluation equal, bit for bit, those of the same device
    model run layer by layer."""
    from ibtmpi.layers import Conv2d, MaxPool2d, ReLU
    from ibtmpi.model import Model
    x = RNG.standard_normal((5, 3, 32, 32)).astype(np.float32)
    y = RNG.integers(0, 5, 5)
    fused = Model("reference", (3, 32, 32), 5, ops=g)
    plain = Model("reference", (3, 32, 32), 5, ops=g)
    pools = [layer for layer in fused.layers if isinstance(layer, MaxPool2d)]
    assert len(pools) == 3 and all(p.relu and p.bias is not None for p in pools)
    for layer in plain.layers:
        if isinstance(layer, Conv2d):
            layer.bias_in_pool = False
        elif isinstance(layer, MaxPool2d):
            layer.bias, layer.relu = None, False
        elif isinstance(layer, ReLU):
            layer.fused = False
    fused.params[...] = g.asarray(RNG.standard_normal(fused.size).astype(np.float32) * 0.1)
    plain.params[...] = fused.params                  # non-zero biases too
    lf = g.asnumpy(fused.forward(g.asarray(x), train=True)).copy()
    lp = g.asnumpy(plain.forward(g.asarray(x), train=True))
    assert lf.tobytes() == lp.tobytes()
    assert fused.loss_and_grad(x, y) == plain.loss_and_grad(x, y)
    assert g.asnumpy(fused.grads).tobytes() == g.asnumpy(plain.grads).tobytes()


def test_gap_and_add_relu_launchers(g):
    x = RNG.standard_normal((3, 4, 5, 6)).astype(np.float32)
    xc = g.asarray(np.ascontiguousarray(x.transpose(1, 0, 2, 3))).transpose(1, 0, 2, 3)
    for xd in (g.asarray(x), xc):
        _close(g.gap_forward(xd), ops.gap_forward(x), g, rtol=1e-5, atol=1e-6)
    dy = RNG.standard_normal((3, 4)).astype(np.float32)
    _close(g.gap_backward(g.asarray(dy), x.shape), ops.gap_backward(dy, x.shape), g,
           rtol=1e-6)
    b = RNG.standard_normal(x.shape).astype(np.float32)
    ref = ops.add_relu_forward(x, b, np.empty_like(x))
    a = g.asarray(np.ascontiguousarray(x.transpose(1, 0, 2, 3))).transpose(1, 0, 2, 3)
    out = g.add_relu_forward(a, g.asarray(b), out=a)          # b in the other layout
    assert out is a
    _close(a, ref, g, rtol=0, atol=0)


@pytest.mark.parametrize("k,s", [(2, 2), (3, 2), (2, 1), (3, 3)])
def test_avgpool_launchers(g, k, s):
    """Both layouts in, the gradient into a conv's (C, N, H, W) layout where
    it lies or into a plain array; the bits are the NumPy twin's."""
    x = RNG.standard_normal((3, 4, 9, 8)).astype(np.float32)
    ry = ops.avgpool_forward(x, k, s)
    xc = g.asarray(np.ascontiguousarray(x.transpose(1, 0, 2, 3))).transpose(1, 0, 2, 3)
    for xd in (g.asarray(x), xc):
        _close(g.avgpool_forward(xd, k, s), ry, g, rtol=0, atol=0)
    dy = RNG.standard_normal(ry.shape).astype(np.float32)
    rdx = ops.avgpool_backward(dy, x.shape, k, s)
    _close(g.avgpool_backward(g.asarray(dy), x.shape, k, s), rdx, g, rtol=0, atol=0)
    out = g.empty4(x.shape, np.float32, True)
    assert g.avgpool_backward(g.asarray(dy), x.shape, k, s, out=out) is out
    assert ops.is_cnhw(out)
    _close(out, rdx, g, rtol=0, atol=0)


def test_an_avgpool_model_step_on_the_device_matches_the_numpy_engine(g):
    from devcheck import AVGPOOL_SPEC, step_matches_numpy
    step_matches_numpy(g, AVGPOOL_SPEC, 12, 4, 2, 1e-5, 1e-6)


def test_an_imagenet_stem_step_on_the_device_matches_the_numpy_engine(g):
    """The resnet*_imagenet presets' stem through the kernels (conv 7x7
    stride 2, the padded pool fused with the ReLU, a strided block)."""
    from devcheck import IMAGENET_STEM_SPEC, step_matches_numpy
    step_matches_numpy(g, IMAGENET_STEM_SPEC, 21, 3, 4, 1e-5, 1e-6)


def test_a_resnet8_step_on_the_device_matches_the_numpy_engine(g):
    """A training step and an evaluation of resnet8 through the kernels:
    gradients, the moved running statistics and eval logits agree with
    the NumPy model's."""
    from devcheck import step_matches_numpy
    host, dev, x, y = step_matches_numpy(g, "resnet8", 16, 6, 2, 1e-5, 1e-6)
    lh = host.forward(x, train=False)
    ld = g.asnumpy(dev.forward(g.asarray(x), train=False))
    np.testing.assert_allclose(ld, lh, rtol=1e-4, atol=1e-4)
    # the kernels read a batchnorm's or a block's (C, N, H, W) output where it
    # lies (im2col, relu, batchnorm, gap): a step copies 7 activations, the
    # residual ReLU's forward outputs brought to its NCHW gradient's layout
    # (3) and the like; 23 before im2col and relu took that layout
    from ibtmpi.testing import fakecupy
    stats = dev.new_stats(6)
    dev.step_grad(g.asarray(x), y, stats)
    fakecupy.COPIES.clear()
    dev.step_grad(g.asarray(x), y, stats)
    assert len(fakecupy.COPIES) <= 7, fakecupy.COPIES


@pytest.mark.parametrize("decoupled,prox", [(0, 0), (1, 1), (0, 1)])
def test_adam_launcher(g, decoupled, prox):
    """GpuOps.adam_update (scalars formed on the host, every one of the
    kernel's width) against the NumPy twin, bitwise on the stand-in."""
    D = g.asarray
    P = 300
    w0, gr, m0, c, u = (RNG.standard_normal(P).astype(np.float32) for _ in range(5))
    v0 = RNG.random(P).astype(np.float32)
    w, m, v = D(w0), D(m0), D(v0)
    args = (2e-3, 0.9, 0.999, 1e-8, 0.01, 0.2, 1 - 0.9 ** 4, 1 - 0.999 ** 4, decoupled,
            prox)
    g.adam_update(w, D(gr), m, v, D(c) if prox else None, D(u) if prox else None, *args)
    rw, rm, rv = w0.copy(), m0.copy(), v0.copy()
    adam_update(rw, gr, rm, rv, c, u, *args)
    for dev, host in ((w, rw), (m, rm), (v, rv)):
        assert g.asnumpy(dev).tobytes() == host.tobytes()
    assert not np.array_equal(rw, w0)


@pytest.mark.parametrize("cls", [Adam, AdamW])
def test_device_adam_is_one_launch_a_step_equal_to_the_host_class(g, cls):
    """The Adam class with GpuOps on the stand-in: one adam_update launch per
    step with a Prox (no CuPy elementwise kernels), the same w, m, v as the
    NumPy class; the step count stays on the host. Another extra term takes
    the array path, still equal to the host class."""
    from ibtmpi.testing import fakecupy
    P = 500
    w0, c, u = (RNG.standard_normal(P).astype(np.float32) for _ in range(3))
    grads = [RNG.standard_normal(P).astype(np.float32) for _ in range(4)]
    D = g.asarray
    wh, wd_ = w0.copy(), D(w0)
    host = cls(wh, 1e-2, (0.9, 0.99), 1e-8, 0.02, extra_grad=Prox(c, u, np.float32(0.3)))
    dev = cls(wd_, 1e-2, (0.9, 0.99), 1e-8, 0.02,
              extra_grad=Prox(D(c), D(u), np.float32(0.3)), ops=g)
    fakecupy.LAUNCHES.clear()
    for gr in grads:
        host.step(gr.copy())
        dev.step(D(gr))
    assert dict(fakecupy.LAUNCHES) == {"adam_update": len(grads)}
    assert g.on_device(dev.m) and g.on_device(dev.v) and not g.on_device(dev.t)
    assert dev.t.tolist() == host.t.tolist() == [len(grads)]
    for k in ("m", "v"):
        np.testing.assert_allclose(g.asnumpy(dev.state()[k]), host.state()[k],
                                   rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(g.asnumpy(wd_), wh, rtol=1e-6, atol=1e-7)
    # a callable extra term: the array ops on the device arrays
    dev.extra_grad = host.extra_grad = lambda w_, g_: g_.__iadd__(w_.dtype.type(0.5))
    fakecupy.LAUNCHES.clear()
    host.step(grads[0].copy())
    dev.step(D(grads[0]))
    assert "adam_update" not in fakecupy.LAUNCHES
    np.testing.assert_allclose(g.asnumpy(wd_), wh, rtol=1e-6, atol=1e-7)
    # state through load(): device buffers from host arrays, t to the host
    saved = {k: g.asnumpy(v) if g.on_device(v) else v.copy()
             for k, v in dev.state().items()}
    fresh = cls(D(w0), 1e-2, ops=g)
    fresh.load(saved)
    assert g.on_device(fresh.m) and not g.on_device(fresh.t)
    assert fresh.t.tolist() == [len(grads) + 1]
    assert g.asnumpy(fresh.v).tobytes() == saved["v"].tobytes()


@pytest.mark.parametrize("dt", [np.uint8, np.uint16])
def test_normalize_u8_launcher_uploads_uint8_and_is_data_normalize(g, dt):
    """A uint8 (uint16: 16-bit bands) (N, H, W, C) host batch goes up as it
    is and comes out as data.normalize's float32 (N, C, H, W), bit for bit;
    a model with set_input_norm takes the stored batch as it takes the
    float one. Another integer type is refused."""
    from ibtmpi.data import normalize
    from ibtmpi.model import Model
    top = np.iinfo(dt).max / 255.0
    x = RNG.integers(0, np.iinfo(dt).max + 1, (4, 8, 8, 3)).astype(dt)
    mean, std = np.array([120.0, 110.0, 100.0]) * top, np.array([60.0, 55.0, 50.0]) * top
    scale = g.asarray((1.0 / std).astype(np.float32))
    shift = g.asarray((-mean / std).astype(np.float32))
    y = g.normalize_u8(x, scale, shift)
    assert g.asnumpy(y).tobytes() == normalize(x, mean, std).tobytes()
    m = Model("tiny", (3, 8, 8), 5, ops=g)
    m.set_input_norm(mean, std)
    a = g.asnumpy(m.forward(x, train=False)).copy()
    b = g.asnumpy(m.forward(normalize(x, mean, std), train=False))
    assert a.tobytes() == b.tobytes()
    with pytest.raises(TypeError, match="uint8 or uint16"):
        g.normalize_u8(x.astype(np.int32), scale, shift)


def test_normalize_u8_aug_launcher_is_host_augmentation_then_normalize(g):
    """With ids, the launcher applies loader.dihedral on the device: a
    model fed the raw uint8 batch and its ids gives the logits of the
    batch augmented and normalised on the host, bit for bit."""
    from ibtmpi.data import normalize
    from ibtmpi.loader import dihedral
    from ibtmpi.model import Model
    x = RNG.integers(0, 256, (8, 8, 8, 3)).astype(np.uint8)
    ids = np.arange(8, dtype=np.int64)[::-1].copy()
    mean, std = np.array([120.0, 110.0, 100.0]), np.array([60.0, 55.0, 50.0])
    x16 = (x.astype(np.uint16) * 257) ^ RNG.integers(0, 256, x.shape).astype(np.uint16)
    for xx, k in ((x16, 257.0), (x, 1.0)):          # uint16 through normalize_u16_aug
        host = normalize(dihedral(xx.copy(), ids), mean * k, std * k)
        y = g.normalize_u8(xx, g.asarray((1.0 / (std * k)).astype(np.float32)),
                           g.asarray((-mean / std).astype(np.float32)), ids=g.asarray(ids))
        assert g.asnumpy(y).tobytes() == host.tobytes()
    y = g.normalize_u8(x, g.asarray((1.0 / std).astype(np.float32)),
                       g.asarray((-mean / std).astype(np.float32)), ids=g.asarray(ids))
    assert g.asnumpy(y).tobytes() == host.tobytes()
    m = Model("tiny", (3, 8, 8), 5, ops=g)
    m.set_input_norm(mean, std)
    a = g.asnumpy(m.forward(x, train=False, ids=ids)).copy()
    assert a.tobytes() == g.asnumpy(m.forward(host, train=False)).tobytes()
