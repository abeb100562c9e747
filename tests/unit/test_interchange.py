"""ibtmpi export --safetensors: torchvision's state_dict names and shapes for
the twin presets (the list below is written from torchvision's resnet.py
naming, not from ibtmpi's code), every value equal to the model's, the
input normalisation and classes in the metadata, ibtmpi's own layer names
for other models, and the command's one-line errors."""
import json
import os

import numpy as np
import pytest

from ibtmpi.cli import main
from ibtmpi.model import Model

st = pytest.importorskip("safetensors.numpy")


def torchvision_resnet_keys(blocks, classes=1000):
    """{key: shape} of torchvision.models.resnet18/34(num_classes=classes)
    .state_dict(): BasicBlock stages at 64/128/256/512, a downsample on each
    stage's first block but the first stage's."""
    def bn(prefix, c):
        return {f"{prefix}.weight": (c,), f"{prefix}.bias": (c,),
                f"{prefix}.running_mean": (c,), f"{prefix}.running_var": (c,),
                f"{prefix}.num_batches_tracked": ()}
    keys = {"conv1.weight": (64, 3, 7, 7), **bn("bn1", 64)}
    cin = 64
    for s, (c, n) in enumerate(zip((64, 128, 256, 512), blocks), start=1):
        for b in range(n):
            p = f"layer{s}.{b}"
            keys[f"{p}.conv1.weight"] = (c, cin if b == 0 else c, 3, 3)
            keys.update(bn(f"{p}.bn1", c))
            keys[f"{p}.conv2.weight"] = (c, c, 3, 3)
            keys.update(bn(f"{p}.bn2", c))
            if b == 0 and s > 1:
                keys[f"{p}.downsample.0.weight"] = (c, cin, 1, 1)
                keys.update(bn(f"{p}.downsample.1", c))
        cin = c
    keys["fc.weight"], keys["fc.bias"] = (classes, 512), (classes,)
    return keys


@pytest.mark.parametrize("preset,blocks,count", [("resnet18_imagenet", (2, 2, 2, 2), 122),
                                                 ("resnet34_imagenet", (3, 4, 6, 3), 218)])
def test_twin_presets_get_torchvisions_names_and_shapes(preset, blocks, count):
    from ibtmpi import interchange
    m = Model(preset, (3, 32, 32), 10, seed=3)
    m.buffers[...] = np.arange(m.n_buffers, dtype=np.float32)     # distinct values
    sd = interchange.state_dict(m, preset)
    want = torchvision_resnet_keys(blocks, 10)
    assert len(want) == count
    assert {k: v.shape for k, v in sd.items()} == want
    assert sd["bn1.num_batches_tracked"].dtype == np.int64
    # every parameter and buffer value is there once, in its own place
    floats = [v for v in sd.values() if v.dtype == np.float32]
    assert sum(v.size for v in floats) == m.size + m.n_buffers
    np.testing.assert_array_equal(sd["conv1.weight"].ravel(), m.params[:64 * 3 * 49])
    np.testing.assert_array_equal(sd["fc.bias"], m.params[-10:])
    np.testing.assert_array_equal(sd["bn1.running_mean"], np.arange(64, dtype=np.float32))
    got = np.sort(np.concatenate([v.ravel() for k, v in sd.items()
                                  if "running" in k]))
    np.testing.assert_array_equal(got, np.arange(m.n_buffers, dtype=np.float32))


def test_export_writes_a_safetensors_file_with_its_metadata(small_dataset, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--quiet", "--simulate", "2", "--set", f"data.path={small_dataset}",
                 "--set", f"run.dir={run}", "--set", "model.layers=resnet18_imagenet",
                 "--set", "run.passes=0.2", "--set", "data.split_size=40",
                 "--set", "run.threads=1"]) == 0
    out = tmp_path / "w.safetensors"
    assert main(["export", str(run), "--safetensors", str(out)]) == 0
    said = capsys.readouterr().out
    assert "122 tensors, torchvision's resnet18 names" in said, said
    got = st.load_file(str(out))
    with np.load(run / "model.npz") as f:
        z, buffers = f["z"], f["buffers"]
    assert sum(v.size for k, v in got.items() if "running" not in k
               and "num_batches" not in k) == z.size
    np.testing.assert_array_equal(got["fc.bias"], z[-len(got["fc.bias"]):])
    np.testing.assert_array_equal(got["bn1.running_var"], buffers[64:128])
    from safetensors import safe_open
    with safe_open(str(out), framework="numpy") as f:
        meta = f.metadata()
    assert meta["format"] == "pt"
    info = json.loads(meta["ibtmpi"])
    assert info["names"] == "torchvision" and info["input_shape"] == [3, 16, 16]
    assert len(info["classes"]) == 5 and len(info["mean"]) == 3
    assert all(0 < s < 1 for s in info["std"])          # torchvision's 0..1 scale


def test_other_models_get_ibtmpis_names_and_errors_are_one_line(trained, tmp_path, capsys):
    out = tmp_path / "w.safetensors"
    assert main(["export", trained, "--safetensors", str(out)]) == 0
    assert "ibtmpi's layer names" in capsys.readouterr().out
    got = st.load_file(str(out))
    assert "layers.0.weight" in got and got["layers.0.weight"].ndim == 4
    assert main(["export", trained]) == 2
    assert "give --onnx FILE, --safetensors FILE or both" in capsys.readouterr().err
    link = tmp_path / "link.safetensors"              # a planted link is replaced, not
    victim = tmp_path / "victim"                      # written through
    victim.write_text("keep")
    os.symlink(victim, link)
    assert main(["export", trained, "--safetensors", str(link)]) == 0
    assert victim.read_text() == "keep" and not os.path.islink(link)


def _resnet_run(data, run, *more):
    return ["train", "--quiet", "--simulate", "2", "--set", f"data.path={data}",
            "--set", f"run.dir={run}", "--set", "model.layers=resnet18_imagenet",
            "--set", "run.passes=0.2", "--set", "data.split_size=40",
            "--set", "run.threads=1", *more]


def test_model_init_from_safetensors_starts_where_the_file_says(small_dataset, tmp_path,
                                                                capsys):
    """A run started from an exported file starts from the same z as one
    started from the run itself (model.npz), bit for bit; a file with
    another class count (torchvision's 1,000) keeps this run's fresh head
    and says so; a missing or misshapen tensor is one line, exit 2."""
    from ibtmpi.config import load
    from ibtmpi.train import Trainer
    src = tmp_path / "src"
    assert main(_resnet_run(small_dataset, src)) == 0
    f = tmp_path / "w.safetensors"
    assert main(["export", str(src), "--safetensors", str(f)]) == 0

    def started(init):
        cfg = load(None, [f"data.path={small_dataset}", "model.layers=resnet18_imagenet",
                          f"run.dir={tmp_path / ('r' + str(abs(hash(init))))}",
                          "run.simulate=2", "data.split_size=40", f"model.init={init}",
                          "run.quiet=true", "run.threads=1"])
        t = Trainer(cfg, log=lambda m: None)
        t.ckpt._init_from_model(False)
        return t
    a, b = started(str(f)), started(str(src))
    assert a.z.tobytes() == b.z.tobytes() and a.zbuf.tobytes() == b.zbuf.tobytes()
    assert a.ckpt.init_note == f"initialised from {f}"
    tensors = st.load_file(str(f))
    rng = np.random.default_rng(0)
    tensors["fc.weight"] = rng.standard_normal((1000, 512)).astype(np.float32)
    tensors["fc.bias"] = np.zeros(1000, np.float32)
    big = tmp_path / "imagenet.safetensors"
    st.save_file(tensors, str(big))                       # no metadata: a foreign file
    c = started(str(big))
    assert "the head (fc.weight [1000, 512], fc.bias [1000] in the file) is initialised " \
           "anew for this data's 5 classes" in c.ckpt.init_note
    assert "names no input normalisation" in c.ckpt.init_note
    fresh = Model("resnet18_imagenet", c.model.input_shape, 5, seed=0)
    n_fc = 512 * 5 + 5
    assert c.z[-n_fc:].tobytes() == fresh.params[-n_fc:].tobytes()     # its own head
    assert c.z[:-n_fc].tobytes() == a.z[:-n_fc].tobytes()             # the file's body
    del tensors["layer3.1.bn2.running_var"]
    tensors["layer1.0.conv1.weight"] = np.zeros((64, 64, 1, 1), np.float32)
    bad = tmp_path / "bad.safetensors"
    st.save_file(tensors, str(bad))
    capsys.readouterr()
    assert main(_resnet_run(small_dataset, tmp_path / "x", "--set", f"model.init={bad}")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "missing layer3.1.bn2.running_var" in err, err
    del tensors["fc.weight"], tensors["fc.bias"]
    tensors["layer3.1.bn2.running_var"] = np.ones(256, np.float32)
    st.save_file(tensors, str(bad))
    assert main(_resnet_run(small_dataset, tmp_path / "y", "--set", f"model.init={bad}")) == 2
    err = capsys.readouterr().err
    assert "missing fc.weight (and 1 more)" in err, err
    tensors["fc.weight"], tensors["fc.bias"] = rng.standard_normal((5, 512)).astype(
        np.float32), np.zeros(5, np.float32)
    st.save_file(tensors, str(bad))
    assert main(_resnet_run(small_dataset, tmp_path / "z", "--set", f"model.init={bad}")) == 2
    err = capsys.readouterr().err
    assert "layer1.0.conv1.weight is [64, 64, 1, 1]" in err and "needs [64, 64, 3, 3]" in err


def test_import_weights_makes_a_model_file_that_evaluate_and_export_use(small_dataset,
                                                                        tmp_path, capsys):
    """import-weights: an exported run's weights back into an ibtmpi model
    file with the same z and buffers, its normalisation from the file;
    evaluate reads it; a file of another preset is one line, exit 2."""
    src = tmp_path / "src"
    assert main(_resnet_run(small_dataset, src)) == 0
    f = tmp_path / "w.safetensors"
    assert main(["export", str(src), "--safetensors", str(f)]) == 0
    out = tmp_path / "imported.npz"
    capsys.readouterr()
    assert main(["import-weights", str(f), "--layers", "resnet18_imagenet", "--data",
                 small_dataset, "--out", str(out)]) == 0
    said = capsys.readouterr().out
    # 122 in the file: 102 parameters and running statistics, 20 num_batches_tracked
    assert "102 tensors of resnet18_imagenet" in said and "the file's own" in said, said
    with np.load(out) as a, np.load(src / "model.npz") as b:
        assert a["z"].tobytes() == b["z"].tobytes()
        assert a["buffers"].tobytes() == b["buffers"].tobytes()
        np.testing.assert_allclose(a["mean"], b["mean"], rtol=1e-12)
    assert main(["evaluate", str(out), "--data", small_dataset, "--split", "test"]) == 0
    assert main(["import-weights", str(f), "--layers", "resnet34_imagenet", "--data",
                 small_dataset, "--out", str(tmp_path / "x.npz")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "missing layer1.2.conv1.weight" in err, err
