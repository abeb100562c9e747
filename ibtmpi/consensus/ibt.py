"""Incremental block training (``ibt``): consensus ADMM filtered by block
momentum, the "improved" method of the source paper as we read it
(DESIGN.md section 3).

  worker  f_i(w) + rho/2 ||w - z_g + u_i||^2       (prox centre z_g)
  G = S/N - z_g; v = eta*v + zeta*G; z = z_g + v; z_g = z + eta*v (always Nesterov)
  S = sum (w^_i + u_i); u_i += w^_i - z
Tests: tests/unit/test_consensus.py, tests/mpi/test_trainer_mpi.py.
"""
from __future__ import annotations

from .admm import ProxAlgorithm
from .base import register
from .bmuf import BlockMomentum


@register
class IBT(BlockMomentum, ProxAlgorithm):
    name = "ibt"
    summary = "ADMM + Nesterov block momentum (the paper's improved method, our reading)"
    vectors = ("z", "zg", "v", "U")

    def setup(self, z0, a):
        super().setup(z0, a)
        self._momentum_setup(z0, a, True)

    def centre(self):
        return self.zg

    def _step(self, S, sl):
        sum_w = self._sum_w(S, sl)
        self._filter(S, sl)
        self._track_duals(S, sl)
        return sum_w
