"""The block protocol every consensus algorithm follows, and the registry.

Per block every worker i starts from ``worker_begin`` (the start point;
easgd: its own w), runs local steps with ``extra_grad`` added to its
gradient (the prox term, or None), then packs ``contribution`` into the
block's single Allreduce. Every rank then calls ``update(S, q_sum)`` on
the SAME reduced sum S, so z is computed identically everywhere, and each
worker calls ``worker_end``. A subclass writes its own part of the update
as ``_step`` on one chunk of the vectors; the chunking (cache-sized pieces
over the rank's threads on the host, one piece on a device), the residuals
and adaptive rho are here, once.

State: ``state_spec()/state()/load()`` are the consensus state every rank
holds alike (the master checkpoints it, every rank reads it back), and
``worker_spec()/worker_state()/worker_load()`` one worker's own (its dual,
easgd's own model). Nothing else names a buffer. The registry
(``ALGORITHMS``) is the single list of algorithm names: config validation,
messages, ``bench`` and docs/config.md read it.
Tests: tests/unit/test_consensus.py (incl. convergence to the centralised
optimum of a convex problem), tests/mpi/test_trainer_mpi.py.
"""
from __future__ import annotations

import abc
import math

import numpy as np

from ..settings import Key, declare, defaults, rule
from .outer import get_outer
from .vector import _chunks, _dots_whole, _in_order, residual_dots

ALGORITHMS = {}          # name -> class, in registration order

declare("algorithm", Key("name", "ibt", "the consensus algorithm (docs/design.md section 3)",
                         choices=lambda: ALGORITHMS, lead=True))


@rule("algorithm")
def _outer_rule(cfg):
    a = cfg["algorithm"]
    if a["outer"] != "auto" and getattr(ALGORITHMS.get(a["name"]), "default_outer",
                                        None) is None:
        return (f"algorithm.outer: {a['name']} has no outer step to swap (easgd moves z "
                f"itself, sgd and ssgd keep no consensus); leave it at auto")
    return None


def register(cls):
    """Class decorator: cls.name becomes an algorithm.name value."""
    ALGORITHMS[cls.name] = cls
    return cls


class WorkerState:
    """What one worker keeps between blocks; algo: a name or a class
    (`zeros`: cupy.zeros keeps the dual on the GPU, for device-resident
    consensus)."""

    def __init__(self, p, dtype, algo, zeros=np.zeros):
        cls = ALGORITHMS[algo] if isinstance(algo, str) else algo
        self.u = zeros(p, dtype) if cls.dual else None   # scaled dual (admm, ibt)
        self.w_own = None                 # easgd: the worker's own model
        self.w_hat = None                 # over-relaxed point of this block


class Algorithm:
    """What the trainer asks of any algorithm before it builds one."""

    name = ""
    summary = ""              # one line for docs and messages
    single_worker = False     # the N = 1 baseline only (sgd)
    per_step = False          # ssgd: a gradient Allreduce every minibatch, no consensus
    dual = False              # a scaled dual u_i per worker (admm, ibt)
    uses_rho = False          # the prox penalty rho (and adaptive rho) applies

    @classmethod
    def check_workers(cls, n, how):
        """ValueError when this algorithm cannot run with n workers; `how`
        says how this job got them (for the advice)."""
        if cls.single_worker and n != 1:
            others = ", ".join(a for a, c in ALGORITHMS.items() if not c.single_worker)
            raise ValueError(f"algorithm {cls.name!r} is the single-worker baseline; "
                             f"{how}, or pick a parallel algorithm ({others})")


class BlockAlgorithm(Algorithm, metaclass=abc.ABCMeta):
    """z0 may be a NumPy or a CuPy array: the update is written as one
    NumPy-API call per elementwise op (CuPy dispatches them, one kernel per
    op, no fused multiply-add), so a GPU worker's z is bitwise equal to the
    host z of the master. `to_host` (device arrays only) copies an array to
    NumPy: adaptive rho decides from float64 residuals that every rank must
    compute identically, so those dot products always run on the host.
    acfg: the [algorithm] section (missing keys take their declared defaults)."""

    default_outer = None      # its outer optimizer (outer.py) at algorithm.outer = auto;
                              # None: the algorithm moves z itself (easgd)
    outer_args = {}           # fixed settings of that outer optimizer (ibt: Nesterov)

    def __init__(self, z0, n_workers, acfg, to_host=None, threads=1):
        a = {**defaults("algorithm"), **acfg}
        self.check_workers(n_workers, "run it without mpiexec (or -n 1)")
        self.n = int(n_workers)
        self.dtype = z0.dtype
        self.z = z0.copy()                # consensus model
        self.z_prev = z0.copy()
        self.rho = float(a["rho"])
        self.dual_reset = bool(a["dual_reset"])
        self.adaptive = bool(a["adaptive_rho"]) and self.uses_rho
        self.mu, self.tau = float(a["rho_mu"]), float(a["rho_tau"])
        self.rho_scale = 1.0              # rho_old / rho_new of the last update
        self.blocks = 0
        self._h = to_host
        self.threads = max(1, int(threads))   # host arrays: chunks updated at once
        self._pool = None
        self.outer = self._new_outer(a)
        self.setup(z0, a)

    @classmethod
    def outer_name(cls, a):
        """The outer optimizer's name algorithm.outer gives (auto: ours;
        None: the algorithm moves z itself)."""
        name = a.get("outer", "auto")
        return cls.default_outer if name == "auto" else name

    def _new_outer(self, a):
        """The outer optimizer that moves z (algorithm.outer; auto: ours)."""
        name = self.outer_name(a)
        if self.default_outer is None and name is not None:
            raise ValueError(f"algorithm {self.name!r} moves z itself: "
                             f"algorithm.outer must be auto, got {name!r}")
        if name is None:
            return None
        args = self.outer_args if name == self.default_outer else {}
        return get_outer(name)(self.z, self.n, a, **args)

    def describe_outer(self, schedule="none"):
        """One log line on an outer step other than plain averaging, or None."""
        if self.outer is None or self.outer.name == "average":
            return None
        return (f"outer step: {self.outer.describe()}"
                + ({"warmup": ", block_lr ramped with the lr's warm-up",
                    "lr": ", block_lr x lr_t / lr"}.get(schedule, "")))

    def outer_gain(self):
        """How far the start point moves per block against plain averaging
        (1: the average; the sgd outer step: its steady-state gain)."""
        g = getattr(self.outer, "gain", None)
        return g() if g is not None else 1.0

    def set_outer_scale(self, scale):
        """zeta's factor for the next update (algorithm.outer_schedule)."""
        if self.outer is not None:
            self.outer.scale = float(scale)

    def setup(self, z0, a):
        """The algorithm's own settings and buffers."""

    # -- what workers start from ------------------------------------------
    def start_point(self):
        return self.z if self.outer is None else self.outer.start_point()

    def centre(self):
        """Prox centre; None: no prox term."""
        return None

    def new_worker(self, p, dtype, zeros=np.zeros):
        return WorkerState(p, dtype, type(self), zeros)

    def worker_begin(self, ws, w):
        """Load the block's start into w (P,) in place."""
        np.copyto(w, self.start_point())

    def extra_grad(self, ws, to_device=None):
        """The term the worker's optimizer adds to its gradient, or None."""
        return None

    def contribution(self, ws, w, out):
        """Write worker i's share of S into out (P,); return ||w - z_s||^2."""
        np.copyto(out, w)
        return self._distance(w)

    def _distance(self, w):
        zs = self.start_point()
        d = (w - zs).astype(np.float64)
        return float(d @ d)

    def worker_end(self, ws, w):
        """Local updates after the consensus step (w: the worker's model)."""

    # -- the replicated update (same on every rank) ------------------------
    def update(self, S, q_sum):
        """S: reduced sum (P,); q_sum: sum_i ||w_i - z_s||^2. Returns diagnostics.

        Host arrays are updated chunk by chunk (_CHUNK elements, every
        elementwise op of the update on one chunk while it is in cache),
        the chunks shared out over `threads`; device arrays in one go. The
        elementwise code is the same (_elementwise), so z is bitwise equal
        either way, and the residuals' float64 sums are added chunk by
        chunk in order on the host in both (residual_dots)."""
        n = self.n
        h = self._h if (self._h is not None and self.adaptive) else (lambda a: a)
        if type(self.z) is np.ndarray:
            dz_sw, dz_dz, step2 = _in_order(self._map(
                lambda s: _dots_whole(*self._elementwise(S, s)), _chunks(self.z.size)))
        else:
            dz_sw, dz_dz, step2 = residual_dots(*(h(a) for a in
                                                  self._elementwise(S, slice(None))))
        primal2 = max(q_sum - 2.0 * dz_sw + n * dz_dz, 0.0)
        dual = math.sqrt(n) * self.rho * math.sqrt(step2)
        primal = math.sqrt(primal2)
        rho_used = self.rho
        self.rho_scale = 1.0
        if self.adaptive:
            if primal > self.mu * dual:
                self.rho_scale = 1.0 / self.tau
            elif dual > self.mu * primal:
                self.rho_scale = self.tau
            if self.rho_scale != 1.0:
                self.rho /= self.rho_scale          # rho_new = rho_old / scale
                self.rescale_duals(self.rho_scale)
        self.blocks += 1
        return {"primal": primal, "dual": dual, "rho": rho_used}

    def rescale_duals(self, scale):
        """Adaptive rho changed rho: scaled duals scale by rho_old/rho_new."""

    def set_rho(self, rho, states):
        """A resume with another algorithm.rho: rho moves to it and every
        scaled dual (the replicated sum, each local worker's u) by
        rho_old/rho_new, so the unscaled duals are kept."""
        if not self.uses_rho or rho == self.rho:
            self.rho = rho
            return
        scale = self.rho / rho
        self.rho = rho
        self.rescale_duals(scale)
        for ws in states:
            u = getattr(ws, "u", None)
            if u is not None:
                u *= self.dtype.type(scale)

    def _elementwise(self, S, sl):
        """The update's elementwise part on the elements `sl` of the vectors;
        returns that slice's residual vectors (z - z_s, sum_w - N*z_s,
        z - z_prev), float32."""
        dt = self.dtype.type
        zs = self.start_point()[sl].copy()
        z, z_prev = self.z[sl], self.z_prev[sl]
        np.copyto(z_prev, z)
        sum_w = self._step(S[sl], sl)
        # residuals: sum ||w_i - z||^2 from sum ||w_i - z_s||^2
        return z - zs, sum_w - dt(self.n) * zs, z - z_prev

    @abc.abstractmethod
    def _step(self, S, sl):
        """The algorithm's update on slice sl (S is already S[sl]): sets
        z[sl] and its own buffers; returns the sum of the workers' w there
        (every algorithm class writes its own: Python refuses to build one
        that does not)."""

    def _map(self, f, items):
        """[f(x) for x in items], over a pool of `threads` threads (NumPy
        releases the GIL inside each op); in order."""
        if self.threads <= 1 or len(items) < 2:
            return [f(x) for x in items]
        if self._pool is None:
            from concurrent.futures import ThreadPoolExecutor
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="consensus")
        return list(self._pool.map(f, items))

    # -- state -----------------------------------------------------------------
    vectors = ("z",)          # the P-vectors of the consensus state (the outer
                              # optimizer's follow z: state_vectors)
    worker_vectors = ()       # the P-vectors of one worker's state

    def state_vectors(self):
        """[(name, array)]: z, the outer optimizer's vectors, then ours."""
        own = [(k, getattr(self, k)) for k in self.vectors]
        out = [(k, getattr(self.outer, k)) for k in self.outer.vectors] if self.outer else []
        return own[:1] + out + own[1:]

    def state_spec(self):
        """{name: (shape, dtype)} of the state every rank holds alike."""
        p, f = self.z.shape, self.dtype
        return {**{k: (p, f) for k, _ in self.state_vectors()},
                "rho": ((), np.float64), "cons_blocks": ((), np.int64),
                **(self.outer.scalar_spec() if self.outer else {})}

    def state(self):
        return {**dict(self.state_vectors()),
                "rho": np.float64(self.rho), "cons_blocks": np.int64(self.blocks),
                **(self.outer.scalar_state() if self.outer else {})}

    def load(self, st, put):
        """put(dst, src): copy a host array into one of ours (host or device)."""
        for k, arr in self.state_vectors():
            put(arr, st[k])
        self.rho, self.blocks = float(st["rho"]), int(st["cons_blocks"])
        if self.outer is not None:
            self.outer.load_scalars(st)

    def observe(self, loss, k, warm):
        """Block k's training loss, after its update, on every rank alike:
        the outer step's overshoot guard (None, or what it found)."""
        return None if self.outer is None else self.outer.observe(loss, k, warm)

    def worker_spec(self):
        return {k: (self.z.shape, self.dtype) for k in self.worker_vectors}

    def worker_state(self, ws):
        return {k: getattr(ws, k) for k in self.worker_vectors}

    def worker_load(self, ws, st, new):
        """new(src): a copy of host array src where this worker's state lives."""
        for k in self.worker_vectors:
            setattr(ws, k, new(st[k]))
