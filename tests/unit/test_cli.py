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


def test_module_entry_point_version():
    out = subprocess.run([sys.executable, "-m", "ibtmpi", "--version"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.startswith("ibtmpi ")


def test_bad_argument_is_exit_2():
    out = subprocess.run([sys.executable, "-m", "ibtmpi", "demo", "--n", "-3"],
                         capture_output=True, text=True)
    assert out.returncode == 2
    assert "must be >= 1" in out.stderr
