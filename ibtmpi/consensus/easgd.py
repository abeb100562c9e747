"""Synchronous elastic averaging SGD (``easgd``; Zhang, Choromanska, LeCun 2015).

  S = sum_i (w_i - z); z += alpha*S; w_i -= alpha*(w_i - z_old), alpha = beta/N
Each worker keeps its own model between blocks (its start point).
Tests: tests/unit/test_consensus.py, tests/unit/test_trainer.py.
"""
from __future__ import annotations

import numpy as np

from ..settings import Key, declare
from .base import BlockAlgorithm, register

declare("algorithm", Key("easgd_beta", 0.9, "EASGD: alpha = beta / N",
                         check=lambda v: 0 < v <= 1, why="{where} must be in (0, 1]",
                         tunable=True))


@register
class EASGD(BlockAlgorithm):
    name = "easgd"
    summary = "synchronous elastic averaging: z += alpha * sum(w_i - z)"
    worker_vectors = ("w_own",)

    def setup(self, z0, a):
        self.easgd_alpha = float(a["easgd_beta"]) / self.n

    def worker_begin(self, ws, w):
        if ws.w_own is None:
            ws.w_own = self.z.copy()
        np.copyto(w, ws.w_own)

    def contribution(self, ws, w, out):
        q = self._distance(w)
        np.subtract(w, self.z, out=out)
        ws.w_own = w.copy()
        return q

    def _step(self, S, sl):
        z = self.z[sl]
        sum_w = S + self.dtype.type(self.n) * z
        z += self.dtype.type(self.easgd_alpha) * S
        return sum_w

    def worker_end(self, ws, w):
        # elastic pull towards the OLD z (symmetric with the z update)
        ws.w_own -= self.dtype.type(self.easgd_alpha) * (ws.w_own - self.z_prev)
