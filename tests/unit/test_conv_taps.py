"""The host's taps convolution (ibtmpi/ops/conv_taps.py): forward output,
input gradient and weight gradient against conv.py's plain ops (equal to
float32 rounding), float64 naive loops and float64 central differences,
for "same" stride-1 convs (3x3 and 5x5) and stride-2 3x3 convs, with the
chunks forced down to one image and to uneven chunks, so every chunk
boundary and both gather paths (one strided copy, per tap) are crossed;
and the grid input gradient (ibtmpi/ops/conv_grid.py) that conv.py's
stride-1 convs keep, against col2im."""
import numpy as np
import pytest

from ibtmpi import ops
from ibtmpi.ops import conv_grid, conv_taps
from test_ops import conv_naive, numgrad

RNG = np.random.default_rng(41)

# (n, c, h, w, f, k, pad, stride): "same" 3x3 pad 1 and 5x5 pad 2, images
# smaller than the kernel, and the stride-2 3x3 pad 1 conv over four
# polyphase planes; non-square images
GEOMS = [(5, 3, 7, 6, 4, 3, 1, 1), (4, 2, 6, 5, 3, 5, 2, 1), (3, 2, 2, 1, 3, 5, 2, 1),
         (5, 3, 8, 6, 4, 3, 1, 2), (3, 2, 2, 4, 3, 3, 1, 2)]


def _chunks(monkeypatch, images, rows, per_image):
    """Force chunks of `images` images of `rows` x `per_image` patch cells
    (0: the default size)."""
    if images:
        monkeypatch.setattr(conv_taps, "CHUNK_BYTES", images * rows * per_image * 4)


def _case(geom):
    n, c, h, w, f, k, pad, _ = geom
    x = RNG.standard_normal((n, c, h, w)).astype(np.float32)
    wt = RNG.standard_normal((f, c, k, k)).astype(np.float32)
    b = RNG.standard_normal(f).astype(np.float32)
    return x, wt, b


@pytest.mark.parametrize("images", [1, 2, 0])
@pytest.mark.parametrize("geom", GEOMS)
def test_taps_conv_matches_the_plain_conv_and_naive_loops(geom, images, monkeypatch):
    n, c, h, w, f, k, pad, s = geom
    x, wt, b = _case(geom)
    _chunks(monkeypatch, images, max(c, f) * k * k, (h // s) * (w // s))
    ws = ops.Workspace()
    kw = {"ws": ws, "stride": s}
    y, xf = ops.conv2d_taps_forward(x, wt, b, pad, **kw)
    y0, col = ops.conv2d_forward(x, wt, b, s, pad)
    assert y.shape == y0.shape and np.allclose(y, y0, rtol=1e-6, atol=1e-6)
    assert np.allclose(y, conv_naive(x.astype(np.float64), wt.astype(np.float64), b, s, pad),
                       atol=1e-4)
    dy = RNG.standard_normal(y.shape).astype(np.float32)
    dy[0, 0] = 0                     # exact zeros, as a max-pool's backward hands over
    dw, db = np.empty_like(wt), np.empty_like(b)
    dx = ops.conv2d_taps_backward(dy, xf, x.shape, wt, pad, dw, db, **kw)
    dw0, db0 = np.empty_like(wt), np.empty_like(b)
    dx0 = ops.conv2d_backward(dy, col, x.shape, wt, s, pad, dw0, db0)
    assert np.allclose(dx, dx0, rtol=1e-5, atol=1e-5) and db.tobytes() == db0.tobytes()
    # dW^T = sum over every output of patch x dy, in float64
    ref = np.zeros(wt.shape)
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    for i in range(k):
        for j in range(k):
            patch = xp[:, :, i:i + s * y.shape[2]:s, j:j + s * y.shape[3]:s]
            ref[:, :, i, j] = np.einsum("nfhw,nchw->fc", dy.astype(np.float64), patch)
    assert np.allclose(dw, ref, rtol=1e-5, atol=1e-5)
    assert np.allclose(dw, dw0, rtol=1e-5, atol=1e-5)
    # the same buffers again, after a step of another batch size
    ops.conv2d_taps_forward(x[:2], wt, b, pad, **kw)
    y2, xf = ops.conv2d_taps_forward(x, wt, b, pad, **kw)
    assert y2.tobytes() == y.tobytes()
    assert ops.conv2d_taps_backward(dy, xf, x.shape, wt, pad, dw, None, need_dx=False,
                                    **kw) is None
    assert np.allclose(dw, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("geom", [GEOMS[0], GEOMS[1], GEOMS[3]])
def test_taps_conv_gradients_match_central_differences(geom, monkeypatch):
    n, c, h, w, f, k, pad, s = geom
    x, wt, b = (a.astype(np.float64) for a in _case(geom))
    _chunks(monkeypatch, 2, max(c, f) * k * k, (h // s) * (w // s))
    y, _ = ops.conv2d_taps_forward(x, wt, b, pad, stride=s)
    proj = RNG.standard_normal(y.shape)

    def loss(xx, ww, bb):
        return float(np.sum(ops.conv2d_taps_forward(xx, ww, bb, pad, stride=s)[0] * proj))
    y, xf = ops.conv2d_taps_forward(x, wt, b, pad, stride=s)
    dw, db = np.empty_like(wt), np.empty_like(b)
    dx = ops.conv2d_taps_backward(proj, xf, x.shape, wt, pad, dw, db, stride=s)
    def f():
        return loss(x, wt, b)
    assert np.allclose(dx, numgrad(f, x), atol=1e-6)
    assert np.allclose(dw, numgrad(f, wt), atol=1e-6)
    assert np.allclose(db, numgrad(f, b), atol=1e-6)


def _grid_chunks(monkeypatch, images, c, k, x_shape, pad):
    block = conv_grid.Grid(x_shape, k, pad).block
    monkeypatch.setattr(conv_grid, "GRID_CHUNK_BYTES", images * c * k * k * block * 4)


@pytest.mark.parametrize("images", [1, 2])
@pytest.mark.parametrize("geom", [(5, 3, 7, 6, 4, 3, 1), (3, 2, 6, 7, 3, 3, 0),
                                  (3, 2, 5, 4, 2, 3, 2), (4, 3, 5, 6, 2, 2, 1),
                                  (4, 2, 6, 5, 3, 5, 2)])
def test_grid_input_gradient_is_col2ims_for_any_chunk(geom, images, monkeypatch):
    """conv.py's stride-1 input gradient on the packed and per-image-padded
    grids: col2im's values with one image, two images and all images per
    chunk."""
    n, c, h, w, f, k, pad = geom
    x = RNG.standard_normal((n, c, h, w)).astype(np.float32)
    wt = RNG.standard_normal((f, c, k, k)).astype(np.float32)
    y, col = ops.conv2d_forward(x, wt, None, 1, pad)
    dy = RNG.standard_normal(y.shape).astype(np.float32)
    dy2 = np.ascontiguousarray(dy.transpose(1, 0, 2, 3)).reshape(f, -1)
    ref = ops.col2im(wt.reshape(f, -1).T @ dy2, x.shape, k, k, 1, pad)
    whole = ops.input_grad_on_grid(dy, wt, x.shape, pad).copy()
    _grid_chunks(monkeypatch, images, c, k, x.shape, pad)
    chunked = ops.input_grad_on_grid(dy, wt, x.shape, pad)
    assert np.allclose(whole, ref, rtol=1e-5, atol=1e-5)
    assert np.allclose(chunked, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("phase", ["rows", "quads"])
def test_phase_input_gradient_is_the_same_for_any_chunk(phase, monkeypatch):
    """The reference CNN's convs (pooling-phase output) take the grid's input
    gradient through conv2d_backward: one image per chunk and one chunk give
    col2im's values."""
    x = RNG.standard_normal((5, 3, 8, 6)).astype(np.float32)
    wt = RNG.standard_normal((4, 3, 3, 3)).astype(np.float32)
    y, col = ops.conv2d_forward(x, wt, None, 1, 1, phase=phase)
    dy = RNG.standard_normal(y.shape).astype(np.float32)
    dw = np.empty_like(wt)
    one = ops.conv2d_backward(dy, col, x.shape, wt, 1, 1, dw, None).copy()
    _grid_chunks(monkeypatch, 1, 3, 3, x.shape, 1)
    per_image = ops.conv2d_backward(dy, col, x.shape, wt, 1, 1, dw, None)
    assert np.allclose(per_image, one, rtol=1e-6, atol=1e-6)
    plain = np.empty((4, x.shape[0] * 8 * 6), np.float32)
    n, _, ho, wo = ops.phase_plain_shape(dy)
    np.copyto(ops.conv_grid._phase_view(plain.reshape(4, n, ho, wo), dy.ndim, ho, wo), dy)
    ref = ops.col2im(wt.reshape(4, -1).T @ plain, x.shape, 3, 3, 1, 1)
    assert np.allclose(one, ref, atol=1e-5)


def test_which_convs_take_the_taps():
    pays = conv_taps.taps_pay
    assert pays(16, 16, 3, 1, 32, 32, 1)            # resnet8's first stage
    assert pays(64, 64, 3, 1, 4, 4, 1)              # any image size
    assert pays(3, 64, 3, 1, 64, 64, 1)
    assert pays(8, 8, 5, 1, 9, 7, 2)                # "same" 5x5
    assert pays(16, 32, 3, 2, 32, 32, 1)            # stride 2: four polyphase planes
    assert pays(32, 64, 3, 2, 16, 16, 1)
    assert not pays(16, 32, 3, 2, 31, 32, 1)        # stride 2 on an odd input
    assert not pays(16, 32, 3, 2, 32, 32, 0)        # stride 2 without padding
    assert pays(64, 128, 3, 2, 64, 64, 1)
    assert not pays(16, 16, 3, 3, 33, 33, 1)        # stride 3
    assert not pays(16, 32, 1, 1, 32, 32, 0)        # 1x1
    assert not pays(16, 16, 3, 1, 32, 32, 1, "rows")    # pooling-phase output
    assert pays(128, 128, 3, 1, 32, 32, 1)          # wide, but many positions
    assert pays(256, 256, 3, 1, 16, 16, 1)
    assert not pays(512, 512, 3, 1, 8, 8, 1)        # wide over few: one big GEMM wins
    assert not pays(256, 512, 3, 2, 16, 16, 1)
    assert not pays(16, 16, 3, 1, 8, 8, 0)          # not "same": conv.py's path
    assert not pays(16, 16, 2, 1, 8, 8, 1)


def test_resnet8_trains_the_same_with_any_chunk(monkeypatch):
    """A whole resnet8 step: one image per chunk and the default chunks give
    the same loss, gradient and running statistics to float32 rounding, and
    each is the same bits when repeated."""
    from ibtmpi.model import Model
    x = RNG.standard_normal((6, 3, 16, 16)).astype(np.float32)
    y = np.arange(6) % 5
    a = Model("resnet8", (3, 16, 16), 5, seed=2)
    la = a.loss_and_grad(x, y)
    monkeypatch.setattr(conv_taps, "CHUNK_BYTES", 1)
    b = Model("resnet8", (3, 16, 16), 5, seed=2)
    lb = b.loss_and_grad(x, y)
    assert np.isclose(la[0], lb[0], rtol=1e-6)
    assert np.allclose(a.grads, b.grads, rtol=1e-4, atol=1e-6)
    assert np.allclose(a.buffers, b.buffers, rtol=1e-5, atol=1e-6)
    g = b.grads.copy()
    b.init(2)
    b.loss_and_grad(x, y)
    assert b.grads.tobytes() == g.tobytes()


@pytest.mark.parametrize("geom", [GEOMS[0], GEOMS[3]])
def test_taps_conv_is_the_same_bits_on_any_number_of_threads(geom, monkeypatch):
    """Chunks on 1 and on 3 threads (each GEMM on one BLAS thread, the
    weight gradient's parts added in chunk order): the same bits."""
    n, c, h, w, f, k, pad, s = geom
    x, wt, b = _case(geom)
    dy = RNG.standard_normal((n, f, h // s, w // s)).astype(np.float32)
    _chunks(monkeypatch, 1, max(c, f) * k * k, (h // s) * (w // s))
    out = []
    for threads in (1, 3):
        monkeypatch.setitem(conv_taps._state, "threads", threads)
        ws = ops.Workspace()
        y, xf = ops.conv2d_taps_forward(x, wt, b, pad, ws=ws, stride=s)
        dw, db = np.empty_like(wt), np.empty_like(b)
        dx = ops.conv2d_taps_backward(dy, xf, x.shape, wt, pad, dw, db, ws=ws, stride=s)
        out.append([a.tobytes() for a in (y, dx, dw, db)])
    assert out[0] == out[1]
