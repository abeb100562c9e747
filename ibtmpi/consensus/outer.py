"""Outer optimizers: the step from the workers' consensus mean to the next
start point, as a registered part of every block algorithm but easgd.

A block algorithm is a local objective (plain: ma, bmuf; the ADMM prox with
duals: admm, ibt) composed with an outer optimizer. After the block's
Allreduce the algorithm hands its outer optimizer the sum S and the factor
c that makes c*S the consensus mean (1/N; admm's l2 shrinks it); with z_s
the block's start point, G = c*S - z_s is the pseudo-gradient (DiLoCo's
outer gradient is -G):

  average  z = c*S; the next start point is z                    (ma, admm)
  sgd      v = eta*v + zeta*G; z = z_s + v;
           next start z + eta*v (Nesterov) or z                  (bmuf, ibt)

``sgd`` is BMUF's filter (Chen & Huo 2016), SlowMo's slow step and
DiLoCo's outer Nesterov SGD: eta is algorithm.block_momentum (< 0: CNTK's
1 - 1/N), zeta algorithm.block_lr. ``algorithm.outer_schedule`` scales zeta
by the local lr's schedule: ``warmup`` by its warm-up ramp only, ``lr`` by
lr_t / lr over the whole run (``scale`` below; every rank computes it from
the block index alone, so z stays replicated). The state (``vectors``) is
checkpointed with the algorithm's and restored exactly.

A new outer optimizer is a class here decorated by ``@register_outer``;
``algorithm.outer`` picks one for any algorithm (``auto``: the algorithm's
own).
Tests: tests/unit/test_outer.py, tests/unit/test_consensus.py.
"""
from __future__ import annotations

import abc

import numpy as np

from ..settings import Key, declare
from .vector import block_momentum

OUTER = {}               # name -> class, in registration order
OUTER_SCHEDULES = ("none", "warmup", "lr")

declare(
    "algorithm",
    Key("outer", "auto", "the outer optimizer on the consensus mean: auto (the "
        "algorithm's own) | average | sgd", choices=lambda: ("auto", *OUTER), added=True),
    Key("block_momentum", 0.25, "eta of the sgd outer optimizer (bmuf, ibt); < 0 means "
        "CNTK's 1 - 1/N", check=lambda v: v < 1,
        why="{where} must be < 1 (or < 0 for 1 - 1/N)", tunable=True),
    Key("block_lr", 1.0, "zeta of the sgd outer optimizer (bmuf, ibt)",
        check=lambda v: v > 0, why="{where} must be > 0", tunable=True),
    Key("nesterov", True, "NBM start point (bmuf); ibt is always Nesterov", tunable=True),
    Key("outer_schedule", "none", "zeta x the local lr's schedule: none | warmup (its "
        "ramp only) | lr (lr_t / lr, the whole run)", choices=OUTER_SCHEDULES,
        added=True, tunable=True),
)


def register_outer(cls):
    OUTER[cls.name] = cls
    return cls


class OuterOptimizer(metaclass=abc.ABCMeta):
    """The step z_s -> z from c*S, on one slice of the vectors at a time
    (the algorithm's update is chunked; see BlockAlgorithm.update)."""

    name = ""
    summary = ""
    vectors = ()              # its P-vectors, checkpointed with the algorithm's

    def __init__(self, z, n, a, nesterov=None):
        self.z = z            # the algorithm's consensus vector (shared, not a copy)
        self.n = n
        self.scale = 1.0      # zeta's factor this block (outer_schedule)

    def start_point(self):
        """Where the workers start the next block (and the prox centre)."""
        return self.z

    @abc.abstractmethod
    def step(self, S, c, sl):
        """z[sl] from S (= S[sl]) and the mean's factor c."""

    def describe(self):
        return self.name


@register_outer
class Average(OuterOptimizer):
    name = "average"
    summary = "z = the consensus mean; the workers start from it"

    def step(self, S, c, sl):
        np.multiply(S, self.z.dtype.type(c), out=self.z[sl])


@register_outer
class OuterSGD(OuterOptimizer):
    name = "sgd"
    summary = "SGD on the pseudo-gradient: lr zeta, momentum eta, Nesterov start point"
    vectors = ("zg", "v")

    def __init__(self, z, n, a, nesterov=None):
        super().__init__(z, n, a)
        eta = float(a["block_momentum"])
        self.eta = 1.0 - 1.0 / n if eta < 0 else eta
        self.zeta = float(a["block_lr"])
        self.nesterov = bool(a["nesterov"]) if nesterov is None else nesterov
        self.zg = z.copy()                # start point / prox centre
        self.v = np.zeros_like(z)         # block momentum

    def start_point(self):
        return self.zg

    def step(self, S, c, sl):
        block_momentum(S, self.zg[sl], self.v[sl], self.z[sl], c, self.eta,
                       self.zeta * self.scale, self.nesterov)

    def gain(self):
        """Steady-state factor on a constant pseudo-gradient: how far the
        start point moves per block against plain averaging."""
        return self.zeta * ((1 + self.eta) if self.nesterov else 1.0) / (1 - self.eta)

    def describe(self):
        return (f"sgd (eta {self.eta:g}, zeta {self.zeta:g}"
                + (", Nesterov" if self.nesterov else "") + f": gain {self.gain():.3g})")


def get_outer(name):
    if name not in OUTER:
        raise ValueError(f"unknown outer optimizer {name!r}; known: {', '.join(OUTER)}")
    return OUTER[name]
