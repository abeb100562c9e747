"""Honest time: a block's wall runs from the end of the previous block to its
own end on the master, everything the master did in between included, so
no block reads less than its slowest worker's compute and the blocks add
up to the training's elapsed time; the master's own work and its wait are
reported apart, and a master that keeps its workers waiting is named."""
import json
import os
import subprocess

import pytest

from conftest import IBTMPI, MPIEXEC, mpiexec, train_args

pytestmark = pytest.mark.skipif(not os.path.exists(MPIEXEC), reason="no mpiexec in the venv")


@pytest.fixture(scope="module")
def data32(tmp_path_factory):
    from ibtmpi.data_prep.prep import prep_synth
    out = str(tmp_path_factory.mktemp("ds") / "synth32")
    prep_synth(out, n=1000, size=32, seed=3, shards=2, quiet=True)
    return out


def _train(data, run, **sets):
    r = subprocess.run(mpiexec(3) + IBTMPI + ["train"] + train_args(data, run, **sets),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    recs = [json.loads(x) for x in open(os.path.join(run, "metrics.jsonl"))]
    return r.stdout, recs, json.load(open(os.path.join(run, "summary.json")))


def test_block_walls_cover_compute_and_add_up(data32, tmp_path):
    """The case measured on 2026-12-04: mpiexec -n 3, 2 passes, a checkpoint
    and an evaluation every block: the walls added up to 42% of the elapsed
    time and 7 of 8 blocks read less than the slowest worker's compute."""
    out, recs, s = _train(data32, str(tmp_path / "r"), passes=2, **{
        "model.layers": "reference", "data.split_size": 100, "run.checkpoint_every": 1,
        "run.eval_every": 1})
    assert len(recs) == 8
    for r in recs:
        assert r["wall_s"] >= r["compute_max_s"], r
        assert 0 < r["master_busy_s"] and 0 <= r["master_slack_s"]
        assert r["master_busy_s"] + r["master_slack_s"] <= r["wall_s"] + 1e-6
    walls = sum(r["wall_s"] for r in recs)
    # the last block's own tail (its checkpoint, metrics) is the last pass's
    assert sum(s["pass_s"]) == pytest.approx(walls + s["tail_s"], rel=1e-5)
    assert abs(sum(s["pass_s"]) - s["wall_s"]) <= 0.03 * s["wall_s"], (s["pass_s"], s["wall_s"])
    assert s["tail_s"] <= max(r["wall_s"] for r in recs)
    assert s["startup_s"] > 0 and s["final_eval_s"] > 0
    # the start-up split into its parts (each at its slowest rank), all of it
    parts = s["startup_parts"]
    assert set(parts) == {"launch and imports", "data", "model", "agreement and resume"}
    assert min(parts.values()) >= 0 and parts["launch and imports"] > 0 and parts["data"] > 0
    assert sum(parts.values()) >= s["startup_s"] - 0.01
    line = [x for x in out.splitlines() if x.startswith("start-up ")][0]
    # the line shows the same figure to its one decimal (the summary rounds
    # to 3 decimals, which may round 0.6499 up across the line's 0.65 edge)
    shown = float(line.split()[1])
    assert line.startswith(f"start-up {shown:.1f} s: launch and imports"), line
    assert abs(shown - s["startup_s"]) <= 0.05 + 1e-9, (line, s["startup_s"])
    # the pass lines read the same honest figures
    for p, secs in enumerate(s["pass_s"][:-1]):
        assert f"pass {p + 1}: train loss" in out
        line = [x for x in out.splitlines() if x.startswith(f"pass {p + 1}:")][0]
        assert f", {secs:.1f} s" in line, line


def test_a_master_that_keeps_fast_workers_waiting_is_named(small_dataset, tmp_path):
    """GPU-fast workers emulated on the CPU: the tiny model, one minibatch
    of 8 per split (about a millisecond of compute), while the master
    checkpoints and evaluates every block: its own work outlasts the
    workers' compute, which the log, summary.json and status say."""
    run = str(tmp_path / "r")
    out, recs, s = _train(small_dataset, run, passes=4, **{
        "data.split_size": 8, "data.batch": 8, "run.checkpoint_every": 1,
        "run.eval_every": 1, "run.quiet": "false", "run.progress_s": 0})
    said = [x for x in out.splitlines() if x.startswith("master: ")]
    assert len(said) == 1, out[-3000:]
    assert "outlasted the workers' compute" in said[0] and "the workers wait for it" in said[0]
    assert s["master_late_blocks"] >= 8
    late = [r for r in recs if r["master_busy_s"]
            > 1.05 * (r["compute_max_s"] + r["data_wait_max_s"]) + 1e-3]
    assert len(late) >= s["master_late_blocks"] * 0.9
    st = subprocess.run(IBTMPI + ["status", run], capture_output=True, text=True,
                        timeout=60).stdout
    assert "the workers wait for it" in st, st


def test_one_process_does_not_blame_its_master(small_dataset, tmp_path):
    """--simulate: the master computes too; its busy time is no delay."""
    r = subprocess.run(IBTMPI + ["train", "--simulate", "2"] + train_args(
        small_dataset, str(tmp_path / "r"), passes=2, **{
            "data.split_size": 8, "data.batch": 8, "run.checkpoint_every": 1,
            "run.eval_every": 1}), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "master: " not in r.stdout
    s = json.load(open(tmp_path / "r" / "summary.json"))
    assert s["master_late_blocks"] == 0


def test_a_checkpoint_written_in_the_background_fails_as_its_own(small_dataset, tmp_path,
                                                                 monkeypatch, capsys):
    """The checkpoint's file is written by a thread while the next block
    computes; a full disk there still ends the job with exit 74 naming
    the checkpoint's block and phase, and the complete checkpoint before it
    is kept."""
    import errno
    from ibtmpi import checkpoint as ckpt
    from ibtmpi.cli import main
    real = ckpt.write_rank

    def full_at_block_3(run_dir, block, rank, arrays):
        if block == 3:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC),
                          os.path.join(ckpt.ckpt_dir(run_dir, block), ckpt.rank_file(rank)))
        return real(run_dir, block, rank, arrays)
    monkeypatch.setattr(ckpt, "write_rank", full_at_block_3)
    run = tmp_path / "r"
    rc = main(["train", "--simulate", "2"] + train_args(small_dataset, str(run), passes=2, **{
        "run.checkpoint_every": 2}))
    err = capsys.readouterr().err
    assert rc == 74, err
    assert "ckpt-00000003/rank-00000.npz: No space left on device (block 3, phase " \
           "checkpoint)" in err, err
    assert ckpt.complete(str(run))[-1] == 1
