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
