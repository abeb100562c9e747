import subprocess
import sys

from ibtmpi.cli import main


def test_demo_runs_small(capsys):
    rc = main(["demo", "--n", "300", "--image-size", "16", "--epochs", "1",
               "--model", "tiny", "--quiet", "--threads", "1"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "test accuracy" in out


def test_bad_model_is_exit_2_with_message(capsys):
    rc = main(["demo", "--n", "300", "--model", "nope", "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "unknown model preset 'nope'" in err


def test_too_few_images_is_exit_2(capsys):
    rc = main(["demo", "--n", "20", "--batch", "64", "--quiet"])
    assert rc == 2
    assert "fewer than one batch" in capsys.readouterr().err


def test_module_entry_point_version():
    out = subprocess.run([sys.executable, "-m", "ibtmpi", "--version"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.startswith("ibtmpi ")


def test_bad_argument_is_exit_2():
    out = subprocess.run([sys.executable, "-m", "ibtmpi", "demo", "--n", "-3"],
                         capture_output=True, text=True)
    assert out.returncode == 2
    assert "must be >= 1" in out.stderr
