"""resnet8 (BatchNorm, residual blocks, GAP) through the trainer: resume
is bitwise exact for z AND the running statistics; the model file,
checkpoints, evaluate, model.init and the ONNX export carry the statistics
(onnxruntime against our own forward); a file without them is refused."""
import os
import zipfile

import numpy as np
import pytest

from ibtmpi import checkpoint as ckpt
from ibtmpi.cli import main
from ibtmpi.config import load
from ibtmpi.dataset import Dataset
from ibtmpi.outputs import TrainedModelError, load_trained
from ibtmpi.train import InjectedFault, Trainer


def cfg(path, run_dir, algo="ibt", *more):
    return load(None, [f"data.path={path}", f"algorithm.name={algo}", "data.split_size=40",
                       "data.batch=16", "model.layers=resnet8", "run.passes=2",
                       "run.quiet=true", f"run.dir={run_dir}", "run.simulate=3",
                       "run.threads=1", "run.checkpoint_every=2", "data.augment=true",
                       *more])


@pytest.mark.parametrize("algo,more", [("ibt", ()), ("ssgd", ()),
                                       ("bmuf", ("optim.name=adamw", "optim.lr=0.003"))])
def test_resnet8_resume_is_bitwise_exact_with_the_running_statistics(
        small_dataset, tmp_path, monkeypatch, algo, more):
    ref = Trainer(cfg(small_dataset, tmp_path / "a", algo, *more), log=lambda m: None)
    ref.run()
    assert ref.zbuf.size == ref.model.n_buffers > 0
    monkeypatch.setenv("IBTMPI_FAULT", "0:5:compute")
    with pytest.raises(InjectedFault):
        Trainer(cfg(small_dataset, tmp_path / "b", algo, *more), log=lambda m: None).run()
    monkeypatch.delenv("IBTMPI_FAULT")
    assert ckpt.complete(str(tmp_path / "b"))[-1] == 3
    t = Trainer(cfg(small_dataset, tmp_path / "b", algo, *more), log=lambda m: None)
    t.run()
    assert t.z.tobytes() == ref.z.tobytes()
    assert t.zbuf.tobytes() == ref.zbuf.tobytes()
    saved = np.load(tmp_path / "b" / "model.npz")
    assert saved["buffers"].tobytes() == ref.zbuf.tobytes()


@pytest.fixture(scope="module")
def bn_run(small_dataset, tmp_path_factory):
    run = tmp_path_factory.mktemp("bn") / "run"
    t = Trainer(cfg(small_dataset, run, "ibt", "run.passes=1"), log=lambda m: None)
    t.run()
    return str(run), t


def test_model_file_and_checkpoint_carry_the_statistics(bn_run, small_dataset):
    run, t = bn_run
    tm = load_trained(run)
    assert (tm.model.buffers == t.zbuf).all()
    x = Dataset(small_dataset).split("test").read_all()[:16]
    # the running statistics decide eval-mode outputs: zeroed means change them
    p = tm.probs(x)
    tm.model.buffers[:] = 0
    assert not np.allclose(tm.probs(x), p)
    last = ckpt.complete(run)[-1]
    from_ckpt = load_trained(ckpt.ckpt_dir(run, last))
    assert (from_ckpt.model.buffers == t.zbuf).all()
    assert main(["evaluate", run]) == 0


def test_a_model_file_without_its_statistics_is_refused(bn_run, tmp_path):
    run, _ = bn_run
    src = os.path.join(run, "model.npz")
    bad = str(tmp_path / "nobuf.npz")
    with zipfile.ZipFile(src) as zi, zipfile.ZipFile(bad, "w") as zo:
        for n in zi.namelist():
            if n != "buffers.npy":
                zo.writestr(n, zi.read(n))
    with pytest.raises(TrainedModelError, match="buffers"):
        load_trained(bad)


def test_model_init_takes_the_statistics(bn_run, small_dataset, tmp_path):
    run, t = bn_run
    c = cfg(small_dataset, tmp_path / "i", "ibt", "run.passes=0.01",
            f"model.init={os.path.join(run, 'model.npz')}")
    t2 = Trainer(c, log=lambda m: None)
    t2.ckpt._init_from_model(False)
    assert t2.zbuf.tobytes() == t.zbuf.tobytes()
    assert (t2.model.buffers == t.zbuf).all()


def test_onnx_export_of_resnet8_matches_onnxruntime(bn_run, small_dataset, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    run, _ = bn_run
    path = str(tmp_path / "r8.onnx")
    assert main(["export", run, "--onnx", path]) == 0
    tm = load_trained(run)
    x = Dataset(small_dataset).split("test").read_all()[:32]
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    logits, = sess.run(["logits"], {"image": x.transpose(0, 3, 1, 2).astype(np.float32)})
    from ibtmpi.data import normalize
    ours = tm.model.forward(normalize(x, tm.mean, tm.std), train=False)
    err = float(np.abs(logits - ours).max() / max(1.0, np.abs(ours).max()))
    assert err <= 1e-5, err
    import onnx
    ops = {n.op_type for n in onnx.load(path).graph.node}
    assert {"BatchNormalization", "Add", "GlobalAveragePool"} <= ops
