"""The 2-D convolution layer (spec ``{type="conv", out=32, k=3, stride=1,
pad=1, bias=true}``; pad omitted = k // 2; bias=false before a batchnorm,
whose beta makes a bias redundant) over ibtmpi/ops/conv.py (NumPy) or
backend.GpuOps (kernels/conv.cu + cuBLAS). Weights (F, C, k, k), bias (F,) unless bias=false,
He-normal init. Tests: tests/unit/test_ops.py (the op against naive loops,
scipy and finite differences), tests/unit/test_model.py (in a model).
"""
from __future__ import annotations

import numpy as np

from .. import ops
from .base import REQUIRED, Layer, he_normal, register


@register
class Conv2d(Layer):
    kind = "conv"
    keys = {"out": REQUIRED, "k": 3, "stride": 1, "pad": None, "bias": True}

    def __init__(self, in_ch, out_ch, k=3, stride=1, pad=None, bias=True):
        super().__init__()
        self.in_ch, self.out_ch, self.k, self.stride = in_ch, out_ch, k, stride
        self.pad = k // 2 if pad is None else pad
        self.has_bias = bool(bias)

    @classmethod
    def from_spec(cls, entry, in_shape, n_classes, idx):
        v = cls.spec_values(entry, idx)
        if len(in_shape) != 3:
            raise ValueError(f"model.layers[{idx}]: conv needs (C, H, W) "
                             f"input, got {in_shape}")
        if not isinstance(v["bias"], bool):
            raise ValueError(f"model.layers[{idx}] (conv): bias must be true or false, "
                             f"got {v['bias']!r}")
        return [cls(in_shape[0], int(v["out"]), int(v["k"]), int(v["stride"]),
                    None if v["pad"] is None else int(v["pad"]), v["bias"])]

    def param_shapes(self):
        w = (self.out_ch, self.in_ch, self.k, self.k)
        return [w, (self.out_ch,)] if self.has_bias else [w]

    @property
    def bias(self):
        return self.params[1] if self.has_bias else None

    def fan_in(self):
        return self.in_ch * self.k * self.k

    def out_shape(self, in_shape):
        c, h, w = in_shape
        if c != self.in_ch:
            raise ValueError(f"conv expects {self.in_ch} input channels, got {c}")
        return (self.out_ch,
                ops.conv_out_size(h, self.k, self.stride, self.pad),
                ops.conv_out_size(w, self.k, self.stride, self.pad))

    def init_params(self, rng, dtype):
        he_normal(self, rng, dtype)

    def flops(self, out_shape):
        return 2 * int(np.prod(out_shape)) * self.fan_in()

    # Set by layers/fuse.py plan_phase_out on a conv followed by a
    # 2x2/stride-2 max-pool with an even output: on the host the conv then
    # hands the pool a phase array (ops.conv2d_forward), "quads" when no
    # input gradient is needed (the pool is fastest on it, the input
    # gradient slowest), else "rows".
    phase_out = None
    # Set by fuse_for_device: the max-pool that follows adds the bias.
    bias_in_pool = False
    # Set by the host model: one Workspace whose "col" buffer every conv
    # shares when its own would exceed COL_SHARE_BYTES; such a conv keeps
    # its input instead of its columns and recomputes them in backward
    # (one more im2col; the same bits), so a deep net holds one column
    # buffer instead of one per conv (resnet18 at 64x64, batch 64: 9.5 GiB
    # of peak RSS with one per conv).
    shared_ws = None
    xtaps = None          # the input planes, when forward took the taps path
    COL_SHARE_BYTES = 128 * 2**20

    def _shared_col(self, x_shape, dtype):
        """The model's shared column buffer for this conv's input shape, or
        None where this conv keeps its own (small, or on a device)."""
        if self.shared_ws is None or not self.on_host:
            return None
        n, c, h, w = x_shape
        m = n * (ops.conv_out_size(h, self.k, self.stride, self.pad)
                 * ops.conv_out_size(w, self.k, self.stride, self.pad))
        if c * self.k * self.k * m * np.dtype(dtype).itemsize <= self.COL_SHARE_BYTES:
            return None
        return self.shared_ws.shared("col", (c * self.k * self.k, m), dtype)

    def _taps(self, x_shape):
        """Whether this forward takes the host's taps path (ops/conv_taps.py
        taps_pay: "same" stride-1 and 3x3 stride-2 convs, narrow or over
        16x16 outputs or more; cache-sized chunks, no stored columns)."""
        return self.on_host and ops.taps_pay(self.in_ch, self.out_ch, self.k, self.stride,
                                              x_shape[2], x_shape[3], self.pad,
                                              self.phase_out)

    def forward(self, x, train):
        self.x_shape = x.shape
        self.xtaps = None
        if self._taps(x.shape):
            y, self.xtaps = ops.conv2d_taps_forward(x, self.params[0], self.bias, self.pad,
                                                    ws=self.ws, stride=self.stride)
            self.x = self.col = None
            return y
        col = self._shared_col(x.shape, x.dtype)
        self.x = x if col is not None else None       # backward recomputes col from it
        if self.phase_out and self.on_host:
            y, self.col = ops.conv2d_forward(x, self.params[0], self.bias,
                                             self.stride, self.pad, col=col, ws=self.ws,
                                             phase=self.phase_out)
            return y
        y, self.col = self.ops.conv2d_forward(
            x, self.params[0], None if self.bias_in_pool else self.bias,
            self.stride, self.pad, **({"col": col} if col is not None else {}), ws=self.ws)
        return y

    def backward(self, dy, need_dx=True):
        db = self.grads[1] if self.has_bias else None
        if self.xtaps is not None:
            return ops.conv2d_taps_backward(dy, self.xtaps, self.x_shape, self.params[0],
                                            self.pad, self.grads[0], db, need_dx,
                                            ws=self.ws, stride=self.stride)
        more = {"scratch": self.shared_ws} if self.on_host else {}
        if self.x is not None:          # the shared columns: recompute this conv's
            col = self._shared_col(self.x_shape, self.x.dtype)
            self.col = ops.im2col(self.x, self.k, self.k, self.stride, self.pad, out=col,
                                  ws=self.ws, phase=self.phase_out)
            more["colws"] = self.shared_ws
        return self.ops.conv2d_backward(dy, self.col, self.x_shape, self.params[0],
                                   self.stride, self.pad, self.grads[0], db, need_dx,
                                   ws=self.ws, **more)

    def onnx(self, inp, out, i, helper, numpy_helper):
        node = helper.make_node(
            "Conv", [inp, f"W{i}"] + ([f"B{i}"] if self.has_bias else []), [out],
            kernel_shape=[self.k, self.k],
            pads=[self.pad] * 4, strides=[self.stride] * 2)
        return [node], self._onnx_weights(i, numpy_helper)

    def describe(self):
        return (f"conv{self.k}x{self.k}({self.in_ch}->{self.out_ch}, "
                f"stride {self.stride}, pad {self.pad}{'' if self.has_bias else ', no bias'})")
