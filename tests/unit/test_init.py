"""model.init: a new run that starts from a trained model.

The oracle: a model.npz holding exactly the He initialisation of seed 7,
given as model.init to a run with model.seed = 0, must train to the same z,
bit for bit, as the run that draws seed 7 itself; for every algorithm, so
every worker's w, the consensus state and (ssgd) the parameters all start
from the file. Mismatched models are refused in one line (exit 2); a
resumed run does not read model.init."""
import os
import shutil

import numpy as np
import pytest

from ibtmpi import checkpoint as ckpt
from ibtmpi.cli import main
from ibtmpi.config import ConfigError, load
from ibtmpi.dataset import Dataset
from ibtmpi.model import Model
from ibtmpi.train import InjectedFault, Trainer
from ibtmpi.config import run_hash
from ibtmpi.outputs import save_model

from conftest import PARALLEL, copy_dataset, train_args

ALGOS = PARALLEL                  # every algorithm for N > 1 (the registry)


def cfg(data, run_dir, algo="ibt", **extra):
    sets = [f"data.path={data}", f"algorithm.name={algo}", "data.split_size=40",
            "data.batch=16", "model.layers=tiny", "run.passes=1", "run.quiet=true",
            f"run.dir={run_dir}", "run.simulate=3", "run.threads=1"]
    return load(None, sets + [f"{k}={v}" for k, v in extra.items()])


def he_model_file(data, path, seed, layers="tiny"):
    """A model.npz whose z is the He initialisation of `seed`."""
    ds = Dataset(data)
    h, w, c = ds.image_shape
    m = Model(layers, (c, h, w), ds.n_classes, seed=seed)
    save_model(str(path), m.params.copy(), m, ds, {"model": {"layers": layers},
                                                   "algorithm": {"name": "sgd"}})
    return str(path)


def final_z(run_dir):
    with np.load(os.path.join(run_dir, "model.npz")) as f:
        return f["z"].copy()


@pytest.mark.parametrize("algo", ALGOS)
def test_init_from_a_file_equals_drawing_the_same_start(small_dataset, tmp_path, algo):
    src = he_model_file(small_dataset, tmp_path / "he7.npz", seed=7)
    Trainer(cfg(small_dataset, tmp_path / "a", algo, **{"model.seed": 7}),
            log=lambda m: None).run()
    logs = []
    Trainer(cfg(small_dataset, tmp_path / "b", algo, **{"model.init": src}),
            log=logs.append).run()
    za, zb = final_z(tmp_path / "a"), final_z(tmp_path / "b")
    assert za.tobytes() == zb.tobytes()
    # and the init mattered: seed 0 without it ends elsewhere
    Trainer(cfg(small_dataset, tmp_path / "c", algo), log=lambda m: None).run()
    assert final_z(tmp_path / "c").tobytes() != za.tobytes()
    assert any(f"model.init: initialised from {src}" in m for m in logs), logs


def test_continue_with_another_worker_count(small_dataset, tmp_path):
    """A finished 3-worker run cannot resume with 2 workers; a new run
    initialised from it can, and starts where it ended."""
    Trainer(cfg(small_dataset, tmp_path / "a"), log=lambda m: None).run()
    with pytest.raises(ckpt.CheckpointError, match="another worker count"):
        Trainer(cfg(small_dataset, tmp_path / "a", **{"run.simulate": 2}),
                log=lambda m: None).run()
    for src in (tmp_path / "a", tmp_path / "a" / "model.npz",
                ckpt.ckpt_dir(str(tmp_path / "a"), ckpt.complete(str(tmp_path / "a"))[-1])):
        t = Trainer(cfg(small_dataset, tmp_path / "b", **{"run.simulate": 2,
                                                          "model.init": str(src)}),
                    log=lambda m: None)
        assert t.ckpt.restore() == 0
        assert t.z.tobytes() == final_z(tmp_path / "a").tobytes()
        assert np.array_equal(t.model.params, t.z)


def test_mismatched_models_are_one_line_exit_2(small_dataset, tmp_path, capsys):
    other = he_model_file(small_dataset, tmp_path / "soft.npz", 0, layers="softmax")
    rc = main(["train"] + train_args(small_dataset, str(tmp_path / "r"),
                                     **{"model.init": other}))
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err
    assert "model.init:" in err and "other layers" in err
    rc = main(["train"] + train_args(small_dataset, str(tmp_path / "r"),
                                     **{"model.init": str(tmp_path / "nope")}))
    err = capsys.readouterr().err
    assert rc == 2 and "model.init:" in err and "does not exist" in err
    assert not os.path.exists(tmp_path / "r" / "metrics.jsonl")


def test_other_image_size_or_class_order_is_refused(small_dataset, tmp_path):
    from ibtmpi.data_prep.prep import prep_synth
    big = str(tmp_path / "d24")
    prep_synth(big, n=200, size=24, seed=1, shards=1, quiet=True)
    src = he_model_file(big, tmp_path / "m24.npz", 0)
    with pytest.raises(ConfigError, match=r"takes \(3, 24, 24\) inputs"):
        Trainer(cfg(small_dataset, tmp_path / "r", **{"model.init": src}),
                log=lambda m: None).ckpt.restore()
    # the same classes in another order would name every output wrongly
    ds = Dataset(small_dataset)
    h, w, c = ds.image_shape
    m = Model("tiny", (c, h, w), ds.n_classes)

    class Rev:
        classes = list(reversed(ds.classes))
        mean, std, meta = ds.mean, ds.std, ds.meta
    rev = str(tmp_path / "rev.npz")
    save_model(rev, m.params.copy(), m, Rev, {"model": {"layers": "tiny"},
                                              "algorithm": {"name": "sgd"}})
    with pytest.raises(ConfigError, match="orders the same classes differently"):
        Trainer(cfg(small_dataset, tmp_path / "r2", **{"model.init": rev}),
                log=lambda m: None).ckpt.restore()


def test_other_normalisation_is_reported_not_refused(small_dataset, tmp_path):
    other = copy_dataset(small_dataset, tmp_path / "copy")
    src = he_model_file(small_dataset, tmp_path / "m.npz", 3)
    with np.load(src) as f:
        arrays = dict(f)
    arrays["mean"] = arrays["mean"] + 10.0
    np.savez(src, **arrays)
    logs = []
    t = Trainer(cfg(other, tmp_path / "r", **{"model.init": src}), log=logs.append)
    assert t.ckpt.restore() == 0
    assert "another normalisation" in t.ckpt.init_note


def test_a_resumed_run_does_not_read_init(small_dataset, tmp_path, monkeypatch):
    src = str(tmp_path / "src")
    Trainer(cfg(small_dataset, src), log=lambda m: None).run()
    c = cfg(small_dataset, tmp_path / "b", **{"model.init": src, "run.passes": 3,
                                             "run.checkpoint_every": 2})
    assert run_hash(c) == run_hash(cfg(small_dataset, tmp_path / "b", **{
        "run.passes": 3, "run.checkpoint_every": 2}))
    monkeypatch.setenv("IBTMPI_FAULT", "0:5:compute")
    with pytest.raises(InjectedFault):
        Trainer(c, log=lambda m: None).run()
    monkeypatch.delenv("IBTMPI_FAULT")
    shutil.rmtree(src)                       # the source is gone: resuming needs none
    logs = []
    Trainer(c, log=logs.append).run()
    assert any("resuming from" in m for m in logs)
    assert not any("model.init" in m for m in logs)


def test_dry_run_names_the_init(small_dataset, tmp_path, capsys):
    src = he_model_file(small_dataset, tmp_path / "m.npz", 5)
    rc = main(["train", "--dry-run"] + train_args(small_dataset, str(tmp_path / "r"),
                                                  **{"model.init": src}))
    out = capsys.readouterr().out
    assert rc == 0
    assert f"start from block 0, initialised from {src}" in out
    assert not os.path.exists(tmp_path / "r")
