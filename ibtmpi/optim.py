"""Local optimizer: SGD with momentum and weight decay over flat vectors.

PyTorch convention: g' = g + wd*w + extra(w); v = mu*v + g'; w -= lr*v
(Nesterov: w -= lr*(g' + mu*v)). ``extra_grad(w, g)`` adds a term to g in
place each step: the ADMM worker adds rho*(w - z + u), EASGD an elastic
pull. ``reset()`` zeroes the momentum (after a consensus sync, optionally).
Test: tests/unit/test_optim.py (against a hand-unrolled recurrence).
"""
from __future__ import annotations

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


class SGD:
    def __init__(self, params, lr=0.01, momentum=0.9, weight_decay=0.0,
                 nesterov=False, extra_grad=None):
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
        self.v = np.zeros_like(params)           # (P,) momentum buffer
        self._tmp = np.empty_like(params)
        self.steps = 0

    def step(self, g):
        """Apply one update with gradient g (P,); g is modified in place."""
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
