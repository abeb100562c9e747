"""slurm/sweep.sh with a stand-in sbatch: a configuration or data error is
caught on the submit host before anything is queued; a good one queues one
job per N and the report job after them."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VENV = os.path.dirname(os.path.dirname(sys.executable))


def sweep(tmp_path, *args):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    log = tmp_path / "sbatch.log"
    sbatch = bin_dir / "sbatch"
    sbatch.write_text(f'#!/bin/sh\necho "$*" >> "{log}"\necho 1$(wc -l < "{log}")\n')
    sbatch.chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", IBTMPI_VENV=VENV,
               IBTMPI_SWEEP_DIR=str(tmp_path / "out"), IBTMPI_SWEEP_NS="1 2")
    r = subprocess.run(["bash", "slurm/sweep.sh", "examples/demo.toml", *args], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=300)
    calls = log.read_text().splitlines() if log.exists() else []
    return r, calls


def test_a_bad_configuration_queues_nothing(small_dataset, tmp_path):
    r, calls = sweep(tmp_path, "--set", f"data.path={small_dataset}", "--set", "optim.lr=-1")
    assert r.returncode == 2
    assert "optim.lr must be > 0" in r.stderr and "nothing submitted" in r.stderr
    assert calls == []
    r, calls = sweep(tmp_path, "--set", f"data.path={tmp_path / 'missing'}")
    assert r.returncode == 2 and "does not exist" in r.stderr and calls == []


def test_a_good_configuration_queues_each_n_then_the_report(small_dataset, tmp_path):
    r, calls = sweep(tmp_path, "--set", f"data.path={small_dataset}")
    assert r.returncode == 0, r.stderr
    assert len(calls) == 3, calls
    assert "--ntasks=1 --job-name=ibtmpi-n1" in calls[0] and "algorithm.name=sgd" in calls[0]
    assert "--ntasks=3 --job-name=ibtmpi-n2" in calls[1]
    assert calls[2].startswith("--dependency=afterany:11:12 ")
    assert not os.path.exists(tmp_path / "out" / "t1-n1")      # the check wrote nothing there
    assert f"progress: {VENV}/bin/ibtmpi status {tmp_path / 'out'}/t1-n*" in r.stdout


def test_seeds_queue_each_n_per_seed(small_dataset, tmp_path, monkeypatch):
    monkeypatch.setenv("IBTMPI_SWEEP_SEEDS", "2")
    r, calls = sweep(tmp_path, "--set", f"data.path={small_dataset}")
    assert r.returncode == 0, r.stderr
    assert len(calls) == 5, calls                      # N = 1, 2 x seeds 0, 1 + report
    out = tmp_path / "out"
    assert f"run.dir={out}/t1-n1 " in calls[0] and "model.seed" not in calls[0]
    assert (f"run.dir={out}/t1-n1-s1 --set algorithm.name=sgd --set model.seed=1 "
            f"--set data.seed=1") in calls[1]
    assert f"run.dir={out}/t1-n2-s1 --set model.seed=1 --set data.seed=1" in calls[3]
    assert calls[4].startswith("--dependency=afterany:11:12:13:14 ")
    monkeypatch.setenv("IBTMPI_SWEEP_SEEDS", "two")
    (tmp_path / "x").mkdir()
    r, calls = sweep(tmp_path / "x", "--set", f"data.path={small_dataset}")
    assert r.returncode == 2 and "IBTMPI_SWEEP_SEEDS must be a whole number" in r.stderr
    assert calls == []
