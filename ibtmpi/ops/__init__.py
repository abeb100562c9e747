"""NumPy reference ops of the CNN engine: the CPU backend and the signature
every CUDA kernel in ``kernels/`` mirrors, one module per op family like
the kernel files (conv.py ~ conv.cu, pool.py ~ pool.cu, activation.py ~
activation.cu, norm.py ~ norm.cu, softmax_xent.py ~ softmax_xent.cu; linear.py and dropout.py
have no kernel file of their own; common.py holds the Workspace and the
buffer helpers). Layout: activations are NCHW, (batch, channels, height,
width); conv weights are (F, C, kh, kw); linear weights are (out, in) so
``y = x @ W.T + b``. Everything is dtype-generic (float32 in training,
float64 in the finite-difference tests); nothing up-casts silently. Callers
may pass ``out=``/scratch buffers so a training step allocates nothing;
``Workspace`` keeps such buffers keyed by name and shape. This package
re-exports every op, so ``from ibtmpi import ops; ops.conv2d_forward(...)``
is the one way callers (layers/, backend.py, the tests) reach them.
Reference oracles (naive loops, scipy, finite differences) live in
tests/unit/test_ops.py.
"""
from __future__ import annotations

from .common import Workspace, _buf, _buf4, _shared, conv_out_size, is_cnhw
from .conv import (_col_geometry, _padded, col2im, conv2d_backward, conv2d_forward,
                   im2col, phase_plain_shape, row_partial_sums, row_sum_widths)
from .conv_grid import _phase_view, input_grad_on_grid
from .conv_taps import conv2d_taps_backward, conv2d_taps_forward, taps_pay
from .pool import (_route_to_phases, avgpool_backward, avgpool_forward,
                   maxpool2_quads_backward, maxpool2_quads_forward,
                   maxpool2_rows_backward, maxpool2_rows_forward, maxpool_backward,
                   maxpool_forward, gap_backward, gap_forward)
from .activation import add_relu_forward, relu_backward, relu_forward
from .norm import (batchnorm_backward, batchnorm_forward, batchnorm_from_moments,
                   batchnorm_moments, bn_partial)
from .linear import linear_backward, linear_forward
from .dropout import dropout_backward, dropout_forward
from .softmax_xent import softmax_xent_backward, softmax_xent_forward

__all__ = [
    "Workspace", "conv_out_size", "is_cnhw",
    "im2col", "col2im", "conv2d_forward", "conv2d_backward", "phase_plain_shape",
    "conv2d_taps_forward", "conv2d_taps_backward", "taps_pay", "input_grad_on_grid",
    "row_sum_widths", "row_partial_sums",
    "maxpool_forward", "maxpool_backward", "maxpool2_rows_forward",
    "maxpool2_rows_backward", "maxpool2_quads_forward", "maxpool2_quads_backward",
    "avgpool_forward", "avgpool_backward",
    "gap_forward", "gap_backward", "add_relu_forward",
    "batchnorm_forward", "batchnorm_backward", "batchnorm_moments",
    "batchnorm_from_moments", "bn_partial",
    "relu_forward", "relu_backward", "linear_forward", "linear_backward",
    "dropout_forward", "dropout_backward",
    "softmax_xent_forward", "softmax_xent_backward",
]
