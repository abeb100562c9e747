"""The single-worker SGD baseline (``sgd``, N = 1): z = w after each block.

The same code path as the parallel algorithms with one worker and no
consensus to speak of; the reference of every speedup.
Tests: tests/unit/test_trainer.py.
"""
from __future__ import annotations

import numpy as np

from .base import BlockAlgorithm, register


@register
class SingleWorker(BlockAlgorithm):
    name = "sgd"
    summary = "the single-worker SGD baseline (N = 1): z = w"
    single_worker = True

    def _step(self, S, sl):
        np.multiply(S, self.dtype.type(1.0 / self.n), out=self.z[sl])
        return S
