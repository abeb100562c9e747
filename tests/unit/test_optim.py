"""SGD against a hand-unrolled recurrence."""
import numpy as np
import pytest

from ibtmpi.optim import SGD


@pytest.mark.parametrize("nesterov", [False, True])
def test_sgd_matches_unrolled_recurrence(nesterov):
    rng = np.random.default_rng(0)
    w0 = rng.standard_normal(5)
    z = rng.standard_normal(5)
    grads = [rng.standard_normal(5) for _ in range(3)]
    lr, mu, wd, rho = 0.1, 0.9, 0.01, 0.5
    w = w0.copy()
    opt = SGD(w, lr, mu, wd, nesterov,
              extra_grad=lambda w_, g_: g_.__iadd__(rho * (w_ - z)))
    for g in grads:
        opt.step(g.copy())
    # by hand
    ww, v = w0.copy(), np.zeros(5)
    for g in grads:
        gg = g + wd * ww + rho * (ww - z)
        v = mu * v + gg
        ww = ww - lr * ((gg + mu * v) if nesterov else v)
    np.testing.assert_allclose(w, ww, rtol=1e-13)
    assert opt.steps == 3
    opt.reset()
    assert not opt.v.any()


def test_plain_sgd_without_momentum():
    w = np.ones(3, np.float32)
    opt = SGD(w, lr=0.5, momentum=0.0)
    opt.step(np.array([1, 2, 3], np.float32))
    np.testing.assert_array_equal(w, [0.5, 0.0, -0.5])
    assert w.dtype == np.float32


@pytest.mark.parametrize("kw", [{"lr": 0}, {"lr": 0.1, "momentum": 1.0},
                                {"lr": 0.1, "weight_decay": -1}])
def test_bad_hyperparameters(kw):
    with pytest.raises(ValueError):
        SGD(np.zeros(2), **kw)


class _Counting:
    """GpuOps on the CuPy stand-in, counting kernel launches by name."""

    def __init__(self):
        from fakecupy import FakeCupy

        from ibtmpi.backend import GpuOps
        self.ops, self.calls = GpuOps(cp=FakeCupy()), []
        launch = self.ops._launch
        self.ops._launch = lambda f, k, *a: (self.calls.append(k), launch(f, k, *a))

    def __getattr__(self, name):
        return getattr(self.ops, name)


@pytest.mark.parametrize("nesterov", [False, True])
@pytest.mark.parametrize("prox", [False, True])
@pytest.mark.parametrize("mu,wd", [(0.9, 5e-4), (0.0, 0.0)])
def test_device_step_is_one_fused_launch_equal_to_the_numpy_step(nesterov, prox, mu, wd):
    from ibtmpi.optim import Prox
    rng = np.random.default_rng(3)
    P = 1000
    w0, c, u = (rng.standard_normal(P).astype(np.float32) for _ in range(3))
    grads = [rng.standard_normal(P).astype(np.float32) for _ in range(4)]
    ops = _Counting()
    D = ops.asarray
    wh, wd_ = w0.copy(), D(w0)
    host = SGD(wh, 0.05, mu, wd, nesterov,
               extra_grad=Prox(c, u, np.float32(0.3)) if prox else None)
    dev = SGD(wd_, 0.05, mu, wd, nesterov,
              extra_grad=Prox(D(c), D(u), np.float32(0.3)) if prox else None, ops=ops)
    for g in grads:
        host.step(g.copy())
        dev.step(D(g))
    assert ops.calls == ["sgd_update"] * len(grads)
    np.testing.assert_allclose(ops.asnumpy(wd_), wh, rtol=1e-6, atol=1e-7)
    if mu:            # without momentum v is never read (the kernel still stores g')
        np.testing.assert_allclose(ops.asnumpy(dev.v), host.v, rtol=1e-6, atol=1e-7)
    assert dev.steps == host.steps == len(grads)


def test_device_step_with_another_extra_term_takes_the_general_path():
    ops = _Counting()
    w = ops.asarray(np.ones(4, np.float32))
    opt = SGD(w, 0.5, 0.0, extra_grad=lambda w_, g_: g_.__iadd__(np.float32(1)), ops=ops)
    opt.step(ops.cp.zeros(4, np.float32))
    assert ops.calls == []
    np.testing.assert_array_equal(ops.asnumpy(w), 0.5)
