"""One run per run directory: a live holder stops a second run at once
(exit 2, naming it, under mpiexec too); a provably dead holder's lock is
taken over; the lock goes when the run ends."""
import json
import os
import socket
import subprocess
import sys
import time

import pytest

from ibtmpi import runlock
from conftest import IBTMPI, MPIEXEC, mpiexec, train_args

from ibtmpi.cli import main


def hold(run_dir, host=None, pid=None, job=None, age=0.0):
    """A lock file as another run would leave it."""
    os.makedirs(run_dir, exist_ok=True)
    path = os.path.join(run_dir, runlock.NAME)
    with open(path, "w") as f:
        json.dump({"host": host or socket.gethostname(), "pid": pid, "job": job,
                   "started": "2026-01-01T00:00:00Z", "token": "other"}, f)
    if age:
        t = time.time() - age
        os.utime(path, (t, t))
    return path


@pytest.fixture
def live_pid():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield p.pid
    p.kill()
    p.wait()


@pytest.fixture
def dead_pid():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_a_live_holder_on_this_host_stops_a_second_run(tmp_path, live_pid):
    path = hold(str(tmp_path), pid=live_pid, job="slurm:77")
    with pytest.raises(runlock.RunDirBusy) as e:
        runlock.acquire(str(tmp_path))
    msg = str(e.value)
    assert f"in use by pid {live_pid} on {socket.gethostname()} (batch job slurm:77)" in msg
    assert f"delete {path}" in msg
    assert json.load(open(path))["token"] == "other"          # left alone


def test_a_dead_holder_on_this_host_is_taken_over_and_released(tmp_path, dead_pid):
    path = hold(str(tmp_path), pid=dead_pid)
    lock = runlock.acquire(str(tmp_path))
    assert lock.took_over == f"process {dead_pid} is no longer running"
    assert json.load(open(path))["pid"] == os.getpid()
    lock.release()
    assert not os.path.exists(path)


def test_another_host(tmp_path, monkeypatch):
    hold(str(tmp_path), host="node-elsewhere", pid=1, age=30)
    with pytest.raises(runlock.RunDirBusy, match="heartbeat 30 s ago"):
        runlock.acquire(str(tmp_path))
    # no heartbeat for longer than STALE_S: gone
    hold(str(tmp_path), host="node-elsewhere", pid=1, age=runlock.STALE_S + 5)
    lock = runlock.acquire(str(tmp_path))
    assert lock.took_over.startswith("no heartbeat for 60")
    lock.release()
    # a Slurm requeue: the same job id, its earlier run on another node
    hold(str(tmp_path), host="node-elsewhere", pid=1, job="slurm:42", age=5)
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    lock = runlock.acquire(str(tmp_path))
    assert lock.took_over == "left by an earlier run of this job (slurm:42, requeued)"
    lock.release()


def test_the_same_job_alive_on_this_host_is_still_busy(tmp_path, live_pid, monkeypatch):
    """Two steps of one allocation on one node with one run.dir: not a requeue."""
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    hold(str(tmp_path), pid=live_pid, job="slurm:42")
    with pytest.raises(runlock.RunDirBusy):
        runlock.acquire(str(tmp_path))


def test_heartbeat_and_release_only_removes_our_own_lock(tmp_path, monkeypatch):
    monkeypatch.setattr(runlock, "HEARTBEAT_S", 0.05)
    lock = runlock.acquire(str(tmp_path))
    t = time.time() - 1000
    os.utime(lock.path, (t, t))
    deadline = time.time() + 10
    while os.stat(lock.path).st_mtime < time.time() - 100 and time.time() < deadline:
        time.sleep(0.02)
    assert os.stat(lock.path).st_mtime > time.time() - 100        # refreshed
    hold(str(tmp_path), pid=1)                                      # someone else's now
    lock.release()
    assert json.load(open(lock.path))["token"] == "other"


def sets(data, run_dir, passes=1):
    return train_args(data, run_dir, passes)


def test_train_on_a_held_directory_is_exit_2_and_trains_nothing(small_dataset, tmp_path,
                                                                 live_pid, capsys):
    run = str(tmp_path / "r")
    hold(run, pid=live_pid)
    assert main(["train"] + sets(small_dataset, run)) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"ibtmpi train: error: run.dir {run} is in use by pid {live_pid}")
    assert sorted(os.listdir(run)) == [runlock.NAME]             # nothing written


def test_train_takes_over_a_dead_runs_lock_and_leaves_none(small_dataset, tmp_path,
                                                           dead_pid, capsys):
    run = str(tmp_path / "r")
    hold(run, pid=dead_pid)
    assert main(["train"] + sets(small_dataset, run)) == 0
    out = capsys.readouterr().out
    assert f"took over {run}/{runlock.NAME}: process {dead_pid} is no longer running" in out
    assert not os.path.exists(os.path.join(run, runlock.NAME))
    assert os.path.exists(os.path.join(run, "model.npz"))




@pytest.mark.skipif(not os.path.exists(MPIEXEC), reason="no mpiexec in the venv")
def test_under_mpiexec_a_held_directory_ends_every_rank_at_once(small_dataset, tmp_path,
                                                                live_pid):
    run = str(tmp_path / "r")
    hold(run, pid=live_pid)
    t0 = time.time()
    r = subprocess.run(mpiexec(3) + IBTMPI + ["train"]
                       + sets(small_dataset, run), capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2, r.stderr
    assert time.time() - t0 < 60
    assert "is in use by pid" in r.stderr and "Traceback" not in r.stderr


def test_a_zombie_holder_is_dead(tmp_path):
    """A rank killed by an MPI abort is a zombie until reaped: not alive."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.time() + 10
    while time.time() < deadline:            # exited, not yet reaped (no wait())
        with open(f"/proc/{p.pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                break
        time.sleep(0.02)
    try:
        hold(str(tmp_path), pid=p.pid)
        lock = runlock.acquire(str(tmp_path))
        assert lock.took_over == f"process {p.pid} is no longer running"
        lock.release()
    finally:
        p.wait()


def _race(run_dir, start, out):
    """One starter of the race: wait for the start, try the lock, report."""
    lock = runlock.RunLock(run_dir)
    while time.time() < start:
        pass
    try:
        lock.acquire()
        out.put(("won", os.getpid()))
        time.sleep(1.0)                  # hold it while the others judge it
        lock.release()
    except runlock.RunDirBusy as e:
        out.put(("busy", str(e)))


def test_starters_racing_for_a_dead_runs_lock_leave_exactly_one_holder(tmp_path, dead_pid):
    """4 starters at once on a lock left by a dead pid: exactly one takes it
    over and the others are told who holds it (before: two winners in 70 of
    150 trials)."""
    import multiprocessing as mp
    ctx = mp.get_context("fork")
    for trial in range(12):
        run = str(tmp_path / f"r{trial}")
        hold(run, pid=dead_pid)
        out = ctx.Queue()
        start = time.time() + 0.3
        procs = [ctx.Process(target=_race, args=(run, start, out)) for _ in range(4)]
        for p in procs:
            p.start()
        got = [out.get(timeout=60) for _ in procs]
        for p in procs:
            p.join(timeout=60)
        won = [g for g in got if g[0] == "won"]
        assert len(won) == 1, (trial, got)
        assert all("is in use by pid" in g[1] for g in got if g[0] == "busy"), got
        assert not os.path.exists(os.path.join(run, runlock.NAME + ".break"))


def test_a_take_over_lock_left_by_a_dead_starter_expires(tmp_path, dead_pid, monkeypatch):
    run = str(tmp_path / "r")
    hold(run, pid=dead_pid)
    brk = os.path.join(run, runlock.NAME + ".break")
    open(brk, "w").close()
    t = time.time() - runlock.BREAK_STALE_S - 1
    os.utime(brk, (t, t))
    lock = runlock.acquire(run)
    assert lock.took_over and not os.path.exists(brk)
    lock.release()
    open(brk, "w").close()                       # a fresh one: wait, then give up
    hold(run, pid=dead_pid)
    monkeypatch.setattr(runlock, "ACQUIRE_S", 0.3)
    with pytest.raises(runlock.RunDirBusy, match=r"\.lock\.break is left behind"):
        runlock.acquire(run)
