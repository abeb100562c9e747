"""NumPy reference of the softmax cross-entropy loss end
(kernels/softmax_xent.cu softmax_xent_fwd / softmax_xent_bwd; the GPU's
fused softmax_xent_train computes both). Tests: tests/unit/test_ops.py
(the formula, huge logits, finite differences), tests/gpu/test_gpu_ops.py.
"""
from __future__ import annotations

import numpy as np


def softmax_xent_forward(logits, labels):
    """Mean cross-entropy of logits (N, K) against integer labels (N,).

    Stable: shifted by the row max before exp. Returns (loss, probs) with
    probs (N, K) the softmax, which backward needs. loss is a Python float
    accumulated in the logits' dtype.
    """
    n = logits.shape[0]
    shifted = logits - logits.max(axis=1, keepdims=True)
    probs = np.exp(shifted)
    s = probs.sum(axis=1, keepdims=True)
    probs /= s
    # -log p[y] = log(sum exp) - shifted[y]
    nll = np.log(s[:, 0]) - shifted[np.arange(n), labels]
    return float(nll.mean(dtype=logits.dtype)), probs


def softmax_xent_backward(probs, labels, out=None):
    """dlogits (N, K) = (probs - onehot(labels)) / N."""
    n = probs.shape[0]
    if out is None:
        out = np.empty_like(probs)
    np.copyto(out, probs)
    out[np.arange(n), labels] -= 1
    out *= probs.dtype.type(1.0 / n)
    return out
