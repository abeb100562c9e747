"""Messages that lead somewhere: a near miss of a key or a data set
directory gets a did-you-mean, and a checkpoint of the same workers in
another process layout (MPI against --simulate) says which launch resumes
it instead of "another worker count"."""
import os
import subprocess

import pytest

from ibtmpi.cli import main
from conftest import IBTMPI, MPIEXEC, copy_dataset, mpiexec, train_args


@pytest.mark.parametrize("key,want", [("optim.learning_rat", "'lr'"), ("optim.lrr", "'lr'"),
                                      ("data.bach", "'batch'")])
def test_a_near_miss_of_a_key_gets_a_did_you_mean(small_dataset, tmp_path, capsys, key, want):
    assert main(["train", "--dry-run"] + train_args(small_dataset, tmp_path / "r")
                + ["--set", f"{key}=1"]) == 2
    assert f"unknown key {key} (did you mean {want}?)" in capsys.readouterr().err


def test_a_near_miss_of_a_data_set_directory_names_it(small_dataset, tmp_path, capsys):
    data = copy_dataset(small_dataset, tmp_path / "synth16")
    assert main(["train", "--dry-run"] + train_args(str(tmp_path / "synth61"),
                                                    tmp_path / "r")) == 2
    err = capsys.readouterr().err
    assert f"does not exist (did you mean {data}?)" in err, err
    assert main(["train", "--dry-run"] + train_args(str(tmp_path / "other"),
                                                    tmp_path / "r")) == 2
    assert "did you mean" not in capsys.readouterr().err


@pytest.mark.skipif(not os.path.exists(MPIEXEC), reason="no mpiexec in the venv")
def test_a_checkpoint_of_the_same_workers_under_mpi_names_the_launch(small_dataset,
                                                                      tmp_path, capsys):
    run = tmp_path / "r"
    r = subprocess.run(mpiexec(3) + IBTMPI + ["train"] + train_args(small_dataset, run),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert main(["train", "--simulate", "2"] + train_args(small_dataset, run)
                + ["--set", "run.passes=2"]) == 2
    err = capsys.readouterr().err
    assert ("was written by the same 2 workers, an MPI job of 3 processes; this run is "
            "--simulate 2" in err and "resume with mpiexec -n 3" in err), err
    assert "another worker count" not in err


def test_one_worker_of_a_block_method_says_it_is_not_the_baseline(small_dataset, tmp_path,
                                                                   capsys):
    args = ["train"] + train_args(small_dataset, tmp_path / "a") + [
        "--set", "run.quiet=false", "--set", "run.passes=0.2"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert ("one worker: this is ibt with N = 1, not the single-worker baseline" in out
            and "--set algorithm.name=sgd" in out), out
    args = ["train"] + train_args(small_dataset, tmp_path / "b") + [
        "--set", "run.quiet=false", "--set", "run.passes=0.2", "--set", "algorithm.name=sgd"]
    assert main(args) == 0
    assert "one worker:" not in capsys.readouterr().out
