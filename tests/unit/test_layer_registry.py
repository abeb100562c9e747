"""The layer registry is the plug-in point: a new layer is one class with
@register (its "new file" is defined inside the test and removed again
afterwards), and the model, its buffers and the ONNX export take it with no
other change."""
import numpy as np
import pytest

from ibtmpi.layers import LAYERS, REQUIRED, Layer, register
from ibtmpi.model import Model


@pytest.fixture
def plugged():
    """Register layer classes for one test, leaving LAYERS as it was."""
    added = []

    def plug(cls):
        register(cls)
        added.append(cls.kind)
        return cls
    yield plug
    for kind in added:
        LAYERS.pop(kind)


def make_scale(plug):
    @plug
    class Scale(Layer):
        """y = a * x, with a running maximum of |x| as a buffer."""
        kind = "scale"
        keys = {"a": REQUIRED}
        buffer_names = ("peak",)

        def __init__(self, a, channels):
            super().__init__()
            self.a, self.channels = a, channels

        @classmethod
        def from_spec(cls, entry, in_shape, n_classes, idx):
            return [cls(float(cls.spec_values(entry, idx)["a"]), in_shape[0])]

        def buffer_shapes(self):
            return [(self.channels,)]

        def forward(self, x, train):
            if train:
                np.maximum(self.buffers[0], np.abs(x).max(axis=(0, 2, 3)),
                           out=self.buffers[0])
            return x * x.dtype.type(self.a)

        def backward(self, dy, need_dx=True):
            return dy * dy.dtype.type(self.a)

        def onnx(self, inp, out, i, helper, numpy_helper):
            a = numpy_helper.from_array(np.array(self.a, np.float32), f"A{i}")
            return [helper.make_node("Mul", [inp, f"A{i}"], [out])], [a]
    return Scale


SPEC = [{"type": "conv", "out": 4}, "relu", {"type": "maxpool"},
        {"type": "scale", "a": 0.5}, "linear"]


def test_a_new_layer_is_one_class(plugged):
    make_scale(plugged)
    m = Model(SPEC, (3, 8, 8), 3, seed=1)
    assert [l.kind for l in m.layers] == ["conv", "maxpool", "relu", "scale",
                                          "flatten", "linear"]
    # the same parameters and gradient as the model without it, with the
    # scale folded into the linear layer's input
    x = np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype(np.float32)
    ref = Model([e for e in SPEC if not (isinstance(e, dict) and e["type"] == "scale")],
                (3, 8, 8), 3, seed=1)
    assert m.params.tobytes() == ref.params.tobytes()
    ref.layers[-1].params[0][...] *= np.float32(0.5)
    np.testing.assert_allclose(m.forward(x), ref.forward(x), rtol=1e-6)
    with pytest.raises(ValueError, match=r"model.layers\[0\] \(scale\): missing key 'a'"):
        Model([{"type": "scale"}, "linear"], (3, 8, 8), 3)
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['b'\]; allowed: \['a'\]"):
        Model([{"type": "scale", "a": 1, "b": 2}, "linear"], (3, 8, 8), 3)


def test_buffers_are_views_of_one_flat_vector(plugged):
    assert Model("reference", (3, 32, 32), 5).n_buffers == 0
    make_scale(plugged)
    m = Model(SPEC, (3, 8, 8), 3, seed=1)
    scale = m.layers[3]
    assert m.n_buffers == 4 and m.buffers.dtype == np.float32
    assert np.shares_memory(scale.buffers[0], m.buffers)
    assert m.buffer_slices == [(3, "peak", slice(0, 4))]
    x = np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype(np.float32)
    m.loss_and_grad(x, np.array([0, 1]))
    assert (m.buffers > 0).all()                 # trained state, not in the gradient
    assert m.grads.size == m.size


def test_a_new_layer_exports_to_onnx(plugged):
    pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from types import SimpleNamespace
    from ibtmpi import onnx_export
    make_scale(plugged)
    m = Model(SPEC, (3, 8, 8), 3, seed=1)
    t = SimpleNamespace(model=m, mean=np.zeros(3, np.float32), std=np.ones(3, np.float32),
                        classes=["a", "b", "c"])
    sess = ort.InferenceSession(onnx_export.build(t).SerializeToString())
    x = np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype(np.float32)
    np.testing.assert_allclose(sess.run(["logits"], {"image": x})[0], m.forward(x),
                               rtol=1e-5, atol=1e-6)
