"""A check shared by the stand-in tests (tests/unit) and the gpu suite
(tests/gpu, which puts this directory on its path): one training step of a
preset or layer list on the device ops `g` against the NumPy engine."""
import numpy as np

# conv -> relu -> overlapping avgpool (reads the (C, N, H, W) layout the conv's
# output keeps through the relu, writes its gradient there) -> conv -> relu ->
# avgpool -> gap -> linear
AVGPOOL_SPEC = [{"type": "conv", "out": 4, "k": 3, "pad": 1}, "relu",
                {"type": "avgpool", "k": 3, "stride": 2},
                {"type": "conv", "out": 6, "k": 3, "pad": 1}, "relu",
                {"type": "avgpool", "k": 2}, "gap", {"type": "linear"}]


# torchvision's ImageNet stem (conv7x7/2 pad 3 without bias, BN, ReLU,
# max-pool 3x3/2 pad 1) and one strided block: the resnet*_imagenet presets'
# new parts, small enough for a step
IMAGENET_STEM_SPEC = [{"type": "conv", "out": 8, "k": 7, "stride": 2, "pad": 3, "bias": False},
                      "batchnorm", "relu", {"type": "maxpool", "k": 3, "stride": 2, "pad": 1},
                      {"type": "residual", "out": 16, "stride": 2}, "gap", {"type": "linear"}]


def step_matches_numpy(g, spec, size, batch, seed, rtol, atol):
    """One loss_and_grad of `spec` on (batch, 3, size, size) inputs with the
    NumPy engine and with `g`: the gradients and the moved running
    statistics agree to rtol/atol. Returns (host, dev, x, y)."""
    from ibtmpi.model import Model
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, 3, size, size)).astype(np.float32)
    y = rng.integers(0, 5, batch)
    host = Model(spec, (3, size, size), 5, seed=seed)
    dev = Model(spec, (3, size, size), 5, seed=seed, ops=g)
    host.loss_and_grad(x, y)
    dev.loss_and_grad(x, y)
    np.testing.assert_allclose(g.asnumpy(dev.grads), host.grads, rtol=rtol, atol=atol)
    np.testing.assert_allclose(g.asnumpy(dev.buffers), host.buffers, rtol=rtol, atol=atol)
    return host, dev, x, y
