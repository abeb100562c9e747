"""A rehearsal of benchmarks/gpu_check.sh, the script a real-GPU run
consists of, on this CPU: `import cupy` finds the CuPy stand-in
(tests/standin), sizes are tiny (GPU_CHECK_QUICK=1). It checks the script
and the `--device gpu` start-up path under mpiexec, not the GPU: the first
rehearsal found the workers waiting in a collective the master skipped."""
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BIN = os.path.dirname(sys.executable)

# the MPI library says it is CUDA-aware, so the script also runs the
# cuda_aware = off training and compares the two models
AWARE = ("import ibtmpi.comm as c\n"
         "c.cuda_support = lambda: (True, 'stand-in: CUDA-aware')\n")


def rehearse(tmp_path, path, sitecustomize=None, script="gpu_check.sh", quick="GPU_CHECK_QUICK",
             **more_env):
    """Run benchmarks/SCRIPT OUT with PATH, `quick`=1 and the stand-in;
    (OUT, {stage: how it ended}, the log's tail)."""
    pp = [os.path.join(ROOT, "tests", "standin")]
    if sitecustomize:
        (tmp_path / "site").mkdir()
        (tmp_path / "site" / "sitecustomize.py").write_text(sitecustomize)
        pp.insert(0, str(tmp_path / "site"))
    env = dict(os.environ, PATH=path, PYTHONPATH=os.pathsep.join(pp), **{quick: "1"},
               **more_env)
    out = tmp_path / "out"
    r = subprocess.run(["bash", os.path.join(ROOT, "benchmarks", script), str(out)],
                       env=env, capture_output=True, text=True, timeout=900)
    log = r.stdout[-4000:] + r.stderr[-2000:]
    stages = dict(line.split(": ", 1) for line in (out / "stages.txt").read_text().splitlines())
    return out, stages, log


def ok(stages, names, log):
    assert list(stages) == names, log
    for name in names:
        assert stages[name].startswith("ok,"), f"{name}: {stages[name]}\n{log}"


COMMON = ["imports", "info", "compile", "gpu-tests", "step-vs-cudnn", "step-resnet8",
          "step-resnet18", "prep"]
REPEAT = ["repeat-1", "repeat-2", "consensus-update", "out-of-memory"]



def prefix_mpiexec(tmp_path):
    """An mpiexec that puts another `python3` first on its ranks' PATH, as
    Open MPI started by its full path does with its own prefix's bin (the
    GPU machine's /usr/bin/mpiexec ran the system's Python, without the
    packages): a sitecustomize making launcher.command give it."""
    bad = tmp_path / "prefix-bin"
    bad.mkdir()
    (bad / "python3").write_text('#!/bin/sh\necho "the prefix\'s python3 ran" >&2; exit 3\n')
    wrap = tmp_path / "mpiexec"
    wrap.write_text(f'#!/bin/sh\nPATH={bad}:$PATH exec {os.path.join(BIN, "mpiexec")} "$@"\n')
    for f in (bad / "python3", wrap):
        f.chmod(0o755)
    return ("import ibtmpi.launcher as l\n"
            "_command = l.command\n"
            f"l.command = lambda n, mpiexec=None: [{str(wrap)!r}] + _command(n, mpiexec)[1:]\n")


@pytest.mark.skipif(not os.path.exists(os.path.join(BIN, "mpiexec")),
                    reason="no mpiexec beside this Python")
def test_gpu_check_stages_with_mpiexec_and_a_cuda_aware_library(tmp_path):
    out, stages, log = rehearse(tmp_path, f"{BIN}{os.pathsep}{os.environ['PATH']}",
                                AWARE + prefix_mpiexec(tmp_path))
    ok(stages, COMMON + ["train-mpi", "train-mpi-master-cpu", "train-mpi-cuda-aware-off"]
       + REPEAT, log)
    train = (out / "train.txt").read_text()
    assert "device buffers to MPI" in train and "staged through pinned host buffers" in train
    assert "cuda_aware on vs off, z bitwise equal: True" in train, train
    assert "master on its GPU vs on the host, z bitwise equal: True" in train, train
    assert "the master keeps z and the consensus state on its GPU" in train, train
    assert "GPU run repeated, z bitwise equal: True" in train, train
    assert "CUPY_GPU_MEMORY_LIMIT=300000: exit status 71 (71 expected)" in train, train
    files = sorted(p.name for p in out.iterdir())
    assert files == ["consensus.txt", "env.txt", "gpu_step.json", "gpu_step.txt",
                     "gpu_step_resnet18.json", "gpu_step_resnet18.txt", "gpu_step_resnet8.json",
                     "gpu_step_resnet8.txt", "gpu_tests.txt", "stages.txt", "train.txt",
                     "train_summary.json", "train_timeline.json"]   # 13 come back
    assert "| ibt |" in (out / "consensus.txt").read_text()
    r18 = json.loads((out / "gpu_step_resnet18.json").read_text())
    assert [(r["model"], r["batch"]) for r in r18] == [("resnet18", 2), ("resnet18", 3)]
    assert [r["batch"] for r in json.loads((out / "gpu_step.json").read_text())] == [2, 3]
    assert "passed" in (out / "gpu_tests.txt").read_text()
    env = (out / "env.txt").read_text()
    assert "GPU: 1 CUDA device(s)\n  GPU 0: CuPy stand-in, compute capability 9.0, 16.0 GiB (" in env
    summary = json.loads((out / "train_summary.json").read_text())
    assert (summary["N"], summary["world_size"], summary["simulated"]) == (2, 3, False)
    assert summary["master_consensus"] == "gpu"


def test_gpu_check_stages_without_mpiexec(tmp_path):
    """No mpiexec on PATH: the 2 workers are simulated in one process."""
    out, stages, log = rehearse(tmp_path, no_mpiexec_path(tmp_path))
    ok(stages, COMMON + ["train-simulate"] + REPEAT, log)
    train = (out / "train.txt").read_text()
    assert "2 workers simulated in one process" in train
    assert "GPU run repeated, z bitwise equal: True" in train, train


def no_mpiexec_path(tmp_path):
    """A PATH with this Python as python3 and no mpiexec."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "python3").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    (bin_ / "python3").chmod(0o755)
    return os.pathsep.join([str(bin_)] + [d for d in os.environ["PATH"].split(os.pathsep)
                                          if not os.path.exists(os.path.join(d, "mpiexec"))])


def test_gpu_check_keeps_to_its_budget(tmp_path):
    """Stages that would start with under 10 s of GPU_CHECK_BUDGET left are
    skipped and say so; the script still ends and writes its summary."""
    out, stages, log = rehearse(tmp_path, no_mpiexec_path(tmp_path), GPU_CHECK_BUDGET="0")
    assert list(stages) == COMMON + ["train-simulate"] + REPEAT, log
    assert set(stages.values()) == {"SKIPPED (the 0 s budget is spent)"}
    assert "not compared, a run did not finish" in (out / "train.txt").read_text()
