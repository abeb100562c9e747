"""No rank hangs when another stops: a master stopped mid-run (SIGSTOP)
is found by the workers' own deadline, the job ends with one line and exit
1, and `ibtmpi status` says why; a stopped worker stays the master's to
name (tests/unit/test_job_endings.py)."""
import os
import signal
import subprocess
import time

import pytest

from conftest import IBTMPI, MPIEXEC, mpiexec, start_job, stop_rank_of_a_job, train_args

pytestmark = pytest.mark.skipif(not os.path.exists(MPIEXEC), reason="no mpiexec in the venv")


def test_a_stopped_master_is_found_by_the_workers(small_dataset, tmp_path):
    run = tmp_path / "run"
    p, out, err, took = stop_rank_of_a_job(small_dataset, run, 0, timeout=90)
    assert p.returncode == 1, err[-2000:]
    assert took < 40, took                  # 3 s floor + 15 s margin, not forever
    said = [x for x in err.splitlines() if "hung rank" in x]
    assert len(said) == 1, err[-2000:]     # one line for the job, from rank 1
    assert said[0].startswith("[rank 1] ibtmpi train: hung rank: block "), said
    assert "rank 0 (the master) is stopped" in said[0], said
    assert "Traceback" not in err
    st = subprocess.run(IBTMPI + ["status", str(run)], capture_output=True, text=True,
                        timeout=60).stdout
    assert "hung rank" in st and "rank 0 (the master) is stopped" in st, st


def test_a_hung_up_launcher_is_not_blamed_on_a_rank(small_dataset, tmp_path):
    """SIGHUP to mpiexec (a closed terminal): MPICH's launcher dies and takes
    every rank along (no rank can catch it or write a checkpoint); `ibtmpi
    status` and the next start name the launcher as a cause, and how to
    avoid it, not only a rank killed by the OOM killer."""
    run = tmp_path / "run"
    p = start_job(small_dataset, run)
    p.send_signal(signal.SIGHUP)
    p.communicate(timeout=60)
    time.sleep(0.5)                       # the watchers write as they see the end
    st = subprocess.run(IBTMPI + ["status", str(run)], capture_output=True, text=True,
                        timeout=60).stdout
    assert ("the launcher ended the job (mpiexec killed, a second Ctrl-C, or hung up by a "
            "closed terminal: run interactive jobs under nohup, tmux or sbatch)") in st, st
    r = subprocess.run(mpiexec(3) + IBTMPI + ["train"] + train_args(small_dataset, run,
                                                                    passes=0.5),
                       capture_output=True, text=True, timeout=120)
    assert "ended when rank " in r.stdout and "or the launcher ended the job" in r.stdout, \
        r.stdout + r.stderr


def _state_and_cpu(pid):
    """(the process state letter, its user + system CPU seconds) from /proc."""
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return f[0], (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def test_no_rank_spins_while_a_worker_is_stopped_inside_the_allreduce(small_dataset, tmp_path):
    """A worker stopped after every rank passed the block's arrival barrier
    (IBTMPI_FAULT=2:3:stop: it SIGSTOPs itself inside its reduction) leaves
    the master and the other worker waiting inside the reduction: they nap
    there instead of spinning a core (the library's blocking Allreduce
    polled at 100% of a core until the watchdog ended the job), and the
    master's timer still ends the job with one line."""
    from conftest import rank_pid, start_job

    run = tmp_path / "run"
    p = start_job(small_dataset, run, {"IBTMPI_FAULT": "2:3:stop",
                                       "IBTMPI_WATCHDOG_FLOOR_S": "8"})
    pids = {r: rank_pid(run, r) for r in (0, 1, 2)}
    try:
        t0 = time.time()
        while _state_and_cpu(pids[2])[0] != "T":
            assert time.time() - t0 < 60, "the worker did not stop itself"
            time.sleep(0.05)
        time.sleep(0.5)                   # past the reduction's spin (at least 50 ms)
        c0 = {r: _state_and_cpu(pids[r])[1] for r in (0, 1)}
        t1 = time.time()
        time.sleep(2.0)
        share = {r: (_state_and_cpu(pids[r])[1] - c0[r]) / (time.time() - t1) for r in (0, 1)}
        out, err = p.communicate(timeout=90)
    finally:
        for pid in pids.values():
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, TypeError):
                pass
    assert share[0] < 0.2 and share[1] < 0.2, share      # was ~1.0 (a core each)
    assert p.returncode == 1, err[-2000:]
    said = [x for x in err.splitlines() if "hung rank" in x]
    assert len(said) == 1 and "rank 2 (worker 1) is stopped" in said[0], err[-2000:]
    assert "Traceback" not in err
