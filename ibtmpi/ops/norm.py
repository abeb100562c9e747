"""NumPy reference of 2-D batch normalisation (kernels/norm.cu), per
channel over (N, H, W), PyTorch's conventions: train mode normalises with
the batch mean and the biased variance and moves the running statistics by
``momentum`` towards the batch mean and the UNBIASED variance
(r = (1 - momentum) * r + momentum * batch); eval mode normalises with the
running statistics; y = gamma * xhat + beta. The backward is the exact one
of the batch statistics:
dx = gamma * invstd / M * (M * dy - sum(dy) - xhat * sum(dy * xhat)),
M = N * H * W. Outputs are (C, N, H, W) buffers seen as NCHW (the layout a
conv writes and reads without a transpose; ops/common.py is_cnhw); inputs
may have any strides. Running statistics are float32 (Model.buffers) for
any activation dtype. Tests: tests/unit/test_ops_modern.py (naive loops,
float64 central differences), tests/unit/test_launchers_host.py and
tests/gpu (the kernels against this).
"""
from __future__ import annotations

import numpy as np

from .common import _buf

_AX = (1, 2, 3)      # the reduced axes of a (C, N, H, W) view


def _col(v):
    return v[:, None, None, None]


def batchnorm_forward(x, gamma, beta, rmean, rvar, train, momentum=0.1, eps=1e-5,
                      ws=None):
    """y (N, C, H, W), xhat (C, N, H, W), invstd (C,) of x (N, C, H, W).
    In train mode rmean/rvar (C,) are updated in place."""
    n, c, h, w = x.shape
    m = n * h * w
    dt = x.dtype.type
    xt = x.transpose(1, 0, 2, 3)
    xhat = _buf(ws, "xhat", (c, n, h, w), x.dtype)
    yt = _buf(ws, "y", (c, n, h, w), x.dtype)
    if train:
        mean = xt.sum(axis=_AX, dtype=x.dtype) / dt(m)
        np.subtract(xt, _col(mean), out=xhat)
        var = _rowdot(xhat, xhat) / dt(m)                        # biased
        mom = np.float32(momentum)
        rmean *= np.float32(1) - mom
        rmean += mom * mean.astype(np.float32)
        unbiased = var * dt(m / (m - 1)) if m > 1 else var
        rvar *= np.float32(1) - mom
        rvar += mom * unbiased.astype(np.float32)
    else:
        mean, var = rmean.astype(x.dtype), rvar.astype(x.dtype)
        np.subtract(xt, _col(mean), out=xhat)
    invstd = dt(1) / np.sqrt(var + dt(eps))
    xhat *= _col(invstd)
    np.multiply(xhat, _col(gamma), out=yt)
    yt += _col(beta)
    return yt.transpose(1, 0, 2, 3), xhat, invstd


def batchnorm_backward(dy, xhat, invstd, gamma, dgamma, dbeta, need_dx=True, ws=None):
    """Writes dgamma, dbeta (C,) (overwrites); returns dx (N, C, H, W), a
    (C, N, H, W) buffer seen as NCHW, or None. dy is left unchanged."""
    c, n, h, w = xhat.shape
    m = n * h * w
    dt = xhat.dtype.type
    dyt = dy.transpose(1, 0, 2, 3)
    tmp = _buf(ws, "dx", (c, n, h, w), xhat.dtype)
    dbeta[...] = dyt.sum(axis=_AX, dtype=xhat.dtype)
    if dyt.flags.c_contiguous:
        dgamma[...] = _rowdot(dyt, xhat)
    else:
        np.multiply(dyt, xhat, out=tmp)
        dgamma[...] = tmp.sum(axis=_AX, dtype=xhat.dtype)
    if not need_dx:
        return None
    # dx = k (M dy - dbeta - xhat dgamma), k = gamma invstd / M, as
    # gamma invstd (dy - xhat dgamma / M - dbeta / M): four passes, no temporary
    np.multiply(xhat, _col(dgamma / dt(m)), out=tmp)
    np.subtract(dyt, tmp, out=tmp)
    tmp -= _col(dbeta / dt(m))
    tmp *= _col(gamma * invstd)
    return tmp.transpose(1, 0, 2, 3)


def _rowdot(a, b):
    """Per channel sum of a * b over (N, H, W) of two C-contiguous (C, N, H, W)
    arrays: one BLAS dot per channel, no temporary (a square-and-sum pass
    writes and rereads a whole activation)."""
    c = a.shape[0]
    a2, b2 = a.reshape(c, 1, -1), b.reshape(c, -1, 1)
    return np.matmul(a2, b2).reshape(c)


def batchnorm_moments(rmean, rvar):
    """A worker's share of the consensus of the running statistics
    (docs/design.md section 9): (mean, var + mean^2), summed over workers."""
    return rmean, rvar + rmean * rmean


def batchnorm_from_moments(s_mean, s_sq, n):
    """The statistics every rank sets from the workers' summed moments:
    mean = avg(mean_i), var = avg(var_i + mean_i^2) - mean^2 (>= 0). With
    one worker that is its own mean, and its variance to float32 rounding
    of mean^2 (the same arithmetic for every n keeps one code path)."""
    inv = np.float32(1.0 / n)
    mean = s_mean * inv
    var = np.maximum(s_sq * inv - mean * mean, np.float32(0))
    return mean, var


def bn_partial(x_cm, a_cm, mean, p, mode):
    """NumPy twin of one kernels/norm.cu bn_partial pass over (C, M) arrays:
    out[c, q] = sum over m = q, q + p, ... of x (mode 0), (x - mean[c])^2
    (mode 1) or x * a (mode 2), in the kernel's order of additions."""
    from .conv import row_partial_sums
    if mode == 0:
        t = x_cm
    elif mode == 1:
        t = x_cm - mean[:, None]
        t = t * t
    else:
        t = x_cm * a_cm
    return row_partial_sums(t, p)
