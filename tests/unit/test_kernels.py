"""CUDA sources checked without a GPU: every kernels/*.cu compiles to PTX
(NVRTC for compute_70/80/90, nvcc where present), and every kernel's logic
runs on the host through the emulator (host_emu.h) and matches the NumPy
reference. Odd grid/block sizes exercise the grid-stride loops.
Files: conv.cu, pool.cu, activation.cu, softmax_xent.cu, optim.cu."""
import os
import shutil

import numpy as np
import pytest

from ibtmpi import kernelcheck as kc
from ibtmpi import ops
from ibtmpi.kernels import sources
from ibtmpi.optim import SGD, Adam, AdamW, Prox, adam_update, sgd_update
from ibtmpi.optim.adam import adam_scalars

RNG = np.random.default_rng(99)
CU = {os.path.basename(p): p for p in sources()}
GRIDS = [(1, 1), (3, 7), (64, 128)]


def test_all_sources_present():
    assert sorted(CU) == ["activation.cu", "conv.cu", "input.cu", "norm.cu", "optim.cu",
                          "pool.cu", "softmax_xent.cu"]


@pytest.mark.parametrize("arch", kc.ARCHS)
@pytest.mark.parametrize("name", sorted(CU))
def test_compiles_with_nvrtc(name, arch):
    ptx = kc.compile_ptx(CU[name], arch)
    n = len(kc.signatures(CU[name]))
    assert ptx.count(".entry") == n and n > 0
    assert f".target sm_{arch.split('_')[1]}" in ptx


NVRTC13 = {m: p for m, p in kc.nvrtc_libs().items() if m >= 13}


@pytest.mark.skipif(not NVRTC13, reason="no NVRTC of CUDA 13 (pip install nvidia-cuda-nvrtc)")
@pytest.mark.parametrize("arch", kc.archs(13))
@pytest.mark.parametrize("name", sorted(CU))
def test_compiles_with_the_nvrtc_of_cuda_13(name, arch):
    """The toolkit generation a current CuPy (cupy-cuda13x) compiles the
    kernels with at run time: the same sources and options must pass it."""
    major = max(NVRTC13)
    ptx = kc.compile_ptx(CU[name], arch, NVRTC13[major])
    assert ptx.count(".entry") == len(kc.signatures(CU[name]))
    assert f".target sm_{arch.split('_')[1]}" in ptx
    assert kc.nvrtc_version(NVRTC13[major]).startswith(f"{major}.")


def test_nvrtc_13_knows_no_compute_70():
    assert kc.archs(12) == kc.ARCHS and "compute_70" not in kc.archs(13)


def test_a_broken_kernel_fails_to_compile(tmp_path):
    bad = tmp_path / "bad.cu"
    bad.write_text('extern "C" __global__ void k(float* x) { x[0] = undefined_thing; }\n')
    with pytest.raises(kc.KernelError, match="does not compile"):
        kc.compile_ptx(str(bad), "compute_80")


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.parametrize("name", sorted(CU))
def test_compiles_with_nvcc(name):
    for arch in ("sm_80", "sm_90"):
        assert ".entry" in kc.compile_nvcc(CU[name], arch)


@pytest.fixture(scope="module")
def mods():
    return {name[:-3]: kc.host_module(path) for name, path in CU.items()}


GEOMS = [(2, 3, 7, 7, 3, 1, 1), (2, 2, 8, 6, 3, 2, 1), (1, 3, 9, 9, 5, 2, 2),
         (2, 1, 5, 5, 1, 1, 0), (1, 2, 6, 7, 2, 2, 0)]


@pytest.mark.parametrize("grid", GRIDS)
@pytest.mark.parametrize("g", GEOMS)
def test_im2col_col2im(mods, g, grid):
    n, c, h, w, k, s, p = g
    ho, wo = ops.conv_out_size(h, k, s, p), ops.conv_out_size(w, k, s, p)
    x = RNG.standard_normal((n, c, h, w)).astype(np.float32)
    col = np.full((c * k * k, n * ho * wo), np.nan, np.float32)
    mods["conv"].im2col(*grid, x, col, n, c, h, w, k, k, s, p, ho, wo, 0)
    np.testing.assert_array_equal(col, ops.im2col(x, k, k, s, p))
    # the same input as a (C, N, H, W) buffer, read where it lies
    col2 = np.full_like(col, np.nan)
    mods["conv"].im2col(*grid, np.ascontiguousarray(x.transpose(1, 0, 2, 3)), col2, n, c,
                        h, w, k, k, s, p, ho, wo, 1)
    np.testing.assert_array_equal(col2, col)
    dcol = RNG.standard_normal(col.shape).astype(np.float32)
    dx = np.full(x.shape, np.nan, np.float32)
    mods["conv"].col2im(*grid, dcol, dx, n, c, h, w, k, k, s, p, ho, wo)
    np.testing.assert_allclose(dx, ops.col2im(dcol, x.shape, k, k, s, p),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("grid", GRIDS)
def test_bias_kernels(mods, grid):
    F, M = 5, 37
    y = RNG.standard_normal((F, M)).astype(np.float32)
    b = RNG.standard_normal(F).astype(np.float32)
    ref = y + b[:, None]
    mods["conv"].bias_add_rows(*grid, y, b, F, M)
    np.testing.assert_array_equal(y, ref)
    for p in (1, 2, 5, M, M + 3):          # one pass of the deterministic row sum
        part = np.full((F, p), np.nan, np.float32)
        mods["conv"].row_partial_sums(*grid, y, part, F, M, p)
        assert part.tobytes() == ops.row_partial_sums(y, p).tobytes(), p
        np.testing.assert_allclose(part.sum(1), y.sum(1), rtol=1e-5, atol=1e-5)
    N, O = 6, 4
    z = RNG.standard_normal((N, O)).astype(np.float32)
    bo = RNG.standard_normal(O).astype(np.float32)
    ref = z + bo
    mods["conv"].bias_add_cols(*grid, z, bo, N, O)
    np.testing.assert_array_equal(z, ref)
    dbo = np.full(O, np.nan, np.float32)
    mods["conv"].bias_grad_cols(*grid, z, dbo, N, O)
    np.testing.assert_allclose(dbo, z.sum(0), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("grid", GRIDS)
@pytest.mark.parametrize("cnhw", [0, 1])
@pytest.mark.parametrize("pad", [0, 1])
@pytest.mark.parametrize("k,s,h,w", [(2, 2, 8, 8), (2, 2, 7, 9), (3, 2, 9, 9),
                                     (3, 3, 9, 7), (2, 1, 5, 6)])
def test_maxpool(mods, k, s, h, w, cnhw, grid, pad):
    """cnhw = 1: x (forward) and dx (backward) lie as (C, N, H, W), the
    layout of a conv's output and of its backward's input; pad: cells of
    padding that never win (torchvision's stem pool)."""
    n, c = 2, 3
    x = RNG.standard_normal((n, c, h, w)).astype(np.float32)
    x[0, 0] = 1.0                                  # a plane of ties
    lay = (lambda a: np.ascontiguousarray(a.transpose(1, 0, 2, 3))) if cnhw else (lambda a: a)
    ho, wo = ops.conv_out_size(h, k, s, pad), ops.conv_out_size(w, k, s, pad)
    y = np.empty((n, c, ho, wo), np.float32)
    am = np.empty((n, c, ho, wo), np.uint8)
    nob = np.zeros(1, np.float32)                  # bias argument when has_bias = 0
    mods["pool"].maxpool_fwd(*grid, lay(x), y, am, nob, n, c, h, w, k, s, ho, wo, cnhw, 0, 0,
                             pad)
    ry, ram = ops.maxpool_forward(x, k, s, pad=pad)
    np.testing.assert_array_equal(y, ry)
    np.testing.assert_array_equal(am, ram)
    dy = RNG.standard_normal(y.shape).astype(np.float32)
    dx = np.full(lay(x).shape, np.nan, np.float32)
    mods["pool"].maxpool_bwd(*grid, dy, am, dx, y, n, c, h, w, k, s, ho, wo, cnhw, 0, pad)
    np.testing.assert_allclose(dx, lay(ops.maxpool_backward(dy, ram, x.shape, k, s,
                                                            pad=pad)),
                               rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("grid", GRIDS)
@pytest.mark.parametrize("cnhw", [0, 1])
@pytest.mark.parametrize("has_bias,relu", [(1, 1), (1, 0), (0, 1)])
@pytest.mark.parametrize("k,s,h,w", [(2, 2, 8, 8), (3, 2, 9, 9), (2, 1, 5, 6)])
def test_maxpool_fused_with_bias_and_relu(mods, k, s, h, w, cnhw, has_bias, relu, grid):
    """conv output without its bias -> [bias] pool [relu] in one launch each
    way: bit for bit the unfused kernels (bias add, maxpool_fwd, relu_fwd;
    relu_bwd, maxpool_bwd), and the NumPy engine's values and argmax."""
    n, c = 3, 4
    x = RNG.standard_normal((n, c, h, w)).astype(np.float32)
    x[0, 0] = 0.25                                 # a plane of ties
    x[1, 1, :2, :2] = [[1e-9, 0.0], [-1e-9, 0.0]]  # distinct, equal once biased
    b = (RNG.standard_normal(c) * (1.0 if has_bias else 0.0)).astype(np.float32)
    b[1] = 1.0 if has_bias else 0.0
    lay = (lambda a: np.ascontiguousarray(a.transpose(1, 0, 2, 3))) if cnhw else (lambda a: a)
    xb = x + b[None, :, None, None] if has_bias else x     # = bias_add_rows, bitwise
    ry, ram = ops.maxpool_forward(xb, k, s)
    ho, wo = ry.shape[2:]
    size = n * c * ho * wo
    nob = np.zeros(1, np.float32)
    pool, act = mods["pool"], mods["activation"]
    # unfused kernels: the reference bits
    y0, am0 = np.empty(ry.shape, np.float32), np.empty(ry.shape, np.uint8)
    pool.maxpool_fwd(*grid, lay(xb), y0, am0, nob, n, c, h, w, k, s, ho, wo, cnhw, 0, 0, 0)
    y1 = np.empty_like(y0)
    act.relu_fwd(*grid, y0, y1, size) if relu else np.copyto(y1, y0)
    dy = RNG.standard_normal(ry.shape).astype(np.float32)
    dpool = np.empty_like(dy)
    act.relu_bwd(*grid, dy, y1, dpool, size) if relu else np.copyto(dpool, dy)
    dx0 = np.full(lay(x).shape, np.nan, np.float32)
    pool.maxpool_bwd(*grid, dpool, am0, dx0, y1, n, c, h, w, k, s, ho, wo, cnhw, 0, 0)
    # fused
    y, am = np.empty(ry.shape, np.float32), np.empty(ry.shape, np.uint8)
    pool.maxpool_fwd(*grid, lay(x), y, am, b, n, c, h, w, k, s, ho, wo, cnhw, has_bias, relu,
                     0)
    assert y.tobytes() == y1.tobytes()
    np.testing.assert_array_equal(am, ram)
    np.testing.assert_array_equal(y, ops.relu_forward(ry) if relu else ry)
    dx = np.full(lay(x).shape, np.nan, np.float32)
    pool.maxpool_bwd(*grid, dy, am, dx, y, n, c, h, w, k, s, ho, wo, cnhw, relu, 0)
    assert dx.tobytes() == dx0.tobytes()
    ref = ops.maxpool_backward(ops.relu_backward(dy, ry) if relu else dy, ram, x.shape, k, s)
    np.testing.assert_allclose(dx, lay(ref), rtol=1e-6, atol=1e-6)   # overlaps: other order


@pytest.mark.parametrize("grid", GRIDS)
def test_relu(mods, grid):
    x = RNG.standard_normal(101).astype(np.float32)
    y = np.empty_like(x)
    mods["activation"].relu_fwd(*grid, x, y, x.size)
    np.testing.assert_array_equal(y, ops.relu_forward(x))
    dy = RNG.standard_normal(101).astype(np.float32)
    dx = np.empty_like(x)
    mods["activation"].relu_bwd(*grid, dy, y, dx, x.size)
    np.testing.assert_array_equal(dx, ops.relu_backward(dy, y))


@pytest.mark.parametrize("grid", GRIDS)
def test_softmax_xent(mods, grid):
    N, K = 9, 5
    z = (RNG.standard_normal((N, K)) * 30).astype(np.float32)
    z[0] = [1e4, 0, -1e4, 5, 5]                    # stability
    y = RNG.integers(0, K, N).astype(np.int64)
    probs = np.empty_like(z)
    nll = np.empty(N, np.float32)
    mods["softmax_xent"].softmax_xent_fwd(*grid, z, y, probs, nll, N, K)
    loss, rp = ops.softmax_xent_forward(z, y)
    np.testing.assert_allclose(probs, rp, rtol=1e-5, atol=1e-7)
    assert abs(nll.mean() - loss) <= 1e-4 * max(1, abs(loss))
    d = np.empty_like(z)
    mods["softmax_xent"].softmax_xent_bwd(*grid, probs, y, d, N, K)
    np.testing.assert_allclose(d, ops.softmax_xent_backward(rp, y), rtol=1e-5, atol=1e-7)
    # the fused training launch: the same gradient bit for bit, and each
    # row's loss and hit added into its slot of acc (2, cap), twice
    cap = N + 3
    acc = np.zeros((2, cap))
    acc[:, N:] = 7.0                                # slots past N untouched
    z[1, :] = 2.0                                   # a tie: the first maximum wins
    y[1] = 1
    z[2, [1, 3]] = z[2].max() + 1                   # a tie of two maxima
    y[2] = 3
    z[3, y[3]] = 100.0                              # a sure hit
    mods["softmax_xent"].softmax_xent_fwd(*grid, z, y, probs, nll, N, K)
    mods["softmax_xent"].softmax_xent_bwd(*grid, probs, y, d, N, K)
    dt = np.full_like(z, np.nan)
    for _ in range(2):
        mods["softmax_xent"].softmax_xent_train(*grid, z, y, dt, acc, N, K, cap)
    assert dt.tobytes() == d.tobytes()
    np.testing.assert_allclose(acc[0, :N], 2 * nll.astype(np.float64), rtol=1e-12)
    hits = (ops.softmax_xent_forward(z, y)[1].argmax(1) == y).astype(np.float64)
    assert hits[1] == 0 and hits[2] == 0 and hits[3] == 1
    np.testing.assert_array_equal(acc[1, :N], 2 * hits)
    assert (acc[:, N:] == 7.0).all()


@pytest.mark.parametrize("grid", GRIDS)
@pytest.mark.parametrize("nesterov,prox", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_sgd_update_kernel_matches_reference_and_sgd_class(mods, grid, nesterov, prox):
    P = 77
    w0, g, v0, c, u = (RNG.standard_normal(P).astype(np.float32) for _ in range(5))
    lr, mu, wd, rho = 0.05, 0.9, 1e-3, 0.3
    w, v = w0.copy(), v0.copy()
    mods["optim"].sgd_update(*grid, w, g, v, c, u, P, lr, mu, wd, rho, nesterov, prox)
    rw, rv = w0.copy(), v0.copy()
    sgd_update(rw, g, rv, c, u, lr, mu, wd, rho, nesterov, prox)
    np.testing.assert_allclose(w, rw, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(v, rv, rtol=1e-6, atol=1e-7)
    # the reference is the arithmetic the CPU trainer's SGD + prox hook does
    cw = w0.copy()
    opt = SGD(cw, lr, mu, wd, bool(nesterov),
              extra_grad=(lambda w_, g_: g_.__iadd__(np.float32(rho) * ((w_ - c) + u)))
              if prox else None)
    opt.v[:] = v0
    opt.step(g.copy())
    np.testing.assert_allclose(cw, rw, rtol=1e-6, atol=1e-7)


# -- batch norm, GAP, residual sum (kernels/norm.cu, pool.cu, activation.cu) --

def _bn_input(n, c, h, w, cnhw):
    x = (RNG.standard_normal((n, c, h, w)) * 2 + 0.5).astype(np.float32)
    base = np.ascontiguousarray(x.transpose(1, 0, 2, 3)) if cnhw else x.copy()
    return x, base


@pytest.mark.parametrize("grid", GRIDS)
@pytest.mark.parametrize("cnhw", [0, 1])
@pytest.mark.parametrize("mode", [0, 1, 2])
@pytest.mark.parametrize("shape,p", [((2, 3, 4, 5), 1), ((3, 2, 5, 7), 2), ((4, 3, 9, 9), 6)])
def test_bn_partial_is_its_twin_bitwise(mods, grid, cnhw, mode, shape, p):
    n, c, h, w = shape
    x, base = _bn_input(n, c, h, w, cnhw)
    M = n * h * w
    xcm = np.ascontiguousarray(x.transpose(1, 0, 2, 3)).reshape(c, M)
    a = RNG.standard_normal((c, M)).astype(np.float32)
    mean = RNG.standard_normal(c).astype(np.float32)
    out = np.empty((c, p), np.float32)
    mods["norm"].bn_partial(*grid, base, a, mean, out, c, M, h * w, p, cnhw, mode)
    ref = ops.bn_partial(xcm, a, mean, p, mode)
    assert out.tobytes() == ref.tobytes()


@pytest.mark.parametrize("grid", GRIDS)
@pytest.mark.parametrize("cnhw", [0, 1])
def test_bn_forward_and_backward_kernels_match_the_numpy_op(mods, grid, cnhw):
    n, c, h, w = 3, 4, 5, 3
    M, HW = n * h * w, h * w
    x, base = _bn_input(n, c, h, w, cnhw)
    gamma = RNG.standard_normal(c).astype(np.float32)
    beta = RNG.standard_normal(c).astype(np.float32)
    rm0 = RNG.standard_normal(c).astype(np.float32)
    rv0 = (RNG.random(c) + 0.5).astype(np.float32)
    k = mods["norm"]
    for train in (1, 0):
        rm, rv = rm0.copy(), rv0.copy()
        mean, invstd = np.empty(c, np.float32), np.empty(c, np.float32)
        s2 = mean
        if train:
            s1, s2 = np.empty(c, np.float32), np.empty(c, np.float32)
            k.bn_partial(*grid, base, base, base, s1, c, M, HW, 1, cnhw, 0)
            k.bn_mean(*grid, s1, mean, c, M)
            k.bn_partial(*grid, base, base, mean, s2, c, M, HW, 1, cnhw, 1)
        k.bn_stats(*grid, s2, mean, invstd, rm, rv, c, M, 0.1, 1e-5, train)
        xhat, y = np.empty((c, M), np.float32), np.empty((c, M), np.float32)
        k.bn_apply(*grid, base, mean, invstd, gamma, beta, xhat, y, c, M, HW, cnhw)
        rrm, rrv = rm0.copy(), rv0.copy()
        ry, rxhat, rinv = ops.batchnorm_forward(x, gamma, beta, rrm, rrv, bool(train))
        np.testing.assert_allclose(y.reshape(c, n, h, w).transpose(1, 0, 2, 3), ry,
                                   rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(invstd, rinv, rtol=1e-5)
        np.testing.assert_allclose(rm, rrm, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(rv, rrv, rtol=1e-5, atol=1e-6)
    # backward, dy in the chosen layout
    dy, dybase = _bn_input(n, c, h, w, cnhw)
    dg, db = np.empty(c, np.float32), np.empty(c, np.float32)
    k.bn_partial(*grid, dybase, dybase, dybase, db, c, M, HW, 1, cnhw, 0)
    k.bn_partial(*grid, dybase, xhat, dybase, dg, c, M, HW, 1, cnhw, 2)
    dx = np.empty((c, M), np.float32)
    k.bn_bwd_dx(*grid, dybase, xhat, dg, db, gamma, invstd, dx, c, M, HW, cnhw)
    rdg, rdb = np.empty(c, np.float32), np.empty(c, np.float32)
    rdx = ops.batchnorm_backward(dy, rxhat, rinv, gamma, rdg, rdb)
    np.testing.assert_allclose(dg, rdg, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(db, rdb, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dx.reshape(c, n, h, w).transpose(1, 0, 2, 3), rdx,
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("grid", GRIDS)
@pytest.mark.parametrize("cnhw", [0, 1])
def test_gap_kernels(mods, grid, cnhw):
    n, c, h, w = 3, 5, 4, 3
    x, base = _bn_input(n, c, h, w, cnhw)
    y = np.empty((n, c), np.float32)
    mods["pool"].gap_fwd(*grid, base, y, n, c, h * w, cnhw)
    naive = np.array([[sum(float(v) for v in x[a, ch].ravel()) / (h * w) for ch in range(c)]
                      for a in range(n)])
    np.testing.assert_allclose(y, naive, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(y, ops.gap_forward(x), rtol=1e-5, atol=1e-6)
    dy = RNG.standard_normal((n, c)).astype(np.float32)
    dx = np.empty((n, c, h, w), np.float32)
    mods["pool"].gap_bwd(*grid, dy, dx, n * c, h * w)
    np.testing.assert_allclose(dx, ops.gap_backward(dy, x.shape), rtol=1e-6)


@pytest.mark.parametrize("grid", GRIDS)
@pytest.mark.parametrize("cnhw", [0, 1])
@pytest.mark.parametrize("k,s,h,w", [(2, 2, 8, 6), (2, 2, 7, 9), (3, 2, 9, 8),
                                     (3, 3, 10, 7), (2, 1, 5, 7), (2, 3, 8, 9)])
def test_avgpool_kernels(mods, k, s, h, w, cnhw, grid):
    """Bit for bit the NumPy twin (the same summation order, then one
    multiply by 1/(k*k)), with overlapping (stride < k), tiling, ragged and
    gapped windows; cnhw = 1: x and dx lie as (C, N, H, W)."""
    n, c = 2, 3
    x, base = _bn_input(n, c, h, w, cnhw)
    lay = (lambda a: np.ascontiguousarray(a.transpose(1, 0, 2, 3))) if cnhw else (lambda a: a)
    ho, wo = ops.conv_out_size(h, k, s, 0), ops.conv_out_size(w, k, s, 0)
    y = np.full((n, c, ho, wo), np.nan, np.float32)
    mods["pool"].avgpool_fwd(*grid, base, y, n, c, h, w, k, s, ho, wo, cnhw)
    assert y.tobytes() == ops.avgpool_forward(x, k, s).tobytes()
    dy = RNG.standard_normal(y.shape).astype(np.float32)
    dx = np.full(base.shape, np.nan, np.float32)
    mods["pool"].avgpool_bwd(*grid, dy, dx, n, c, h, w, k, s, ho, wo, cnhw)
    assert dx.tobytes() == lay(ops.avgpool_backward(dy, x.shape, k, s)).tobytes()


@pytest.mark.parametrize("grid", GRIDS)
def test_add_relu_kernel(mods, grid):
    a, b = (RNG.standard_normal(101).astype(np.float32) for _ in range(2))
    y = np.empty(101, np.float32)
    mods["activation"].add_relu_fwd(*grid, a, b, y, 101)
    assert y.tobytes() == ops.add_relu_forward(a, b, np.empty(101, np.float32)).tobytes()
    mods["activation"].add_relu_fwd(*grid, a, b, a, 101)       # in place
    assert a.tobytes() == y.tobytes()


@pytest.mark.parametrize("grid", GRIDS)
@pytest.mark.parametrize("decoupled,prox", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_adam_update_kernel_matches_reference_and_adam_class(mods, grid, decoupled, prox):
    """Three steps of the kernel against the NumPy twin (bitwise: the host
    build does not contract into FMA) and the twin's first step against the
    Adam/AdamW class with the prox hook."""
    P = 77
    w0, c, u = (RNG.standard_normal(P).astype(np.float32) for _ in range(3))
    grads = [RNG.standard_normal(P).astype(np.float32) for _ in range(3)]
    lr, b1, b2, eps, wd, rho = 1e-2, 0.9, 0.999, 1e-8, 0.05, 0.3
    w, m, v = w0.copy(), np.zeros(P, np.float32), np.zeros(P, np.float32)
    rw, rm, rv = w.copy(), m.copy(), v.copy()
    for t, g in enumerate(grads, start=1):
        bc1, bc2 = 1 - b1 ** t, 1 - b2 ** t
        omb1, omb2, step, bc2s, decay = adam_scalars(lr, b1, b2, wd, bc1, bc2)
        mods["optim"].adam_update(*grid, w, g, m, v, c, u, P, b1, omb1, b2, omb2, step,
                                  bc2s, eps, wd, decay, rho, decoupled, prox)
        adam_update(rw, g, rm, rv, c, u, lr, b1, b2, eps, wd, rho, bc1, bc2,
                    decoupled, prox)
        assert w.tobytes() == rw.tobytes()
        assert m.tobytes() == rm.tobytes() and v.tobytes() == rv.tobytes()
    assert not np.array_equal(w, w0) and m.any() and v.all()
    cw = w0.copy()
    opt = (AdamW if decoupled else Adam)(cw, lr, (b1, b2), eps, wd, extra_grad=(
        Prox(c, u, np.float32(rho)) if prox else None))
    opt.step(grads[0].copy())
    one = w0.copy()
    adam_update(one, grads[0], np.zeros(P, np.float32), np.zeros(P, np.float32), c, u,
                lr, b1, b2, eps, wd, rho, 1 - b1, 1 - b2, decoupled, prox)
    assert cw.tobytes() == one.tobytes()


KIND = {np.uint8: "u8", np.uint16: "u16"}


def _pixels(shape, dt):
    """Random stored pixels over dt's whole range, and a mean/std on its scale."""
    top = np.iinfo(dt).max
    x = RNG.integers(0, top + 1, shape).astype(dt)
    c = shape[-1]
    return x, RNG.random(c) * 0.8 * top + 0.04 * top, RNG.random(c) * 0.25 * top + 0.02 * top


@pytest.mark.parametrize("dt", [np.uint8, np.uint16])
@pytest.mark.parametrize("grid", GRIDS)
@pytest.mark.parametrize("shape", [(3, 5, 4, 3), (2, 6, 7, 4), (1, 3, 3, 13)])
def test_normalize_u8_is_data_normalize_bitwise(mods, grid, shape, dt):
    """normalize_u8 and normalize_u16 (16-bit bands): data.normalize's bits."""
    from ibtmpi.data import normalize
    n, h, w, c = shape
    x, mean, std = _pixels(shape, dt)
    scale = (1.0 / std).astype(np.float32)
    shift = (-mean / std).astype(np.float32)
    y = np.empty((n, c, h, w), np.float32)
    getattr(mods["input"], f"normalize_{KIND[dt]}")(*grid, x, y, scale, shift, n, h, w, c)
    assert y.tobytes() == normalize(x, mean, std).tobytes()


@pytest.mark.parametrize("dt", [np.uint8, np.uint16])
@pytest.mark.parametrize("grid", GRIDS)
@pytest.mark.parametrize("shape", [(8, 5, 5, 3), (8, 6, 4, 2), (9, 1, 1, 3), (8, 7, 7, 1)])
def test_normalize_u8_aug_is_dihedral_then_normalize_bitwise(mods, grid, shape, dt):
    """Every transform id on square and non-square images: the kernel's
    output is loader.dihedral on the host followed by data.normalize."""
    from ibtmpi.data import normalize
    from ibtmpi.loader import dihedral
    n, h, w, c = shape
    x, mean, std = _pixels(shape, dt)
    ids = (np.arange(n) % 8).astype(np.int32)
    RNG.shuffle(ids)
    scale = (1.0 / std).astype(np.float32)
    shift = (-mean / std).astype(np.float32)
    y = np.empty((n, c, h, w), np.float32)
    getattr(mods["input"], f"normalize_{KIND[dt]}_aug")(*grid, x, y, scale, shift, ids,
                                                       n, h, w, c)
    want = normalize(dihedral(x.copy(), ids), mean, std)
    assert y.tobytes() == want.tobytes()
    if h > 1 and w > 1:                     # not the identity: the ids matter
        assert y.tobytes() != normalize(x, mean, std).tobytes()
