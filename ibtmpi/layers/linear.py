"""The fully connected layer (spec ``{type="linear", out=256}``; out
omitted or "classes" = the number of classes) and the flatten before it
(spec ``"flatten"``; a linear layer on a (C, H, W) input brings its own)
over ibtmpi/ops/linear.py (NumPy) or backend.GpuOps (cuBLAS +
kernels/conv.cu bias_add_cols). Weight (out, in), bias (out,), He-normal
init. Tests: tests/unit/test_ops.py (naive product, finite differences),
tests/unit/test_model.py.
"""
from __future__ import annotations

import numpy as np

from .base import Layer, he_normal, register


@register
class Flatten(Layer):
    kind = "flatten"

    def out_shape(self, in_shape):
        return (int(np.prod(in_shape)),)

    def forward(self, x, train):
        self.x_shape = x.shape
        return x.reshape(x.shape[0], -1)

    def backward(self, dy, need_dx=True):
        return dy.reshape(self.x_shape)

    def onnx(self, inp, out, i, helper, numpy_helper):
        return [helper.make_node("Flatten", [inp], [out], axis=1)], []


@register
class Linear(Layer):
    kind = "linear"
    keys = {"out": "classes"}

    def __init__(self, in_features, out_features):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features

    @classmethod
    def from_spec(cls, entry, in_shape, n_classes, idx):
        """[Flatten, Linear] on a multi-axis input, else [Linear]."""
        v = cls.spec_values(entry, idx)
        out = n_classes if v["out"] == "classes" else int(v["out"])
        if len(in_shape) != 1:
            flat = Flatten()
            return [flat, cls(flat.out_shape(in_shape)[0], out)]
        return [cls(in_shape[0], out)]

    def param_shapes(self):
        return [(self.out_features, self.in_features), (self.out_features,)]

    def fan_in(self):
        return self.in_features

    def out_shape(self, in_shape):
        if len(in_shape) != 1 or in_shape[0] != self.in_features:
            raise ValueError(f"linear expects ({self.in_features},) input, "
                             f"got {in_shape}; add a flatten layer before it")
        return (self.out_features,)

    def init_params(self, rng, dtype):
        he_normal(self, rng, dtype)

    def flops(self, out_shape):
        return 2 * self.in_features * self.out_features

    def forward(self, x, train):
        self.x = x
        out = self._scratch("y", (x.shape[0], self.out_features), x.dtype)
        return self.ops.linear_forward(x, self.params[0], self.params[1], out=out)

    def backward(self, dy, need_dx=True):
        out = self._scratch("dx", self.x.shape, dy.dtype) if need_dx else None
        return self.ops.linear_backward(dy, self.x, self.params[0], self.grads[0],
                                   self.grads[1], need_dx, out=out)

    def onnx(self, inp, out, i, helper, numpy_helper):
        node = helper.make_node("Gemm", [inp, f"W{i}", f"B{i}"], [out], transB=1)
        return [node], self._onnx_weights(i, numpy_helper)

    def describe(self):
        return f"linear({self.in_features}->{self.out_features})"
