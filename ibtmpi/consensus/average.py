"""Model averaging (``ma``): the plain local objective, S = sum_i w_i,
composed with the ``average`` outer optimizer (outer.py): z = S/N.
Tests: tests/unit/test_consensus.py, tests/unit/test_trainer.py.
"""
from __future__ import annotations

from .base import BlockAlgorithm, register


@register
class ModelAverage(BlockAlgorithm):
    name = "ma"
    summary = "model averaging: z = avg(w_i)"
    default_outer = "average"

    def _step(self, S, sl):
        self.outer.step(S, 1.0 / self.n, sl)
        return S
