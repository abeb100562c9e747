"""The ReLU layer (spec ``"relu"``) over ibtmpi/ops/activation.py (NumPy)
or backend.GpuOps (kernels/activation.cu); after a max-pool on a GPU the
pool applies it (layers/fuse.py). Tests: tests/unit/test_ops.py,
tests/unit/test_model.py (the relu/pool reordering).
"""
from __future__ import annotations

from .base import Layer, register


@register
class ReLU(Layer):
    """In place when ``inplace`` (from_spec sets it for non-first layers:
    no layer here needs its own forward output after ReLU overwrote it)."""

    kind = "relu"

    def __init__(self):
        super().__init__()
        self.inplace = False
        self.fused = False      # fuse_for_device: the max-pool before applies it

    @classmethod
    def from_spec(cls, entry, in_shape, n_classes, idx):
        cls.spec_values(entry, idx)
        layer = cls()
        layer.inplace = idx > 0
        return [layer]

    def forward(self, x, train):
        if self.fused:
            return x
        out = x if self.inplace else self._scratch("y", x.shape, x.dtype)
        self.y = self.ops.relu_forward(x, out=out)
        return self.y

    def backward(self, dy, need_dx=True):
        if self.fused:
            return dy
        # dy is the next layer's scratch gradient; overwrite it in place.
        return self.ops.relu_backward(dy, self.y, out=dy if self.inplace else None)

    def onnx(self, inp, out, i, helper, numpy_helper):
        return [helper.make_node("Relu", [inp], [out])], []
