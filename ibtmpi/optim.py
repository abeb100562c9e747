"""Local optimizer: SGD with momentum and weight decay over flat vectors.

PyTorch convention: g' = g + wd*w + extra(w); v = mu*v + g'; w -= lr*v
(Nesterov: w -= lr*(g' + mu*v)). ``extra_grad(w, g)`` adds a term to g in
place each step: the ADMM worker adds rho*(w - c + u) (a ``Prox``).
``reset()`` zeroes the momentum (after a consensus sync, optionally).
On a GPU (``ops`` given) a step without an extra term or with a ``Prox`` is
ONE launch of the fused kernel (kernels/optim.cu sgd_update) instead of
6-10 elementwise passes over the parameter vector.
Test: tests/unit/test_optim.py (against a hand-unrolled recurrence, and the
fused launch against the NumPy step).
"""
from __future__ import annotations

import math

import numpy as np


def sgd_update(w, g, v, c, u, lr, mu, wd, rho, nesterov, has_prox):
    """Reference of kernels/optim.cu sgd_update (in place on w and v):
    g' = g + wd*w (+ rho*(w - c + u)); v = mu*v + g'; w -= lr*(v or g' + mu*v).
    Same arithmetic as SGD.step with the ADMM prox hook (a test checks)."""
    dt = w.dtype.type
    gi = g + dt(wd) * w
    if has_prox:
        gi += dt(rho) * ((w - c) + u)
    v *= dt(mu)
    v += gi
    w -= dt(lr) * ((gi + dt(mu) * v) if nesterov else v)


class Prox:
    """extra_grad of an ADMM worker: g += rho*(w - c + u), c the prox centre
    and u the scaled dual (host or device arrays, as w)."""

    def __init__(self, c, u, rho):
        self.c, self.u, self.rho = c, u, rho
        self._tmp = None

    def __call__(self, w, g):
        if self._tmp is None:
            self._tmp = np.empty_like(self.c)
        tmp = self._tmp
        np.subtract(w, self.c, out=tmp)
        np.add(tmp, self.u, out=tmp)
        np.multiply(tmp, self.rho, out=tmp)
        np.add(g, tmp, out=g)


class SGD:
    def __init__(self, params, lr=0.01, momentum=0.9, weight_decay=0.0,
                 nesterov=False, extra_grad=None, ops=None):
        if lr <= 0:
            raise ValueError(f"optim.lr must be > 0, got {lr}")
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"optim.momentum must be in [0, 1), got {momentum}")
        if weight_decay < 0:
            raise ValueError(f"optim.weight_decay must be >= 0, got {weight_decay}")
        self.w = params                          # (P,) updated in place
        self.lr, self.momentum = lr, momentum
        self.weight_decay, self.nesterov = weight_decay, nesterov
        self.extra_grad = extra_grad
        self.ops = ops                           # backend.GpuOps: fused step
        self.v = np.zeros_like(params)           # (P,) momentum buffer
        self._tmp = np.empty_like(params)
        self.steps = 0

    def step(self, g):
        """Apply one update with gradient g (P,); g may be modified in place."""
        p = self.extra_grad
        if self.ops is not None and (p is None or isinstance(p, Prox)):
            c, u, rho = (p.c, p.u, p.rho) if p is not None else (None, None, 0.0)
            self.ops.sgd_update(self.w, g, self.v, c, u, self.lr, self.momentum,
                                self.weight_decay, rho, self.nesterov, p is not None)
            self.steps += 1
            return
        dt = self.w.dtype.type
        if self.weight_decay:
            np.multiply(self.w, dt(self.weight_decay), out=self._tmp)
            g += self._tmp
        if self.extra_grad is not None:
            self.extra_grad(self.w, g)
        if self.momentum:
            self.v *= dt(self.momentum)
            self.v += g
            if self.nesterov:
                np.multiply(self.v, dt(self.momentum), out=self._tmp)
                self._tmp += g
                upd = self._tmp
            else:
                upd = self.v
        else:
            upd = g
        np.multiply(upd, dt(self.lr), out=self._tmp)
        self.w -= self._tmp
        self.steps += 1

    def reset(self):
        self.v.fill(0)

    def state(self):
        return {"v": self.v, "steps": self.steps}


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
