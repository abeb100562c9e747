"""Running without a usable MPI: one process trains (also --simulate N),
and a process a launcher started as one of several ranks stops with a clear
error instead of training the whole job alone.

The subprocesses hide mpi4py (sys.modules['mpi4py'] = None makes its import
fail as it does where mpi4py is missing or finds no libmpi)."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

NO_MPI = ("import sys; sys.modules['mpi4py'] = None; "
          "from ibtmpi.cli import main; sys.exit(main(sys.argv[1:]))")
SETS = ["--set", "model.layers=tiny", "--set", "data.split_size=64",
        "--set", "data.batch=16", "--set", "run.passes=1", "--quiet"]


def _clean_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if k not in ("PMI_SIZE", "PMI_RANK", "OMPI_COMM_WORLD_SIZE",
                        "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")}
    env.update(extra)
    return env


def _ibtmpi(args, no_mpi, **env):
    pre = [sys.executable, "-c", NO_MPI] if no_mpi else [sys.executable, "-m", "ibtmpi"]
    return subprocess.run(pre + args, capture_output=True, text=True, timeout=300,
                          env=_clean_env(**env))


def test_simulate_without_mpi_is_bitwise_the_run_with_mpi(small_dataset, tmp_path):
    z = {}
    for no_mpi in (False, True):
        run = tmp_path / f"run-{no_mpi}"
        out = _ibtmpi(["train", "--simulate", "2", "--set", f"data.path={small_dataset}",
                       "--set", f"run.dir={run}"] + SETS, no_mpi)
        assert out.returncode == 0, out.stderr
        assert "Traceback" not in out.stderr
        z[no_mpi] = np.load(run / "model.npz")["z"]
        s = json.load(open(run / "summary.json"))
        assert s["N"] == 2 and s["world_size"] == 1
    assert z[True].tobytes() == z[False].tobytes()


def test_launched_rank_without_mpi_stops_with_a_clear_error(small_dataset, tmp_path):
    run = tmp_path / "run"
    for var in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_STEP_NUM_TASKS"):
        out = _ibtmpi(["train", "--set", f"data.path={small_dataset}",
                       "--set", f"run.dir={run}"] + SETS, True, **{var: "3"})
        assert out.returncode == 2, (var, out.stdout, out.stderr)
        assert "Traceback" not in out.stderr
        assert f"one of 3 ranks ({var}=3) but has no usable MPI" in out.stderr
        assert "pip install mpich" in out.stderr
        assert not (run / "model.npz").exists()
    # the other ranks of the launch say nothing: one line for the job, not one a rank
    for var, rank in (("PMI_RANK", "1"), ("OMPI_COMM_WORLD_RANK", "2"), ("SLURM_PROCID", "1")):
        out = _ibtmpi(["train", "--set", f"data.path={small_dataset}",
                       "--set", f"run.dir={run}"] + SETS, True, PMI_SIZE="3", **{var: rank})
        assert out.returncode == 2 and out.stderr == "", (var, out.stderr)


def test_info_says_there_is_no_mpi():
    out = _ibtmpi(["info", "--model", "tiny"], True)
    assert out.returncode == 0, out.stderr
    assert "MPI: none: mpi4py could not be loaded (" in out.stdout


def test_serial_world_collectives(monkeypatch):
    from ibtmpi import comm
    monkeypatch.setattr(comm, "MPI", None)
    for var in comm._LAUNCHER_SIZE:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PMI_SIZE", "1")           # a launch of one rank is fine
    assert (comm.world_size(), comm.world_rank()) == (1, 0)
    assert comm.node_rank_size() == (0, 1)
    assert comm.worker_local_rank() == 0
    send = np.arange(5, dtype=np.float32)
    recv = np.zeros_like(send)
    comm.allreduce_sum(send, recv, comm.self_comm(), count=False)
    assert (recv == send).all()
    assert comm.bcast({"a": 1}) == {"a": 1} and comm.allgather(7) == [7]
    comm.wait_all([])
    monkeypatch.setenv("PMI_SIZE", "2")
    with pytest.raises(comm.MPIUnavailable, match="PMI_SIZE=2"):
        comm.world_size()
    with pytest.raises(comm.MPIUnavailable, match="needs MPI"):
        comm.allreduce_sweep([64])


def test_info_without_mpi_says_there_is_none():
    out = _ibtmpi(["info"], True)
    assert out.returncode == 0, out.stderr
    line = [x for x in out.stdout.splitlines() if x.startswith("CUDA-aware MPI")]
    assert line and "no MPI library (mpi4py could not be loaded" in line[0], out.stdout
    assert "has no CUDA-support query" not in out.stdout
