"""run.time_limit: the master stops the job with a checkpoint before the
time limit (exit 75, as a preemption), and the rerun ends with the same z
as an uninterrupted run; where the limit comes from (Slurm's end time,
squeue, a duration); durations parsed the way Slurm users write them."""
import json
import os
import subprocess
import time

import numpy as np
import pytest

from ibtmpi import checkpoint as ckpt
from ibtmpi.train import lifecycle as tr
from conftest import IBTMPI, MPIEXEC, mpiexec, train_args

from ibtmpi.cli import main
from ibtmpi.config import ConfigError, load, parse_duration


def sets(data, run_dir, passes, **extra):
    return train_args(data, run_dir, passes, **{"algorithm.name": "ibt", **extra})


def test_stops_before_the_limit_with_a_checkpoint_and_resumes_bitwise(
        small_dataset, tmp_path, capsys):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    assert main(["train", "--simulate", "2"] + sets(small_dataset, a, 30,
                                                    **{"run.time_limit": "none"})) == 0
    blocks = len(open(os.path.join(a, "metrics.jsonl")).readlines())
    took = json.load(open(os.path.join(a, "summary.json")))["blocks_wall_s"]
    capsys.readouterr()
    # a limit of about a third of the run
    limit = f"{max(took / 3, 0.2):.3f}s"
    t0 = time.time()
    rc = main(["train", "--simulate", "2"] + sets(small_dataset, b, 30,
                                                  **{"run.time_limit": limit}))
    dt = time.time() - t0
    out = capsys.readouterr().out
    assert rc == 75, out
    assert "time limit " in out and f"(run.time_limit = {limit})" in out
    assert "stopping after the next block with a checkpoint" in out
    done = len(open(os.path.join(b, "metrics.jsonl")).readlines())
    assert 0 < done < blocks
    assert dt < took + 5          # it did stop early, not at the end
    # the rerun (no limit) picks up there and ends as the uninterrupted run
    assert main(["train", "--simulate", "2"] + sets(small_dataset, b, 30,
                                                    **{"run.time_limit": "none"})) == 0
    assert "resuming from" in capsys.readouterr().out
    za = np.load(os.path.join(a, "model.npz"))["z"]
    zb = np.load(os.path.join(b, "model.npz"))["z"]
    assert za.tobytes() == zb.tobytes()


def test_where_the_limit_comes_from(tmp_path):
    now = lambda: 1000.0
    assert tr.resolve_deadline("90m", env={}, clock=now) == (6400.0, "run.time_limit = 90m")
    assert tr.resolve_deadline("none", env={"SLURM_JOB_END_TIME": "5000"}) == (None, "")
    assert tr.resolve_deadline("auto", env={}) == (None, "")
    assert tr.resolve_deadline("auto", env={"SLURM_JOB_END_TIME": "5000",
                                            "SLURM_JOB_ID": "7"}) == (5000.0, "the end of Slurm job 7")
    # older Slurm: no SLURM_JOB_END_TIME, squeue says when the job ends
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    sq = bin_dir / "squeue"
    sq.write_text("#!/bin/sh\n[ \"$3\" = 7 ] && echo 2030-01-02T03:04:05\n")
    sq.chmod(0o755)
    env = {"SLURM_JOB_ID": "7"}
    old = os.environ["PATH"]
    os.environ["PATH"] = f"{bin_dir}:{old}"
    try:
        end, src = tr.resolve_deadline("auto", env=env)
        sq.write_text("#!/bin/sh\necho UNLIMITED\n")
        assert tr.resolve_deadline("auto", env=env) == (None, "")
    finally:
        os.environ["PATH"] = old
    assert end == time.mktime((2030, 1, 2, 3, 4, 5, 0, 0, -1))
    assert src == "the end of Slurm job 7, from squeue"


@pytest.mark.parametrize("text,secs", [("45s", 45), ("90m", 5400), ("4h", 14400),
                                       ("2d", 172800), ("10:00", 600), ("1:30:00", 5400),
                                       ("2-00:00:00", 172800), ("1-12", 129600)])
def test_durations(text, secs):
    assert parse_duration(text) == secs


def test_bad_time_limits_are_config_errors():
    for bad in ("30", "soon", "0m", "1:2:3:4"):
        with pytest.raises(ConfigError, match="run.time_limit"):
            load(None, ["data.path=x", f"run.time_limit={bad}"])
    # TOML reads 01:30:00 as a time of day: taken as the duration it reads as
    assert load(None, ["data.path=x", "run.time_limit=01:30:00"])["run"]["time_limit"] \
        == "01:30:00"




@pytest.mark.skipif(not os.path.exists(MPIEXEC), reason="no mpiexec in the venv")
def test_under_mpiexec_every_rank_stops_at_the_same_block(small_dataset, tmp_path):
    run = str(tmp_path / "r")
    r = subprocess.run(mpiexec(3) + IBTMPI + ["train"]
                       + sets(small_dataset, run, 500, **{"run.time_limit": "3s",
                                                          "run.quiet": "false"}),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 75, r.stdout + r.stderr
    assert "stopped by the time limit (run.time_limit = 3s) after block" in r.stdout
    k = ckpt.complete(run)[-1]
    m = ckpt.read_manifest(run, k)
    assert m["n_workers"] == 2
    assert len(open(os.path.join(run, "metrics.jsonl")).readlines()) == k + 1
