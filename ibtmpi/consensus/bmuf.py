"""Blockwise model-update filtering (``bmuf``; Chen & Huo, ICASSP 2016):
ma's plain local objective composed with the ``sgd`` outer optimizer
(outer.py):

  G = S/N - z_g; v = eta*v + zeta*G; z = z_g + v; z_g = z + eta*v (NBM) or z
with S = sum_i w_i; workers start from z_g.
Tests: tests/unit/test_consensus.py, tests/unit/test_trainer.py.
"""
from __future__ import annotations

from .average import ModelAverage
from .base import register


@register
class BMUF(ModelAverage):
    name = "bmuf"
    summary = "block momentum on avg(w_i) (CBM, or NBM with algorithm.nesterov)"
    default_outer = "sgd"
