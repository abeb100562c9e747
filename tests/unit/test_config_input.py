"""Configuration and command-line input: non-finite numbers refused, a
did-you-mean by meaning, a refused start leaves no run directory, the
demo's directories follow its settings, --set wins over a shorthand flag.
(First found by trying the project from a fresh clone.)"""
import math
import os

import pytest

from ibtmpi import config
from ibtmpi.cli import build_parser, main
from conftest import train_args

# non-finite floats are refused, not trained until they diverge
@pytest.mark.parametrize("text", ["optim.lr=inf", "algorithm.rho=nan", "optim.gamma=-inf",
                                  "run.progress_s=inf", "optim.milestones=[1.0, inf]"])
def test_non_finite_float_keys_exit_2(small_dataset, tmp_path, capsys, text):
    rc = main(["train", "--quiet", "--set", f"data.path={small_dataset}",
               "--set", f"run.dir={tmp_path / 'run'}", "--set", text])
    err = capsys.readouterr().err
    assert rc == 2, err
    key = text.split("=")[0]
    assert f"{key} must " in err and "finite" in err, err


def test_finite_floats_still_pass():
    cfg = config.load(None, ["data.path=x", "optim.lr=0.1", "optim.schedule=step",
                                "optim.milestones=[1.0, 2]"])
    assert math.isfinite(cfg["optim"]["lr"])


# did-you-mean by meaning, not only by spelling
@pytest.mark.parametrize("text,said", [
    ("data.batch_size=8", "did you mean 'batch'?"),
    ("optim.learning_rate=0.1", "did you mean 'lr'?"),
    ("optim.lr_schedule=cosine", "did you mean 'schedule'?"),
    ("algorithm.algo=admm", "did you mean 'name'?"),
    ("run.epochs=3", "did you mean 'passes'?"),
    ("run.num_workers=4", "mpiexec -n N+1"),
])
def test_common_synonyms_are_suggested(text, said):
    with pytest.raises(config.ConfigError) as e:
        config.load(None, ["data.path=x", text])
    assert said in str(e.value), str(e.value)


# a start that fails validation leaves no empty run directory
@pytest.mark.parametrize("bad", [["--set", "data.path=/nonexistent/data"],
                                 ["--set", "data.batch=100000"]])
def test_refused_start_leaves_no_run_directory(small_dataset, tmp_path, capsys, bad):
    run = tmp_path / "runs" / "e2"
    args = ["train", "--quiet", "--set", f"data.path={small_dataset}",
            "--set", f"run.dir={run}"] + bad
    assert main(args) == 2
    assert not (tmp_path / "runs").exists(), os.listdir(tmp_path / "runs")


def test_refused_start_keeps_an_existing_run_directory(small_dataset, tmp_path):
    run = tmp_path / "mine"
    run.mkdir()
    assert main(["train", "--quiet", "--set", f"data.path={small_dataset}",
                 "--set", f"run.dir={run}", "--set", "data.batch=100000"]) == 2
    assert run.is_dir()


# a demo with other settings gets its own run (and data) directory
def _demo(*argv):
    from ibtmpi.envcmds import _demo_names
    return _demo_names(build_parser().parse_args(["demo", *argv]))


def test_demo_names_its_directories_after_its_settings():
    assert _demo() == ("data/demo", "runs/demo")
    assert _demo("--workers", "4") == ("data/demo", "runs/demo-4w")
    assert _demo("--algorithm", "admm") == ("data/demo", "runs/demo-admm")
    assert _demo("--image-size", "16", "--n", "400")[0] == "data/demo-16px-400"
    a, b = _demo("--set", "optim.lr=0.1")[1], _demo("--set", "optim.lr=0.2")[1]
    assert a != b and a.startswith("runs/demo-")
    assert _demo("--workers", "4", "--run-dir", "x") == ("data/demo", "x")


def test_set_wins_over_the_shorthand_flag(small_dataset, tmp_path):
    run = tmp_path / "run"
    argv = ["train", "--quiet"] + train_args(small_dataset, run)
    argv[argv.index("run.quiet=true")] = "run.quiet=false"
    assert main(argv) == 0
    cfg = config.load(str(run / "config.toml"))
    assert cfg["run"]["quiet"] is False
