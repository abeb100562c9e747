"""Fail fast, never hang: real `mpiexec -n 3` jobs (master + 2 workers)
with injected faults, a NaN, a signal to one rank and a SIGKILL of a worker;
and every bad input ending with exit status 2 and a clear message."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from ibtmpi import checkpoint as ckpt
from ibtmpi import runlock
from ibtmpi.cli import main
from conftest import IBTMPI, MPIEXEC, mpiexec

pytestmark = pytest.mark.skipif(not os.path.exists(MPIEXEC), reason="no mpiexec in the venv")


def base_sets(data, run_dir, passes=3, **extra):
    sets = {"data.path": data, "algorithm.name": "admm", "data.split_size": 40,
            "data.batch": 16, "model.layers": "tiny", "run.passes": passes,
            "run.dir": run_dir, "run.threads": 1, "run.eval_every": 1,
            "run.checkpoint_every": 1, **extra}
    out = []
    for k, v in sets.items():
        out += ["--set", f"{k}={v}"]
    return out


def launch(sets, env=None, n=3, popen=False):
    cmd = mpiexec(n) + IBTMPI + ["train", "--quiet"] + sets
    e = dict(os.environ, **(env or {}))
    if popen:
        return subprocess.Popen(cmd, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
    t0 = time.time()
    r = subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=180)
    return r.returncode, r.stdout, r.stderr, time.time() - t0


@pytest.mark.parametrize("rank,phase", [(1, "compute"), (2, "allreduce"), (0, "allreduce"),
                                        (0, "evaluation"), (1, "checkpoint"),
                                        (0, "checkpoint")])
def test_injected_fault_ends_the_job_fast(small_dataset, tmp_path, rank, phase, capsys):
    rc, out, err, dt = launch(base_sets(small_dataset, tmp_path / "r"),
                              {"IBTMPI_FAULT": f"{rank}:2:{phase}"})
    assert rc != 0
    assert dt < 60
    assert f"[rank {rank}] ibtmpi train failed in block 2, phase {phase}" in err
    assert "InjectedFault" in err
    saved = (tmp_path / "r" / f"error-rank-{rank}.txt").read_text()
    assert f"failed in block 2, phase {phase}" in saved
    # `ibtmpi status` says why, from that file: its heading and the exception
    # (once rank 0 is gone: MPICH's mpiexec can return a second before the
    # launcher's signal has ended every rank, and until then the run is live)
    lock = tmp_path / "r" / runlock.NAME
    for _ in range(150):
        try:
            if not runlock._pid_alive(json.loads(lock.read_text())["pid"]):
                break
        except FileNotFoundError:           # released: rank 0 ended on its own
            break
        time.sleep(0.1)
    assert main(["status", str(tmp_path / "r")]) == 0
    assert (f": [rank {rank}] ibtmpi train failed in block 2, phase {phase}: "
            f"ibtmpi.errors.InjectedFault: injected fault on rank {rank}, block 2, "
            f"phase {phase} (see error-rank-{rank}.txt)") in capsys.readouterr().out


def test_divergence_stops_names_block_and_rank_keeps_checkpoint(small_dataset, tmp_path):
    run = tmp_path / "r"
    rc, out, err, dt = launch(base_sets(small_dataset, run), {"IBTMPI_FAULT": "2:3:nan"})
    assert rc == 4, (out, err)
    # the message names the block, the rank and the worker, and the exact command
    # that resumes with a lower learning rate (it changed on purpose: hardening 2)
    assert "diverged at block 3 (rank(s) [2]): non-finite loss or model on worker(s) [1]" in out
    assert "Lower optim.lr (now 0.02) or raise algorithm.rho (now 0.01)" in out
    # the advised command can be pasted as it is: the launcher and the program
    # are the ones that ran, by path where PATH would find others (a venv not
    # activated), and the --set that follows halves the lr
    import shlex
    import shutil
    advice = shlex.split(out.rstrip().rsplit("e.g. ", 1)[1])
    assert advice[-2:] == ["--set", "optim.lr=0.01"], advice
    assert advice[1:3] == ["-n", "3"] and os.path.realpath(shutil.which(advice[0])) == \
        os.path.realpath(MPIEXEC), advice
    prog = advice[3:6] if advice[4:6] == ["-m", "ibtmpi"] else advice[3:4]
    assert os.path.realpath(shutil.which(prog[0])) in (os.path.realpath(sys.executable),
                                                       os.path.realpath(IBTMPI[0])), advice
    assert advice[len(prog) + 3] == "train"
    assert ckpt.complete(str(run))[-1] == 2         # the good one, not block 3
    m = ckpt.read_manifest(str(run), 2)
    assert all(os.path.exists(os.path.join(ckpt.ckpt_dir(str(run), 2), f)) for f in m["files"])


def test_watchdog_names_the_rank_that_did_not_arrive(small_dataset, tmp_path):
    rc, out, err, dt = launch(base_sets(small_dataset, tmp_path / "r",
                                        **{"run.watchdog_s": 3}),
                              {"IBTMPI_FAULT": "2:2:hang"})
    assert rc != 0
    assert dt < 30
    assert "block 2 ran past run.watchdog_s = 3 s; rank(s) [2] had not arrived" in err


def _rank_pids(marker):
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            cmd = open(f"/proc/{d}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        # a rank is `python -m ibtmpi ...`; the launcher (Hydra's mpiexec and
        # proxy, Open MPI's prterun) carries the same words later in its argv
        if cmd[1:3] == [b"-m", b"ibtmpi"] and any(marker.encode() in c for c in cmd):
            pids.append(int(d))
    return sorted(pids)


def _wait_for(pred, timeout=60):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if pred():
            return True
        time.sleep(0.1)
    return False


def test_signal_on_one_rank_checkpoints_and_resumes(small_dataset, tmp_path):
    run = str(tmp_path / "r")
    sets = base_sets(small_dataset, run, passes=200, **{"run.checkpoint_every": 50})
    p = launch(sets, popen=True)
    assert _wait_for(lambda: os.path.exists(os.path.join(run, "metrics.jsonl"))
                     and sum(1 for _ in open(os.path.join(run, "metrics.jsonl"))) >= 3)
    pids = _rank_pids(run)
    assert len(pids) == 3, pids
    os.kill(pids[-1], signal.SIGUSR1)              # one rank only
    out, err = p.communicate(timeout=60)
    assert p.returncode == 75, (out, err)
    assert "preempted" in out
    done = ckpt.complete(run)
    assert done, "no checkpoint after preemption"
    rc, out2, err2, _ = launch(sets)
    assert rc == 0, err2
    assert f"resuming from {ckpt.ckpt_dir(run, done[-1])}" in out2
    lines = [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl"))]
    assert [l["block"] for l in lines] == list(range(len(lines)))


def test_sigkill_of_a_worker_then_resume(small_dataset, tmp_path):
    run = str(tmp_path / "r")
    sets = base_sets(small_dataset, run, passes=200, **{"run.checkpoint_every": 20})
    p = launch(sets, popen=True)
    assert _wait_for(lambda: len(ckpt.complete(run)) >= 1)
    pids = _rank_pids(run)
    t0 = time.time()
    os.kill(pids[-1], signal.SIGKILL)
    p.communicate(timeout=60)
    assert p.returncode != 0 and time.time() - t0 < 30
    last = ckpt.complete(run)[-1]
    m = ckpt.read_manifest(run, last)                # intact
    assert m["n_workers"] == 2
    rc, out, err, _ = launch(base_sets(small_dataset, run, passes=200,
                                       **{"run.checkpoint_every": 20}))
    assert rc == 0, err
    assert "resuming from" in out


def _corrupt(src, dst):
    shutil.copytree(src, dst)
    with open(os.path.join(dst, "train-00001-of-00003.h5"), "wb") as f:
        f.write(b"garbage" * 100)
    return str(dst)


BAD = [
    ("missing dataset", lambda d, t: ["--set", f"data.path={t}/nope"], {}, "does not exist"),
    ("corrupt hdf5", lambda d, t: ["--set", f"data.path={_corrupt(d, t / 'c')}"], {},
     "train-00001-of-00003.h5: cannot be read as HDF5"),
    ("too few samples", lambda d, t: ["--set", f"data.path={d}", "--set", "data.batch=1000"],
     {}, "fewer than 1 workers x batch 1000"),
    ("unknown key", lambda d, t: ["--set", f"data.path={d}", "--set", "optim.lrr=1"], {},
     "unknown key optim.lrr (did you mean 'lr'?)"),
    ("wrong type", lambda d, t: ["--set", f"data.path={d}", "--set", "data.batch=abc"], {},
     "data.batch must be an integer"),
    ("negative rho", lambda d, t: ["--set", f"data.path={d}", "--set", "algorithm.rho=-1"],
     {}, "algorithm.rho must be > 0"),
    ("zero batch", lambda d, t: ["--set", f"data.path={d}", "--set", "data.batch=0"], {},
     "data.batch must be >= 1"),
    ("model does not fit the data", lambda d, t: [
        "--set", f"data.path={d}", "--set",
        'model.layers=[{type="conv", out=4, k=32, pad=0}, {type="linear"}]'], {},
     "does not fit an input of size 16"),
    ("slurm without launcher", lambda d, t: ["--set", f"data.path={d}"],
     {"SLURM_NTASKS": "4"}, "started without a launcher"),
    ("run dir not writable", lambda d, t: ["--set", f"data.path={d}", "--set",
                                           "run.dir=/proc/1/nope"], {}, "is not writable"),
    ("gpu without gpu", lambda d, t: ["--set", f"data.path={d}", "--device", "gpu"], {},
     "--device gpu was asked for but"),
]


@pytest.mark.parametrize("name,args,env,msg", BAD, ids=[b[0] for b in BAD])
def test_bad_input_exits_2_with_message(small_dataset, tmp_path, monkeypatch, capsys,
                                        name, args, env, msg):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    rc = main(["train", "--quiet", "--set", f"run.dir={tmp_path / 'run'}"]
              + args(small_dataset, tmp_path))
    err = capsys.readouterr().err
    assert rc == 2
    assert msg in err


def test_resume_from_other_config_exits_2_and_overwrites_nothing(small_dataset, tmp_path,
                                                                  capsys):
    run = tmp_path / "run"
    common = ["train", "--quiet", "--set", f"data.path={small_dataset}", "--set",
              f"run.dir={run}", "--set", "model.layers=tiny", "--set", "data.split_size=40"]
    assert main(common) == 0
    before = {f: open(run / f, "rb").read() for f in ("metrics.jsonl", "summary.json")}
    rc = main(common + ["--set", "model.layers=softmax"])
    assert rc == 2
    assert "written by another configuration" in capsys.readouterr().err
    assert {f: open(run / f, "rb").read() for f in before} == before


def _resume_ends_as_uninterrupted(sets, tmp_path):
    """Rerun the interrupted job in tmp_path/b: it resumes and ends with
    the z of the uninterrupted job in tmp_path/a, bit for bit."""
    import numpy as np
    rc, out, err, _ = launch(sets(tmp_path / "b"))
    assert rc == 0, err
    assert "resuming from" in out
    za = np.load(tmp_path / "a" / "model.npz", allow_pickle=False)["z"]
    zb = np.load(tmp_path / "b" / "model.npz", allow_pickle=False)["z"]
    assert za.tobytes() == zb.tobytes()


@pytest.mark.parametrize("algo", ["ibt", "easgd"])
def test_mpi_run_killed_and_resumed_equals_uninterrupted(small_dataset, tmp_path, algo):
    sets = lambda d: base_sets(small_dataset, str(d), passes=2,
                               **{"algorithm.name": algo, "run.checkpoint_every": 2})
    rc, out, err, _ = launch(sets(tmp_path / "a"))
    assert rc == 0, err
    rc, out, err, _ = launch(sets(tmp_path / "b"), {"IBTMPI_FAULT": "1:6:compute"})
    assert rc != 0 and "InjectedFault" in err
    assert ckpt.complete(str(tmp_path / "b"))[-1] == 3
    failed = (tmp_path / "b" / "error-rank-1.txt").read_text()
    _resume_ends_as_uninterrupted(sets, tmp_path)
    # the resumed job moved the failed job's error file aside, kept whole
    assert not (tmp_path / "b" / "error-rank-1.txt").exists()
    old = list((tmp_path / "b" / "old-errors").glob("error-rank-1-*.txt"))
    assert len(old) == 1 and old[0].read_text() == failed


def test_a_full_disk_ends_the_job_with_74_in_one_line_and_resumes(small_dataset, tmp_path):
    """ENOSPC while a worker writes its checkpoint: exit status 74, one line
    naming the rank, file and block (no traceback), the complete checkpoint
    before it kept; the same command resumes once there is space."""
    sets = lambda d: base_sets(small_dataset, str(d), passes=2)
    rc, out, err, _ = launch(sets(tmp_path / "a"))
    assert rc == 0, err
    rc, out, err, dt = launch(sets(tmp_path / "b"), {"IBTMPI_FAULT": "1:5:enospc"})
    assert rc == 74, (rc, err)
    assert dt < 60
    assert "Traceback" not in err
    assert ("[rank 1] ibtmpi train: error: cannot write " in err
            and "ckpt-00000005/rank-00001.npz: No space left on device (block 5, "
            "phase checkpoint)" in err), err
    # one line for the job, and not MPICH's `Abort(74) on node ...` banner after it
    # (the rank's own stderr; Open MPI's launcher prints a banner of its own)
    lines = err.splitlines()
    assert not any(x.startswith("Abort(") for x in lines), err
    assert len([x for x in lines if "ibtmpi" in x]) == 1, err
    assert ckpt.complete(str(tmp_path / "b"))[-1] == 4
    # `ibtmpi status` says failed, and why (it said "stopped", with no reason)
    st = subprocess.run(IBTMPI + ["status", str(tmp_path / "b")], capture_output=True,
                        text=True, timeout=60).stdout
    assert ": failed after " in st and "No space left on device" in st, st
    _resume_ends_as_uninterrupted(sets, tmp_path)


def test_device_auto_without_gpu_trains_on_cpu_and_says_so(small_dataset, tmp_path, capsys):
    from ibtmpi import backend
    if backend.gpu_status()[0]:
        pytest.skip("this machine has a GPU")
    run = tmp_path / "run"
    rc = main(["train", "--quiet", "--device", "auto", "--set", f"data.path={small_dataset}",
               "--set", f"run.dir={run}", "--set", "model.layers=tiny",
               "--set", "data.split_size=40"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "--device auto: computing on the CPU (" in out
    assert (run / "model.npz").exists()


def test_cuda_aware_flag_is_recorded_and_checked(small_dataset, tmp_path, capsys):
    run = tmp_path / "run"
    rc = main(["train", "--quiet", "--cuda-aware", "off", "--set", f"data.path={small_dataset}",
               "--set", f"run.dir={run}", "--set", "model.layers=tiny",
               "--set", "data.split_size=40", "--set", "run.passes=0.2"])
    assert rc == 0
    assert 'cuda_aware = "off"' in (run / "config.toml").read_text()
    with pytest.raises(SystemExit) as e:
        main(["train", "--cuda-aware", "maybe", "--set", f"data.path={small_dataset}"])
    assert e.value.code == 2
    assert "invalid choice: 'maybe'" in capsys.readouterr().err


def test_a_setup_error_on_the_workers_alone_is_reported_by_them(small_dataset, tmp_path):
    """Rank 0 has the data, the workers' node does not (MPMD launch): the
    workers' reason must reach the user, not just an MPI abort."""
    run = tmp_path / "run"
    rank0 = [sys.executable, "-m", "ibtmpi", "train", "--quiet"] + base_sets(small_dataset, run)
    workers = [sys.executable, "-m", "ibtmpi", "train", "--quiet"] + base_sets(
        tmp_path / "missing", run)
    t0 = time.time()
    r = subprocess.run(mpiexec(1, 2) + rank0 + [":", "-n", "2"] + workers,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and time.time() - t0 < 60
    assert "] ibtmpi train: error: dataset directory" in r.stderr
    assert "missing does not exist" in r.stderr


def test_a_run_dir_the_workers_cannot_write_fails_at_start(small_dataset, tmp_path):
    """Workers write their checkpoint files into run.dir too: a directory they
    cannot create is reported before any training (MPMD launch: only the
    workers get the bad path)."""
    blocker = tmp_path / "file"
    blocker.write_text("x")
    rank0 = [sys.executable, "-m", "ibtmpi", "train", "--quiet"] + base_sets(
        small_dataset, tmp_path / "run")
    workers = [sys.executable, "-m", "ibtmpi", "train", "--quiet"] + base_sets(
        small_dataset, blocker / "run")
    r = subprocess.run(mpiexec(1, 2) + rank0 + [":", "-n", "2"] + workers,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "] ibtmpi train: error: run.dir" in r.stderr and "is not writable" in r.stderr
    m = tmp_path / "run" / "metrics.jsonl"
    assert not m.exists() or m.read_text() == ""              # no block was trained
