"""NumPy reference of the ReLU (kernels/activation.cu relu_fwd / relu_bwd).
Tests: tests/unit/test_ops.py, tests/gpu/test_gpu_ops.py.
"""
from __future__ import annotations

import numpy as np


def relu_forward(x, out=None):
    """y = max(x, 0); out may be x itself (in place)."""
    return np.maximum(x, 0, out=out)


def relu_backward(dy, y, out=None):
    """dx = dy where y > 0, else 0 (y is the forward output)."""
    if out is None:
        out = np.empty_like(dy)
    np.multiply(dy, y > 0, out=out)
    return out


def add_relu_forward(a, b, out):
    """y = max(a + b, 0) into out (a residual block's sum and its ReLU;
    kernels/activation.cu add_relu_fwd); out may be a or b."""
    np.add(a, b, out=out)
    return np.maximum(out, 0, out=out)
