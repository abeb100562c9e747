"""A model trained on a uint16 set (16-bit bands kept) through the commands
that read it back: its safetensors normalisation is on the 0..1 scale of
the stored type (export, import-weights and model.init agree), evaluate
and the held-out report refuse a set stored as another type with one line,
the ONNX graph says its input's range, and a uint16 model needs bands to
predict from."""
import json

import numpy as np
import pytest

from ibtmpi.cli import main
from ibtmpi.dataset import Dataset
from ibtmpi.outputs import load_trained
from ibtmpi.testing.data16 import uint16_copy
from conftest import train_args


@pytest.fixture(scope="module")
def trained16(small_dataset, tmp_path_factory):
    root = tmp_path_factory.mktemp("u16")
    data = uint16_copy(small_dataset, root / "d16")
    run = str(root / "run")
    assert main(["train"] + train_args(data, run, 0.5)) == 0
    return data, run


def test_the_model_keeps_the_stored_type(trained16):
    data, run = trained16
    tm = load_trained(run)
    assert tm.dtype == np.uint16 and tm.stored_max == 65535.0
    assert tm.preprocess["dtype"] == "uint16" and tm.preprocess["bands"] == "all"
    np.testing.assert_allclose(tm.mean, Dataset(data).mean)


def test_safetensors_normalisation_is_on_the_stored_types_0_1_scale(trained16, tmp_path,
                                                                    capsys):
    pytest.importorskip("safetensors")
    from safetensors import safe_open
    data, run = trained16
    tm = load_trained(run)
    f = str(tmp_path / "m.safetensors")
    assert main(["export", run, "--safetensors", f]) == 0
    with safe_open(f, framework="numpy") as h:
        info = json.loads(h.metadata()["ibtmpi"])
    np.testing.assert_allclose(info["mean"], tm.mean / 65535.0)
    assert max(info["mean"]) < 1.0
    out = str(tmp_path / "imp.npz")
    assert main(["import-weights", f, "--layers", "tiny", "--data", data, "--out", out]) == 0
    np.testing.assert_allclose(load_trained(out).mean, tm.mean, rtol=1e-12)
    capsys.readouterr()
    run2 = str(tmp_path / "ft")
    assert main(["train"] + train_args(data, run2, 0.25, **{"model.init": f,
                                                           "run.quiet": "false"})) == 0
    said = capsys.readouterr().out
    assert "model.init: initialised from" in said and "another normalisation" not in said


def test_evaluate_refuses_a_set_of_another_stored_type(trained16, small_dataset, capsys):
    _, run = trained16
    capsys.readouterr()
    assert main(["evaluate", run, "--data", small_dataset]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "stores uint8 pixels, the model was trained on uint16 ones" in err


def test_held_out_report_refuses_another_stored_type(trained16, small_dataset):
    from ibtmpi.bench import _right
    _, run = trained16
    sp = Dataset(small_dataset).split("test")
    with pytest.raises(ValueError, match="stores uint8 pixels, .* trained on uint16"):
        _right(run, sp.read_all(), sp.labels)


def test_onnx_input_range_is_the_stored_types(trained16, tmp_path, capsys):
    pytest.importorskip("onnx")
    import onnx
    _, run = trained16
    f = str(tmp_path / "m.onnx")
    capsys.readouterr()
    assert main(["export", run, "--onnx", f]) == 0
    assert "0..65,535" in capsys.readouterr().out
    meta = {p.key: p.value for p in onnx.load(f).metadata_props}
    assert "0..65535 as stored" in meta["input"]


def test_a_uint16_model_predicts_from_bands_only():
    from ibtmpi.data_prep.images import check_preprocess
    assert check_preprocess({"bands": "all", "band_scale": None, "dtype": "uint16"},
                            3)["dtype"] == "uint16"
    for bad in ({"bands": "rgb", "band_scale": None, "dtype": "uint16"},
                {"bands": "all", "band_scale": {"offset": [0] * 3, "scale": [1] * 3},
                 "dtype": "uint16"},
                {"bands": "all", "band_scale": None, "dtype": "float32"}):
        with pytest.raises(ValueError, match="is not one prep folder writes"):
            check_preprocess(bad, 3)
