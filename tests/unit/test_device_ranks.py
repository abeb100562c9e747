"""--device under mpiexec where the ranks do not all see a GPU: one decision
for every rank, made from what each sees (an MPMD launch gives the ranks
different PYTHONPATHs: tests/standin's `cupy` is the CuPy stand-in with one
device, without it CuPy is missing). The master needs no GPU; a worker
without one is named; nothing hangs."""
import json
import os
import subprocess
import sys

import pytest
from conftest import MPIEXEC, train_args

pytestmark = pytest.mark.skipif(not os.path.exists(MPIEXEC), reason="no mpiexec beside this Python")
STANDIN = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "standin")


def launch(parts, device, data, run, **extra):
    """parts: [(ranks, has_gpu)] in rank order; extra: more --set keys."""
    from ibtmpi import launcher
    cmd = launcher.command(sum(n for n, _ in parts), MPIEXEC)
    for i, (n, gpu) in enumerate(parts):
        cmd += ([":"] if i else []) + ["-n", str(n), "env", f"PYTHONPATH={STANDIN if gpu else ''}",
                                       sys.executable, "-m", "ibtmpi", "train", "--device",
                                       device] + train_args(data, run, passes=0.5, **extra)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_gpu_workers_with_a_master_that_has_no_gpu(small_dataset, tmp_path):
    r = launch([(1, False), (2, True)], "gpu", small_dataset, tmp_path / "run")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["N"] == 2 and s["world_size"] == 3


def test_a_master_with_a_gpu_updates_z_there(small_dataset, tmp_path):
    """Every node has a GPU: the master of its own keeps its consensus state
    on its GPU (run.master_device = auto, the default) and says so; z
    (model.npz) and the evaluations are bitwise those of the host master
    (cpu)."""
    import numpy as np
    out = {}
    for where in ("auto", "cpu"):
        run = tmp_path / where
        r = launch([(1, True), (2, True)], "gpu", small_dataset, run,
                   **({"run.master_device": where} if where == "cpu" else {}),
                   **{"algorithm.name": "admm"})
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        s = json.loads((run / "summary.json").read_text())
        said = "the master keeps z and the consensus state on its GPU" in r.stdout
        assert (s["master_consensus"], said) == (("gpu", True) if where == "auto" else
                                                 ("cpu", False))
        with np.load(run / "model.npz") as f:
            out[where] = (f["z"].tobytes(), s["test_acc"], s["val_acc"])
    assert out["auto"] == out["cpu"]


def test_master_device_gpu_without_one_is_refused(small_dataset, tmp_path):
    r = launch([(1, False), (2, True)], "gpu", small_dataset, tmp_path / "run",
               **{"run.master_device": "gpu"})
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert ("ibtmpi train: error: run.master_device = gpu, but the master (rank 0) has no "
            "GPU") in r.stderr
    assert "Traceback" not in r.stderr


def test_auto_with_a_worker_without_gpu_computes_on_the_cpu(small_dataset, tmp_path):
    r = launch([(2, True), (1, False)], "auto", small_dataset, tmp_path / "run")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "--device auto: computing on the CPU (rank 2 (" in r.stdout
    assert "CuPy is not installed" in r.stdout


def test_gpu_with_a_worker_without_gpu_fails_naming_it(small_dataset, tmp_path):
    r = launch([(2, True), (1, False)], "gpu", small_dataset, tmp_path / "run")
    assert r.returncode != 0
    assert "ibtmpi train: error: --device gpu was asked for but rank 2 (" in r.stderr


def test_evaluate_on_gpu_ranks_matches_the_cpu(small_dataset, tmp_path):
    """`ibtmpi evaluate --device gpu` under mpiexec: every rank computes (no
    master), each binds its node-local GPU; the report is the CPU one's."""
    from ibtmpi import launcher
    run = tmp_path / "run"
    subprocess.run([sys.executable, "-m", "ibtmpi", "train", "--simulate", "2"]
                   + train_args(small_dataset, run, passes=0.5), check=True,
                   capture_output=True, timeout=120)
    reports = {}
    for device in ("cpu", "gpu"):
        out = tmp_path / device
        r = subprocess.run(launcher.command(2, MPIEXEC) + [
            "-n", "2", "env", f"PYTHONPATH={STANDIN}", sys.executable, "-m", "ibtmpi",
            "evaluate", str(run / "model.npz"), "--data", small_dataset, "--device", device,
            "--out", str(out)], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        reports[device] = json.loads((out / "report.json").read_text())
    assert reports["gpu"]["ranks"] == 2
    for key in ("accuracy", "confusion"):
        assert reports["gpu"][key] == reports["cpu"][key]
