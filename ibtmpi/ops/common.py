"""Shared pieces of the NumPy ops: the scratch-buffer ``Workspace``, the
buffer helpers every op family uses (``_buf``, ``_shared``, ``_buf4`` and
the (C, N, H, W) layout test ``is_cnhw``) and ``conv_out_size``, the
geometry check of conv and pool. No kernel of its own; exercised by every
test in tests/unit/test_ops.py.
"""
from __future__ import annotations

import numpy as np


class Workspace:
    """Named scratch buffers reused across steps (no per-step allocation).

    A buffer returned by ``get`` stays valid until ``get`` is called again
    with the same name; a layer owns the names it uses.
    """

    def __init__(self):
        self._bufs: dict[str, np.ndarray] = {}

    def get(self, name, shape, dtype, zero=False):
        shape = tuple(int(s) for s in shape)
        buf = self._bufs.get(name)
        if buf is None or buf.shape != shape or buf.dtype != dtype:
            buf = np.zeros(shape, dtype) if zero else np.empty(shape, dtype)
            self._bufs[name] = buf
        elif zero:
            buf.fill(0)
        return buf

    def shared(self, name, shape, dtype):
        """A buffer of this shape carved from the front of one flat buffer
        that grows to the largest request under this name: callers that
        never need two of its shapes at once share the memory."""
        n = int(np.prod(shape))
        buf = self._bufs.get(name)
        if buf is None or buf.size < n or buf.dtype != dtype:
            buf = np.empty(n, dtype)
            self._bufs[name] = buf
        return buf[:n].reshape(shape)

    def nbytes(self):
        return sum(b.nbytes for b in self._bufs.values())


def _buf(ws, name, shape, dtype, zero=False):
    if ws is None:
        return np.zeros(shape, dtype) if zero else np.empty(shape, dtype)
    return ws.get(name, shape, dtype, zero)


def _shared(ws, name, shape, dtype):
    if ws is None:
        return np.empty(shape, dtype)
    return ws.shared(name, shape, dtype)


def is_cnhw(x):
    """True when x (N, C, H, W) is an NCHW view of a C-contiguous (C, N, H, W)
    buffer: the physical layout conv produces (see the module docstring)."""
    return (x.ndim == 4 and not x.flags.c_contiguous
            and x.transpose(1, 0, 2, 3).flags.c_contiguous)


def _buf4(ws, name, shape, dtype, cnhw, zero=False):
    """(N, C, H, W) buffer, physically (C, N, H, W) when cnhw."""
    if not cnhw:
        return _buf(ws, name, shape, dtype, zero)
    n, c, h, w = shape
    return _buf(ws, name, (c, n, h, w), dtype, zero).transpose(1, 0, 2, 3)


def conv_out_size(size, k, stride, pad):
    """Output length of a conv/pool along one axis; errors on a bad geometry."""
    out = (size + 2 * pad - k) // stride + 1
    if out < 1:
        raise ValueError(
            f"kernel {k} with stride {stride} and padding {pad} does not fit "
            f"an input of size {size}")
    return out
