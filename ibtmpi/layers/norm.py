"""The 2-D batch-normalisation layer (spec ``{type="batchnorm",
momentum=0.1, eps=1e-5}``, after a conv) over ibtmpi/ops/norm.py (NumPy) or
backend.GpuOps (kernels/norm.cu). gamma/beta (C,) are parameters in the
flat vector (under the consensus like any weight: the ADMM prox applies to
them); the running mean/variance (C,) are buffers (Model.buffers), which
the block's one Allreduce averages as docs/design.md section 9 says
(``moments`` / ``from_moments``). Init: gamma 1, beta 0, running mean 0,
running variance 1 (PyTorch's). Tests: tests/unit/test_ops_modern.py.
"""
from __future__ import annotations

from .. import ops
from .base import Layer, register


@register
class BatchNorm2d(Layer):
    kind = "batchnorm"
    keys = {"momentum": 0.1, "eps": 1e-5}
    param_names = ("gamma", "beta")
    buffer_names = ("running_mean", "running_var")

    def __init__(self, channels, momentum=0.1, eps=1e-5):
        super().__init__()
        if not 0.0 <= momentum <= 1.0:
            raise ValueError(f"batchnorm momentum must be in [0, 1], got {momentum}")
        if not eps > 0:
            raise ValueError(f"batchnorm eps must be > 0, got {eps}")
        self.channels, self.momentum, self.eps = channels, float(momentum), float(eps)

    @classmethod
    def from_spec(cls, entry, in_shape, n_classes, idx):
        v = cls.spec_values(entry, idx)
        if len(in_shape) != 3:
            raise ValueError(f"model.layers[{idx}]: batchnorm needs (C, H, W) input "
                             f"(after a conv), got {in_shape}")
        return [cls(in_shape[0], float(v["momentum"]), float(v["eps"]))]

    def param_shapes(self):
        return [(self.channels,), (self.channels,)]

    def buffer_shapes(self):
        return [(self.channels,), (self.channels,)]

    def out_shape(self, in_shape):
        if len(in_shape) != 3 or in_shape[0] != self.channels:
            raise ValueError(f"batchnorm expects ({self.channels}, H, W) input, "
                             f"got {in_shape}")
        return in_shape

    def init_params(self, rng, dtype):
        self.params[0][...] = 1
        self.params[1][...] = 0

    def init_buffers(self):
        self.buffers[0][...] = 0
        self.buffers[1][...] = 1

    def moments(self, bufs):
        return list(ops.batchnorm_moments(*bufs))

    def from_moments(self, sums, n):
        return list(ops.batchnorm_from_moments(*sums, n))

    def forward(self, x, train):
        gamma, beta = self.params
        rmean, rvar = self.buffers
        y, self.xhat, self.invstd = self.ops.batchnorm_forward(
            x, gamma, beta, rmean, rvar, train, self.momentum, self.eps, ws=self.ws)
        return y

    def backward(self, dy, need_dx=True):
        return self.ops.batchnorm_backward(dy, self.xhat, self.invstd, self.params[0],
                                           self.grads[0], self.grads[1], need_dx,
                                           ws=self.ws)

    def onnx(self, inp, out, i, helper, numpy_helper):
        import numpy as np
        names = [f"BN{i}_{n}" for n in ("scale", "bias", "mean", "var")]
        arrs = [self._host(a) for a in self.params] + [self._host(b) for b in self.buffers]
        inits = [numpy_helper.from_array(np.ascontiguousarray(a, np.float32), n)
                 for a, n in zip(arrs, names)]
        node = helper.make_node("BatchNormalization", [inp] + names, [out],
                                epsilon=self.eps, momentum=1.0 - self.momentum)
        return [node], inits

    def describe(self):
        return f"batchnorm({self.channels})"
