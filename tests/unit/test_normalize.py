"""data.normalize: the inputs' mean and std are the data set's (default,
as before), ImageNet's (for ImageNet-pretrained weights) or given; the
model file records them, so evaluate, predict and ONNX see the inputs the
model was trained on."""
import numpy as np
import pytest

from ibtmpi.cli import main
from ibtmpi.config import ConfigError, load, run_hash
from ibtmpi.data import IMAGENET_MEAN, IMAGENET_STD, input_norm
from ibtmpi.dataset import Dataset
from ibtmpi.outputs import load_trained
from conftest import train_args


def test_the_three_forms_on_the_stored_pixels_scale(small_dataset):
    ds = Dataset(small_dataset)
    m, s = input_norm(load(None, ["data.path=x"]), ds)
    assert m.tolist() == list(ds.mean) and s.tolist() == list(ds.std)
    m, s = input_norm(load(None, ["data.path=x", 'data.normalize="imagenet"']), ds)
    np.testing.assert_allclose(m, np.array(IMAGENET_MEAN) * 255)
    np.testing.assert_allclose(s, np.array(IMAGENET_STD) * 255)
    m, s = input_norm(load(None, ["data.path=x",
                                  "data.normalize=[[0.5, 0.5, 0.5], [0.25, 0.25, 0.25]]"]), ds)
    assert m.tolist() == [127.5] * 3 and s.tolist() == [63.75] * 3
    with pytest.raises(ValueError, match="gives 2 means and 2 stds; .* has 3 band"):
        input_norm(load(None, ["data.path=x", "data.normalize=[[0.5, 0.5], [0.2, 0.2]]"]), ds)


def test_the_0_1_scale_of_a_uint16_set_is_its_full_range(small_dataset, tmp_path):
    from ibtmpi.testing.data16 import uint16_copy
    ds = Dataset(uint16_copy(small_dataset, tmp_path / "d16"))
    m, s = input_norm(load(None, ["data.path=x", 'data.normalize="imagenet"']), ds)
    np.testing.assert_allclose(m, np.array(IMAGENET_MEAN) * 65535)
    np.testing.assert_allclose(s, np.array(IMAGENET_STD) * 65535)
    m, s = input_norm(load(None, ["data.path=x"]), ds)
    assert m.tolist() == list(ds.mean) and min(m) > 255        # stored units


@pytest.mark.parametrize("bad", ['"imagenette"', "[[0.5], [0]]", "[[0.5, 0.4], [0.2]]", "3"])
def test_a_bad_value_is_one_line(bad):
    with pytest.raises(ConfigError, match=r"data.normalize must be \"dataset\", \"imagenet\""):
        load(None, ["data.path=x", f"data.normalize={bad}"])


def test_the_default_keeps_older_checkpoints_digest():
    base = load(None, ["data.path=x"])
    old = {s: dict(t) for s, t in base.items()}
    old["data"].pop("normalize")
    assert run_hash(old) == run_hash(base)
    assert run_hash(load(None, ["data.path=x", 'data.normalize="imagenet"'])) != run_hash(base)


def test_a_run_trains_evaluates_and_predicts_with_its_normalisation(small_dataset, tmp_path,
                                                                    capsys):
    run = tmp_path / "r"
    assert main(["train", "--simulate", "2"] + train_args(small_dataset, run)
                + ["--set", 'data.normalize="imagenet"']) == 0
    tm = load_trained(str(run))
    np.testing.assert_allclose(tm.mean, np.array(IMAGENET_MEAN) * 255)
    ck = load_trained(str(sorted((run / "checkpoints").iterdir())[-1]))
    np.testing.assert_allclose(ck.std, np.array(IMAGENET_STD) * 255)
    # evaluate with the recorded normalisation reproduces the run's test accuracy
    import json
    acc = json.load(open(run / "summary.json"))["test_acc"]
    capsys.readouterr()
    assert main(["evaluate", str(run)]) == 0
    assert capsys.readouterr().out.startswith(f"accuracy {acc:.4f}")


def test_imagenet_on_a_band_set_is_refused(tmp_path, capsys):
    from PIL import Image
    from ibtmpi.data_prep.cli import main as prep_main
    tifffile = pytest.importorskip("tifffile")
    root = tmp_path / "tree"
    rng = np.random.default_rng(0)
    for cls in ("a", "b"):
        (root / cls).mkdir(parents=True)
        for i in range(6):
            tifffile.imwrite(root / cls / f"{i}.tif", rng.integers(0, 255, (8, 8, 4), np.uint8))
    data = str(tmp_path / "d")
    assert prep_main(["folder", str(root), data, "--bands", "all", "--quiet"]) == 0
    assert main(["train"] + train_args(data, tmp_path / "r", **{"data.split_size": 4})
                + ["--set", 'data.normalize="imagenet"']) == 2
    assert ('data.normalize = "imagenet" takes 3 bands (RGB); ' in capsys.readouterr().err)
