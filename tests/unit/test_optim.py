"""SGD against a hand-unrolled recurrence; Adam/AdamW against the written
update in float64, their state, resume and the reset-after-sync rule."""
import copy

import numpy as np
import pytest

from ibtmpi import optim
from ibtmpi.config import DEFAULTS, ConfigError, load, run_hash
from ibtmpi.optim import SGD, Adam, AdamW, Prox, adam_update


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
        from ibtmpi.testing.fakecupy import FakeCupy

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


# -- Adam / AdamW ------------------------------------------------------------

def _adam_by_hand(w0, grads, lr, b1, b2, eps, wd, decoupled, prox=None):
    """The update as Kingma & Ba write it (bias-corrected m_hat, v_hat), with
    L2 (Adam) or decoupled (AdamW, Loshchilov & Hutter) weight decay, in
    float64; prox = (c, u, rho) adds rho*(w - c + u) to the gradient."""
    w, m, v = w0.astype(np.float64), 0.0, 0.0
    for t, g in enumerate(grads, start=1):
        gg = g + (0.0 if decoupled else wd * w)
        if prox is not None:
            c, u, rho = prox
            gg = gg + rho * (w - c + u)
        if decoupled:
            w = w - lr * wd * w
        m = b1 * m + (1 - b1) * gg
        v = b2 * v + (1 - b2) * gg * gg
        m_hat, v_hat = m / (1 - b1 ** t), v / (1 - b2 ** t)
        w = w - lr * m_hat / (np.sqrt(v_hat) + eps)
    return w, m, v


@pytest.mark.parametrize("cls", [Adam, AdamW])
@pytest.mark.parametrize("wd", [0.0, 0.05])
@pytest.mark.parametrize("prox", [False, True])
def test_adam_matches_the_written_update_in_float64(cls, wd, prox):
    rng = np.random.default_rng(1)
    P = 7
    w0, c, u = (rng.standard_normal(P) for _ in range(3))
    grads = [rng.standard_normal(P) * 10.0 ** -k for k in range(5)]   # shrinking
    lr, b1, b2, eps, rho = 0.01, 0.8, 0.95, 1e-6, 0.3
    w = w0.copy()
    opt = cls(w, lr, (b1, b2), eps, wd, extra_grad=Prox(c, u, rho) if prox else None)
    for g in grads:
        opt.step(g.copy())
    ww, m, v = _adam_by_hand(w0, grads, lr, b1, b2, eps, wd, cls is AdamW,
                             (c, u, rho) if prox else None)
    np.testing.assert_allclose(w, ww, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(opt.m, m, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(opt.v, v, rtol=1e-12, atol=1e-18)
    assert opt.t.tolist() == [5] and opt.steps == 5
    # float32 follows the same update to float32 precision
    w32 = w0.astype(np.float32)
    o32 = cls(w32, lr, (b1, b2), eps, wd, extra_grad=Prox(
        c.astype(np.float32), u.astype(np.float32), np.float32(rho)) if prox else None)
    for g in grads:
        o32.step(g.astype(np.float32))
    assert w32.dtype == o32.m.dtype == o32.v.dtype == np.float32
    np.testing.assert_allclose(w32, ww, rtol=1e-5, atol=1e-6)


def test_adamw_decay_is_decoupled_and_adam_decay_is_not():
    """With a zero gradient AdamW shrinks w by exactly 1 - lr*wd (the moments
    stay zero: no step beyond the decay); Adam's L2 term goes through the
    moments instead, a step of about lr*sign(w)."""
    w = np.array([2.0, -4.0])
    opt = AdamW(w, lr=0.1, weight_decay=0.5)
    opt.step(np.zeros(2))
    np.testing.assert_array_equal(w, [2.0 * 0.95, -4.0 * 0.95])
    assert not opt.m.any() and not opt.v.any()
    w = np.array([2.0, -4.0])
    Adam(w, lr=0.1, weight_decay=0.5).step(np.zeros(2))
    np.testing.assert_allclose(w, [1.9, -3.9], rtol=1e-7)


@pytest.mark.parametrize("cls", [Adam, AdamW])
@pytest.mark.parametrize("scale", [1e-4, 1.0, 1e3])
def test_first_step_is_lr_times_sign_of_g(cls, scale):
    """Bias correction at t = 1: m_hat = g, v_hat = g^2, so the step is
    lr*g/(|g| + eps), about lr*sign(g) whatever the gradient's scale."""
    rng = np.random.default_rng(2)
    g = (rng.standard_normal(50) * scale).astype(np.float32)
    w = np.zeros(50, np.float32)
    cls(w, lr=0.01, betas=(0.9, 0.999), eps=1e-8).step(g.copy())
    g64 = g.astype(np.float64)
    np.testing.assert_allclose(-w, 0.01 * g64 / (np.abs(g64) + 1e-8), rtol=2e-6)
    if scale >= 1:                   # eps negligible against |g|
        np.testing.assert_allclose(-w, 0.01 * np.sign(g), rtol=2e-6)


@pytest.mark.parametrize("decoupled", [False, True])
@pytest.mark.parametrize("prox", [False, True])
def test_numpy_twin_is_the_class_step_bitwise(decoupled, prox):
    """adam_update (the kernel's reference) and Adam.step (the CPU path with
    the prox hook) do the same float32 arithmetic."""
    rng = np.random.default_rng(4)
    P = 301
    w0, c, u = (rng.standard_normal(P).astype(np.float32) for _ in range(3))
    grads = [rng.standard_normal(P).astype(np.float32) for _ in range(4)]
    lr, b1, b2, eps, wd, rho = 3e-3, 0.9, 0.999, 1e-8, 0.02, 0.25
    w = w0.copy()
    cls = AdamW if decoupled else Adam
    opt = cls(w, lr, (b1, b2), eps, wd,
              extra_grad=Prox(c, u, np.float32(rho)) if prox else None)
    rw, rm, rv = w0.copy(), np.zeros(P, np.float32), np.zeros(P, np.float32)
    for t, g in enumerate(grads, start=1):
        opt.step(g.copy())
        adam_update(rw, g, rm, rv, c, u, lr, b1, b2, eps, wd, rho, 1 - b1 ** t,
                    1 - b2 ** t, decoupled, prox)
    assert w.tobytes() == rw.tobytes()
    assert opt.m.tobytes() == rm.tobytes() and opt.v.tobytes() == rv.tobytes()


def test_adam_state_round_trip_and_reset():
    rng = np.random.default_rng(5)
    w = rng.standard_normal(9).astype(np.float32)
    opt = AdamW(w, lr=0.01, weight_decay=0.1)
    for _ in range(2):
        opt.step(rng.standard_normal(9).astype(np.float32))
    spec = opt.state_spec()
    assert spec == {"m": ((9,), np.float32), "v": ((9,), np.float32),
                    "t": ((1,), np.int64)}
    saved = {k: v.copy() for k, v in opt.state().items()}
    assert saved["t"].tolist() == [2] and saved["m"].any() and saved["v"].all()
    other = AdamW(w.copy(), lr=0.01, weight_decay=0.1)
    other.load(saved)
    for k in spec:
        assert other.state()[k].tobytes() == saved[k].tobytes()
    assert other.state()["t"] is other.t              # loaded into, not replaced
    other.reset()
    assert not any(v.any() for v in other.state().values())
    assert saved["t"].tolist() == [2]                 # the saved copy is untouched


@pytest.mark.parametrize("cls", [Adam, AdamW])
def test_resume_through_saved_state_is_bitwise(cls, tmp_path):
    """Six steps straight, or three, the state written to disk and loaded
    into a fresh optimizer, then three more: the same bits."""
    rng = np.random.default_rng(6)
    P = 64
    w0, c, u = (rng.standard_normal(P).astype(np.float32) for _ in range(3))
    grads = [rng.standard_normal(P).astype(np.float32) for _ in range(6)]

    def new(w):
        return cls(w, 2e-3, (0.9, 0.99), 1e-8, 0.01,
                   extra_grad=Prox(c, u, np.float32(0.1)))
    straight_w = w0.copy()
    straight = new(straight_w)
    for g in grads:
        straight.step(g.copy())
    first_w = w0.copy()
    first = new(first_w)
    for g in grads[:3]:
        first.step(g.copy())
    np.savez(tmp_path / "state.npz", w=first_w, **first.state())
    with np.load(tmp_path / "state.npz") as z:
        again_w = z["w"].copy()
        again = new(again_w)
        again.load({k: z[k] for k in again.state_spec()})
    for g in grads[3:]:
        again.step(g.copy())
    assert again_w.tobytes() == straight_w.tobytes()
    for k, buf in straight.state().items():
        assert again.state()[k].tobytes() == buf.tobytes()


@pytest.mark.parametrize("kw", [{"lr": 0}, {"lr": 0.1, "betas": (1.0, 0.999)},
                                {"lr": 0.1, "betas": (0.9, -0.1)}, {"lr": 0.1, "eps": 0},
                                {"lr": 0.1, "weight_decay": -1}])
def test_adam_bad_hyperparameters(kw):
    with pytest.raises(ValueError):
        Adam(np.zeros(2), **kw)


def _o(**kw):
    o = copy.deepcopy(DEFAULTS["optim"])
    o.update(kw)
    return o


@pytest.mark.parametrize("o,reset", [
    (_o(), True),                                        # today's default: reset
    (_o(reset_momentum=False), False),                   # the older name, for sgd
    (_o(reset_state=False), False), (_o(reset_state=True, reset_momentum=False), True),
    (_o(name="adam"), False), (_o(name="adamw"), False),  # DiLoCo keeps its state
    (_o(name="adamw", reset_momentum=True), False),       # an sgd key: ignored
    (_o(name="adamw", reset_state=True), True)])
def test_reset_state_resolution(o, reset):
    opt = optim.make(o, np.zeros(3, np.float32))
    assert optim.reset_on_sync(o) is reset
    assert opt.reset_on_sync is reset
    assert type(opt).name == o["name"]


def test_adam_config_keys_validate_and_keep_old_digests():
    base = ["data.path=x"]
    cfg = load(None, base + ["optim.name=adamw", "optim.betas=[0, 0.9]",
                             "optim.momentum=0.99", "optim.nesterov=true"])
    assert cfg["optim"]["betas"] == [0.0, 0.9]                     # floats
    opt = optim.make(cfg["optim"], np.zeros(2, np.float32))
    assert (opt.b1, opt.b2, opt.eps) == (0.0, 0.9, 1e-8)
    for bad, msg in [("optim.betas=[0.9, 1.0]", "optim.betas must both be in"),
                     ("optim.betas=[0.9]", "optim.betas must be two numbers"),
                     ("optim.eps=0", "optim.eps must be > 0"),
                     ("optim.reset_state=sometimes", "optim.reset_state must be auto")]:
        with pytest.raises(ConfigError, match=msg):
            load(None, base + [bad])
    # a checkpoint written before these keys existed has the same digest
    now = load(None, base)
    old = copy.deepcopy(now)
    for k in ("betas", "eps", "reset_state"):
        old["optim"].pop(k)
    assert run_hash(old) == run_hash(now)
    assert run_hash(load(None, base + ["optim.eps=1e-6"])) != run_hash(now)


@pytest.mark.parametrize("cls", [SGD, AdamW])
def test_clip_norm_scales_the_loss_gradient_before_decay_and_prox(cls):
    """optim.clip_norm: a gradient over the norm is scaled to it (the step
    equals the step with the scaled gradient by hand), one under it is left
    alone; weight decay and the prox term are added after the clip. The
    device path (the CuPy stand-in) takes the same steps."""
    rng = np.random.default_rng(5)
    P = 400
    w0, c, u = (rng.standard_normal(P).astype(np.float32) for _ in range(3))
    big = (rng.standard_normal(P) * 10).astype(np.float32)       # norm about 200
    small = (rng.standard_normal(P) * 0.01).astype(np.float32)   # norm about 0.2
    clip = 3.0
    scaled = big * np.float32(clip / np.sqrt(np.sum(big.astype(np.float64) ** 2)))

    def run(grads, clip_norm, ops=None):
        D = (lambda a: a) if ops is None else ops.asarray
        w = D(w0.copy())
        opt = cls(w, 0.05, **({"momentum": 0.9} if cls is SGD else {}),
                  weight_decay=0.01, ops=ops,
                  extra_grad=Prox(D(c), D(u), np.float32(0.3)))
        opt.clip_norm = clip_norm
        for g in grads:
            opt.step(D(g.copy()))
        return w if ops is None else ops.asnumpy(w)
    np.testing.assert_array_equal(run([big, small], clip), run([scaled, small], 0.0))
    assert not np.array_equal(run([big, small], clip), run([big, small], 0.0))
    dev = run([big, small], clip, _Counting())
    np.testing.assert_allclose(dev, run([big, small], clip), rtol=1e-5, atol=1e-6)
    o = {**DEFAULTS["optim"], "clip_norm": 2.5}
    assert optim.make(o, np.zeros(3, np.float32)).clip_norm == 2.5
    assert optim.make(DEFAULTS["optim"], np.zeros(3, np.float32)).clip_norm == 0.0


# -- optim.backbone_lr_scale: the backbone at lr * s, the head at lr ---------

def _torch_groups_steps(cls, w0, h, grads, lr, s, wd, clip):
    """The same steps by torch.optim with two parameter groups (the
    backbone w[:h] at lr*s, the head w[h:] at lr), the gradient clipped
    over both as torch.nn.utils.clip_grad_norm_ does: the oracle."""
    torch = pytest.importorskip("torch")
    back = torch.nn.Parameter(torch.tensor(w0[:h], dtype=torch.float64))
    head = torch.nn.Parameter(torch.tensor(w0[h:], dtype=torch.float64))
    groups = [{"params": [back], "lr": lr * s}, {"params": [head], "lr": lr}]
    opt = (torch.optim.SGD(groups, lr=lr, momentum=0.9, weight_decay=wd) if cls is SGD
           else torch.optim.AdamW(groups, lr=lr, weight_decay=wd) if cls is AdamW
           else torch.optim.Adam(groups, lr=lr, weight_decay=wd))
    for g in grads:
        back.grad = torch.tensor(g[:h], dtype=torch.float64)
        head.grad = torch.tensor(g[h:], dtype=torch.float64)
        torch.nn.utils.clip_grad_norm_([back, head], clip)
        opt.step()
    return np.concatenate([back.detach().numpy(), head.detach().numpy()])


@pytest.mark.parametrize("cls", [SGD, Adam, AdamW])
@pytest.mark.parametrize("s", [0.1, 0.0])
def test_backbone_lr_scale_is_torchs_two_param_groups(cls, s):
    """optim.backbone_lr_scale = s through optim.make: each step equals
    torch.optim's with the backbone in a group at lr*s and the head at lr
    (the clip over the whole gradient, decoupled decay at each group's
    lr); s = 0 leaves the backbone where it was (SGD, AdamW; Adam's L2 term
    moves nothing either). The fused device path (the CuPy stand-in) takes
    the same steps, one launch per part."""
    rng = np.random.default_rng(11)
    P, h, lr, wd, clip = 300, 240, 0.05, 0.01, 4.0
    w0 = rng.standard_normal(P).astype(np.float32)
    grads = [(rng.standard_normal(P) * 0.5).astype(np.float32) for _ in range(4)]
    o = {**DEFAULTS["optim"], "name": cls.name, "lr": lr, "weight_decay": wd,
         "clip_norm": clip, "backbone_lr_scale": s}

    def run(ops=None):
        D = (lambda a: a) if ops is None else ops.asarray
        w = D(w0.copy())
        opt = optim.make(o, w, ops=ops, head_start=h)
        assert opt.lr_split == (h, s)
        for g in grads:
            opt.step(D(g.copy()))
        return w if ops is None else ops.asnumpy(w)
    got = run()
    want = _torch_groups_steps(cls, w0, h, grads, lr, s, wd, clip)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
    if s == 0:
        np.testing.assert_array_equal(got[:h], w0[:h])
    assert not np.allclose(got[h:], w0[h:])
    ops = _Counting()
    np.testing.assert_allclose(run(ops), got, rtol=1e-5, atol=1e-6)
    assert ops.calls == [f"{'sgd' if cls is SGD else 'adam'}_update"] * (2 * len(grads))


@pytest.mark.parametrize("cls", [SGD, AdamW])
def test_backbone_lr_scale_one_is_the_plain_step_bitwise(cls):
    """s = 1 (the default) is one part: the same bits as before the key."""
    rng = np.random.default_rng(12)
    w0 = rng.standard_normal(50).astype(np.float32)
    grads = [rng.standard_normal(50).astype(np.float32) for _ in range(3)]
    outs = []
    for o in ({**DEFAULTS["optim"], "name": cls.name},
              {**DEFAULTS["optim"], "name": cls.name, "backbone_lr_scale": 1.0}):
        w = w0.copy()
        opt = optim.make(o, w, head_start=40)
        assert opt.lr_split is None
        for g in grads:
            opt.step(g.copy())
        outs.append(w)
    np.testing.assert_array_equal(*outs)


def test_backbone_lr_scale_config_and_the_models_head():
    from ibtmpi.model import Model
    with pytest.raises(ConfigError, match="backbone_lr_scale"):
        load(None, ["data.path=x", "optim.backbone_lr_scale=-1"])
    cfg = load(None, ["data.path=x", "optim.backbone_lr_scale=0.1"])
    m = Model("reference", (3, 16, 16), 5, seed=0)
    h = m.head_start()
    last = [sl for li, _n, sl in m.slices if li == m.head]
    assert m.layers[m.head].kind == "linear" and h == last[0].start
    assert m.size - h == sum(sl.stop - sl.start for sl in last)
    assert optim.make(cfg["optim"], m.params, head_start=h).lr_split == (h, 0.1)
    with pytest.raises(ConfigError, match="head is a linear layer"):
        optim.make(cfg["optim"], m.params)
