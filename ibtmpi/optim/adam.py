"""Adam (L2 weight decay in the gradient) and AdamW (decoupled weight decay)
over a flat vector, in PyTorch's order (torch.optim.Adam / AdamW):

  g' = g (+ wd*w: Adam) + extra(w)         the ADMM prox / EASGD pull
  w *= 1 - lr*wd                            AdamW only (Loshchilov & Hutter)
  t += 1;  m = b1*m + (1-b1)*g';  v = b2*v + (1-b2)*g'^2
  w -= (lr/bc1) * m / (sqrt(v)/sqrt(bc2) + eps),  bc1 = 1-b1^t, bc2 = 1-b2^t

The algorithm's extra term (``extra_grad``: a ``Prox`` or another
callable) is part of the gradient, so it enters BEFORE the moments and
is evaluated at w before AdamW's decay, as the loss gradient is.
PyTorch updates m as lerp(m, g', 1-b1): the same in exact arithmetic,
last-bit differences in float32. The scalars (lr/bc1, sqrt(bc2), 1-b1,
1-b2, 1-lr*wd) are formed on the host in float64 and used in float32.
State: m, v (P,) of w's dtype (on the device with w) and the step count
t, a (1,) int64 host array: all three are checkpointed, swapped between
simulated workers and zeroed by ``reset()``, which after a consensus
sync happens only with optim.reset_state = true (auto keeps the state,
as DiLoCo keeps its inner AdamW's). optim.momentum and
optim.nesterov are SGD's keys and are ignored here.
On a GPU (``ops`` given) a step without an extra term or with a ``Prox``
is ONE launch of kernels/optim.cu adam_update, whose NumPy twin is
``adam_update`` below; another callable takes the array ops of ``step``.
Tests: tests/unit/test_optim.py (against the formula in float64, and the
fused launch against the NumPy step), tests/unit/test_kernels.py,
tests/unit/test_launchers_host.py.
"""
from __future__ import annotations

import math

import numpy as np

from ..settings import Key, bad, declare
from .base import Optimizer, Prox, _part, register


def _betas_setting(value, where):
    if (isinstance(value, list) and len(value) == 2
            and all(isinstance(b, (int, float)) and not isinstance(b, bool)
                    and math.isfinite(b) for b in value)):
        return [float(b) for b in value]
    raise bad(where, f"must be two numbers [beta1, beta2], got {value!r}")


declare(
    "optim",
    Key("betas", [0.9, 0.999], "adam, adamw: the moments' decay rates",
        parse=_betas_setting, check=lambda v: all(0 <= b < 1 for b in v),
        why="{where} must both be in [0, 1), got {v!r}", added=True, tunable=True),
    Key("eps", 1e-8, "adam, adamw: added to the denominator", check=lambda v: v > 0,
        why="{where} must be > 0, got {v!r}", added=True, tunable=True),
)


def adam_scalars(lr, b1, b2, wd, bc1, bc2):
    """The host scalars of one step, in float64: (1-b1, 1-b2, lr/bc1,
    sqrt(bc2), 1-lr*wd)."""
    return 1.0 - b1, 1.0 - b2, lr / bc1, math.sqrt(bc2), 1.0 - lr * wd


def adam_update(w, g, m, v, c, u, lr, b1, b2, eps, wd, rho, bc1, bc2, decoupled,
                has_prox):
    """Reference of kernels/optim.cu adam_update (in place on w, m and v;
    NumPy or CuPy arrays): one step with bias corrections bc1, bc2 of the
    step count after this step. decoupled: AdamW's decay, else wd*w in
    the gradient; has_prox: g' += rho*(w - c + u). Same arithmetic as
    Adam.step with the ADMM prox hook (a test checks)."""
    dt = w.dtype.type
    omb1, omb2, step, bc2s, decay = adam_scalars(lr, b1, b2, wd, bc1, bc2)
    gi = g if decoupled else g + dt(wd) * w
    if has_prox:
        gi = gi + dt(rho) * ((w - c) + u)
    if decoupled:
        w *= dt(decay)
    m *= dt(b1)
    m += dt(omb1) * gi
    v *= dt(b2)
    v += dt(omb2) * (gi * gi)
    w -= dt(step) * (m / (np.sqrt(v) / dt(bc2s) + dt(eps)))


@register
class Adam(Optimizer):
    name = "adam"
    decoupled = False

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                 extra_grad=None, ops=None):
        super().__init__(params, lr, extra_grad, ops)
        b1, b2 = betas
        if not (0.0 <= b1 < 1.0 and 0.0 <= b2 < 1.0):
            raise ValueError(f"optim.betas must be in [0, 1), got {list(betas)}")
        if not eps > 0:
            raise ValueError(f"optim.eps must be > 0, got {eps}")
        if weight_decay < 0:
            raise ValueError(f"optim.weight_decay must be >= 0, got {weight_decay}")
        self.b1, self.b2 = float(b1), float(b2)
        self.eps, self.weight_decay = float(eps), float(weight_decay)
        self.m = np.zeros_like(params)           # (P,) first moment
        self.v = np.zeros_like(params)           # (P,) second moment
        self.t = np.zeros(1, np.int64)           # (1,) step count, on the host
        self._tmp = np.empty_like(params)

    @classmethod
    def from_config(cls, o, params, ops=None):
        return cls(params, o["lr"], tuple(o["betas"]), o["eps"], o["weight_decay"],
                   ops=ops)

    @classmethod
    def auto_reset(cls, o):
        return False          # DiLoCo keeps the inner state across syncs

    def state(self):
        return {"m": self.m, "v": self.v, "t": self.t}

    def corrections(self):
        """Count this step; (bc1, bc2) of the new count, in float64."""
        self.t[0] += 1
        t = int(self.t[0])
        return 1.0 - self.b1 ** t, 1.0 - self.b2 ** t

    def step(self, g):
        """Apply one update with gradient g (P,); g may be modified in place."""
        self.clip(g)
        bc1, bc2 = self.corrections()
        self.steps += 1
        p, wd = self.extra_grad, self.weight_decay
        if self.ops is not None and (p is None or isinstance(p, Prox)):
            c, u, rho = (p.c, p.u, p.rho) if p is not None else (None, None, 0.0)
            for sl, lr in self.segments(self.lr):
                self.ops.adam_update(self.w[sl], g[sl], self.m[sl], self.v[sl],
                                     _part(c, sl), _part(u, sl), lr, self.b1, self.b2,
                                     self.eps, wd, rho, bc1, bc2, self.decoupled,
                                     p is not None)
            return
        dt = self.w.dtype.type
        parts = [(sl, adam_scalars(lr, self.b1, self.b2, wd, bc1, bc2))
                 for sl, lr in self.segments(self.lr)]
        omb1, omb2, _, bc2s, _ = parts[0][1]
        w, m, v, tmp = self.w, self.m, self.v, self._tmp
        if wd and not self.decoupled:
            np.multiply(w, dt(wd), out=tmp)
            g += tmp
        if p is not None:
            p(w, g)                       # at w before the decay
        if wd and self.decoupled:
            for sl, (_, _, _, _, decay) in parts:
                w[sl] *= dt(decay)
        m *= dt(self.b1)
        np.multiply(g, dt(omb1), out=tmp)
        m += tmp
        v *= dt(self.b2)
        np.multiply(g, g, out=tmp)
        tmp *= dt(omb2)
        v += tmp
        np.sqrt(v, out=tmp)               # denominator: sqrt(v)/sqrt(bc2) + eps
        tmp /= dt(bc2s)
        tmp += dt(self.eps)
        np.divide(m, tmp, out=tmp)
        for sl, (_, _, step, _, _) in parts:
            tmp[sl] *= dt(step)
        w -= tmp


@register
class AdamW(Adam):
    name = "adamw"
    decoupled = True
