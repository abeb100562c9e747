"""ibtmpi status: the state of a run directory read from its files, for
every state a job can leave it in."""
import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from ibtmpi import checkpoint as ckpt
from ibtmpi import runlock
from conftest import train_args

from ibtmpi.cli import main


def sets(data, run_dir, passes):
    return train_args(data, run_dir, passes, **{"algorithm.name": "admm",
                                                 "run.checkpoint_every": 3})


@pytest.fixture(scope="module")
def finished(small_dataset, tmp_path_factory):
    """A 2-pass run (12 blocks) that finished."""
    run = str(tmp_path_factory.mktemp("status") / "done")
    assert main(["train", "--simulate", "2"] + sets(small_dataset, run, 2)) == 0
    return run


def status(capsys, *runs, json_out=False):
    rc = main(["status", *(["--json"] if json_out else []), *runs])
    got = capsys.readouterr()
    return rc, got.out, got.err


def halfway(finished, dst):
    """The run as it was after 9 of its 12 blocks, checkpoint 8 complete."""
    shutil.copytree(finished, dst)
    os.remove(os.path.join(dst, "summary.json"))
    lines = open(os.path.join(dst, "metrics.jsonl")).readlines()[:9]
    open(os.path.join(dst, "metrics.jsonl"), "w").writelines(lines)
    shutil.rmtree(ckpt.ckpt_dir(dst, 11))
    return str(dst)


def test_finished(finished, capsys):
    rc, out, _ = status(capsys, finished)
    acc = json.load(open(os.path.join(finished, "summary.json")))["test_acc"]
    assert rc == 0
    assert out.startswith(f"{finished}: admm, N=2: finished: 12/12 blocks (100%), "
                          f"test acc {acc:.4f} in ")


def test_running_with_time_left(finished, tmp_path, capsys):
    run = halfway(finished, tmp_path / "r")
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with open(os.path.join(run, runlock.NAME), "w") as f:
            json.dump({"host": os.uname().nodename, "pid": p.pid, "job": "slurm:9"}, f)
        rc, out, _ = status(capsys, run)
        recs = [json.loads(x) for x in open(os.path.join(run, "metrics.jsonl"))]
        per_block = sum(r["wall_s"] for r in recs[-9:]) / 9
        assert f"running (pid {p.pid} on {os.uname().nodename}, slurm:9; heartbeat " in out
        assert "9/12 blocks (75%), about " in out and "val acc" in out
        rc, out, _ = status(capsys, run, json_out=True)
        info = json.loads(out)
        assert info["state"] == "running" and info["blocks_done"] == 9
        assert info["block_s"] == pytest.approx(per_block)
    finally:
        p.kill()
        p.wait()
    # the holder is gone: stopped, and where a rerun resumes
    rc, out, _ = status(capsys, run)
    assert (f"stopped after 9/12 blocks (75%), not running; a rerun resumes from "
            f"{ckpt.ckpt_dir(run, 8)}") in out


def test_failed_and_not_started_and_missing(finished, tmp_path, capsys):
    run = halfway(finished, tmp_path / "f")
    time.sleep(0.01)
    with open(os.path.join(run, "error-rank-1.txt"), "w") as f:
        f.write("[rank 1] ibtmpi train failed in block 9, phase compute:\n...")
    rc, out, _ = status(capsys, run)
    assert (f"failed after 9/12 blocks (75%) (see error-rank-1.txt); a rerun resumes "
            f"from {ckpt.ckpt_dir(run, 8)}") in out
    empty = tmp_path / "empty"
    empty.mkdir()
    rc, out, err = status(capsys, str(empty), str(tmp_path / "nope"))
    assert rc == 2
    assert out == f"{empty}: not started (no block done)\n"
    assert f"ibtmpi status: error: {tmp_path / 'nope'} is not a directory" in err


def test_a_dataset_is_not_taken_for_a_run(small_dataset, capsys):
    rc, out, err = status(capsys, small_dataset)
    assert rc == 2 and out == ""
    assert f"{small_dataset} is a dataset (it holds dataset.json), not a run directory" in err
