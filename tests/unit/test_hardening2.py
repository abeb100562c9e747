"""Defects found by trying the project from a fresh clone (hardening, round 2):
one test per item, each failing on the code before its fix."""
import glob
import math
import os

import pytest

from ibtmpi import config
from ibtmpi.cli import build_parser, main
from conftest import rank_pid, train_args

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


# item 7: non-finite floats are refused, not trained until they diverge
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


# item 11: did-you-mean by meaning, not only by spelling
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


# item 14: a start that fails validation leaves no empty run directory
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


# item 12: a demo with other settings gets its own run (and data) directory
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


# item 9: the templates keep their progress lines; --set wins over a flag
def test_slurm_templates_do_not_pass_quiet():
    for path in glob.glob(os.path.join(ROOT, "slurm", "*.sbatch")):
        for line in open(path):
            if "ibtmpi train" in line:
                assert "--quiet" not in line, (path, line)


def test_set_wins_over_the_shorthand_flag(small_dataset, tmp_path):
    run = tmp_path / "run"
    argv = ["train", "--quiet"] + train_args(small_dataset, run)
    argv[argv.index("run.quiet=true")] = "run.quiet=false"
    assert main(argv) == 0
    cfg = config.load(str(run / "config.toml"))
    assert cfg["run"]["quiet"] is False


# item 15: no plots is said with its reason, not as "0 plots"
def test_no_plots_says_why(monkeypatch):
    from ibtmpi import cli, outputs

    def missing():
        raise outputs.NoPlotting("matplotlib is not installed: pip install 'ibtmpi[plot]'")
    monkeypatch.setattr(outputs, "pyplot", missing)
    said = cli._plots_said([])
    assert said.startswith("no plots (matplotlib is not installed") and "0 plots" not in said
    assert cli._plots_said(["a.png", "b.png"]) == "2 plots"


# item 1: prep onto a full file system: exit 74, one line, nothing left behind
@pytest.fixture
def full_fs(tmp_path):
    """A 3 MiB tmpfs (root only); unmounted afterwards."""
    import subprocess
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "full"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if r.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _prep(argv, patch_free=False):
    """`ibtmpi prep ARGV` in a subprocess; patch_free: the free-space check
    passes, so the disk fills in the middle of the writes."""
    import subprocess
    import sys
    code = ("import sys\nfrom ibtmpi.data_prep import writer\n"
            + ("writer.free_bytes = lambda path: 1 << 50\n" if patch_free else "")
            + "from ibtmpi.data_prep.cli import main\n"
            f"sys.exit(main({argv!r}, prog='ibtmpi prep'))\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)


def _one_line_74(r, mnt):
    assert r.returncode == 74, (r.returncode, r.stderr[-3000:])
    lines = (r.stdout + r.stderr).strip().splitlines()
    assert len(lines) == 1, lines[:20]
    assert "No space left on device" in lines[0] and "run it again" in lines[0]
    assert os.listdir(mnt) == []                     # no partial data set left


@pytest.mark.parametrize("patch_free", [False, True], ids=["checked-first", "mid-write"])
def test_prep_synth_on_a_full_disk(full_fs, patch_free):
    r = _prep(["synth", str(full_fs / "ds"), "--n", "3000", "--size", "32", "--quiet"],
              patch_free)
    _one_line_74(r, full_fs)
    if not patch_free:
        assert "the data set needs about" in r.stderr


@pytest.mark.parametrize("patch_free", [False, True], ids=["checked-first", "mid-write"])
def test_prep_folder_on_a_full_disk(full_fs, tmp_path, patch_free):
    import numpy as np
    from PIL import Image
    rng = np.random.default_rng(0)
    for c in ("a", "b"):
        (tmp_path / "src" / c).mkdir(parents=True)
        for i in range(150):
            Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(
                tmp_path / "src" / c / f"{i}.png")
    r = _prep(["folder", str(tmp_path / "src"), str(full_fs / "ds"), "--size", "64",
               "--quiet"], patch_free)
    _one_line_74(r, full_fs)


# items 5 and 6: a damaged shard is an error naming its file (and row)
def _damaged(src, dst, where):
    """A copy of the dataset with one train shard damaged: 'heap' = 2 KiB of
    random bytes at offset 2048 (HDF5's metadata), 'pixels' = 64 random
    bytes in the middle of the image rows."""
    import shutil
    shutil.copytree(src, dst)
    shard = sorted(glob.glob(os.path.join(dst, "train-*.h5")))[-1]
    rng = __import__("numpy").random.default_rng(1)
    with open(shard, "r+b") as f:
        if where == "heap":
            f.seek(2048)
            f.write(rng.bytes(2048))
        else:
            f.seek(os.path.getsize(shard) // 2)
            f.write(rng.bytes(64))
    return str(dst), shard


@pytest.mark.parametrize("cache", ["disk", "memory"])
@pytest.mark.parametrize("where", ["heap", "pixels"])
def test_a_damaged_shard_is_named(small_dataset, tmp_path, capsys, where, cache):
    data, shard = _damaged(small_dataset, tmp_path / "d", where)
    rc = main(["train"] + train_args(data, tmp_path / "run", **{"data.cache": cache}))
    err = capsys.readouterr().err
    assert rc == 2, err
    assert shard in err and "damaged" in err and "Traceback" not in err, err
    if where == "pixels":
        assert "row " in err and "cannot be read" in err


def test_prep_inspect_names_a_file_with_a_damaged_heap(small_dataset, tmp_path, capsys):
    from ibtmpi.data_prep.cli import main as prep
    data, shard = _damaged(small_dataset, tmp_path / "d", "heap")
    assert prep(["inspect", data]) == 2
    err = capsys.readouterr().err
    assert shard in err and "Traceback" not in err, err


def test_shards_carry_checksums_and_old_ones_still_load(small_dataset, tmp_path):
    import h5py
    import numpy as np
    import shutil
    from ibtmpi.dataset import Dataset
    shard = sorted(glob.glob(os.path.join(small_dataset, "train-*.h5")))[0]
    with h5py.File(shard, "r") as f:
        assert f["images"].fletcher32 and f["labels"].fletcher32
    # an older data set: the same rows without checksums (contiguous labels)
    old = tmp_path / "old"
    shutil.copytree(small_dataset, old)
    for p in glob.glob(str(old / "*.h5")):
        with h5py.File(p, "r") as f:
            im, lb = f["images"][:], f["labels"][:]
            attrs = dict(f.attrs)
        with h5py.File(p, "w") as f:
            f.create_dataset("images", data=im, chunks=(1,) + im.shape[1:])
            f.create_dataset("labels", data=lb)
            f.attrs.update(attrs)
        with h5py.File(p, "r") as f:
            assert not f["images"].fletcher32
    a, b = Dataset(small_dataset).split("train"), Dataset(str(old)).split("train")
    idx = np.arange(a.n)[::-7]
    assert np.array_equal(a.read(idx), b.read(idx))
    assert np.array_equal(a.labels, b.labels)


# item 2: every array of a file we read is checked from its header first
def _forge(src, dst, name, shape=(2 ** 40,), dtype="<f8"):
    """A copy of the npz `src` whose member `name` declares `shape` (and
    holds 16 bytes): loading it would try to allocate 8 TiB."""
    import io
    import zipfile
    import numpy as np
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for item in zin.infolist():
            data = zin.read(item.filename)
            if item.filename == f"{name}.npy":
                buf = io.BytesIO()
                np.lib.format.write_array_header_1_0(
                    buf, {"descr": dtype, "fortran_order": False, "shape": shape})
                data = buf.getvalue() + b"\0" * 16
            zout.writestr(item, data)
    return str(dst)


@pytest.fixture(scope="module")
def trained(small_dataset, tmp_path_factory):
    run = tmp_path_factory.mktemp("trained") / "run"
    assert main(["train"] + train_args(small_dataset, run)) == 0
    return str(run / "model.npz")


@pytest.mark.parametrize("member", ["input_shape", "mean", "std", "format", "classes",
                                    "layers", "z"])
@pytest.mark.parametrize("command", ["evaluate", "predict", "export", "init"])
def test_a_model_file_declaring_a_huge_array_exits_2(trained, small_dataset, tmp_path,
                                                     capsys, member, command):
    import numpy as np
    from PIL import Image
    bad = _forge(trained, tmp_path / "bad.npz", member)
    img = tmp_path / "x.png"
    Image.fromarray(np.zeros((16, 16, 3), np.uint8)).save(img)
    argv = {"evaluate": ["evaluate", bad, "--data", small_dataset],
            "predict": ["predict", bad, str(img)],
            "export": ["export", bad, "--onnx", str(tmp_path / "m.onnx")],
            "init": ["train"] + train_args(small_dataset, tmp_path / "run",
                                           **{"model.init": bad})}[command]
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "bad.npz" in lines[0] and repr(member) in lines[0], err


def test_a_checkpoint_declaring_more_than_it_holds_is_refused(trained, tmp_path):
    from ibtmpi.checkpoint import CheckpointError, read_rank
    bad = _forge(trained, tmp_path / "ck.npz", "z", shape=(8359,), dtype="<f4")
    with pytest.raises(CheckpointError, match=r"declares float32\[8359\] but the file holds 144 bytes"):
        read_rank(bad, {"z": ((8359,), "float32")})


# item 16: one process reports no Allreduce traffic; a clamped split is said
def test_one_process_plans_no_allreduce_and_says_a_clamped_split(small_dataset, tmp_path,
                                                                 capsys):
    argv = ["train", "--dry-run"] + train_args(small_dataset, tmp_path / "r",
                                              **{"data.split_size": 5000})
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "communication: none (one process" in out and "Allreduce(s) per pass" not in out
    # 480 train images, one worker: the split is its whole range, and it says why
    assert ("split 480 per worker (data.split_size 5,000 is more than a worker's 480 "
            "samples: each worker takes its whole range, one block per pass)") in out
    assert main(["train", "--simulate", "2", "--dry-run"]
                + train_args(small_dataset, tmp_path / "r")) == 0
    out = capsys.readouterr().out
    assert "Allreduce(s) per pass (one per block)" in out and "simulated here: no MPI" in out
    assert main(["train"] + train_args(small_dataset, tmp_path / "r2",
                                       **{"data.split_size": 5000})) == 0
    out = capsys.readouterr().out
    assert "split 480 (data.split_size 5,000 is more than" in out


def test_bench_table_shows_no_allreduce_for_one_process():
    from ibtmpi import bench
    row = {"name": "t1-sgd-1", "simulated": False, "N": 1, "world_size": 1,
           "algorithm": "sgd", "wall_per_pass": 1.0, "critical_per_pass": 1.0,
           "ips_worker_mean": None, "ips_worker_ci": None, "rank0_cpu_share": None,
           "allreduce_calls_per_pass": 9.0, "allreduce_mib_per_pass": 21.3}
    md = "\n".join(bench._time_table([row], row))
    assert "| none | none |" in md and "21.3" not in md


# item 18: --quiet means quiet; the docs list what model.npz holds
def test_prep_quiet_prints_nothing(tmp_path, capsys):
    import numpy as np
    from PIL import Image
    from ibtmpi.data_prep.cli import main as prep
    for c in ("a", "b"):
        (tmp_path / "src" / c).mkdir(parents=True)
        for i in range(12):
            Image.fromarray(np.full((8, 8, 3), i, np.uint8)).save(tmp_path / "src" / c / f"{i}.png")
    (tmp_path / "src" / "a" / "broken.png").write_bytes(b"not an image")
    assert prep(["folder", str(tmp_path / "src"), str(tmp_path / "f"), "--size", "8",
                 "--quiet"]) == 0
    out, err = capsys.readouterr()          # the skipped file is a warning: still said
    assert out.startswith("skipped 1 unreadable file(s):") and "wrote" not in out, out
    assert len(out.strip().splitlines()) == 2 and err == ""
    assert prep(["synth", str(tmp_path / "s"), "--n", "60", "--size", "8", "--quiet"]) == 0
    assert capsys.readouterr() == ("", "")


def test_docs_list_what_model_npz_holds(trained):
    import numpy as np
    text = open(os.path.join(ROOT, "docs", "config.md")).read()
    section = text[text.index("- `model.npz`:"):]
    section = section[:section.index("model-best.npz")]
    with np.load(trained) as f:
        for key in f.files:
            assert f"`{key}`" in section, key
    assert "n_classes" not in section


# item 13: an error every rank knows ends the job in order, without MPI_Abort
@pytest.mark.skipif(not os.path.exists(os.path.join(os.path.dirname(__import__("sys").executable),
                                                    "mpiexec")), reason="no mpiexec")
def test_errors_every_rank_knows_end_without_abort(small_dataset, tmp_path):
    import subprocess

    from conftest import IBTMPI, mpiexec

    def run(*sets):
        r = subprocess.run(mpiexec(3) + IBTMPI + ["train"] + train_args(
            small_dataset, tmp_path / "run", **dict(s.split("=", 1) for s in sets)),
            capture_output=True, text=True, timeout=120)
        return r.returncode, r.stdout, r.stderr
    for sets, said in [(("optim.lr=-1",), "optim.lr must be > 0"),
                       (("data.path=/nonexistent",), "does not exist"),
                       (("model.init=/nonexistent/model.npz",), "model.init:")]:
        rc, out, err = run(*sets)
        assert rc == 2, (sets, err)
        assert "Abort" not in out + err and "MPI_Abort" not in out + err, err
        lines = err.strip().splitlines()
        assert len(lines) == 1 and said in lines[0], err
    assert run()[0] == 0                                 # a checkpoint of this config
    rc, out, err = run("model.layers=softmax")
    assert rc == 2 and "written by another configuration" in err and "Abort" not in err, err


# item 8: the first Ctrl-C checkpoints at the end of the block, exit 130
@pytest.mark.parametrize("n", [1, 3])
def test_ctrl_c_checkpoints_and_resumes(small_dataset, tmp_path, n):
    import signal
    import subprocess

    import time
    from ibtmpi import checkpoint as ckpt
    from conftest import IBTMPI, MPIEXEC, mpiexec
    if n > 1 and not os.path.exists(MPIEXEC):
        pytest.skip("no mpiexec")
    run = tmp_path / "run"
    cmd = (mpiexec(n) if n > 1 else []) + IBTMPI + ["train"] + train_args(
        small_dataset, run, passes=400, **{"run.quiet": "false", "run.progress_s": 0})
    p = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    for line in p.stdout:                  # training has started
        if line.startswith("placement:"):
            break
    time.sleep(1.0)
    t0 = time.time()
    os.killpg(p.pid, signal.SIGINT)        # what a terminal's Ctrl-C does
    out, err = p.communicate(timeout=60)
    took = time.time() - t0
    assert p.returncode == 130, (out[-2000:], err[-2000:])
    assert took < 10, took
    assert err.count("interrupted") == 1 and "press Ctrl-C again to stop at once" in err, err
    assert "pending" not in err and "Abort" not in err, err
    assert "interrupted: stopped by Ctrl-C (SIGINT) after block" in out, out[-1000:]
    done = ckpt.complete(str(run))
    assert done, "no checkpoint written"
    # the same command would resume from it
    r = subprocess.run(cmd + ["--dry-run"], capture_output=True, text=True, timeout=120)
    assert f"resume from {ckpt.ckpt_dir(str(run), done[-1])}" in r.stdout, r.stdout + r.stderr


# item 4: a hung rank no longer hangs the job by default
@pytest.mark.skipif(not os.path.exists(os.path.join(os.path.dirname(__import__("sys").executable),
                                                    "mpiexec")), reason="no mpiexec")
def test_a_stopped_worker_is_found_by_the_default_watchdog(small_dataset, tmp_path):
    """SIGSTOP one worker mid-run with run.watchdog_s at its default (auto;
    its 60 s floor lowered to 3 s through the environment for the test):
    one line naming the rank, exit 1, and `ibtmpi status` says hung rank."""
    import signal
    import subprocess

    import time
    from conftest import IBTMPI, start_job
    run = tmp_path / "run"
    p = start_job(small_dataset, run, {"IBTMPI_WATCHDOG_FLOOR_S": "3"})
    worker = rank_pid(run, 2)
    assert worker, "rank 2 not found"
    t0 = time.time()
    os.kill(worker, signal.SIGSTOP)
    try:
        out, err = p.communicate(timeout=60)
    finally:
        try:
            os.kill(worker, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert p.returncode == 1, err[-2000:]
    assert time.time() - t0 < 30
    said = [x for x in err.splitlines() if "hung rank" in x]
    # stopped before or inside the Allreduce: named either way (it is on this node)
    assert said and ("rank(s) [2] had not arrived" in said[0]
                     or "rank 2 (worker 1) is stopped" in said[0]), err[-2000:]
    assert "Traceback" not in err
    st = subprocess.run(IBTMPI + ["status", str(run)], capture_output=True, text=True,
                        timeout=60).stdout
    assert "hung rank" in st, st


# item 3: the divergence advice works: lr and rho may change on a resume
def test_divergence_advice_resumes_with_a_lower_lr(small_dataset, tmp_path, capsys,
                                                    monkeypatch):
    import json
    import subprocess
    import sys
    from ibtmpi import checkpoint as ckpt
    from conftest import IBTMPI
    run = tmp_path / "run"
    argv = ["train"] + train_args(small_dataset, run, passes=2, **{
        "algorithm.name": "admm", "run.checkpoint_every": 2})
    monkeypatch.setenv("IBTMPI_FAULT", "0:7:nan")
    monkeypatch.setattr(sys, "argv", ["ibtmpi"] + argv)
    assert main(argv) == 4
    out, err = capsys.readouterr()
    line = [x for x in out.splitlines() if "diverged" in x][0]
    assert line.startswith("ibtmpi train: diverged at block 7 (rank(s) [0]): ")
    assert f"the last good checkpoint {ckpt.ckpt_dir(str(run), 5)} is kept" in line
    assert line.endswith(" --set optim.lr=0.01") and "RuntimeWarning" not in out + err
    st = subprocess.run(IBTMPI + ["status", str(run)], capture_output=True, text=True,
                        timeout=60).stdout
    assert "diverged at block 7 (rank(s) [0])" in st and "stopped" not in st, st
    # the advised command: the same with --set optim.lr=0.01, and a rho change too
    monkeypatch.delenv("IBTMPI_FAULT")
    rc = main(argv + ["--set", "optim.lr=0.01", "--set", "algorithm.rho=0.05"])
    out = capsys.readouterr().out
    assert rc == 0, out
    said = "algorithm.rho 0.01 -> 0.05, optim.lr 0.02 -> 0.01"
    assert f"resuming with changed settings at block 6: {said}" in out
    recs = [json.loads(x) for x in open(run / "metrics.jsonl")]
    assert [r.get("config_changed") for r in recs if r["block"] == 6] == [said]
    assert {r["lr"] for r in recs if r["block"] >= 6} == {0.01}
    assert {r["rho"] for r in recs if r["block"] >= 6} == {0.05}
    m = ckpt.read_manifest(str(run), ckpt.complete(str(run))[-1])
    assert m["changed"] == [{"block": 6, "changes": said}]
    # a key that changes the model or the data order still refuses
    assert main(argv + ["--set", "data.batch=8"]) == 2


def test_a_divergence_in_block_0_claims_no_checkpoint(small_dataset, tmp_path, capsys,
                                                      monkeypatch):
    monkeypatch.setenv("IBTMPI_FAULT", "0:0:nan")
    assert main(["train"] + train_args(small_dataset, tmp_path / "r")) == 4
    out = capsys.readouterr().out
    assert "no checkpoint was written before it" in out and "is kept" not in out


def test_set_rho_keeps_the_unscaled_duals(small_dataset, tmp_path):
    import numpy as np
    from ibtmpi.train import Trainer
    cfg = config.load(None, ["data.path=" + small_dataset, "algorithm.name=admm",
                             "model.layers=tiny", "data.split_size=40", "run.simulate=2",
                             f"run.dir={tmp_path / 'r'}", "run.quiet=true"])
    t = Trainer(cfg, log=lambda m: None)
    rng = np.random.default_rng(0)
    t.cons.U[...] = rng.standard_normal(t.cons.U.shape).astype(np.float32)
    states = [t.states[i] for i in t.local]
    for ws in states:
        ws.u[...] = rng.standard_normal(ws.u.shape).astype(np.float32)
    y_U = t.cons.rho * t.cons.U.astype(np.float64)
    y_u = [t.cons.rho * ws.u.astype(np.float64) for ws in states]
    t.cons.set_rho(0.04, states)
    assert t.cons.rho == 0.04
    assert np.allclose(0.04 * t.cons.U, y_U, rtol=1e-6)
    for ws, y in zip(states, y_u):
        assert np.allclose(0.04 * ws.u, y, rtol=1e-6)


# item 19: templates that run on a stock cluster with the recommended install
def test_srun_mpi_plugin_follows_the_venvs_mpi(capsys):
    from ibtmpi import launcher
    assert launcher.srun_mpi_plugin("hydra") == "pmi2"
    assert launcher.srun_mpi_plugin("openmpi") == "pmix"
    assert launcher.srun_mpi_plugin("unknown") == "pmi2"
    assert main(["info", "--srun-mpi"]) == 0
    out = capsys.readouterr().out.strip()
    assert out == launcher.srun_mpi_plugin(launcher.flavor(launcher.find_mpiexec()))


def test_templates_ask_no_long_time_limit_and_say_their_pmi():
    import re
    for path in glob.glob(os.path.join(ROOT, "slurm", "*.sbatch")):
        text = open(path).read()
        for t in re.findall(r"^#SBATCH --time=(\S+)", text, re.M):
            h = int(t.split(":")[0]) if ":" in t else 0
            assert h <= 1, (path, t)            # fits a 2-hour partition
        if "srun --mpi" in text:
            assert "pmix}" not in text and "info --srun-mpi" in text, path
            assert 'echo "srun --mpi=$PMI' in text, path


# item 17: a worker killed without a word is named afterwards
def test_lost_rank_is_the_one_that_ended_first_without_a_word(tmp_path):
    import json
    from ibtmpi.train.lifecycle import RANKS_DIR, lost_rank
    d = tmp_path / RANKS_DIR
    d.mkdir()
    for r, end, said in [(0, 100.30, ""), (1, 100.31, ""), (2, 100.25, "")]:
        (d / f"rank-{r}.json").write_text(json.dumps({"rank": r, "host": "n1", "pid": 10 + r}))
        (d / f"rank-{r}.end").write_text(f"{end}\n")
        (d / f"rank-{r}.out").write_text(said)
    assert lost_rank(str(tmp_path)) == {"rank": 2, "host": "n1", "pid": 12, "lead_s": 0.05}
    (d / "rank-2.out").write_text("ok")         # it said goodbye: an ordinary end
    assert lost_rank(str(tmp_path)) is None
    (d / "rank-2.out").write_text("")
    (d / "rank-0.out").write_text("ok")         # rank 0 aborted after its own message
    assert lost_rank(str(tmp_path)) is None


@pytest.mark.skipif(not os.path.exists(os.path.join(os.path.dirname(__import__("sys").executable),
                                                    "mpiexec")), reason="no mpiexec")
def test_a_sigkilled_worker_is_named_by_status_and_the_next_start(small_dataset, tmp_path):
    import signal
    import subprocess
    import time
    from conftest import IBTMPI, mpiexec
    run = tmp_path / "run"
    cmd = mpiexec(3) + IBTMPI + ["train"] + train_args(
        small_dataset, run, passes=400, **{"run.quiet": "false", "run.progress_s": 0})
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in p.stdout:
        if line.startswith("placement:"):
            break
    time.sleep(1.0)
    worker = rank_pid(run, 2)
    assert worker
    os.kill(worker, signal.SIGKILL)
    p.communicate(timeout=60)
    assert p.returncode != 0
    time.sleep(0.5)                       # the watchers write as they see the end
    st = subprocess.run(IBTMPI + ["status", str(run)], capture_output=True, text=True,
                        timeout=60).stdout
    # the watchers' clocks name the killed rank; under load the ranks its
    # launcher then kills can end within their jitter (a few ms), and then
    # the text's lead says how close it was (lifecycle.lost_rank_text)
    import re
    m = re.search(r"rank (\d) \(pid (\d+) on [^)]*\) ended first, ([\d.]+) s before the "
                  r"others, without a word", st)
    assert m, st
    assert m.group(1) == "2" and m.group(2) == str(worker) or float(m.group(3)) < 0.02, st
    # the next job of the run says so too (a short one: it resumes and ends)
    r = subprocess.run(mpiexec(3) + IBTMPI + ["train"] + train_args(small_dataset, run,
                                                                    passes=0.5),
                       capture_output=True, text=True, timeout=120)
    assert f"the previous job in {run} ended when rank {m.group(1)} (pid {m.group(2)}" \
        in r.stdout, r.stdout + r.stderr


# review of the round: a start refused on one rank alone, the advised command
# run twice, a checkpoint whose data (not its header) is damaged
@pytest.mark.skipif(not os.path.exists(os.path.join(os.path.dirname(__import__("sys").executable),
                                                    "mpiexec")), reason="no mpiexec")
def test_a_config_only_one_rank_cannot_read_ends_in_order(small_dataset, tmp_path):
    """Rank 1 cannot read the config file (another node's view of it): it
    meets the others at the start-up agreement, not inside another
    collective (run.threads = auto takes the node's rank count, a
    collective): exit 2 in one line, no hang."""
    import subprocess
    from conftest import IBTMPI, mpiexec
    cfg = tmp_path / "run.toml"
    cfg.write_text(f'[data]\npath = "{small_dataset}"\nsplit_size = 40\n'
                   f'[model]\nlayers = "tiny"\n[run]\ndir = "{tmp_path / "r"}"\n')
    code = ("import os, sys\nfrom ibtmpi import comm\n"
            "if comm.world_rank() == 1:\n"
            f"    os.environ['X'] = '1'; sys.argv[sys.argv.index('--config') + 1] = "
            f"'{tmp_path / 'missing.toml'}'\n"
            "from ibtmpi.cli import main\nsys.exit(main(sys.argv[1:]))\n")
    r = subprocess.run(mpiexec(3) + [IBTMPI[0], "-c", code, "train", "--config", str(cfg)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("[rank 1] ibtmpi train: error: cannot "
                                                   "read config"), r.stderr


def test_the_advised_command_diverging_again_still_exits_4(small_dataset, tmp_path, capsys,
                                                            monkeypatch):
    import sys
    argv = ["train"] + train_args(small_dataset, tmp_path / "r") + ["--set", "optim.lr=0.01"]
    monkeypatch.setenv("IBTMPI_FAULT", "0:2:nan")
    monkeypatch.setattr(sys, "argv", ["ibtmpi"] + argv)
    assert main(argv) == 4
    line = [x for x in capsys.readouterr().out.splitlines() if "diverged" in x][0]
    assert line.endswith(" --set optim.lr=0.005") and "optim.lr=0.01" not in line, line


def test_a_checkpoint_with_damaged_data_is_set_aside(small_dataset, tmp_path, capsys):
    """A flipped bit in a checkpoint's array data (its header intact) fails
    the zip's CRC: the checkpoint is set aside as damaged and the one before
    it resumes, instead of a crash."""
    import zipfile
    from ibtmpi import checkpoint as ckpt
    run = tmp_path / "r"
    sets = train_args(small_dataset, run, passes=1, **{"run.checkpoint_every": 2})
    assert main(["train"] + sets) == 0
    done = ckpt.complete(str(run))
    f = os.path.join(ckpt.ckpt_dir(str(run), done[-1]), ckpt.rank_file(0))
    with zipfile.ZipFile(f) as zf:
        info = zf.getinfo("z.npy")
    with open(f, "r+b") as fh:
        fh.seek(info.header_offset + 30 + len(info.filename) + 128 + 8)
        b = fh.read(1)
        fh.seek(-1, 1)
        fh.write(bytes([b[0] ^ 0x10]))
    capsys.readouterr()
    assert main(["train"] + train_args(small_dataset, run, passes=2,
                                       **{"run.checkpoint_every": 2})) == 0
    out = capsys.readouterr().out
    assert "cannot be read" in out and "set aside as" in out, out
    assert f"resuming from {ckpt.ckpt_dir(str(run), done[-2])}" in out


def test_the_allreduce_alarm_fires_once_past_its_deadline_and_not_when_disarmed():
    import threading
    from ibtmpi.train.lifecycle import Alarm
    fired, ev = [], threading.Event()
    a = Alarm()
    a.arm(0.05, lambda *x: (fired.append(x), ev.set()), 7, "why")
    assert ev.wait(2) and fired == [(7, "why")]
    ev.clear()
    for k in range(50):                     # armed and disarmed per block: never fires
        a.arm(0.2, lambda *x: (fired.append(x), ev.set()), k)
        a.disarm()
    assert not ev.wait(0.4) and len(fired) == 1
    assert sum(t.name == "allreduce-alarm" for t in threading.enumerate()) >= 1
