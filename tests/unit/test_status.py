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
    last = json.loads(open(os.path.join(finished, "metrics.jsonl")).readlines()[-1])
    assert f"; a worker's peak RSS up to {max(last['peak_rss_mib']):.0f} MiB" in out
    assert "CuPy pool" not in out                  # a CPU run


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
        assert f"a worker's peak RSS up to {max(recs[-1]['peak_rss_mib']):.0f} MiB" in out
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
        f.write("[rank 1] ibtmpi train failed in block 9, phase compute:\nTraceback (most "
                "recent call last):\n  File x, line 1\nValueError: bad thing\n\n")
    rc, out, _ = status(capsys, run)
    assert (f"failed after 9/12 blocks (75%): [rank 1] ibtmpi train failed in block 9, "
            f"phase compute: ValueError: bad thing (see error-rank-1.txt); a rerun resumes "
            f"from {ckpt.ckpt_dir(run, 8)}") in out
    oom = "[rank 1] ibtmpi train: out of memory (GPU 0) in block 9, phase compute: x. Lower"
    with open(os.path.join(run, "error-rank-1.txt"), "w") as f:
        f.write(oom + "\n")
    rc, out, _ = status(capsys, run)
    assert f"failed after 9/12 blocks (75%): {oom} (see error-rank-1.txt)" in out
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


def test_a_straggling_worker_is_shown(finished, tmp_path, capsys):
    run = str(tmp_path / "s")
    shutil.copytree(finished, run)
    path = os.path.join(run, "metrics.jsonl")
    recs = [json.loads(l) for l in open(path)]
    for k, r in enumerate(recs):                 # worker 1 slow in all but one block
        r["compute_s"] = [1.0, 1.0, 1.0] if k == 5 else [1.0, 1.6, 1.0]
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in recs)
    rc, out, _ = status(capsys, run)
    assert rc == 0
    assert out.rstrip().endswith("worker 1 computed longest in 11 of the last 12 blocks "
                                 "(1.60x the median worker)")
    rc, out, _ = status(capsys, run, json_out=True)
    assert json.loads(out)["straggler"] == {"worker": 1, "blocks": 11, "of": 12,
                                            "ratio": 1.6}
    for r in recs:                               # evenly spread: nobody named
        r["compute_s"] = [1.0, 1.0, 1.6] if r["block"] % 2 else [1.0, 1.6, 1.0]
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in recs)
    rc, out, _ = status(capsys, run, json_out=True)
    assert "straggler" not in json.loads(out)


def test_workers_that_waited_for_cores_are_shown_from_the_summary(finished, tmp_path, capsys):
    """The trainer counts, per CPU worker, the blocks its process had a core
    for under 60% of its compute time (summary.json starved_blocks);
    status names the workers for which that was half the blocks or more."""
    run = str(tmp_path / "o")
    shutil.copytree(finished, run)
    path = os.path.join(run, "summary.json")
    s = json.load(open(path))
    assert s["starved_blocks"] == {}          # the tiny run: nobody
    s["starved_blocks"] = {"0": 12, "1": 9, "2": 5}
    json.dump(s, open(path, "w"))
    rc, out, _ = status(capsys, run)
    assert rc == 0 and out.rstrip().endswith(
        "; workers 0-1 waited for cores (CPU under 60% of compute time) in 9 of 12 blocks")
    rc, out, _ = status(capsys, run, json_out=True)
    assert json.loads(out)["starved"] == {"workers": [0, 1], "blocks": 9, "of": 12}


def test_workers_waiting_for_cores_are_shown_while_the_run_is_not_finished(
        finished, tmp_path, capsys):
    """The trainer lists the CPU workers starved in each block (metrics
    `starved`); for a run still going or cut off, status applies the live
    report's rule: starved in 8 of the last 10 blocks."""
    run = halfway(finished, tmp_path / "w")
    path = os.path.join(run, "metrics.jsonl")
    recs = [json.loads(l) for l in open(path)]
    assert not any("starved" in r for r in recs)      # the tiny run: nobody
    for k, r in enumerate(recs):                      # 9 blocks
        r["starved"] = [0, 1] if k != 4 else [1]      # 0 in 8, 1 in 9, 2 in none
        if k < 2:
            r["starved"].append(2)
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in recs)
    rc, out, _ = status(capsys, run)
    assert out.rstrip().endswith(
        "; workers 0-1 waited for cores (CPU under 60% of compute time) in 8 of the "
        "last 9 blocks"), out
    recs[1]["starved"] = [1]                          # worker 0 now in 7 of 9
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in recs)
    rc, out, _ = status(capsys, run, json_out=True)
    assert json.loads(out)["starved"] == {"workers": [1], "blocks": 9, "of": 9, "last": True}


def test_the_best_evaluation_is_named_when_it_is_not_the_last(small_dataset, tmp_path, capsys):
    run = str(tmp_path / "peaked")
    # lr 0.3 on the tiny model: val accuracy peaks before the end
    assert main(["train", "--simulate", "3"] + train_args(small_dataset, run, 3, **{
        "algorithm.name": "ma", "run.eval_every": 1, "optim.lr": 0.3,
        "run.checkpoint_every": 2})) == 0
    b = json.load(open(os.path.join(run, "summary.json")))["best"]
    rc, out, _ = status(capsys, run)
    assert rc == 0
    assert out.rstrip().endswith(f"; model-best.npz (block {b['block']}, val acc "
                                 f"{b['val_acc']:.4f}): test acc {b['test_acc']:.4f}")
    # with run.early_stop the finished line says why it ended early
    early = str(tmp_path / "early")
    assert main(["train", "--simulate", "3"] + train_args(small_dataset, early, 3, **{
        "algorithm.name": "ma", "run.eval_every": 1, "optim.lr": 0.3,
        "run.checkpoint_every": 2, "run.early_stop": 2})) == 0
    e = json.load(open(os.path.join(early, "summary.json")))
    rc, out, _ = status(capsys, early)
    n = e["stopped_early"]["after_block"] + 1
    assert f"finished: {n}/{n} blocks (100%)" in out
    assert f"(stopped early: {e['stopped_early']['reason']})" in out
    # the same run stopped (no summary, no lock): the best so far, from the metrics
    os.remove(os.path.join(run, "summary.json"))
    rc, out, _ = status(capsys, run)
    assert "stopped after" in out and out.rstrip().endswith(
        f", best val acc {b['val_acc']:.4f} at block {b['block']}")
