"""Incremental block training (``ibt``): consensus ADMM filtered by block
momentum, the "improved" method of the source paper as we read it: admm's local objective composed with the
``sgd`` outer optimizer (outer.py), always Nesterov.

  worker  f_i(w) + rho/2 ||w - z_g + u_i||^2       (prox centre z_g)
  G = c*S - z_g; v = eta*v + zeta*G; z = z_g + v; z_g = z + eta*v
  S = sum (w^_i + u_i); u_i += w^_i - z;  c = 1/N (with l2: admm's shrink)
  centred duals (algorithm.centred_duals): u_i += w^_i - c*S, so sum u_i = 0
Tests: tests/unit/test_consensus.py, tests/mpi/test_trainer_mpi.py.
"""
from __future__ import annotations

from .admm import ADMM
from .base import register


@register
class IBT(ADMM):
    name = "ibt"
    summary = "ADMM + Nesterov block momentum (the paper's improved method, our reading)"
    default_outer = "sgd"
    outer_args = {"nesterov": True}
