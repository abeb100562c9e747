"""How a job ends (docs/reliability.md): an error every rank knows ends in
order, the first Ctrl-C checkpoints, a stopped or killed worker is found
and named, the divergence advice works, and the Allreduce alarm fires
once past its deadline.
(First found by trying the project from a fresh clone.)"""
import os

import pytest

from ibtmpi import config
from ibtmpi.cli import main
from conftest import rank_pid, train_args

# an error every rank knows ends the job in order, without MPI_Abort
@pytest.mark.skipif(not os.path.exists(os.path.join(os.path.dirname(__import__("sys").executable),
                                                    "mpiexec")), reason="no mpiexec")
def test_errors_every_rank_knows_end_without_abort(small_dataset, tmp_path):
    import subprocess

    from conftest import IBTMPI, mpiexec

    def run(*sets):
        r = subprocess.run(mpiexec(3) + IBTMPI + ["train"] + train_args(
            small_dataset, tmp_path / "run", **dict(s.split("=", 1) for s in sets)),
            capture_output=True, text=True, timeout=120)
        return r.returncode, r.stdout, r.stderr
    for sets, said in [(("optim.lr=-1",), "optim.lr must be > 0"),
                       (("data.path=/nonexistent",), "does not exist"),
                       (("model.init=/nonexistent/model.npz",), "model.init:")]:
        rc, out, err = run(*sets)
        assert rc == 2, (sets, err)
        assert "Abort" not in out + err and "MPI_Abort" not in out + err, err
        lines = err.strip().splitlines()
        assert len(lines) == 1 and said in lines[0], err
    assert run()[0] == 0                                 # a checkpoint of this config
    rc, out, err = run("model.layers=softmax")
    assert rc == 2 and "written by another configuration" in err and "Abort" not in err, err


# the first Ctrl-C checkpoints at the end of the block, exit 130
@pytest.mark.parametrize("n", [1, 3])
def test_ctrl_c_checkpoints_and_resumes(small_dataset, tmp_path, n):
    import signal
    import subprocess

    import time
    from ibtmpi import checkpoint as ckpt
    from conftest import IBTMPI, MPIEXEC, mpiexec
    if n > 1 and not os.path.exists(MPIEXEC):
        pytest.skip("no mpiexec")
    run = tmp_path / "run"
    cmd = (mpiexec(n) if n > 1 else []) + IBTMPI + ["train"] + train_args(
        small_dataset, run, passes=400, **{"run.quiet": "false", "run.progress_s": 0})
    p = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    for line in p.stdout:                  # training has started
        if line.startswith("placement:"):
            break
    time.sleep(1.0)
    t0 = time.time()
    os.killpg(p.pid, signal.SIGINT)        # what a terminal's Ctrl-C does
    out, err = p.communicate(timeout=60)
    took = time.time() - t0
    assert p.returncode == 130, (out[-2000:], err[-2000:])
    assert took < 10, took
    assert err.count("interrupted") == 1 and "press Ctrl-C again to stop at once" in err, err
    assert "pending" not in err and "Abort" not in err, err
    assert "interrupted: stopped by Ctrl-C (SIGINT) after block" in out, out[-1000:]
    done = ckpt.complete(str(run))
    assert done, "no checkpoint written"
    # the same command would resume from it
    r = subprocess.run(cmd + ["--dry-run"], capture_output=True, text=True, timeout=120)
    assert f"resume from {ckpt.ckpt_dir(str(run), done[-1])}" in r.stdout, r.stdout + r.stderr


# a hung rank no longer hangs the job by default
@pytest.mark.skipif(not os.path.exists(os.path.join(os.path.dirname(__import__("sys").executable),
                                                    "mpiexec")), reason="no mpiexec")
def test_a_stopped_worker_is_found_by_the_default_watchdog(small_dataset, tmp_path):
    """SIGSTOP one worker mid-run with run.watchdog_s at its default (auto;
    its 60 s floor lowered to 3 s through the environment for the test):
    one line naming the rank, exit 1, and `ibtmpi status` says hung rank."""
    import subprocess

    from conftest import IBTMPI, stop_rank_of_a_job
    run = tmp_path / "run"
    p, out, err, took = stop_rank_of_a_job(small_dataset, run, 2, timeout=60)
    assert p.returncode == 1, err[-2000:]
    assert took < 30
    said = [x for x in err.splitlines() if "hung rank" in x]
    # stopped before or inside the Allreduce: named either way (it is on this node)
    assert said and ("rank(s) [2] had not arrived" in said[0]
                     or "rank 2 (worker 1) is stopped" in said[0]), err[-2000:]
    assert "Traceback" not in err
    st = subprocess.run(IBTMPI + ["status", str(run)], capture_output=True, text=True,
                        timeout=60).stdout
    assert "hung rank" in st, st


# the divergence advice works: lr and rho may change on a resume
def test_divergence_advice_resumes_with_a_lower_lr(small_dataset, tmp_path, capsys,
                                                    monkeypatch):
    import json
    import subprocess
    import sys
    from ibtmpi import checkpoint as ckpt
    from conftest import IBTMPI
    run = tmp_path / "run"
    argv = ["train"] + train_args(small_dataset, run, passes=2, **{
        "algorithm.name": "admm", "run.checkpoint_every": 2})
    monkeypatch.setenv("IBTMPI_FAULT", "0:7:nan")
    monkeypatch.setattr(sys, "argv", ["ibtmpi"] + argv)
    assert main(argv) == 4
    out, err = capsys.readouterr()
    line = [x for x in out.splitlines() if "diverged" in x][0]
    assert line.startswith("ibtmpi train: diverged at block 7 (rank(s) [0]): ")
    assert f"the last good checkpoint {ckpt.ckpt_dir(str(run), 5)} is kept" in line
    assert line.endswith(" --set optim.lr=0.01") and "RuntimeWarning" not in out + err
    st = subprocess.run(IBTMPI + ["status", str(run)], capture_output=True, text=True,
                        timeout=60).stdout
    assert "diverged at block 7 (rank(s) [0])" in st and "stopped" not in st, st
    # the advised command: the same with --set optim.lr=0.01, and a rho change too
    monkeypatch.delenv("IBTMPI_FAULT")
    rc = main(argv + ["--set", "optim.lr=0.01", "--set", "algorithm.rho=0.05"])
    out = capsys.readouterr().out
    assert rc == 0, out
    said = "algorithm.rho 0.01 -> 0.05, optim.lr 0.02 -> 0.01"
    assert f"resuming with changed settings at block 6: {said}" in out
    recs = [json.loads(x) for x in open(run / "metrics.jsonl")]
    assert [r.get("config_changed") for r in recs if r["block"] == 6] == [said]
    assert {r["lr"] for r in recs if r["block"] >= 6} == {0.01}
    assert {r["rho"] for r in recs if r["block"] >= 6} == {0.05}
    m = ckpt.read_manifest(str(run), ckpt.complete(str(run))[-1])
    assert m["changed"] == [{"block": 6, "changes": said}]
    # a key that changes the model or the data order still refuses
    assert main(argv + ["--set", "data.batch=8"]) == 2


def test_a_divergence_in_block_0_claims_no_checkpoint(small_dataset, tmp_path, capsys,
                                                      monkeypatch):
    monkeypatch.setenv("IBTMPI_FAULT", "0:0:nan")
    assert main(["train"] + train_args(small_dataset, tmp_path / "r")) == 4
    out = capsys.readouterr().out
    assert "no checkpoint was written before it" in out and "is kept" not in out


def test_set_rho_keeps_the_unscaled_duals(small_dataset, tmp_path):
    import numpy as np
    from ibtmpi.train import Trainer
    cfg = config.load(None, ["data.path=" + small_dataset, "algorithm.name=admm",
                             "model.layers=tiny", "data.split_size=40", "run.simulate=2",
                             f"run.dir={tmp_path / 'r'}", "run.quiet=true"])
    t = Trainer(cfg, log=lambda m: None)
    rng = np.random.default_rng(0)
    t.cons.U[...] = rng.standard_normal(t.cons.U.shape).astype(np.float32)
    states = [t.blocks.states[i] for i in t.local]
    for ws in states:
        ws.u[...] = rng.standard_normal(ws.u.shape).astype(np.float32)
    y_U = t.cons.rho * t.cons.U.astype(np.float64)
    y_u = [t.cons.rho * ws.u.astype(np.float64) for ws in states]
    t.cons.set_rho(0.04, states)
    assert t.cons.rho == 0.04
    assert np.allclose(0.04 * t.cons.U, y_U, rtol=1e-6)
    for ws, y in zip(states, y_u):
        assert np.allclose(0.04 * ws.u, y, rtol=1e-6)


# a worker killed without a word is named afterwards
def test_lost_rank_is_the_one_that_ended_first_without_a_word(tmp_path):
    import json
    from ibtmpi.train.lifecycle import RANKS_DIR, lost_rank
    d = tmp_path / RANKS_DIR
    d.mkdir()
    for r, end, said in [(0, 100.30, ""), (1, 100.31, ""), (2, 100.25, "")]:
        (d / f"rank-{r}.json").write_text(json.dumps({"rank": r, "host": "n1", "pid": 10 + r}))
        (d / f"rank-{r}.end").write_text(f"{end}\n")
        (d / f"rank-{r}.out").write_text(said)
    assert lost_rank(str(tmp_path)) == {"rank": 2, "host": "n1", "pid": 12, "lead_s": 0.05}
    (d / "rank-2.out").write_text("ok")         # it said goodbye: an ordinary end
    assert lost_rank(str(tmp_path)) is None
    (d / "rank-2.out").write_text("")
    (d / "rank-0.out").write_text("ok")         # rank 0 aborted after its own message
    assert lost_rank(str(tmp_path)) is None


@pytest.mark.skipif(not os.path.exists(os.path.join(os.path.dirname(__import__("sys").executable),
                                                    "mpiexec")), reason="no mpiexec")
def test_a_sigkilled_worker_is_named_by_status_and_the_next_start(small_dataset, tmp_path):
    import signal
    import subprocess
    import time
    from conftest import IBTMPI, mpiexec
    run = tmp_path / "run"
    cmd = mpiexec(3) + IBTMPI + ["train"] + train_args(
        small_dataset, run, passes=400, **{"run.quiet": "false", "run.progress_s": 0})
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in p.stdout:
        if line.startswith("placement:"):
            break
    time.sleep(1.0)
    worker = rank_pid(run, 2)
    assert worker
    os.kill(worker, signal.SIGKILL)
    p.communicate(timeout=60)
    assert p.returncode != 0
    time.sleep(0.5)                       # the watchers write as they see the end
    st = subprocess.run(IBTMPI + ["status", str(run)], capture_output=True, text=True,
                        timeout=60).stdout
    # the watchers' clocks name the killed rank; under load the ranks its
    # launcher then kills can end within their jitter (a few ms), and then
    # the text's lead says how close it was (lifecycle.lost_rank_text)
    import re
    m = re.search(r"rank (\d) \(pid (\d+) on [^)]*\) ended first, ([\d.]+) s before the "
                  r"others, without a word", st)
    assert m, st
    assert m.group(1) == "2" and m.group(2) == str(worker) or float(m.group(3)) < 0.02, st
    # the next job of the run says so too (a short one: it resumes and ends)
    r = subprocess.run(mpiexec(3) + IBTMPI + ["train"] + train_args(small_dataset, run,
                                                                    passes=0.5),
                       capture_output=True, text=True, timeout=120)
    assert f"the previous job in {run} ended when rank {m.group(1)} (pid {m.group(2)}" \
        in r.stdout, r.stdout + r.stderr


# a start refused on one rank alone, the advised command
# run twice, a checkpoint whose data (not its header) is damaged
@pytest.mark.skipif(not os.path.exists(os.path.join(os.path.dirname(__import__("sys").executable),
                                                    "mpiexec")), reason="no mpiexec")
def test_a_config_only_one_rank_cannot_read_ends_in_order(small_dataset, tmp_path):
    """Rank 1 cannot read the config file (another node's view of it): it
    meets the others at the start-up agreement, not inside another
    collective (run.threads = auto takes the node's rank count, a
    collective): exit 2 in one line, no hang."""
    import subprocess
    from conftest import IBTMPI, mpiexec
    cfg = tmp_path / "run.toml"
    cfg.write_text(f'[data]\npath = "{small_dataset}"\nsplit_size = 40\n'
                   f'[model]\nlayers = "tiny"\n[run]\ndir = "{tmp_path / "r"}"\n')
    code = ("import os, sys\nfrom ibtmpi import comm\n"
            "if comm.world_rank() == 1:\n"
            f"    os.environ['X'] = '1'; sys.argv[sys.argv.index('--config') + 1] = "
            f"'{tmp_path / 'missing.toml'}'\n"
            "from ibtmpi.cli import main\nsys.exit(main(sys.argv[1:]))\n")
    r = subprocess.run(mpiexec(3) + [IBTMPI[0], "-c", code, "train", "--config", str(cfg)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("[rank 1] ibtmpi train: error: cannot "
                                                   "read config"), r.stderr


def test_the_advised_command_diverging_again_still_exits_4(small_dataset, tmp_path, capsys,
                                                            monkeypatch):
    import sys
    argv = ["train"] + train_args(small_dataset, tmp_path / "r") + ["--set", "optim.lr=0.01"]
    monkeypatch.setenv("IBTMPI_FAULT", "0:2:nan")
    monkeypatch.setattr(sys, "argv", ["ibtmpi"] + argv)
    assert main(argv) == 4
    line = [x for x in capsys.readouterr().out.splitlines() if "diverged" in x][0]
    assert line.endswith(" --set optim.lr=0.005") and "optim.lr=0.01" not in line, line


def test_the_allreduce_alarm_fires_once_past_its_deadline_and_not_when_disarmed():
    import threading
    from ibtmpi.train.lifecycle import Alarm
    fired, ev = [], threading.Event()
    a = Alarm()
    a.arm(0.05, lambda *x: (fired.append(x), ev.set()), 7, "why")
    assert ev.wait(2) and fired == [(7, "why")]
    ev.clear()
    for k in range(50):                     # armed and disarmed per block: never fires
        a.arm(0.2, lambda *x: (fired.append(x), ev.set()), k)
        a.disarm()
    assert not ev.wait(0.4) and len(fired) == 1
    assert sum(t.name == "allreduce-alarm" for t in threading.enumerate()) >= 1


def test_time_this_process_was_stopped_does_not_count_against_the_others(monkeypatch):
    """A rank stopped itself (SIGSTOP, then continued: Open MPI continues
    the ranks it ends after another rank's Abort) must not blame the others
    for the time it was stopped: the watchdog's clock (OwnClock) and the
    Alarm leave out a gap of more than FROZEN_GAP_S between two looks at
    the clock. Here the clock jumps 10 s, as after a stop."""
    import threading
    import time

    from ibtmpi.train import lifecycle
    real, jump = lifecycle.time.monotonic, [0.0]

    class Clock:
        @staticmethod
        def monotonic():
            return real() + jump[0]
    monkeypatch.setattr(lifecycle, "time", Clock)
    own = lifecycle.OwnClock()
    jump[0] = 3.0                           # a long slice of work: counts
    assert 3.0 <= own() < 3.5
    jump[0] = 13.0                          # stopped for 10 s: does not
    assert 3.0 <= own() < 3.5
    fired, ev = [], threading.Event()
    a = lifecycle.Alarm()
    a.arm(1.2, lambda *x: (fired.append(x), ev.set()), 1)
    time.sleep(0.3)
    jump[0] = 23.0                          # stopped for 10 s while armed
    assert not ev.wait(0.6) and not fired   # 10 s past its deadline, but stopped
    assert ev.wait(3) and fired == [(1,)]   # fires once it ran its 1.2 s
