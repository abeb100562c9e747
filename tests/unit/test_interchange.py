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
