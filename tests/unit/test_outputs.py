"""evaluate / predict / export / plot on a model trained by the trainer;
ONNX checked with onnxruntime against our forward; MPI evaluation equal to
one process; clear errors for missing, incompatible and mismatched inputs."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from ibtmpi.cli import main
from ibtmpi.config import load
from ibtmpi.dataset import Dataset
from ibtmpi.outputs import TrainedModelError, load_trained
from ibtmpi.train import Trainer
from conftest import IBTMPI, mpiexec


@pytest.fixture(scope="module")
def run_dir(small_dataset, tmp_path_factory):
    d = str(tmp_path_factory.mktemp("trained") / "run")
    cfg = load(None, [f"data.path={small_dataset}", "algorithm.name=admm",
                      "data.split_size=40", "data.batch=16", "model.layers=tiny",
                      "run.passes=2", "run.quiet=true", f"run.dir={d}",
                      "run.simulate=2", "run.threads=1", "optim.schedule=cosine"])
    Trainer(cfg, log=lambda m: None).run()
    return d


def test_evaluate_matches_the_trainer_and_writes_reports(run_dir, small_dataset, tmp_path, capsys):
    out = tmp_path / "ev"
    assert main(["evaluate", run_dir, "--data", small_dataset, "--out", str(out)]) == 0
    rep = json.load(open(out / "report.json"))
    summary = json.load(open(os.path.join(run_dir, "summary.json")))
    assert rep["accuracy"] == pytest.approx(summary["test_acc"], abs=1e-12)
    cm = np.array(rep["confusion"])
    assert cm.sum() == rep["n"] == 60
    for i, c in enumerate(rep["classes"]):
        pc = rep["per_class"][c]
        assert pc["support"] == cm[i].sum()
        if cm[:, i].sum():
            assert pc["precision"] == pytest.approx(cm[i, i] / cm[:, i].sum())
    assert (out / "confusion.png").stat().st_size > 1000
    assert "confusion matrix" in capsys.readouterr().out


def test_evaluate_takes_the_runs_dataset_when_no_data_is_given(run_dir, tmp_path, capsys):
    """Without --data: the data.path of the run that made the model, from
    a run directory, its model file or one of its checkpoints; a model
    with no run around it, or a run whose data moved, is a clear exit 2."""
    import shutil
    from ibtmpi import checkpoint as ckpt
    summary = json.load(open(os.path.join(run_dir, "summary.json")))
    last = ckpt.ckpt_dir(run_dir, ckpt.complete(run_dir)[-1])
    for model in (run_dir, os.path.join(run_dir, "model.npz"), last):
        assert main(["evaluate", model]) == 0, capsys.readouterr().err
        acc = float(capsys.readouterr().out.split()[1])
        assert acc == pytest.approx(summary["test_acc"], abs=1e-4), model
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(os.path.join(run_dir, "model.npz"), alone)
    assert main(["evaluate", str(alone / "model.npz")]) == 2
    assert "not in a run directory" in capsys.readouterr().err
    moved = tmp_path / "moved"
    moved.mkdir()
    shutil.copy(os.path.join(run_dir, "model.npz"), moved)
    with open(moved / "config.toml", "w") as f:
        f.write('[data]\npath = "/nonexistent/data"\n')
    assert main(["evaluate", str(moved)]) == 2
    assert "/nonexistent/data" in capsys.readouterr().err


def test_evaluate_under_mpi_is_identical(run_dir, small_dataset, tmp_path):
    for n, out in ((1, tmp_path / "a"), (3, tmp_path / "b")):
        r = subprocess.run(mpiexec(n) + IBTMPI + [
                            "evaluate", run_dir, "--data", small_dataset, "--split", "train",
                            "--out", str(out)], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
    a, b = json.load(open(tmp_path / "a" / "report.json")), json.load(open(tmp_path / "b" / "report.json"))
    assert a["confusion"] == b["confusion"] and b["ranks"] == 3


def test_onnx_export_matches_our_forward(run_dir, small_dataset, tmp_path):
    import onnxruntime as ort
    path = str(tmp_path / "m.onnx")
    assert main(["export", run_dir, "--onnx", path]) == 0
    import onnx
    # opset 17's IR version, not the installed onnx's newest: older
    # onnxruntime releases (1.19, the last for Python 3.9) read IR <= 10
    assert onnx.load(path).ir_version == 8
    tm = load_trained(run_dir)
    x = Dataset(small_dataset).split("test").read_all()[:32]
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    probs, = sess.run(["probs"], {"image": x.transpose(0, 3, 1, 2).astype(np.float32)})
    ours = tm.probs(x)
    err = float(np.abs(probs - ours).max())
    assert err <= 1e-4, err
    print(f"ONNX vs ours: max abs diff {err:.2e} on {len(x)} images")


def test_predict_uses_training_preprocessing(run_dir, small_dataset, tmp_path, capsys):
    ds = Dataset(small_dataset)
    x = ds.split("test").read_all()[:5]
    d = tmp_path / "imgs"
    d.mkdir()
    for i, im in enumerate(x):
        Image.fromarray(im).save(d / f"{i}.png")
    Image.fromarray(x[0][:, :, 0], "L").save(d / "grey.png")        # converted to RGB
    (d / "broken.jpg").write_bytes(b"not an image")
    out = tmp_path / "p.json"
    # one file unreadable: the others are predicted and written, the exit is 2
    assert main(["predict", run_dir, str(d), "--format", "json", "--out", str(out)]) == 2
    res = json.load(open(out))
    assert [e["file"].endswith("broken.jpg") for e in res["errors"]] == [True]
    got = {os.path.basename(r["file"]): r for r in res["predictions"]}
    tm = load_trained(run_dir)
    ref = tm.probs(x)
    for i in range(5):
        p = np.array([got[f"{i}.png"][f"p_{c}"] for c in tm.classes])
        np.testing.assert_allclose(p, ref[i], atol=1e-6)
        assert got[f"{i}.png"]["class"] == tm.classes[int(ref[i].argmax())]
    err = capsys.readouterr().err
    assert "cannot read" in err and "1 of 7 file(s) could not be read" in err, err
    # csv on stdout
    assert main(["predict", run_dir, str(d / "0.png")]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("file,class,p_") and len(lines) == 2


def test_predict_none_readable_is_exit_2(run_dir, tmp_path):
    (tmp_path / "x.jpg").write_bytes(b"nope")
    assert main(["predict", run_dir, str(tmp_path / "x.jpg")]) == 2


def test_plot_writes_pngs(run_dir, tmp_path, capsys):
    assert main(["plot", run_dir, "--out", str(tmp_path / "pl")]) == 0
    for f in ("loss_accuracy.png", "residuals.png", "time_breakdown.png",
              "worker_compute.png",                   # N = 2: per-worker heatmap
              "memory.png",                           # each worker's peak RSS
              "learning_rate.png"):                   # a cosine schedule
        assert (tmp_path / "pl" / f).stat().st_size > 2000
    recs = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))]
    assert all(len(r["compute_s"]) == 2 and max(r["compute_s"]) == r["compute_max_s"]
               for r in [dict(x, compute_max_s=round(x["compute_max_s"], 6)) for x in recs])


def test_checkpoint_directory_loads_like_the_model(run_dir):
    from ibtmpi import checkpoint as ckpt
    last = ckpt.complete(run_dir)[-1]
    a = load_trained(run_dir)
    b = load_trained(ckpt.ckpt_dir(run_dir, last))
    np.testing.assert_array_equal(a.model.params, b.model.params)


def test_errors(run_dir, small_dataset, tmp_path, capsys):
    assert main(["evaluate", str(tmp_path / "none"), "--data", small_dataset]) == 2
    assert "does not exist" in capsys.readouterr().err
    # incompatible: a model file whose parameters do not fit its layers
    bad = tmp_path / "bad.npz"
    with np.load(os.path.join(run_dir, "model.npz"), allow_pickle=False) as f:
        arrays = {k: f[k] for k in f.files}
    arrays["z"] = arrays["z"][:-7]
    np.savez(bad, **arrays)
    assert main(["export", str(bad), "--onnx", str(tmp_path / "x.onnx")]) == 2
    assert "is float32[" in capsys.readouterr().err
    with pytest.raises(TrainedModelError, match="not an ibtmpi model"):
        np.savez(tmp_path / "other.npz", a=np.zeros(3))
        load_trained(str(tmp_path / "other.npz"))
    # a dataset with other classes / other image size
    from ibtmpi.data_prep.prep import prep_synth
    other = str(tmp_path / "other")
    prep_synth(other, n=100, size=16, classes=("lake", "road", "land"), quiet=True)
    assert main(["evaluate", run_dir, "--data", other]) == 2
    assert "was trained on" in capsys.readouterr().err
    big = str(tmp_path / "big")
    prep_synth(big, n=100, size=24, quiet=True)
    assert main(["evaluate", run_dir, "--data", big]) == 2
    assert "the model takes (16, 16, 3)" in capsys.readouterr().err


def test_evaluation_on_the_device_path_matches(run_dir, small_dataset):
    """Evaluation through the GPU launchers (CuPy stand-in running the
    host-emulated kernels) gives the host model's probabilities."""
    from ibtmpi.testing.fakecupy import FakeCupy
    from ibtmpi.backend import GpuOps
    tm = load_trained(run_dir)
    x = Dataset(small_dataset).split("test").read_all()[:16]
    dev = tm.to_device(GpuOps(cp=FakeCupy()))
    np.testing.assert_allclose(dev.probs(x), tm.probs(x), atol=1e-5)


def test_evaluate_gpu_without_gpu_is_exit_2(run_dir, small_dataset, capsys):
    assert main(["evaluate", run_dir, "--data", small_dataset, "--device", "gpu"]) == 2
    assert "--device gpu was asked for but" in capsys.readouterr().err


def test_an_output_place_that_cannot_be_written_is_one_line(run_dir, small_dataset, tmp_path,
                                                            capsys, monkeypatch):
    """Every command that writes: an output path under a regular file is bad
    input (exit 2), a full disk is exit 74; one line each, no traceback."""
    blocker = tmp_path / "file"
    blocker.write_text("x")
    img = tmp_path / "x.png"
    Image.new("RGB", (16, 16)).save(img)
    calls = [["evaluate", run_dir, "--data", small_dataset, "--out", str(blocker / "ev")],
             ["predict", run_dir, str(img), "--out", str(blocker / "p.csv")],
             ["export", run_dir, "--onnx", str(blocker / "m.onnx")],
             ["plot", run_dir, "--out", str(blocker / "pl")],
             ["bench", "report", run_dir, "--out", str(blocker / "rep")]]
    for argv in calls:
        assert main(argv) == 2, argv
        got = capsys.readouterr()
        err = got.err
        assert err.startswith(f"ibtmpi {argv[0]}: error: ") and f"{blocker}" in err \
            and "Not a directory" in err, err
        if argv[0] == "evaluate":        # found before the evaluation, not after it
            assert "accuracy" not in got.out, got.out
        assert len(err.strip().splitlines()) == 1, err
    import builtins
    import errno
    real_open = builtins.open

    def full(path, mode="r", *a, **k):
        if "w" in mode and str(path).startswith(str(tmp_path)):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real_open(path, mode, *a, **k)
    monkeypatch.setattr(builtins, "open", full)
    assert main(["predict", run_dir, str(img), "--out", str(tmp_path / "p.csv")]) == 74
    err = capsys.readouterr().err
    assert err.startswith(f"ibtmpi predict: error: cannot write {tmp_path / 'p.csv'}: "
                          f"No space left on device; free space"), err
    assert len(err.strip().splitlines()) == 1


def test_without_matplotlib_reports_are_written_and_plot_says_what_to_install(
        run_dir, small_dataset, tmp_path, capsys, monkeypatch):
    """matplotlib is an extra: evaluate and bench report still write their
    text and JSON, plot is one line with exit 2."""
    for mod in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, mod)
    monkeypatch.setitem(sys.modules, "matplotlib", None)      # import fails
    out = tmp_path / "ev"
    assert main(["evaluate", run_dir, "--data", small_dataset, "--out", str(out)]) == 0
    assert "no confusion.png: matplotlib is not installed" in capsys.readouterr().out
    assert (out / "report.json").exists() and not (out / "confusion.png").exists()
    assert main(["plot", run_dir, "--out", str(tmp_path / "p")]) == 2
    assert "pip install 'ibtmpi[plot]'" in capsys.readouterr().err
    rep = tmp_path / "rep"
    assert main(["bench", "report", run_dir, "--out", str(rep)]) == 0
    assert "(no plots: matplotlib is not installed" in (rep / "report.md").read_text()


def test_export_without_onnx_says_what_to_install(run_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnx", None)
    assert main(["export", run_dir, "--onnx", str(tmp_path / "m.onnx")]) == 2
    err = capsys.readouterr().err
    assert "pip install 'ibtmpi[onnx]'" in err and "Traceback" not in err
    assert not (tmp_path / "m.onnx").exists()


def test_model_keeps_its_band_preprocessing(run_dir, tmp_path):
    """model.npz records how files become its input; a model from before
    that record (no 'preprocess') reads files as RGB."""
    z = dict(np.load(os.path.join(run_dir, "model.npz")))
    assert json.loads(str(z.pop("preprocess"))) == {"bands": "rgb", "band_scale": None}
    np.savez(tmp_path / "old.npz", **z)
    assert load_trained(str(tmp_path / "old.npz")).preprocess == {"bands": "rgb",
                                                                  "band_scale": None}


def test_the_worker_compute_plot_ticks_whole_workers():
    from ibtmpi import outputs
    plt = outputs.pyplot()
    recs = [{"N": 2, "compute_s": [1.0, 1.2 + 0.01 * b]} for b in range(10)]
    fig = outputs._fig_worker_compute(plt, recs, None, "test")
    fig.canvas.draw()
    ticks = fig.axes[0].get_yticks()
    inside = [t for t in ticks if -0.5 <= t <= 1.5]
    assert inside and all(float(t).is_integer() for t in inside), ticks
    plt.close(fig)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_report_matches_scikit_learn(seed):
    """Overall and average accuracy, Cohen's kappa and the per-class figures,
    from the confusion matrix, against scikit-learn from the labels."""
    sk = pytest.importorskip("sklearn.metrics")
    from ibtmpi.outputs import report
    rng = np.random.default_rng(seed)
    k = 5
    y = rng.integers(0, k, 400)
    if seed == 2:
        y[y == 3] = 1                    # a class with no true samples
    p = np.where(rng.random(400) < 0.7, y, rng.integers(0, k, 400))
    cm = np.zeros((k, k), np.int64)
    np.add.at(cm, (y, p), 1)
    rep = report(cm, [f"c{i}" for i in range(k)])
    assert rep["accuracy"] == pytest.approx(sk.accuracy_score(y, p), abs=1e-12)
    with np.errstate(all="ignore"):
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            bal = sk.balanced_accuracy_score(y, p)
    assert rep["average_accuracy"] == pytest.approx(bal, abs=1e-12)
    assert rep["kappa"] == pytest.approx(sk.cohen_kappa_score(y, p), abs=1e-12)
    f1 = sk.f1_score(y, p, labels=range(k), average=None, zero_division=0)
    assert [rep["per_class"][f"c{i}"]["f1"] for i in range(k)] == pytest.approx(f1, abs=1e-12)
