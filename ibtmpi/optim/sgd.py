"""SGD with momentum and weight decay over a flat vector.

PyTorch convention: g' = g + wd*w + extra(w); v = mu*v + g'; w -= lr*v
(Nesterov: w -= lr*(g' + mu*v)). Its one state buffer is the momentum v.
On a GPU (``ops`` given) a step without an extra term or with a ``Prox`` is
ONE launch of the fused kernel (kernels/optim.cu sgd_update, whose NumPy
twin is ``sgd_update`` below) instead of 6-10 elementwise passes.
Test: tests/unit/test_optim.py (against a hand-unrolled recurrence, and the
fused launch against the NumPy step); tests/unit/test_kernels.py.
"""
from __future__ import annotations

import numpy as np

from ..settings import Key, declare
from .base import Optimizer, Prox, _part, register

declare(
    "optim",
    Key("momentum", 0.9, "sgd", check=lambda v: 0 <= v < 1, why="{where} must be in [0, 1)",
        tunable=True),
    Key("nesterov", False, "sgd", tunable=True),
    Key("reset_momentum", True, "sgd: zero the local momentum after every sync",
        tunable=True),
)


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


@register
class SGD(Optimizer):
    name = "sgd"

    def __init__(self, params, lr=0.01, momentum=0.9, weight_decay=0.0,
                 nesterov=False, extra_grad=None, ops=None):
        super().__init__(params, lr, extra_grad, ops)
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"optim.momentum must be in [0, 1), got {momentum}")
        if weight_decay < 0:
            raise ValueError(f"optim.weight_decay must be >= 0, got {weight_decay}")
        self.momentum = momentum
        self.weight_decay, self.nesterov = weight_decay, nesterov
        self.v = np.zeros_like(params)           # (P,) momentum buffer
        self._tmp = np.empty_like(params)

    @classmethod
    def from_config(cls, o, params, ops=None):
        return cls(params, o["lr"], o["momentum"], o["weight_decay"], o["nesterov"],
                   ops=ops)

    def state(self):
        return {"v": self.v}

    def step(self, g):
        """Apply one update with gradient g (P,); g may be modified in place."""
        self.clip(g)
        p = self.extra_grad
        if self.ops is not None and (p is None or isinstance(p, Prox)):
            c, u, rho = (p.c, p.u, p.rho) if p is not None else (None, None, 0.0)
            for sl, lr in self.segments(self.lr):
                self.ops.sgd_update(self.w[sl], g[sl], self.v[sl], _part(c, sl),
                                    _part(u, sl), lr, self.momentum, self.weight_decay,
                                    rho, self.nesterov, p is not None)
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
        for sl, lr in self.segments(self.lr):
            np.multiply(upd[sl], dt(lr), out=self._tmp[sl])
        self.w -= self._tmp
        self.steps += 1
