"""CNN layers with explicit forward/backward over the ops in ``ops.py``.

A layer declares its parameter shapes; the model hands it views into the
one flat parameter vector and the one flat gradient vector (``bind``).
Activations are NCHW (see ops.py). ``forward`` keeps what ``backward``
needs; both write into the layer's own Workspace, so a returned array is
valid until the layer's next call. Tests: tests/unit/test_layers.py
(finite differences) and tests/unit/test_ops.py (naive oracles).
"""
from __future__ import annotations

import math

import numpy as np

from . import ops


class Layer:
    """Base: no parameters, shape unchanged. Subclasses define
    ``forward(x, train) -> y`` and ``backward(dy, need_dx) -> dx``."""

    kind = "layer"

    def __init__(self):
        self.ws = ops.Workspace()
        self.ops = ops          # the NumPy ops, or a GpuOps with the same signatures
        self.params: list[np.ndarray] = []
        self.grads: list[np.ndarray] = []

    def param_shapes(self):
        return []

    def fan_in(self):
        return 1

    def out_shape(self, in_shape):
        return in_shape

    def bind(self, params, grads):
        self.params, self.grads = params, grads

    @property
    def on_host(self):
        return self.ops is ops

    def _scratch(self, name, shape, dtype, cnhw=False):
        """A reusable host buffer; on a device None (the launchers allocate),
        or a fresh array when the layout matters (cnhw)."""
        if not self.on_host:
            return self.ops.empty4(shape, dtype, True) if cnhw else None
        return ops._buf4(self.ws, name, shape, dtype, cnhw) if cnhw else \
            self.ws.get(name, shape, dtype)

    def describe(self):
        return self.kind


class Conv2d(Layer):
    kind = "conv"

    def __init__(self, in_ch, out_ch, k=3, stride=1, pad=None):
        super().__init__()
        self.in_ch, self.out_ch, self.k, self.stride = in_ch, out_ch, k, stride
        self.pad = k // 2 if pad is None else pad

    def param_shapes(self):
        return [(self.out_ch, self.in_ch, self.k, self.k), (self.out_ch,)]

    def fan_in(self):
        return self.in_ch * self.k * self.k

    def out_shape(self, in_shape):
        c, h, w = in_shape
        if c != self.in_ch:
            raise ValueError(f"conv expects {self.in_ch} input channels, got {c}")
        return (self.out_ch,
                ops.conv_out_size(h, self.k, self.stride, self.pad),
                ops.conv_out_size(w, self.k, self.stride, self.pad))

    # Set by the model on a conv followed by a 2x2/stride-2 max-pool with an
    # even output: on the host the conv then hands the pool a phase array
    # (ops.conv2d_forward), "quads" when no input gradient is needed (the
    # pool is fastest on it, the input gradient slowest), else "rows".
    phase_out = None
    # Set by fuse_for_device: the max-pool that follows adds the bias.
    bias_in_pool = False

    def forward(self, x, train):
        self.x_shape = x.shape
        if self.phase_out and self.on_host:
            y, self.col = ops.conv2d_forward(x, self.params[0], self.params[1],
                                             self.stride, self.pad, ws=self.ws,
                                             phase=self.phase_out)
            return y
        y, self.col = self.ops.conv2d_forward(
            x, self.params[0], None if self.bias_in_pool else self.params[1],
            self.stride, self.pad, ws=self.ws)
        return y

    def backward(self, dy, need_dx=True):
        return self.ops.conv2d_backward(dy, self.col, self.x_shape, self.params[0],
                                   self.stride, self.pad, self.grads[0],
                                   self.grads[1], need_dx, ws=self.ws)

    def describe(self):
        return (f"conv{self.k}x{self.k}({self.in_ch}->{self.out_ch}, "
                f"stride {self.stride}, pad {self.pad})")


class MaxPool2d(Layer):
    kind = "maxpool"

    def __init__(self, k=2, stride=None):
        super().__init__()
        self.k = k
        self.stride = k if stride is None else stride
        self.bias = None        # fuse_for_device: the conv's bias, added here
        self.relu = False       # fuse_for_device: the ReLU that follows, applied here

    def out_shape(self, in_shape):
        c, h, w = in_shape
        return (c, ops.conv_out_size(h, self.k, self.stride, 0),
                ops.conv_out_size(w, self.k, self.stride, 0))

    def forward(self, x, train):
        self.phase = x.ndim          # 5, 6: a conv's phase array (host only)
        if self.phase > 4:
            self.x_shape = ops.phase_plain_shape(x)
            fwd = (ops.maxpool2_rows_forward if self.phase == 5
                   else ops.maxpool2_quads_forward)
            y, self.argmax = fwd(x, ws=self.ws)
            return y
        self.x_shape = x.shape
        self.x_cnhw = ops.is_cnhw(x)
        fused = {} if self.bias is None and not self.relu else \
            {"bias": self.bias, "relu": self.relu}             # GPU only
        y, self.argmax = self.ops.maxpool_forward(x, self.k, self.stride, ws=self.ws,
                                                  **fused)
        self.y = y if self.relu else None
        return y

    def backward(self, dy, need_dx=True):
        if self.phase > 4:
            bwd = (ops.maxpool2_rows_backward if self.phase == 5
                   else ops.maxpool2_quads_backward)
            return bwd(dy, self.argmax, ws=self.ws)
        # dx gets the same memory layout as x had: when x was a conv output
        # (an NCHW view of a (C, N, H, W) buffer), the conv's backward then
        # reads dx without a transpose copy.
        out = self._scratch("dx", self.x_shape, dy.dtype, self.x_cnhw)
        fused = {"y": self.y} if self.relu else {}
        return self.ops.maxpool_backward(dy, self.argmax, self.x_shape, self.k,
                                         self.stride, out=out, **fused)

    def describe(self):
        return f"maxpool{self.k}(stride {self.stride})"


class ReLU(Layer):
    """In place when ``inplace`` (the model sets it for non-first layers:
    no layer here needs its own forward output after ReLU overwrote it)."""

    kind = "relu"

    def __init__(self):
        super().__init__()
        self.inplace = False
        self.fused = False      # fuse_for_device: the max-pool before applies it

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


class Flatten(Layer):
    kind = "flatten"

    def out_shape(self, in_shape):
        return (int(np.prod(in_shape)),)

    def forward(self, x, train):
        self.x_shape = x.shape
        return x.reshape(x.shape[0], -1)

    def backward(self, dy, need_dx=True):
        return dy.reshape(self.x_shape)


class Linear(Layer):
    kind = "linear"

    def __init__(self, in_features, out_features):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features

    def param_shapes(self):
        return [(self.out_features, self.in_features), (self.out_features,)]

    def fan_in(self):
        return self.in_features

    def out_shape(self, in_shape):
        if len(in_shape) != 1 or in_shape[0] != self.in_features:
            raise ValueError(f"linear expects ({self.in_features},) input, "
                             f"got {in_shape}; add a flatten layer before it")
        return (self.out_features,)

    def forward(self, x, train):
        self.x = x
        out = self._scratch("y", (x.shape[0], self.out_features), x.dtype)
        return self.ops.linear_forward(x, self.params[0], self.params[1], out=out)

    def backward(self, dy, need_dx=True):
        out = self._scratch("dx", self.x.shape, dy.dtype) if need_dx else None
        return self.ops.linear_backward(dy, self.x, self.params[0], self.grads[0],
                                   self.grads[1], need_dx, out=out)

    def describe(self):
        return f"linear({self.in_features}->{self.out_features})"


class Dropout(Layer):
    kind = "dropout"

    def __init__(self, p=0.5):
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout p must be in [0, 1), got {p}")
        self.p = p
        self.rng = np.random.default_rng(0)
        self.mask = None

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

    def describe(self):
        return f"dropout({self.p})"


def fuse_for_device(layers):
    """On a GPU, fold a conv's bias add and a following ReLU into the
    max-pool between them (kernels/pool.cu): conv -> pool -> relu, the
    model's order after _commute_relu_pool, then runs as GEMM + one pool
    launch forward and one pool launch backward instead of five launches
    and three passes over the conv's output, with the same bits. Layers
    must be bound (the pool keeps a view of the conv's bias)."""
    for i, layer in enumerate(layers):
        if not isinstance(layer, MaxPool2d):
            continue
        if i > 0 and isinstance(layers[i - 1], Conv2d):
            layers[i - 1].bias_in_pool = True
            layer.bias = layers[i - 1].params[1]
        if i + 1 < len(layers) and isinstance(layers[i + 1], ReLU):
            layers[i + 1].fused = True
            layer.relu = True


def he_std(layer):
    return math.sqrt(2.0 / layer.fan_in())
