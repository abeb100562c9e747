"""The optimizer protocol and its registry, and the ADMM prox hook.

An optimizer updates one flat parameter vector w (P,) in place from a
gradient g (P,): ``step(g)``. It owns its state buffers (SGD: the momentum
v; Adam: moments and a step count) and is the only code that names them:
``state_spec()`` gives {name: (shape, dtype)}, ``state()`` the live
buffers, ``load(state)`` copies values in (host or device arrays),
``reset()`` zeroes them (after a consensus sync, where the optimizer's
``reset_on_sync`` says so: optim.reset_state, resolved by ``reset_on_sync``
below). A buffer may live on the host while the others are on the
device (Adam's step count): ``load`` copies each value to where its
buffer is. Checkpoints, the trainer and the simulated
workers' swaps go through these four and nothing else. ``lr`` and
``extra_grad`` are set by the trainer: the learning rate of the block
(lr.py's LrSchedule) and the algorithm's term added to g before the
update (the ADMM prox, a ``Prox``; docs/design.md section 3).
A new optimizer is one module in this package with a class decorated by
``@register`` and one import line in __init__.py.
Tests: tests/unit/test_optim.py.
"""
from __future__ import annotations

import abc

import numpy as np

from ..settings import Key, bad, declare, non_negative

OPTIMIZERS = {}          # name -> class: the single list (config, docs)


def _reset_state_setting(value, where):
    if value == "auto" or isinstance(value, bool):
        return value
    raise bad(where, f"must be auto, true or false, got {value!r}")


declare(
    "optim",
    Key("name", "sgd", "the local optimizer (ibtmpi/optim/: sgd, adam, adamw)",
        choices=lambda: OPTIMIZERS, added=True, lead=True),
    Key("lr", 0.02, "", check=lambda v: v > 0, why="{where} must be > 0, got {v}",
        tunable=True),
    Key("weight_decay", 5e-4, "sgd, adam: L2 in the gradient; adamw: decoupled",
        check=non_negative, why="{where} must be >= 0", tunable=True),
    Key("clip_norm", 0.0, "clip each step's loss gradient to this L2 norm; 0: off",
        check=non_negative, why="{where} must be >= 0 (0: off), got {v!r}", added=True,
        tunable=True),
    Key("backbone_lr_scale", 1.0, "the lr of every layer but the head (the last linear "
        "layer) is lr times this: below 1 for fine-tuning (model.init); 0 freezes them",
        check=non_negative, why="{where} must be >= 0, got {v!r}", added=True,
        tunable=True),
    Key("reset_state", "auto", "zero the optimizer state after every sync: auto (sgd: "
        "reset_momentum; adam/adamw: false) | true | false", parse=_reset_state_setting,
        added=True, tunable=True),
)


def register(cls):
    """Class decorator: cls.name becomes an optim.name value."""
    OPTIMIZERS[cls.name] = cls
    return cls


class Optimizer(metaclass=abc.ABCMeta):
    name = ""
    reset_on_sync = True     # make() sets it from optim.reset_state
    clip_norm = 0.0          # make() sets it from optim.clip_norm; 0: off
    lr_split = None          # make() sets it from optim.backbone_lr_scale: (head start, scale)

    def __init__(self, params, lr, extra_grad=None, ops=None):
        if lr <= 0:
            raise ValueError(f"optim.lr must be > 0, got {lr}")
        self.w = params                          # (P,) updated in place
        self.lr = lr
        self.extra_grad = extra_grad
        self.ops = ops                           # backend.GpuOps: fused steps
        self.steps = 0

    @classmethod
    @abc.abstractmethod
    def from_config(cls, o, params, ops=None):
        """From the [optim] section (every key there, at its declared
        default where not set); every optimizer class writes its own."""

    @classmethod
    def auto_reset(cls, o):
        """What optim.reset_state = "auto" means for this optimizer: here
        optim.reset_momentum (true by default), the key's older name."""
        return o.get("reset_momentum", True)

    @abc.abstractmethod
    def step(self, g):
        """One update of w from the gradient g (and extra_grad)."""

    def clip(self, g):
        """Scale the loss gradient g in place to an L2 norm of at most
        clip_norm (before weight decay and the prox term); each step calls
        it first. The norm is a float64 pairwise sum (the same bits at any
        BLAS thread count); on a GPU the factor stays on the device (no
        host sync a step)."""
        if not self.clip_norm:
            return
        if self.ops is not None and self.ops.on_device(g):     # NumPy calls, CuPy's ops
            nrm = np.sqrt(np.sum(np.square(g.astype(np.float64))))
            g *= np.minimum(1.0, self.clip_norm / (nrm + 1e-12)).astype(g.dtype)
            return
        nrm = float(np.sqrt(np.sum(np.square(g, dtype=np.float64))))
        if nrm > self.clip_norm:
            g *= g.dtype.type(self.clip_norm / nrm)

    def segments(self, lr):
        """The learning rate of each contiguous part of w: ((slice, lr),).
        One part, or with optim.backbone_lr_scale s != 1 two: w[:h] (the
        backbone) at lr*s and w[h:] (the head, the last linear layer) at
        lr. Only the lr-scaled tail of a step goes by part; the gradient
        clip, the weight decay term and the prox stay global, and each
        part of a fused GPU step is one launch on contiguous views."""
        if self.lr_split is None:
            return ((slice(None), lr),)
        h, s = self.lr_split
        return ((slice(0, h), lr * s), (slice(h, None), lr))

    # -- state: the only way anybody reads or writes the buffers -------------
    def state_spec(self):
        """{name: (shape, dtype)} of the buffers a checkpoint keeps."""
        return {k: (v.shape, v.dtype) for k, v in self.state().items()}

    def state(self):
        """{name: live buffer} (on the device for a GPU optimizer)."""
        return {}

    def load(self, state):
        """Copy `state` ({name: host or device array}) into the buffers."""
        for k, buf in self.state().items():
            src = state[k]
            if self.ops is not None:
                src = (self.ops.asarray(src) if self.ops.on_device(buf)
                       else self.ops.asnumpy(src))
            buf[...] = src

    def reset(self):
        for buf in self.state().values():
            buf.fill(0)


def _part(x, sl):
    """x[sl], or None where x is (no prox term)."""
    return None if x is None else x[sl]


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


def reset_on_sync(o):
    """Whether the inner optimizer's state is zeroed after every consensus
    sync, from the [optim] section: reset_state true or false, or "auto":
    the optimizer's own default (Optimizer.auto_reset: optim.reset_momentum,
    the older name, true by default, as SGD always did; Adam/AdamW: false,
    as DiLoCo keeps its inner state)."""
    r = o.get("reset_state", "auto")
    if r == "auto":
        return bool(OPTIMIZERS[o["name"]].auto_reset(o))
    return bool(r)


def make(o, params, ops=None, head_start=None):
    """The optimizer optim.name names, built from the [optim] section;
    head_start: where the head's parameters start in `params` (needed
    when optim.backbone_lr_scale is not 1)."""
    name = o["name"]
    if name not in OPTIMIZERS:
        raise ValueError(f"optim.name must be one of {', '.join(OPTIMIZERS)}, got {name!r}")
    opt = OPTIMIZERS[name].from_config(o, params, ops)
    opt.reset_on_sync = reset_on_sync(o)
    opt.clip_norm = float(o.get("clip_norm", 0.0))
    scale = float(o.get("backbone_lr_scale", 1.0))
    if scale != 1.0:
        if head_start is None:
            raise bad("optim.backbone_lr_scale", f"= {scale:g} needs a model whose head is a "
                      "linear layer (model.layers has none)")
        opt.lr_split = (int(head_start), scale)
    return opt
