import re
import subprocess
import sys

from ibtmpi.cli import main


def test_demo_runs_mpi_job(tmp_path, capsys):
    """The README's demo path, small: prep + mpiexec -n 3 train."""
    rc = main(["demo", "--data", str(tmp_path / "d"), "--n", "300",
               "--image-size", "16", "--model", "tiny", "--passes", "1",
               "--run-dir", str(tmp_path / "run"), "--quiet"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "wrote" in out and re.search(r"mpiexec( --[a-z-]+)* -n 3 ", out)
    import json
    s = json.load(open(tmp_path / "run" / "summary.json"))
    assert s["world_size"] == 3 and s["N"] == 2
    assert s["allreduce_calls"] == s["blocks"]


def test_info_bad_model_is_exit_2(capsys):
    rc = main(["info", "--model", "nope"])
    assert rc == 2
    assert "unknown model preset 'nope'" in capsys.readouterr().err


def test_info_says_whether_gpu_and_cuda_aware_mpi_are_there(capsys, monkeypatch):
    from ibtmpi import backend, comm
    monkeypatch.setattr(backend, "gpu_status", lambda: (False, "CuPy sees no CUDA device"))
    monkeypatch.setattr(comm, "cuda_support", lambda: (None, "no query"))
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "GPU: CuPy sees no CUDA device; --device gpu is refused here\n" in out
    assert "CUDA-aware MPI: not said (no query; run.cuda_aware = auto follows it)" in out
    monkeypatch.setattr(backend, "gpu_status", lambda: (True, "4 CUDA device(s)"))
    monkeypatch.setattr(comm, "cuda_support", lambda: (True, "MPIX_Query_cuda_support() = 1"))
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "GPU: 4 CUDA device(s)\n" in out and "CUDA-aware MPI: yes (MPIX_Query" in out


def test_module_entry_point_version():
    out = subprocess.run([sys.executable, "-m", "ibtmpi", "--version"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.startswith("ibtmpi ")


def test_bad_argument_is_exit_2():
    out = subprocess.run([sys.executable, "-m", "ibtmpi", "demo", "--n", "-3"],
                         capture_output=True, text=True)
    assert out.returncode == 2
    assert "must be >= 1" in out.stderr
