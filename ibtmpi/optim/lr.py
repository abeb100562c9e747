"""The local learning rate as a pure function of the position in the run.

Test: tests/unit/test_lr_schedule.py against the closed forms.
"""
from __future__ import annotations

import math

from ..settings import Key, declare, non_negative, rule

SCHEDULES = ("constant", "step", "cosine")


def _decay_horizon(value, cfg):
    """What cosine's decay_passes = 0 means: run.passes (the digest holds it)."""
    if cfg["optim"]["schedule"] == "cosine" and not value:
        return float(cfg["run"]["passes"])
    return value


def _milestones_ok(v):
    return (all(isinstance(m, (int, float)) and not isinstance(m, bool) and m > 0 for m in v)
            and list(v) == sorted(v))


# the schedule's keys came after the first checkpoints (left out of the
# digest at their defaults); a resume may change any of them
LR = {"added": True, "tunable": True}
declare(
    "optim",
    Key("schedule", "constant", "constant | step | cosine: lr per block (ssgd: per step)",
        choices=SCHEDULES, **LR),
    Key("milestones", [], "step: passes at which lr is multiplied by gamma",
        check=_milestones_ok,
        why="{where} must be increasing numbers of passes > 0, got {v!r}", **LR),
    Key("gamma", 0.1, "step: the factor", check=lambda v: 0 < v <= 1,
        why="{where} must be in (0, 1]", **LR),
    Key("decay_passes", 0.0, "cosine: passes to decay over; 0: run.passes",
        check=non_negative, why="{where} must be >= 0 (0: run.passes)",
        resolve=_decay_horizon, shown="0 (= `run.passes`)", **LR),
    Key("final_ratio", 0.0, "cosine: the last lr as a fraction of lr",
        check=lambda v: 0 <= v <= 1, why="{where} must be in [0, 1]", **LR),
    Key("warmup_passes", 0.0, "linear lr warm-up (any schedule)", check=non_negative,
        why="{where} must be >= 0", **LR),
)


@rule("optim")
def _milestones_rule(cfg):
    o = cfg["optim"]
    if o["milestones"] and o["schedule"] != "step":
        return "optim.milestones is set but optim.schedule is not 'step'"
    return None

class LrSchedule:
    """The local learning rate at block k: a pure function of the position
    in the run, so every rank (and the in-process simulation, and a resumed
    run) computes the same value with no communication. Block methods use
    one rate per block (a block is one consensus step): lr_at(k). ssgd,
    whose steps are each a synchronous update, asks per step: lr_at(k,
    s / S, 1 / S) for step s of S, so a warm-up works even with one block
    per pass.

    schedule: ``constant`` (lr), ``step`` (lr * gamma^m, m = milestones
    passed; milestones in passes, e.g. [30, 45]) or ``cosine`` (from lr down
    to lr * final_ratio over ``decay_passes``, then flat). ``warmup_passes``
    (W, in blocks here) ramps linearly before either: lr * (p + unit) / W
    at position p. Tested in tests/unit/test_lr_schedule.py against the
    closed forms."""

    def __init__(self, o, blocks_per_pass, passes):
        self.lr, self.kind = float(o["lr"]), o["schedule"]
        self.bpp = int(blocks_per_pass)
        self.warm = float(o["warmup_passes"]) * self.bpp          # in blocks
        self.gamma = float(o["gamma"])
        self.marks = [float(m) * self.bpp for m in o["milestones"]]
        self.end = float(o["decay_passes"] or passes) * self.bpp
        self.final = self.lr * float(o["final_ratio"])

    def __call__(self, k, frac=0.0, unit=1.0):
        p = k + frac                                    # position in blocks
        if p < self.warm:
            return self.lr * min(1.0, (p + unit) / self.warm)
        if self.kind == "step":
            return self.lr * self.gamma ** sum(p >= m for m in self.marks)
        if self.kind == "cosine":
            span = self.end - self.warm
            t = 1.0 if span <= 0 else min(1.0, (p - self.warm) / span)
            return self.lr - (self.lr - self.final) * 0.5 * (1.0 - math.cos(math.pi * t))
        return self.lr

    def factor(self, k, which):
        """lr_t / lr at block k, for the outer step (algorithm.outer_schedule):
        ``none`` 1, ``warmup`` the warm-up ramp only, ``lr`` the whole
        schedule."""
        if which == "none" or (which == "warmup" and k >= self.warm):
            return 1.0
        return self(k) / self.lr

    def describe(self):
        """One line for the log (None for a constant rate without warm-up)."""
        if self.kind == "constant" and not self.warm:
            return None
        warm = f", linear warm-up over {self.warm:g} block(s)" if self.warm else ""
        if self.kind == "step":
            at = ", ".join(f"{m:g}" for m in self.marks) or "none"
            return f"lr schedule: step, x{self.gamma:g} at blocks {at}{warm}"
        if self.kind == "cosine":
            return (f"lr schedule: cosine {self.lr:g} -> {self.final:g} by block "
                    f"{self.end:g}{warm}")
        return f"lr schedule: constant {self.lr:g}{warm}"
