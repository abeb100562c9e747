"""NumPy reference of the fully connected layer, ``y = x @ W.T + b`` with
W (out, in). No kernel file of its own: on a GPU the GEMMs go through
cuBLAS and the bias add is kernels/conv.cu bias_add_cols (backend.GpuOps).
Tests: tests/unit/test_ops.py, tests/gpu/test_gpu_ops.py.
"""
from __future__ import annotations

import numpy as np


def linear_forward(x, w, b, out=None):
    """y (N, O) = x (N, I) @ w (O, I).T + b (O,)."""
    out = np.matmul(x, w.T, out=out)
    out += b
    return out


def linear_backward(dy, x, w, dw, db, need_dx=True, out=None):
    """Writes dw (O, I) = dy.T @ x and db (O,) in place; returns dx (N, I)."""
    np.matmul(dy.T, x, out=dw)
    np.sum(dy, axis=0, out=db)
    if not need_dx:
        return None
    return np.matmul(dy, w, out=out)
