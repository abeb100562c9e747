"""The inverted-dropout layer (spec ``{type="dropout", p=0.5}``; the
identity at evaluation and in ONNX) over ibtmpi/ops/dropout.py, host only
for now (no kernel: the GPU path refuses it with a clear message). Its
generator is its own, reseeded by the model per block and worker
(Model.set_dropout_seed), so there is no RNG state to checkpoint. Test:
tests/unit/test_ops.py.
"""
from __future__ import annotations

import numpy as np

from .. import ops
from .base import Layer, register


@register
class Dropout(Layer):
    kind = "dropout"
    keys = {"p": 0.5}

    def __init__(self, p=0.5):
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout p must be in [0, 1), got {p}")
        self.p = p
        self.rng = np.random.default_rng(0)
        self.mask = None

    @classmethod
    def from_spec(cls, entry, in_shape, n_classes, idx):
        return [cls(float(cls.spec_values(entry, idx)["p"]))]

    def seed_rng(self, entropy):
        self.rng = np.random.default_rng(entropy)

    def forward(self, x, train):
        if not train or self.p == 0.0:
            self.mask = None
            return x
        if not self.on_host:
            raise ValueError("dropout is not available on the GPU yet; remove the "
                             "dropout layer or train with --device cpu")
        y, self.mask = ops.dropout_forward(
            x, self.p, self.rng, out=self.ws.get("y", x.shape, x.dtype),
            mask=self.ws.get("mask", x.shape, x.dtype))
        return y

    def backward(self, dy, need_dx=True):
        return ops.dropout_backward(dy, self.mask, out=dy)

    def onnx(self, inp, out, i, helper, numpy_helper):
        return [helper.make_node("Identity", [inp], [out])], []

    def describe(self):
        return f"dropout({self.p})"
