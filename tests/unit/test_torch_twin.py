"""Weights in and out of PyTorch, checked against torch itself (the test
extra has it): a plain-torch twin of torchvision's resnet18 / resnet34
(torchvision's module names and layout: conv1, bn1, maxpool,
layer1..4 of BasicBlocks with downsample.0/.1, avgpool, fc; PyPI's
torchvision does not import beside this CPU torch, so its resnet.py is
written out here), with random weights and random BatchNorm statistics,
saved with safetensors.torch and read by ibtmpi, gives torch's logits in
eval mode; and ibtmpi's export loads into the twin with strict=True and
gives ibtmpi's logits."""
import numpy as np
import pytest


@pytest.fixture
def tv():
    """The twin module (tests/unit/torchtwin.py), torch and safetensors.torch."""
    torch = pytest.importorskip("torch")
    st_torch = pytest.importorskip("safetensors.torch")
    import torchtwin
    return torchtwin, torch, st_torch


def ours(layers, classes, side):
    from ibtmpi.model import Model
    return Model(layers, (3, side, side), classes, seed=0)


def logits_of(model, x):
    return np.array(model.forward(x, train=False), np.float64)


@pytest.mark.parametrize("layers, blocks", [("resnet18_imagenet", (2, 2, 2, 2)),
                                            ("resnet34_imagenet", (3, 4, 6, 3))])
def test_torch_weights_give_torchs_logits(layers, blocks, tmp_path, tv):
    from ibtmpi.interchange import load_into
    twin, torch, st_torch = tv
    classes, side = 7, 64
    net = twin.twin(blocks, classes, seed=3)
    path = str(tmp_path / "tv.safetensors")
    st_torch.save_file({k: v.contiguous() for k, v in net.state_dict().items()}, path)
    m = ours(layers, classes, side)
    notes, _ = load_into(m, layers, path)
    assert notes == []
    x = np.random.default_rng(0).standard_normal((3, 3, side, side)).astype(np.float32)
    with torch.no_grad():
        want = net(torch.from_numpy(x)).double().numpy()
    got = logits_of(m, x)
    scale = np.abs(want).max()
    assert scale > 0.1                                  # not a dead net
    assert np.abs(got - want).max() <= 1e-4 * max(1.0, scale), (np.abs(got - want).max(), scale)


def test_an_export_loads_into_torch_strictly_and_gives_our_logits(tmp_path, tv):
    from ibtmpi.interchange import state_dict
    twin, torch, st_torch = tv
    layers, classes, side = "resnet18_imagenet", 5, 64
    m = ours(layers, classes, side)
    rng = np.random.default_rng(1)
    m.buffers[...] = np.abs(rng.standard_normal(m.buffers.shape)).astype(np.float32) + 0.5
    path = str(tmp_path / "ours.safetensors")
    from safetensors.numpy import save_file
    save_file(state_dict(m, layers), path)
    net = twin.ResNet((2, 2, 2, 2), classes).eval()
    net.load_state_dict(st_torch.load_file(path), strict=True)
    x = rng.standard_normal((2, 3, side, side)).astype(np.float32)
    with torch.no_grad():
        theirs = net(torch.from_numpy(x)).double().numpy()
    mine = logits_of(m, x)
    assert np.abs(mine - theirs).max() <= 1e-4 * max(1.0, np.abs(mine).max())
