"""The pooling layers over ibtmpi/ops/pool.py (NumPy) or backend.GpuOps
(kernels/pool.cu): the max-pool (spec ``{type="maxpool", k=2, stride=2}``;
stride omitted = k; with the host phase-array fast path after a conv, and on
a GPU the conv's bias and the following ReLU taken in: layers/fuse.py), the
average pool (``{type="avgpool", k=2, stride=2}``, the same windows; not
fused: a ReLU does not commute with a mean) and the global average pool
(``"gap"``). Tests: tests/unit/test_ops.py (naive loops, finite
differences), tests/unit/test_launchers_host.py (the fused path),
tests/unit/test_model.py (an avgpool model's gradient and ONNX export).
"""
from __future__ import annotations

from .. import ops
from .base import Layer, register


class _WindowPool(Layer):
    """What the k x k window pools share (not a layer kind of its own): the
    spec keys (stride omitted = k; no padding), the build, the output shape,
    the ONNX node (``onnx_op`` with kernel_shape and strides), describe()."""

    keys = {"k": 2, "stride": None}
    onnx_op = ""

    def __init__(self, k=2, stride=None):
        super().__init__()
        self.k = k
        self.stride = k if stride is None else stride

    @classmethod
    def from_spec(cls, entry, in_shape, n_classes, idx):
        v = cls.spec_values(entry, idx)
        return [cls(int(v["k"]), None if v["stride"] is None else int(v["stride"]))]

    def out_shape(self, in_shape):
        c, h, w = in_shape
        return (c, ops.conv_out_size(h, self.k, self.stride, 0),
                ops.conv_out_size(w, self.k, self.stride, 0))

    def onnx(self, inp, out, i, helper, numpy_helper):
        return [helper.make_node(self.onnx_op, [inp], [out], kernel_shape=[self.k, self.k],
                                 strides=[self.stride] * 2)], []

    def describe(self):
        return f"{self.kind}{self.k}(stride {self.stride})"


@register
class MaxPool2d(_WindowPool):
    """``pad`` cells of padding that never win (torchvision's stem pool:
    ``{type="maxpool", k=3, stride=2, pad=1}``); pad < k."""

    kind = "maxpool"
    onnx_op = "MaxPool"
    keys = {"k": 2, "stride": None, "pad": 0}

    def __init__(self, k=2, stride=None, pad=0):
        super().__init__(k, stride)
        if not 0 <= pad < k:
            raise ValueError(f"maxpool pad must be in [0, k), got pad {pad} for k {k}")
        self.pad = pad
        self.bias = None        # fuse_for_device: the conv's bias, added here
        self.relu = False       # fuse_for_device: the ReLU that follows, applied here

    @classmethod
    def from_spec(cls, entry, in_shape, n_classes, idx):
        v = cls.spec_values(entry, idx)
        stride = None if v["stride"] is None else int(v["stride"])
        try:
            return [cls(int(v["k"]), stride, int(v["pad"]))]
        except ValueError as e:
            raise ValueError(f"model.layers[{idx}] (maxpool): {e}") from None

    def out_shape(self, in_shape):
        c, h, w = in_shape
        return (c, ops.conv_out_size(h, self.k, self.stride, self.pad),
                ops.conv_out_size(w, self.k, self.stride, self.pad))

    def onnx(self, inp, out, i, helper, numpy_helper):
        pads = {"pads": [self.pad] * 4} if self.pad else {}
        return [helper.make_node(self.onnx_op, [inp], [out], kernel_shape=[self.k, self.k],
                                 strides=[self.stride] * 2, **pads)], []

    def describe(self):
        return super().describe()[:-1] + (f", pad {self.pad})" if self.pad else ")")

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
        if self.pad:
            fused["pad"] = self.pad
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
        if self.pad:
            fused["pad"] = self.pad
        return self.ops.maxpool_backward(dy, self.argmax, self.x_shape, self.k,
                                         self.stride, out=out, **fused)


@register
class AvgPool2d(_WindowPool):
    """Mean over k x k windows with stride s (no padding); overlapping
    windows (stride < k) are fine. The output keeps the input's physical
    layout on the host, and the gradient is written in it (a conv's
    (C, N, H, W)) on either backend."""

    kind = "avgpool"
    onnx_op = "AveragePool"

    def forward(self, x, train):
        self.x_shape = x.shape
        self.x_cnhw = ops.is_cnhw(x)
        return self.ops.avgpool_forward(x, self.k, self.stride, ws=self.ws)

    def backward(self, dy, need_dx=True):
        out = self._scratch("dx", self.x_shape, dy.dtype, self.x_cnhw)
        return self.ops.avgpool_backward(dy, self.x_shape, self.k, self.stride, out=out)


@register
class GlobalAvgPool(Layer):
    """Global average pooling (spec ``"gap"``): (C, H, W) -> (C,), the
    mean over the spatial positions; a linear layer may follow directly."""

    kind = "gap"

    def out_shape(self, in_shape):
        if len(in_shape) != 3:
            raise ValueError(f"gap needs (C, H, W) input, got {in_shape}")
        return (in_shape[0],)

    def forward(self, x, train):
        self.x_shape = x.shape
        return self.ops.gap_forward(x, out=self._scratch("y", x.shape[:2], x.dtype))

    def backward(self, dy, need_dx=True):
        if not need_dx:
            return None
        return self.ops.gap_backward(dy, self.x_shape,
                                     out=self._scratch("dx", self.x_shape, dy.dtype))

    def onnx(self, inp, out, i, helper, numpy_helper):
        return [helper.make_node("GlobalAveragePool", [inp], [f"{out}_4d"]),
                helper.make_node("Flatten", [f"{out}_4d"], [out], axis=1)], []

    def describe(self):
        return "global average pool"
