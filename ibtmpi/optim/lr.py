"""The local learning rate as a pure function of the position in the run.

Test: tests/unit/test_lr_schedule.py against the closed forms.
"""
from __future__ import annotations

import math


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
