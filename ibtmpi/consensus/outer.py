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
import math

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
    Key("overshoot_backoff", True, "when the overshoot guard fires: the plain average's "
        "gain from then on, the block momentum dropped (false: warn only)", added=True,
        tunable=True),
)


def register_outer(cls):
    OUTER[cls.name] = cls
    return cls


class OvershootGuard:
    """CNTK warns when its block momentum settings amplify too much; this
    watches what that amplification does. With an outer step that
    amplifies (gain > 1), after the lr's warm-up: a block training loss
    above max(RISE x, OVER +) the lowest one before the last block, in two
    blocks in a row, is an overshoot. Then (algorithm.overshoot_backoff)
    zeta's factor makes the step's gain 1, the plain average's, for the
    rest of the run, and the outer step's momentum and its look-ahead are
    dropped (the next block starts from z); without the back-off it only
    says so. Either way it fires once. Every rank feeds it the
    same reduced loss, so every rank decides alike (MPI == simulation);
    its state is four numbers, checkpointed with the outer step's."""

    RISE, OVER = 1.5, 0.25

    def __init__(self, backoff):
        self.backoff = backoff
        self.factor = 1.0              # zeta's factor
        self.low = math.inf            # the lowest loss since the warm-up, but the last's
        self.last = math.nan           # the last block's loss
        self.fired = 0

    def observe(self, loss, k, warm, gain):
        """Block k's training loss (warm: the lr warm-up's blocks; gain: the
        outer step's own): None, or when it overshoots now {low: the lowest
        loss it rose from, factor: zeta's factor from now on}."""
        if k < warm or gain * self.factor <= 1.0 or (self.fired and not self.backoff):
            return None
        low, last = self.low, self.last
        self.low, self.last = min(low, last) if last == last else low, loss
        high = lambda x: x > max(self.RISE * low, low + self.OVER)   # noqa: E731
        if not (low < math.inf and high(loss) and high(last)):
            return None
        self.fired += 1
        if self.backoff:
            self.factor = 1.0 / gain            # the plain average's gain from now on
        return {"low": low, "factor": self.factor}

    def array(self):
        return np.array([self.factor, self.low, self.last, self.fired], np.float64)

    def load(self, a):
        self.factor, self.low, self.last, self.fired = (float(a[0]), float(a[1]),
                                                        float(a[2]), int(a[3]))


class OuterOptimizer(metaclass=abc.ABCMeta):
    """The step z_s -> z from c*S, on one slice of the vectors at a time
    (the algorithm's update is chunked; see BlockAlgorithm.update)."""

    name = ""
    summary = ""
    vectors = ()              # its P-vectors, checkpointed with the algorithm's
    guard = None              # an OvershootGuard where the step can amplify

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

    def observe(self, loss, k, warm):
        """After block k's update: its training loss (every rank alike).
        None, or what the overshoot guard found (its back-off applied)."""
        return None

    def scalar_spec(self):
        """{name: (shape, dtype, "optional")} of its small state."""
        return {}

    def scalar_state(self):
        return {}

    def load_scalars(self, st):
        """From a checkpoint (one written before a scalar existed lacks it)."""


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
        self.guard = OvershootGuard(bool(a.get("overshoot_backoff", True)))

    def start_point(self):
        return self.zg

    def step(self, S, c, sl):
        block_momentum(S, self.zg[sl], self.v[sl], self.z[sl], c, self.eta,
                       self.zeta * self.scale * self.guard.factor, self.nesterov)

    def observe(self, loss, k, warm):
        found = self.guard.observe(loss, k, warm, self.gain())
        if found is not None and self.guard.backoff:
            self.v[...] = 0               # the momentum carried the overshoot: drop it,
            self.zg[...] = self.z         # and start the next block from z itself
        return found

    def scalar_spec(self):
        return {"outer_guard": ((4,), np.float64, "optional")}

    def scalar_state(self):
        return {"outer_guard": self.guard.array()}

    def load_scalars(self, st):
        if "outer_guard" in st:
            self.guard.load(st["outer_guard"])

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
