"""The training driver in simulation: every algorithm runs, writes its run
directory, makes one Allreduce per block (ssgd: per minibatch); config errors."""
import json
import os

import numpy as np
import pytest
from conftest import PARALLEL, cfg_for

from ibtmpi import comm
from ibtmpi.cli import main
from ibtmpi.config import ConfigError, load
from ibtmpi.train import Trainer


@pytest.mark.parametrize("algo", PARALLEL)
def test_every_algorithm_runs_and_counts_allreduces(small_dataset, tmp_path, algo):
    cfg = cfg_for(small_dataset, tmp_path / "r", algo)
    comm.STATS.update(allreduce=0, bytes=0)
    t = Trainer(cfg, log=lambda m: None)
    s = t.run()
    blocks = t.total_blocks
    assert blocks == 2 * t.sched.blocks_per_pass
    if algo == "ssgd":
        expect = 2 * t.sched.steps_per_pass()
    else:
        expect = blocks
    assert s["allreduce_calls"] == expect
    # [S (P) | 6 scalars | compute, data-wait, compute CPU, peak RSS, GPU pool
    # (N each) | flags (1 + N)]
    assert s["allreduce_bytes"] == expect * (t.model.size + 6 + 5 * 3 + 1 + 3) * 4
    lines = [json.loads(l) for l in open(tmp_path / "r" / "metrics.jsonl")]
    assert [l["block"] for l in lines] == list(range(blocks))
    assert all(l["samples"] > 0 and np.isfinite(l["train_loss"]) for l in lines)
    assert "val_acc" in lines[-1]
    assert 0.0 <= s["test_acc"] <= 1.0
    for f in ("config.toml", "summary.json", "model.npz"):
        assert (tmp_path / "r" / f).exists()
    # the written config reloads to the same values
    again = load(str(tmp_path / "r" / "config.toml"))
    assert again == cfg


def test_training_makes_progress(small_dataset, tmp_path):
    """admm, 2 simulated workers, tiny CNN, 480 train images 16x16, 8
    passes: measured test accuracy 0.733 (chance 0.2); asserted > 0.5."""
    cfg = cfg_for(small_dataset, tmp_path / "r", "admm", n=2,
                  **{"run.passes": 8, "optim.lr": 0.05})
    t = Trainer(cfg, log=lambda m: None)
    s = t.run()
    first = t.history[0]["train_loss"]
    last = t.history[-1]["train_loss"]
    assert last < first
    assert s["test_acc"] > 0.5


def test_sgd_single_worker_only(small_dataset, tmp_path):
    with pytest.raises(ValueError, match="single-worker baseline"):
        Trainer(cfg_for(small_dataset, tmp_path, "sgd", n=3))
    t = Trainer(cfg_for(small_dataset, tmp_path / "s", "sgd", n=1), log=lambda m: None)
    assert t.run()["N"] == 1


def test_config_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown key algorithm.rhoo \(did you mean 'rho'\?\)"):
        load(None, ["data.path=x", "algorithm.rhoo=1"])
    with pytest.raises(ConfigError, match=r"unknown section \[optimizer\].*'optim'"):
        load(None, ["data.path=x", "optimizer.lr=1"])
    with pytest.raises(ConfigError, match="algorithm.rho must be > 0"):
        load(None, ["data.path=x", "algorithm.rho=-1"])
    with pytest.raises(ConfigError, match="data.batch must be an integer"):
        load(None, ["data.path=x", "data.batch=abc"])
    with pytest.raises(ConfigError, match="data.path is not set"):
        load(None, [])
    p = tmp_path / "c.toml"
    p.write_text("[data]\npath = 'x'\nbatchsize = 3\n")
    with pytest.raises(ConfigError, match=r"c.toml: unknown key data.batchsize \(did you mean 'batch'\?\)"):
        load(str(p))


def test_cli_train_bad_config_exit_2(capsys, tmp_path):
    rc = main(["train", "--set", "data.path=" + str(tmp_path / "none"), "--quiet"])
    assert rc == 2
    assert "does not exist" in capsys.readouterr().err


def test_examples_parse():
    root = os.path.join(os.path.dirname(__file__), "..", "..", "examples")
    for f in os.listdir(root):
        if f.endswith(".toml"):
            load(os.path.join(root, f))


def test_warmup_adds_its_allreduces_and_restarts_consensus(small_dataset, tmp_path):
    cfg = cfg_for(small_dataset, tmp_path / "r", "ibt", n=2,
                  **{"algorithm.warmup_steps": 5})
    t = Trainer(cfg, log=lambda m: None)
    init = t.model.params.copy()
    s = t.run()
    assert s["allreduce_calls"] == t.total_blocks + 5
    assert not np.array_equal(init, t.z)


def test_progress_lines_follow_the_clock_and_estimate_the_rest():
    from ibtmpi.monitor import Progress
    t = [100.0]
    lines = []
    pr = Progress(total=10, start=2, every_s=60, log=lines.append, clock=lambda: t[0])

    def rec(k):
        return {"samples": 50, "pass": k // 5, "block_in_pass": k % 5, "train_loss": 0.5}
    t[0] = 130.0
    pr.block_done(2, rec(2), 5)            # 30 s: too soon
    assert lines == []
    t[0] = 160.0
    pr.block_done(3, rec(3), 5)            # 60 s, 2 blocks done, 6 left
    assert lines == ["block 4/10 (pass 1, 4/5): train loss 0.5000, 2 img/s, "
                     "0:01:00 elapsed, about 0:03:00 left"]
    t[0] = 230.0                           # with the workers' memory figures
    pr.block_done(3, dict(rec(3), peak_rss_mib=[300.4, 320.2], gpu_pool_mib=[0.5, 0.9]), 5)
    assert lines[-1].endswith("left; a worker's peak RSS up to 320 MiB, its CuPy pool up "
                              "to 0.9 MiB"), lines[-1]
    del lines[-1]
    t[0] = 400.0
    pr.block_done(4, rec(4), 5)            # a pass's last block: the pass line says it
    assert len(lines) == 1
    t[0] = 430.0
    pr.block_done(5, rec(5), 5)            # 30 s after the pass line: too soon
    assert len(lines) == 1
    off = Progress(10, 0, 0, lines.append, clock=lambda: t[0])
    t[0] = 1e6
    off.block_done(0, rec(0), 5)
    assert len(lines) == 1


@pytest.mark.parametrize("extra,expect", [([], True), (["run.progress_s=0"], False),
                                          (["run.quiet=true"], False)])
def test_progress_lines_in_a_log(small_dataset, tmp_path, capsys, extra, expect):
    """stderr is not a terminal under pytest: the batch-log lines appear
    unless progress_s = 0 or quiet; the run's digest ignores progress_s."""
    from ibtmpi.config import run_hash
    sets = [f"data.path={small_dataset}", "data.split_size=40", "model.layers=tiny",
            f"run.dir={tmp_path}", "run.simulate=2", "run.passes=1"]
    cfg = load(None, sets + ["run.progress_s=1e-9"] + extra)
    logs = []
    Trainer(cfg, log=logs.append).run()
    got = [m for m in logs if m.startswith("block ")]
    assert bool(got) == expect, logs
    if expect:
        assert got[0].startswith("block 1/") and "left" in got[0]
    assert run_hash(cfg) == run_hash(load(None, sets))


ADAMW = {"optim.name": "adamw", "optim.lr": 3e-3, "optim.weight_decay": 0.01}


def test_adamw_inner_optimizer_trains_ibt(small_dataset, tmp_path):
    """ibt with 3 simulated workers, each with its own AdamW state swapped in
    and out: measured train loss 1.71 in the first block, 1.46 in the last
    (2 passes)."""
    t = Trainer(cfg_for(small_dataset, tmp_path / "r", "ibt", n=3, **ADAMW),
                log=lambda m: None)
    t.run()
    losses = [r["train_loss"] for r in t.history]
    assert np.isfinite(t.z).all()
    assert np.mean(losses[-2:]) < losses[0] - 0.1
    assert t.history[-1]["algorithm"] == "ibt"


def test_adamw_resume_is_bitwise_the_uninterrupted_run(small_dataset, tmp_path):
    """Each worker's m, v and step count t are checkpointed (m_<i>, v_<i>,
    t_<i>) and resumed: one pass, then resumed to two, gives the z of two
    passes straight."""
    from ibtmpi import checkpoint as ckpt
    extra = dict(ADAMW, **{"run.checkpoint_every": 1})
    straight = Trainer(cfg_for(small_dataset, tmp_path / "a", "ibt", n=2, **extra),
                       log=lambda m: None)
    straight.run()
    last = ckpt.complete(str(tmp_path / "a"))[-1]
    f = os.path.join(ckpt.ckpt_dir(str(tmp_path / "a"), last), ckpt.rank_file(0))
    with np.load(f) as z:
        assert {"m_0", "v_1", "t_0", "t_1"} <= set(z.files)
        assert z["t_1"].dtype == np.int64 and z["t_1"][0] > straight.total_blocks
        assert z["m_0"].any() and z["v_1"].all()
    half = Trainer(cfg_for(small_dataset, tmp_path / "b", "ibt", n=2,
                           **extra, **{"run.passes": 1}), log=lambda m: None)
    half.run()
    again = Trainer(cfg_for(small_dataset, tmp_path / "b", "ibt", n=2, **extra),
                    log=lambda m: None)
    again.run()
    assert again.start > 0
    assert again.z.tobytes() == straight.z.tobytes()


@pytest.mark.parametrize("name,reset_state,kept", [
    ("sgd", "auto", False), ("sgd", "false", True),
    ("adamw", "auto", True), ("adamw", "true", False)])
def test_reset_state_decides_whether_the_inner_state_survives_a_sync(
        small_dataset, tmp_path, name, reset_state, kept):
    """What each worker's optimizer holds when its local steps start: from
    the second block on, the state left by its previous block (kept) or
    zeros (reset; sgd's default, as before optim.reset_state existed)."""
    t = Trainer(cfg_for(small_dataset, tmp_path / "r", "ibt", n=2,
                        **dict(ADAMW, **{"optim.name": name,
                                         "optim.reset_state": reset_state})),
                log=lambda m: None)
    seen = []
    run_steps = t.workers.run_steps

    def spy(mbs, feed=None):
        seen.append({k: t._host(v).copy() for k, v in t.opt.state().items()})
        return run_steps(mbs, feed)
    t.workers.run_steps = spy
    t.run()
    assert len(seen) == 2 * t.total_blocks
    assert not any(v.any() for v in seen[0].values())       # block 0: fresh
    later = seen[2:]
    key = "v" if name == "sgd" else "m"
    assert all(s[key].any() == kept for s in later)
    if name == "adamw":
        assert all((s["t"][0] > 0) == kept for s in later)


@pytest.mark.parametrize("lr,warned", [(1.0, True), (1e-9, True), (0.05, False)])
def test_a_run_stuck_at_chance_says_so_once(small_dataset, tmp_path, lr, warned):
    """A run whose training loss is no better than ln(classes) from its
    second pass on (lr 1: dead ReLUs, the loss at chance; lr 1e-9: nothing
    moves from the initial loss, above chance) gets one warning and goes on;
    a run that learns gets none."""
    sets = [f"data.path={small_dataset}", "data.split_size=40", "model.layers=tiny",
            f"run.dir={tmp_path}", "run.simulate=2", "run.passes=3", f"optim.lr={lr}"]
    logs = []
    t = Trainer(load(None, sets), log=logs.append)
    t.run()
    said = [m for m in logs if "has learned nothing" in m]
    assert len(said) == int(warned), logs
    assert len([h for h in t.history if h["block_in_pass"] == 0]) == 3    # it went on
    if warned:
        assert said[0].startswith("warning: pass 2's training loss ")
        assert "(ln 5 = 1.6094)" in said[0] and f"optim.lr (now {lr:g})" in said[0]


def test_ssgd_divergence_is_reported_not_a_crash(small_dataset, tmp_path):
    """ssgd has no rho: its divergence message advises a lower lr alone
    (it raised AttributeError on uses_rho before)."""
    from ibtmpi.errors import Diverged
    c = load(None, [f"data.path={small_dataset}", "algorithm.name=ssgd", "optim.lr=1e6",
                    "model.layers=tiny", "run.simulate=2", "run.quiet=true",
                    f"run.dir={tmp_path / 'r'}", "run.threads=1", "data.split_size=40"])
    with pytest.raises(Diverged, match=r"Lower optim.lr \(now 1e\+06\): a resume"):
        Trainer(c, log=lambda m: None).run()


def test_a_finished_trainer_goes_with_its_last_reference(small_dataset, tmp_path):
    """The parts built with callbacks into the trainer hold it weakly: no
    reference cycle keeps it (and its data set's open HDF5 files) alive
    until the next garbage collection, so a run's shards can be changed
    the moment it returns."""
    import gc
    import weakref
    was = gc.isenabled()
    gc.disable()
    try:
        t = Trainer(cfg_for(small_dataset, tmp_path / "r", "ibt", n=2), log=lambda m: None)
        t.run()
        ref = weakref.ref(t)
        del t
        assert ref() is None
    finally:
        if was:
            gc.enable()


def test_the_consensus_state_alone_restarts_whole_and_loads_its_buffers():
    """ConsensusState with no trainer: a restart makes the new consensus's
    z the state's; agreed buffers are loaded into the model at once."""
    from ibtmpi import consensus
    from ibtmpi.model import Model
    from ibtmpi.train.trainer import ConsensusState
    m = Model("resnet8", (3, 8, 8), 3, seed=0)
    old = consensus.make_consensus("ibt", np.zeros(4, np.float32), 2, {})
    s = ConsensusState(old, old.z, np.zeros(m.n_buffers, np.float32))
    new = consensus.make_consensus("ibt", np.ones(4, np.float32), 2, {})
    s.restart(new)
    assert s.cons is new and s.z is new.z and s.z[0] == 1.0
    agreed = np.arange(m.n_buffers, dtype=np.float32)
    s.set_buffers(agreed, m)
    assert s.zbuf is agreed and np.array_equal(m.buffers, agreed)
