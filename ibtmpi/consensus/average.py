"""Model averaging (``ma``): z = S/N, S = sum_i w_i.

Tests: tests/unit/test_consensus.py, tests/unit/test_trainer.py.
"""
from __future__ import annotations

import numpy as np

from .base import BlockAlgorithm, register


@register
class ModelAverage(BlockAlgorithm):
    name = "ma"
    summary = "model averaging: z = avg(w_i)"

    def _step(self, S, sl):
        np.multiply(S, self.dtype.type(1.0 / self.n), out=self.z[sl])
        return S
