"""Blockwise model-update filtering (``bmuf``; Chen & Huo, ICASSP 2016).

  G = S/N - z_g; v = eta*v + zeta*G; z = z_g + v; z_g = z + eta*v (NBM) or z
with S = sum_i w_i; workers start from z_g. ``BlockMomentum`` is the
filter, shared with ibt.
Tests: tests/unit/test_consensus.py, tests/unit/test_trainer.py.
"""
from __future__ import annotations

import numpy as np

from .base import BlockAlgorithm, register
from .vector import block_momentum


class BlockMomentum:
    """Mixin: the block-momentum filter over z, its start point z_g and v."""

    def _momentum_setup(self, z0, a, nesterov):
        eta = float(a["block_momentum"])
        self.eta = 1.0 - 1.0 / self.n if eta < 0 else eta
        self.zeta = float(a["block_lr"])
        self.nesterov = nesterov
        self.zg = z0.copy()               # start point / prox centre
        self.v = np.zeros_like(z0)        # block momentum

    def start_point(self):
        return self.zg

    def _filter(self, S, sl):
        block_momentum(S, self.zg[sl], self.v[sl], self.z[sl], 1.0 / self.n,
                       self.eta, self.zeta, self.nesterov)


@register
class BMUF(BlockMomentum, BlockAlgorithm):
    name = "bmuf"
    summary = "block momentum on avg(w_i) (CBM, or NBM with algorithm.nesterov)"
    vectors = ("z", "zg", "v")

    def setup(self, z0, a):
        self._momentum_setup(z0, a, bool(a["nesterov"]))

    def _step(self, S, sl):
        self._filter(S, sl)
        return S
