"""NumPy inverted dropout (host only: no kernel yet, the GPU path refuses a
dropout layer, see layers/dropout.py). The mask comes from the layer's own
generator, reseeded per block and worker. Test: tests/unit/test_ops.py.
"""
from __future__ import annotations

import numpy as np


def dropout_forward(x, p, rng, out=None, mask=None):
    """Inverted dropout: y = x * mask, mask = (u >= p) / (1 - p)."""
    if p <= 0.0:
        return x, None
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability must be in [0, 1), got {p}")
    u = rng.random(x.shape, dtype=np.float32)
    if mask is None:
        mask = np.empty(x.shape, x.dtype)
    np.multiply(u >= p, x.dtype.type(1.0 / (1.0 - p)), out=mask)
    return np.multiply(x, mask, out=out), mask


def dropout_backward(dy, mask, out=None):
    if mask is None:
        return dy
    return np.multiply(dy, mask, out=out)
