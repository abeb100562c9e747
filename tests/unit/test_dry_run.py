"""train --dry-run: the checks of a real start (config, data, run directory
and its lock, the checkpoint to resume from) with nothing trained or written,
and a plan whose figures are the real run's."""
import json
import os
import subprocess

import pytest

from ibtmpi import checkpoint as ckpt
from ibtmpi import runlock
from conftest import IBTMPI, MPIEXEC, mpiexec, train_args

from ibtmpi.cli import main



def sets(data, run_dir, passes=1, **extra):
    return train_args(data, run_dir, passes, **{"algorithm.name": "admm", **extra})


def snapshot(d):
    """Every path under d with its size and mtime."""
    out = {}
    for root, dirs, files in os.walk(d):
        for f in dirs + files:
            p = os.path.join(root, f)
            st = os.stat(p)
            out[p] = (st.st_size, st.st_mtime_ns)
    return out


def test_dry_run_plans_the_real_run_and_writes_nothing(small_dataset, tmp_path, capsys):
    run = str(tmp_path / "new" / "r")
    assert main(["train", "--dry-run", "--simulate", "2"] + sets(small_dataset, run)) == 0
    out = capsys.readouterr().out
    assert not os.path.exists(tmp_path / "new")            # not even the directory
    # 600 images: 480 train, 240 per worker, split 40: 6 blocks per pass
    assert "job: admm, 2 workers simulated in one process; workers compute on cpu" in out
    assert f"data: {small_dataset}: train 480, val 60, test 60 images 16x16x3, 5 classes" in out
    assert ("split 40 per worker (block 80), batch 16, 240 samples per worker: 6 blocks "
            "per pass, 3 steps per block; 6 blocks for 1 pass(es)") in out
    assert "6 Allreduce(s) per pass (one per block)" in out
    assert "start from block 0" in out and f"run.dir: {run}: free" in out
    assert "evaluation: z on val every 6 block(s); the best kept as model-best.npz\n" in out
    assert "lr: constant 0.02" in out and "diagnostics:" not in out
    assert main(["train", "--dry-run", "--simulate", "2", "--set", "run.timeline=true",
                 "--set", "run.early_stop=2", "--set", "run.early_stop_delta=0.01"]
                + sets(small_dataset, run)) == 0
    out = capsys.readouterr().out
    assert "diagnostics: timeline of every rank (timeline.json)\n" in out
    assert ("early stop after 2 evaluations without a better one (val accuracy up by "
            "more than 0.01)") in out
    # the real run does what the plan said
    assert main(["train", "--simulate", "2"] + sets(small_dataset, run)) == 0
    capsys.readouterr()
    recs = [json.loads(x) for x in open(os.path.join(run, "metrics.jsonl"))]
    assert len(recs) == 6 and {r["samples"] for r in recs} == {80}
    summary = json.load(open(os.path.join(run, "summary.json")))
    assert summary["allreduce_calls"] == 6
    # a longer run would resume; the directory is left exactly as it was
    before = snapshot(run)
    assert main(["train", "--dry-run", "--simulate", "2"]
                + sets(small_dataset, run, passes=2)) == 0
    out = capsys.readouterr().out
    last = ckpt.complete(run)[-1]
    assert f"resume from {ckpt.ckpt_dir(run, last)} ({last + 1}/12 blocks done; next: block {last + 1})" in out
    assert snapshot(run) == before


def test_dry_run_fails_where_the_run_would(small_dataset, tmp_path, capsys):
    run = str(tmp_path / "r")
    assert main(["train", "--simulate", "2"] + sets(small_dataset, run)) == 0
    capsys.readouterr()
    # another configuration in the same directory (the batch: the data order;
    # optim.lr may change on a resume since hardening round 2, and says so)
    assert main(["train", "--dry-run", "--simulate", "2"]
                + sets(small_dataset, run, **{"data.batch": 8})) == 2
    assert ("written by another configuration (data.batch: 16 in the checkpoint, 8 "
            "now)") in capsys.readouterr().err
    assert main(["train", "--dry-run", "--simulate", "2"]
                + sets(small_dataset, run, **{"optim.lr": 0.5})) == 0
    assert ("would resume with changed settings at block 6: optim.lr 0.02 -> 0.5"
            in capsys.readouterr().out)
    # another worker count
    assert main(["train", "--dry-run", "--simulate", "3"] + sets(small_dataset, run)) == 2
    assert "was written by 2 worker(s)" in capsys.readouterr().err
    # a live run holds the directory
    with open(os.path.join(run, runlock.NAME), "w") as f:
        json.dump({"host": os.uname().nodename, "pid": os.getppid(), "job": None}, f)
    assert main(["train", "--dry-run", "--simulate", "2"] + sets(small_dataset, run)) == 2
    assert f"is in use by pid {os.getppid()}" in capsys.readouterr().err
    os.remove(os.path.join(run, runlock.NAME))
    # a run.dir that cannot be made
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["train", "--dry-run"] + sets(small_dataset, str(blocker / "r"))) == 2
    assert "cannot be created" in capsys.readouterr().err


@pytest.mark.skipif(not os.path.exists(MPIEXEC), reason="no mpiexec in the venv")
def test_dry_run_under_mpiexec_reads_every_ranks_checkpoint(small_dataset, tmp_path):
    run = str(tmp_path / "r")
    cmd = mpiexec(3) + IBTMPI + ["train"]
    every = {"run.checkpoint_every": 3}          # two complete checkpoints: 2 and 5
    r = subprocess.run(cmd + sets(small_dataset, run, **every), capture_output=True,
                       text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    last = ckpt.complete(run)[-1]
    where = ckpt.ckpt_dir(run, last)
    with open(os.path.join(where, ckpt.rank_file(2)), "wb") as f:
        f.write(b"damaged")                      # rank 2's file only
    before = snapshot(run)
    r = subprocess.run(cmd + ["--dry-run"] + sets(small_dataset, run, passes=2, **every),
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    assert last == 5 and ckpt.complete(run) == [2, 5]
    assert "job: admm, 2 workers, 3 processes (rank 0 the master)" in r.stdout
    assert f"checkpoint {where} cannot be read (rank 2:" in r.stdout
    assert "a run would set it aside" in r.stdout
    assert f"resume from {ckpt.ckpt_dir(run, 2)} (3/12 blocks done; next: block 3)" in r.stdout
    assert snapshot(run) == before               # nothing set aside, nothing written


def test_rerun_of_a_finished_run_keeps_its_summary_and_model(small_dataset, tmp_path, capsys):
    """The same command again on a finished run trains nothing and must not
    overwrite the real summary (its wall time and test accuracy) with an
    empty segment's; raising run.passes trains on and the summary says where
    it resumed and the time of every block."""
    run = str(tmp_path / "r")
    argv = ["train", "--simulate", "2"] + sets(small_dataset, run)
    assert main(argv) == 0
    capsys.readouterr()
    files = {f: open(os.path.join(run, f), "rb").read() for f in ("summary.json", "model.npz")}
    assert main(argv) == 0
    out = capsys.readouterr().out
    acc = json.loads(files["summary.json"])["test_acc"]
    assert (f"{run} already holds 6 trained blocks, this run asks for 6 (test accuracy "
            f"{acc:.4f}): nothing to train") in out
    for f, data in files.items():
        assert open(os.path.join(run, f), "rb").read() == data, f
    assert main(["train", "--simulate", "2"] + sets(small_dataset, run, passes=2)) == 0
    s = json.load(open(os.path.join(run, "summary.json")))
    recs = [json.loads(x) for x in open(os.path.join(run, "metrics.jsonl"))]
    assert s["blocks"] == 12 and s["resumed_at_block"] == 6 and len(recs) == 12
    assert s["blocks_wall_s"] == pytest.approx(sum(r["wall_s"] for r in recs))
