"""The outer optimizers (ibtmpi/consensus/outer.py): the algorithms as
compositions of a local objective and an outer step, the outer state
through a checkpoint, and the outer step's schedule."""
import json

import numpy as np
import pytest

from ibtmpi import checkpoint as ckpt
from ibtmpi.config import ConfigError, load
from ibtmpi.consensus import OUTER, make_consensus
from ibtmpi.errors import Diverged
from ibtmpi.optim import LrSchedule
from ibtmpi.train import InjectedFault, Trainer


def _drive(algo, acfg, blocks=6, n=3, p=1000, seed=0):
    """z after `blocks` updates of fake workers that step towards their
    own targets from the start point (prox and duals included)."""
    rng = np.random.default_rng(seed)
    c = make_consensus(algo, rng.standard_normal(p).astype(np.float32), n, acfg)
    targets = rng.standard_normal((n, p)).astype(np.float32)
    states = [c.new_worker(p, np.float32) for _ in range(n)]
    zs = []
    for _ in range(blocks):
        S = np.zeros(p, np.float32)
        out = np.empty(p, np.float32)
        q = 0.0
        for i, ws in enumerate(states):
            w = np.empty(p, np.float32)
            c.worker_begin(ws, w)
            w += np.float32(0.3) * (targets[i] - w)
            q += c.contribution(ws, w, out)
            S += out
        c.update(S, q)
        for ws in states:
            c.worker_end(ws, None)
        zs.append(c.z.copy())
    return c, zs


def test_the_algorithms_are_compositions_bit_for_bit():
    """bmuf is ma with the sgd outer optimizer, ibt is admm with it (Nesterov)."""
    a = {"block_momentum": 0.6, "block_lr": 1.3}
    _, bmuf = _drive("bmuf", a)
    _, ma_sgd = _drive("ma", {**a, "outer": "sgd"})
    assert all(x.tobytes() == y.tobytes() for x, y in zip(bmuf, ma_sgd))
    _, ibt = _drive("ibt", a)
    _, admm_sgd = _drive("admm", {**a, "outer": "sgd", "nesterov": True})
    assert all(x.tobytes() == y.tobytes() for x, y in zip(ibt, admm_sgd))
    # and the average outer step makes bmuf plain averaging
    _, ma = _drive("ma", {})
    _, bmuf_avg = _drive("bmuf", {"outer": "average"})
    assert all(x.tobytes() == y.tobytes() for x, y in zip(ma, bmuf_avg))
    assert ibt[-1].tobytes() != _drive("admm", {})[1][-1].tobytes()


def test_outer_sgd_is_sgd_on_the_pseudo_gradient():
    """v = eta*v + zeta*(mean - z_s); z = z_s + v; z_s = z + eta*v: checked
    against a float64 loop for 4 blocks, with CNTK's eta = 1 - 1/N."""
    n, p = 4, 50
    c, zs = _drive("bmuf", {"block_momentum": -1.0, "block_lr": 0.7, "nesterov": True},
                   blocks=4, n=n, p=p, seed=3)
    assert c.outer.eta == pytest.approx(0.75)
    assert c.outer.gain() == pytest.approx(0.7 * 1.75 / 0.25)
    rng = np.random.default_rng(3)
    z = rng.standard_normal(p).astype(np.float32).astype(np.float64)
    targets = rng.standard_normal((n, p)).astype(np.float32).astype(np.float64)
    zs_, v = z.copy(), np.zeros(p)
    for k in range(4):
        mean = np.mean([zs_ + 0.3 * (t - zs_) for t in targets], axis=0)
        v = 0.75 * v + 0.7 * (mean - zs_)
        z = zs_ + v
        zs_ = z + 0.75 * v
        np.testing.assert_allclose(zs[k], z, rtol=1e-4, atol=1e-5)


def test_outer_state_is_the_checkpointed_state():
    c, _ = _drive("admm", {"outer": "sgd", "block_momentum": 0.5})
    st = c.state()
    assert list(c.state_spec()) == ["z", "zg", "v", "U", "rho", "cons_blocks", "outer_guard"]
    assert st["zg"] is c.outer.zg and st["v"] is c.outer.v
    fresh = make_consensus("admm", np.zeros(1000, np.float32), 3,
                      {"outer": "sgd", "block_momentum": 0.5})
    fresh.load({k: np.array(v) for k, v in st.items()}, np.copyto)
    assert fresh.outer.zg.tobytes() == c.outer.zg.tobytes()
    assert fresh.outer.v.tobytes() == c.outer.v.tobytes() and fresh.blocks == c.blocks
    assert list(make_consensus("ma", np.zeros(4, np.float32), 2, {}).state_spec())[:1] == ["z"]


def _cfg(data, run_dir, **extra):
    sets = [f"data.path={data}", "algorithm.name=admm", "algorithm.outer=sgd",
            "algorithm.block_momentum=0.5", "algorithm.outer_schedule=lr",
            "optim.schedule=cosine", "optim.warmup_passes=0.5", "data.split_size=40",
            "data.batch=16", "model.layers=tiny", "run.passes=2", "run.quiet=true",
            f"run.dir={run_dir}", "run.simulate=3", "run.threads=1",
            "run.checkpoint_every=2"]
    return load(None, sets + [f"{k}={v}" for k, v in extra.items()])


CENTRED = {"algorithm.centred_duals": "true", "algorithm.block_lr": 0.7}


@pytest.mark.parametrize("extra,other", [({}, {"algorithm.outer_schedule": "none"}),
                                         (CENTRED, {**CENTRED,
                                                    "algorithm.centred_duals": "false"})],
                         ids=["schedule", "centred-duals"])
def test_a_new_composition_resumes_bit_for_bit(small_dataset, tmp_path, monkeypatch, extra,
                                               other):
    """admm with the sgd outer optimizer and a scheduled outer step (and
    with centred duals, whose consensus mean is not state): a run stopped
    in block 5 resumes from its checkpoint (z, z_g, v, U) to the
    uninterrupted run's z, bit for bit, and the setting made a difference."""
    ref = Trainer(_cfg(small_dataset, tmp_path / "a", **extra), log=lambda m: None)
    ref.run()
    monkeypatch.setenv("IBTMPI_FAULT", "0:5:compute")
    with pytest.raises(InjectedFault):
        Trainer(_cfg(small_dataset, tmp_path / "b", **extra), log=lambda m: None).run()
    monkeypatch.delenv("IBTMPI_FAULT")
    k = ckpt.complete(str(tmp_path / "b"))[-1]
    saved = ckpt.read_rank(f"{ckpt.ckpt_dir(str(tmp_path / 'b'), k)}/{ckpt.rank_file(0)}",
                           ref.cons.state_spec())
    assert saved["v"].any() and saved["zg"].tobytes() != saved["z"].tobytes()
    logs = []
    t = Trainer(_cfg(small_dataset, tmp_path / "b", **extra), log=logs.append)
    t.run()
    assert any("resuming from" in m for m in logs)
    assert t.z.tobytes() == ref.z.tobytes()
    # the setting made a difference (the outer step followed the schedule)
    other = Trainer(_cfg(small_dataset, tmp_path / "c", **other), log=lambda m: None)
    other.run()
    assert other.z.tobytes() != ref.z.tobytes()
    lines = [json.loads(l) for l in open(tmp_path / "b" / "metrics.jsonl")]
    assert [l["block"] for l in lines] == list(range(ref.total_blocks))


def test_outer_schedule_factor():
    s = LrSchedule({"lr": 0.1, "schedule": "cosine", "warmup_passes": 1.0, "gamma": 0.1,
                    "milestones": [], "decay_passes": 0.0, "final_ratio": 0.0}, 4, 3)
    assert [s.factor(k, "none") for k in range(12)] == [1.0] * 12
    assert [s.factor(k, "warmup") for k in range(6)] == pytest.approx([.25, .5, .75, 1, 1, 1])
    assert s.factor(3, "lr") == pytest.approx(1.0)
    assert s.factor(8, "lr") == pytest.approx(0.5 * (1 + np.cos(np.pi * 4 / 8)))


def test_outer_settings_are_checked(small_dataset):
    base = [f"data.path={small_dataset}"]
    assert load(None, base + ["algorithm.outer=sgd"])["algorithm"]["outer"] == "sgd"
    with pytest.raises(ConfigError, match="did you mean 'sgd'"):
        load(None, base + ["algorithm.outer=sgdd"])
    with pytest.raises(ConfigError, match="easgd moves z itself"):
        load(None, base + ["algorithm.name=easgd", "algorithm.outer=average"])
    with pytest.raises(ConfigError, match="outer_schedule must be one of none, warmup, lr"):
        load(None, base + ["algorithm.outer_schedule=cosine"])
    assert set(OUTER) >= {"average", "sgd"}


def test_the_overshoot_guard_fires_on_an_amplifying_outer_step(small_dataset, tmp_path):
    """eta 0.9, zeta 5 (gain 95): the training loss climbs from block 2 on.
    Warn-only (algorithm.overshoot_backoff = false), the guard says so at
    block 3, once, names the settings, and the run diverges at block 8.
    With the back-off (the default) it says so at the same block, the outer
    step falls back to the plain average's gain and the run trains to the
    end. The defaults (gain 1.67) and plain averaging stay quiet."""
    def run(name, *sets):
        logs = []
        c = load(None, [f"data.path={small_dataset}", "model.layers=tiny",
                        "data.split_size=20", "data.batch=10", "run.passes=3",
                        "run.simulate=4", "run.threads=1", "run.quiet=true",
                        f"run.dir={tmp_path / name}", *sets])
        t = Trainer(c, log=logs.append)
        try:
            t.run()
            ended = "trained"
        except Diverged as e:
            ended = f"diverged at block {e.block}"
        lines = [h for h in t.history if "outer_overshoot" in h]
        return [m for m in logs if "overshoots" in m], ended, lines, t
    hot = ("algorithm.block_momentum=0.9", "algorithm.block_lr=5")
    said, ended, lines, _ = run("warn", *hot, "algorithm.overshoot_backoff=false")
    assert len(said) == 1 and said[0].startswith(
        "warning: the outer step overshoots: block 3's training loss")
    assert "95x (algorithm.block_momentum 0.9, block_lr 5). Lower" in said[0]
    assert ended == "diverged at block 8" and [h["block"] for h in lines] == [3]
    said, ended, lines, t = run("backoff", *hot)
    assert len(said) == 1 and "95x (algorithm.block_momentum 0.9, block_lr 5): backed off " \
        "to the plain average's gain from block 4 (zeta x 0.0105, " in said[0]
    assert ended == "trained" and [h["block"] for h in lines] == [3]
    assert lines[0]["outer_overshoot"]["factor"] == pytest.approx(1 / 95, rel=1e-5)
    assert t.cons.outer.guard.factor * t.cons.outer_gain() == pytest.approx(1.0)
    for name, sets in (("default", ()), ("avg", ("algorithm.name=admm",))):
        assert run(name, *sets)[:3] == ([], "trained", [])


def test_the_guard_alone_follows_its_rule_and_its_state_round_trips():
    """A loss above max(1.5 x, + 0.25) the lowest one before the last, in two
    blocks in a row after the warm-up, with a gain above 1: the guard fires
    there; warn-only it fires once; its four numbers restore it exactly, and
    a checkpoint written before it existed loads without them."""
    from ibtmpi.consensus.outer import OvershootGuard
    seq = [9.0, 1.0, 0.9, 1.2, 1.5, 1.6, 1.0, 2.0, 2.0]   # block 0-1: warm-up
    g = OvershootGuard(backoff=False)
    fired = [k for k, x in enumerate(seq) if g.observe(x, k, warm=2, gain=3.0)]
    assert fired == [5]                 # 1.5 and 1.6 > max(1.35, 1.15); then once only
    assert not any(OvershootGuard(False).observe(x, k, 2, 1.0) for k, x in enumerate(seq))
    g = OvershootGuard(backoff=True)
    got = [g.observe(x, k, 2, 4.0) for k, x in enumerate(seq[:6])]
    assert got[5] == {"low": 0.9, "factor": 0.25} and g.factor == 0.25
    assert not any(g.observe(x, k, 2, 4.0) for k, x in enumerate([5.0, 9.0, 20.0], 6))
    h = OvershootGuard(backoff=False)
    for k, x in enumerate(seq[:4]):
        h.observe(x, k, 2, 3.0)
    again = OvershootGuard(backoff=False)
    again.load(h.array())
    assert again.array().tobytes() == h.array().tobytes()
    assert [again.observe(x, k, 2, 3.0) is not None for k, x in enumerate(seq[4:], 4)] == \
        [False, True, False, False, False]
    c = make_consensus("ibt", np.zeros(4, np.float32), 2, {"block_momentum": 0.5})
    spec = c.state_spec()
    assert spec["outer_guard"] == ((4,), np.float64, "optional")
    c.outer.guard.load(np.array([0.5, 1.0, 2.0, 1.0]))
    st = c.state()
    d = make_consensus("ibt", np.zeros(4, np.float32), 2, {"block_momentum": 0.5})
    d.load(st, np.copyto)
    assert d.outer.guard.array().tobytes() == c.outer.guard.array().tobytes()
    old = {k: v for k, v in st.items() if k != "outer_guard"}   # an older checkpoint
    e = make_consensus("ibt", np.zeros(4, np.float32), 2, {"block_momentum": 0.5})
    e.load(old, np.copyto)
    assert e.outer.guard.factor == 1.0