"""The residual basic block (spec ``{type="residual", out=128, stride=2}``):
conv3x3(stride s)-BN-ReLU-conv3x3-BN plus the shortcut (the identity, or
conv1x1(stride s)-BN where the shape changes), added, then a ReLU — the
basic block of He et al. 2016 and torchvision's ResNet-18 (convs without
bias: the BN's beta is the bias). A layer that holds layers: its
parameters and buffers are its children's, in order (conv1, bn1, conv2,
bn2, then the shortcut's), so the model stays a list of layers and the
flat vectors, optimizers, consensus, checkpoints and ONNX see nothing new.
Tests: tests/unit/test_ops_modern.py (the block's gradient against float64
central differences, a resnet8 model's too).
"""
from __future__ import annotations

from .activation import ReLU
from .base import REQUIRED, Layer, register
from .conv import Conv2d
from .norm import BatchNorm2d


@register
class Residual(Layer):
    kind = "residual"
    keys = {"out": REQUIRED, "stride": 1}

    def __init__(self, in_ch, out_ch, stride=1):
        self.children = []
        super().__init__()
        self.in_ch, self.out_ch, self.stride = in_ch, out_ch, stride
        relu = ReLU()
        relu.inplace = True                 # over bn1's output, which no one rereads
        self.main = [Conv2d(in_ch, out_ch, 3, stride, 1, bias=False),
                     BatchNorm2d(out_ch), relu,
                     Conv2d(out_ch, out_ch, 3, 1, 1, bias=False), BatchNorm2d(out_ch)]
        self.identity = stride == 1 and in_ch == out_ch
        self.short = [] if self.identity else [
            Conv2d(in_ch, out_ch, 1, stride, 0, bias=False), BatchNorm2d(out_ch)]
        self.children = self.main + self.short
        self.ops = self._ops                # hand the backend to the children

    @classmethod
    def from_spec(cls, entry, in_shape, n_classes, idx):
        v = cls.spec_values(entry, idx)
        if len(in_shape) != 3:
            raise ValueError(f"model.layers[{idx}]: residual needs (C, H, W) input, "
                             f"got {in_shape}")
        out, stride = int(v["out"]), int(v["stride"])
        if out < 1 or stride < 1:
            raise ValueError(f"model.layers[{idx}] (residual): out and stride must be "
                             f">= 1, got out={out}, stride={stride}")
        return [cls(in_shape[0], out, stride)]

    # the backend (NumPy ops or a GpuOps) reaches every child
    @property
    def ops(self):
        return self._ops

    @ops.setter
    def ops(self, value):
        self._ops = value
        for c in self.children:
            c.ops = value

    # -- shapes and storage: the children's, in order ---------------------------
    @property
    def param_names(self):
        return [f"{self._tag(j)}.{n}" for j, c in enumerate(self.children)
                for n in c.param_names[:len(c.param_shapes())]]

    @property
    def buffer_names(self):
        return [f"{self._tag(j)}.{n}" for j, c in enumerate(self.children)
                for n in c.buffer_names]

    def _tag(self, j):
        return ("conv1", "bn1", "relu", "conv2", "bn2", "short_conv", "short_bn")[j]

    def param_shapes(self):
        return [s for c in self.children for s in c.param_shapes()]

    def buffer_shapes(self):
        return [s for c in self.children for s in c.buffer_shapes()]

    def _split(self, flat, count):
        out, off = [], 0
        for c in self.children:
            k = len(count(c))
            out.append(flat[off:off + k])
            off += k
        return out

    def bind(self, params, grads):
        self.params, self.grads = params, grads
        shapes = lambda c: c.param_shapes()             # noqa: E731
        for c, p, g in zip(self.children, self._split(params, shapes),
                           self._split(grads, shapes)):
            c.bind(p, g)

    def bind_buffers(self, buffers):
        self.buffers = buffers
        for c, b in zip(self.children, self._split(buffers, lambda c: c.buffer_shapes())):
            c.bind_buffers(b)

    def out_shape(self, in_shape):
        c, h, w = in_shape
        if c != self.in_ch:
            raise ValueError(f"residual expects {self.in_ch} input channels, got {c}")
        shape = in_shape
        self.shapes = [shape]
        for layer in self.main:
            shape = layer.out_shape(shape)
            self.shapes.append(shape)
        return shape

    # -- initial state ------------------------------------------------------------
    def init_params(self, rng, dtype):
        for c in self.children:
            c.init_params(rng, dtype)

    def init_buffers(self):
        for c in self.children:
            c.init_buffers()

    def moments(self, bufs):
        return [m for c, b in zip(self.children, self._split(bufs, lambda c: c.buffer_shapes()))
                for m in c.moments(b)]

    def from_moments(self, sums, n):
        return [m for c, s in zip(self.children, self._split(sums, lambda c: c.buffer_shapes()))
                for m in c.from_moments(s, n)]

    def flops(self, out_shape):
        main = sum(c.flops(s) for c, s in zip(self.main, self.shapes[1:]))
        return main + (self.short[0].flops(out_shape) if self.short else 0)

    # -- compute ---------------------------------------------------------------------
    def forward(self, x, train):
        h = x
        for layer in self.main:
            h = layer.forward(h, train)
        s = x
        for layer in self.short:
            s = layer.forward(s, train)
        # the sum and its ReLU, in place over bn2's output (its backward
        # reads only its xhat)
        self.y = self.ops.add_relu_forward(h, s, out=h)
        return self.y

    def backward(self, dy, need_dx=True):
        d = self.ops.relu_backward(dy, self.y, out=dy)    # dy: the next layer's scratch
        ds = d
        for j in range(len(self.short) - 1, -1, -1):
            ds = self.short[j].backward(ds, need_dx or j > 0)
        dm = d
        for j in range(len(self.main) - 1, -1, -1):
            dm = self.main[j].backward(dm, need_dx or j > 0)
        if not need_dx:
            return None
        dm += ds
        return dm

    def onnx(self, inp, out, i, helper, numpy_helper):
        nodes, inits = [], []

        def chain(layers, start, tag):
            t = start
            for j, layer in enumerate(layers):
                o = f"{out}_{tag}{j}"
                n, w = layer.onnx(t, o, f"{i}_{tag}{j}", helper, numpy_helper)
                nodes.extend(n)
                inits.extend(w)
                t = o
            return t
        m = chain(self.main, inp, "m")
        s = chain(self.short, inp, "s")
        nodes.append(helper.make_node("Add", [m, s], [f"{out}_sum"]))
        nodes.append(helper.make_node("Relu", [f"{out}_sum"], [out]))
        return nodes, inits

    def describe(self):
        short = "identity" if self.identity else "conv1x1+bn"
        return (f"residual({self.in_ch}->{self.out_ch}, stride {self.stride}, "
                f"shortcut {short})")

