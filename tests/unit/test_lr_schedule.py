"""optim.schedule: the learning rate of each block against its closed form,
the config checks, the trainer using it block by block (metrics, simulated
workers, exact resume), and checkpoints of older versions still resuming."""
import json
import math
import shutil

import numpy as np
import pytest

from ibtmpi import checkpoint as ckpt
from ibtmpi.config import DEFAULTS, ConfigError, load
from ibtmpi.optim import LrSchedule
from ibtmpi.train import InjectedFault, Trainer
from ibtmpi.config import run_hash


def opts(**kw):
    o = dict(DEFAULTS["optim"])
    o.update(kw)
    return o


def test_constant_is_the_base_rate_everywhere():
    s = LrSchedule(opts(lr=0.05), blocks_per_pass=10, passes=3)
    assert [s(k) for k in range(30)] == [0.05] * 30
    assert s.describe() is None


def test_step_multiplies_by_gamma_at_each_milestone():
    s = LrSchedule(opts(lr=0.1, schedule="step", milestones=[1, 2.5], gamma=0.5),
                   blocks_per_pass=4, passes=4)
    # milestones at blocks 4 and 10
    want = [0.1] * 4 + [0.05] * 6 + [0.025] * 6
    assert [s(k) for k in range(16)] == pytest.approx(want, rel=0, abs=1e-15)
    assert "blocks 4, 10" in s.describe()


def test_cosine_runs_from_lr_to_the_final_ratio_over_the_horizon():
    lr, bpp, passes = 0.08, 5, 4
    s = LrSchedule(opts(lr=lr, schedule="cosine", final_ratio=0.1), bpp, passes)
    end = bpp * passes
    for k in range(end + 5):
        t = min(k, end) / end
        want = 0.008 + (lr - 0.008) * (1 + math.cos(math.pi * t)) / 2
        assert s(k) == pytest.approx(want, rel=1e-12)
    assert s(0) == lr and s(end // 2) == pytest.approx((lr + 0.008) / 2)
    assert s(end + 100) == pytest.approx(0.008)          # flat after the horizon
    # decay_passes sets the horizon independently of run.passes
    s2 = LrSchedule(opts(lr=lr, schedule="cosine", decay_passes=2), bpp, passes)
    assert s2(10) == pytest.approx(0.0) and s2(15) == pytest.approx(0.0)


@pytest.mark.parametrize("kind", ["constant", "step", "cosine"])
def test_warmup_ramps_linearly_then_hands_over(kind):
    s = LrSchedule(opts(lr=0.04, schedule=kind, warmup_passes=0.5,
                        milestones=[3] if kind == "step" else []), 8, 4)
    assert [s(k) for k in range(4)] == pytest.approx([0.01, 0.02, 0.03, 0.04])
    assert s(4) == pytest.approx(0.04)      # cosine starts its decay at the warm-up's end
    assert s(5) <= 0.04
    assert "warm-up over 4 block(s)" in s.describe()


def test_a_position_inside_a_block_refines_the_warmup():
    """ssgd asks per step (k + s/S, unit 1/S): the warm-up ramps over steps,
    even where a pass is one block."""
    s = LrSchedule(opts(lr=0.1, warmup_passes=1.0), blocks_per_pass=1, passes=3)
    assert s(0) == 0.1                                  # per block: no ramp at all
    S = 4
    got = [s(k, i / S, 1 / S) for k in range(2) for i in range(S)]
    assert got == pytest.approx([0.025, 0.05, 0.075, 0.1, 0.1, 0.1, 0.1, 0.1])
    c = LrSchedule(opts(lr=0.1, schedule="cosine"), blocks_per_pass=1, passes=2)
    assert c(0, 0.5, 0.25) == pytest.approx(0.1 * (1 + math.cos(math.pi / 4)) / 2)


def test_ssgd_changes_the_rate_every_step(small_dataset, tmp_path):
    t = Trainer(cfg(small_dataset, tmp_path / "s", "ssgd",
                    **{"optim.warmup_passes": 0.5, "optim.lr": 0.06}), log=lambda m: None)
    seen = []
    step = t.opt.step
    t.opt.step = lambda g: (seen.append(t.opt.lr), step(g))
    t.run()
    S, W = t.sched.steps_in_block(0), 0.5 * t.sched.blocks_per_pass
    assert S > 1 and len(seen) == S * t.total_blocks
    want = [0.06 * min(1.0, (k + (i + 1) / S) / W) for k in range(t.total_blocks)
            for i in range(S)]
    assert seen == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("sets,msg", [
    (["optim.schedule=cosin"], "did you mean 'cosine'"),
    (["optim.milestones=[10]"], "milestones is set but optim.schedule is not 'step'"),
    (["optim.schedule=step", "optim.milestones=[20, 10]"], "increasing numbers"),
    (["optim.schedule=step", "optim.milestones=[0]"], "increasing numbers"),
    (["optim.schedule=step", "optim.milestones=30"], "must be a list"),
    (["optim.schedule=step", "optim.milestones=['a']"], "increasing numbers"),
    (["optim.gamma=0"], "optim.gamma must be in"),
    (["optim.final_ratio=2"], "optim.final_ratio"),
    (["optim.warmup_passes=-1"], "optim.warmup_passes"),
])
def test_schedule_config_errors(sets, msg):
    with pytest.raises(ConfigError, match=msg):
        load(None, ["data.path=x"] + sets)


def cfg(path, run_dir, algo="ibt", **extra):
    sets = [f"data.path={path}", f"algorithm.name={algo}", "data.split_size=40",
            "data.batch=16", "model.layers=tiny", "run.passes=2", "run.quiet=true",
            f"run.dir={run_dir}", "run.simulate=3", "run.threads=1",
            "run.checkpoint_every=2"]
    return load(None, sets + [f"{k}={v}" for k, v in extra.items()])


COSINE = {"optim.schedule": "cosine", "optim.warmup_passes": 0.5, "optim.lr": 0.05}


@pytest.mark.parametrize("algo", ["ibt", "ssgd"])
def test_the_trainer_uses_the_schedule_block_by_block(small_dataset, tmp_path, algo):
    logs = []
    t = Trainer(cfg(small_dataset, tmp_path / "a", algo, **COSINE), log=logs.append)
    t.run()
    recs = [json.loads(line) for line in open(tmp_path / "a" / "metrics.jsonl")]
    unit = 1.0 / t.sched.steps_in_block(0) if algo == "ssgd" else 1.0
    assert [r["lr"] for r in recs] == [t.lr_at(k, 0.0, unit) for k in range(t.total_blocks)]
    assert recs[0]["lr"] < recs[1]["lr"] and recs[-1]["lr"] < 0.05 / 2
    assert any(m.startswith("lr schedule: cosine 0.05 -> 0") for m in logs)
    # and the rate reaches the optimizer: a constant run at 0.05 differs
    c = Trainer(cfg(small_dataset, tmp_path / "c", algo, **{"optim.lr": 0.05}),
                log=lambda m: None)
    c.run()
    assert not np.array_equal(c.z, t.z)


def test_a_run_with_a_schedule_resumes_bitwise(small_dataset, tmp_path, monkeypatch):
    sched = {"optim.schedule": "step", "optim.milestones": "[0.5, 1.5]",
             "optim.warmup_passes": 0.25}
    ref = Trainer(cfg(small_dataset, tmp_path / "a", **sched), log=lambda m: None)
    ref.run()
    monkeypatch.setenv("IBTMPI_FAULT", "0:5:compute")
    with pytest.raises(InjectedFault):
        Trainer(cfg(small_dataset, tmp_path / "b", **sched), log=lambda m: None).run()
    monkeypatch.delenv("IBTMPI_FAULT")
    t = Trainer(cfg(small_dataset, tmp_path / "b", **sched), log=lambda m: None)
    t.run()
    assert t.z.tobytes() == ref.z.tobytes()


def test_checkpoints_of_older_versions_keep_their_digest():
    """The schedule keys at their defaults leave the digest as it was before
    they existed (values computed by the version before them), so checkpoints
    written then still resume."""
    c = load(None, ["data.path=/nonexistent/d", "algorithm.name=admm"])
    assert (run_hash(c), run_hash(c, legacy=True)) == ("47f1a845c7170f06", "bf06722da55810f3")
    c = load(None, ["data.path=/x", "optim.lr=0.05", "model.layers=tiny"])
    assert run_hash(c) == "e8a0a9646cd20b12"
    assert run_hash(load(None, ["data.path=/x", "optim.schedule=cosine"])) != run_hash(
        load(None, ["data.path=/x"]))


def test_another_configuration_is_refused_naming_what_differs(small_dataset, tmp_path):
    Trainer(cfg(small_dataset, tmp_path / "r", **COSINE), log=lambda m: None).run()
    # keys that change the data order are refused, each named with both values
    with pytest.raises(ckpt.CheckpointError) as e:
        Trainer(cfg(small_dataset, tmp_path / "r",
                    **{**COSINE, "data.batch": 8, "data.augment": "true"}),
                log=lambda m: None).run()
    msg = str(e.value)
    assert "data.augment: false in the checkpoint, true now" in msg
    assert "data.batch: 16 in the checkpoint, 8 now" in msg
    # the learning rate, rho and the schedule may change on a resume (since
    # hardening round 2): each change is named with both values, a key left
    # out of the digest at its default with that default; a cosine schedule's
    # horizon is run.passes unless given, so more passes name it too
    for extra, said in [({"optim.lr": 0.02, "algorithm.rho": 0.5},
                         "algorithm.rho 0.01 -> 0.5, optim.lr 0.05 -> 0.02"),
                        ({"run.passes": 4}, "optim.decay_passes 2.0 -> 4.0"),
                        ({"optim.final_ratio": 0.1}, "optim.final_ratio 0.0 -> 0.1")]:
        logs = []
        shutil.copytree(tmp_path / "r", tmp_path / "c")
        Trainer(cfg(small_dataset, tmp_path / "c", **{**COSINE, **extra}),
                log=logs.append).run()
        assert any("resuming with changed settings at block" in m and m.endswith(said)
                   for m in logs), logs
        shutil.rmtree(tmp_path / "c")
    # with the horizon pinned, the run extends
    logs = []
    Trainer(cfg(small_dataset, tmp_path / "r",
                **{**COSINE, "run.passes": 3, "optim.decay_passes": 2}),
            log=logs.append).run()
    assert any("resuming from" in m for m in logs)
