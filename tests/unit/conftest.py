import os
import sys

import pytest

from ibtmpi import consensus
from ibtmpi.config import load

# the venv's own launcher; tests that need it skip where it is missing
MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")
IBTMPI = [sys.executable, "-m", "ibtmpi"]

# the algorithms, from their registry (a new one is tested with no edit here):
# BLOCK the block algorithms (one consensus Allreduce a block), PARALLEL those
# plus the per-step ones (ssgd): every algorithm for N > 1
PARALLEL = [n for n, c in consensus.ALGORITHMS.items() if not c.single_worker]
BLOCK = [n for n in PARALLEL if not consensus.ALGORITHMS[n].per_step]


def cfg_for(path, run_dir, algo, n=3, **extra):
    """A small simulated run's configuration: N = n workers of the tiny
    net on `path`, 2 passes of 40-sample splits; extra: more settings, as
    keywords named section.key (`**{"optim.lr": 0.1}`)."""
    sets = [f"data.path={path}", f"algorithm.name={algo}", "data.split_size=40",
            "data.batch=16", "model.layers=tiny", "run.passes=2", "run.quiet=true",
            f"run.dir={run_dir}", f"run.simulate={n}", "run.threads=1"]
    return load(None, sets + [f"{k}={v}" for k, v in extra.items()])


def mpiexec(n, *more):
    """[the venv's mpiexec, what it needs for n ranks here (Open MPI:
    --oversubscribe, --allow-run-as-root), -n, n]; `more`: the rank counts
    of further MPMD parts, which count towards the options too."""
    from ibtmpi import launcher
    return launcher.command(n + sum(more), MPIEXEC) + ["-n", str(n)]


@pytest.fixture(scope="session")
def small_dataset(tmp_path_factory):
    """A 600-image 16x16 synthetic dataset with 3 train shards (session-wide)."""
    from ibtmpi.data_prep.prep import prep_synth
    out = str(tmp_path_factory.mktemp("ds") / "synth16")
    prep_synth(out, n=600, size=16, seed=4, shards=3, quiet=True)
    return out


@pytest.fixture(scope="session")
def trained(small_dataset, tmp_path_factory):
    """model.npz of a one-pass run on small_dataset (session-wide: read only)."""
    from ibtmpi.cli import main
    run = tmp_path_factory.mktemp("trained") / "run"
    assert main(["train"] + train_args(small_dataset, run)) == 0
    return str(run / "model.npz")


def copy_dataset(src, dst):
    import shutil
    shutil.copytree(src, dst)
    return str(dst)


def train_args(data, run_dir, passes=1, **extra):
    """`--set` arguments of a small, quick training run (tiny model, split
    40, batch 16, one thread, quiet); extra: more keys, e.g.
    **{"algorithm.name": "ibt"}."""
    out = []
    for k, v in {"data.path": data, "data.split_size": 40, "data.batch": 16,
                 "model.layers": "tiny", "run.passes": passes, "run.dir": run_dir,
                 "run.threads": 1, "run.quiet": "true", **extra}.items():
        out += ["--set", f"{k}={v}"]
    return out


def rank_pid(run_dir, rank):
    """The pid of MPI rank `rank` of the job training into run_dir, from the
    processes' own environment (MPICH's PMI_RANK or Open MPI's rank), not
    from anything ibtmpi wrote; None if there is none."""
    for d in os.listdir("/proc"):
        try:
            env = open(f"/proc/{d}/environ", "rb").read().split(b"\0")
            cmd = open(f"/proc/{d}/cmdline", "rb").read()
        except OSError:
            continue
        if b"ibtmpi" in cmd and str(run_dir).encode() in cmd and (
                f"PMI_RANK={rank}".encode() in env
                or f"OMPI_COMM_WORLD_RANK={rank}".encode() in env):
            return int(d)
    return None


def start_job(data, run_dir, env=None, passes=400):
    """A long `mpiexec -n 3` training job (master + 2 workers) into run_dir,
    returned (a Popen) once it printed its placement line and ran a second
    more, for tests that stop, kill or hang up one of its processes."""
    import subprocess
    import time
    p = subprocess.Popen(
        mpiexec(3) + IBTMPI + ["train"] + train_args(
            data, run_dir, passes=passes, **{"run.quiet": "false", "run.progress_s": 0}),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=dict(os.environ, **(env or {})))
    for line in p.stdout:
        if line.startswith("placement:"):
            break
    time.sleep(1.0)
    return p


def stop_rank_of_a_job(data, run_dir, rank, timeout):
    """SIGSTOP `rank` of a start_job() job (its watchdog floor lowered to
    3 s) and wait for the job to end: (Popen, stdout, stderr, seconds from
    the stop to the end). The stopped process is killed afterwards."""
    import signal
    import time
    p = start_job(data, run_dir, {"IBTMPI_WATCHDOG_FLOOR_S": "3"})
    pid = rank_pid(run_dir, rank)
    assert pid, f"rank {rank} not found"
    t0 = time.time()
    os.kill(pid, signal.SIGSTOP)
    try:
        out, err = p.communicate(timeout=timeout)
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return p, out, err, time.time() - t0
