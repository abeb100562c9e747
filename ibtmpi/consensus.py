"""Consensus algorithms as plain array math (no MPI): DESIGN.md section 3.

Per block every worker i starts from ``start_point()`` (easgd: its own w),
runs local SGD with ``extra_grad`` (the prox or elastic term), then packs
``contribution`` into the block's single Allreduce. Every rank then calls
``update(S, stats)`` on the SAME reduced sum S, so z is computed
identically everywhere, and each worker calls ``worker_end``.

  ma     z = S/N,                      S = sum w_i
  admm   z = N*rho*avg/(l2 + N*rho),   S = sum (w^_i + u_i);  u_i += w^_i - z
  bmuf   G = S/N - z_g; v = eta*v + zeta*G; z = z_g + v; z_g = z + eta*v (NBM) or z
  ibt    as bmuf with S = sum (w^_i + u_i), prox centre z_g;  u_i += w^_i - z
  easgd  S = sum (w_i - z); z += alpha*S; w_i -= alpha*(w_i - z_old)
(w^ = a*w + (1-a)*centre: over-relaxation; a = 1 by default.)

sum_i u_i is tracked on every rank as U = S - N*z (no extra collective),
which gives the primal residual sum_i ||w_i - z||^2 from the packed
sum_i ||w_i - z_s||^2 about the block's start point z_s.
Tests: tests/unit/test_consensus.py (incl. convergence to the centralised
optimum of a convex problem), tests/mpi/test_trainer_mpi.py.
"""
from __future__ import annotations

import math

import numpy as np

BLOCK_ALGOS = ("sgd", "ma", "admm", "bmuf", "ibt", "easgd")


# -- vector updates: references of kernels/consensus.cu ------------------------

def axpby(out, a, x, b, y):
    """out = a*x + b*y."""
    dt = out.dtype.type
    t = dt(b) * y
    np.multiply(x, dt(a), out=out)
    out += t
    return out


def dual_update(u, w_hat, z, scale):
    """Scaled dual: u = (u + w_hat - z) * scale (scale = rho_old/rho_new)."""
    u += w_hat
    u -= z
    if scale != 1.0:
        u *= u.dtype.type(scale)


def block_momentum(S, zg, v, z, inv_n, eta, zeta, nesterov):
    """G = S/N - zg; v = eta*v + zeta*G; z = zg + v; zg = z + eta*v or z."""
    dt = z.dtype.type
    G = S * dt(inv_n) - zg
    v *= dt(eta)
    v += dt(zeta) * G
    np.add(zg, v, out=z)
    if nesterov:
        np.add(z, dt(eta) * v, out=zg)
    else:
        np.copyto(zg, z)


def _dot(a, b):
    """Dot product for the replicated residuals: NumPy's pairwise sum, not
    BLAS, whose threaded ddot sums in an order that depends on the rank's
    thread count; adaptive rho must decide identically on every rank."""
    return float(np.sum(np.multiply(a, b)))


_CHUNK = 1 << 16


def residual_dots(dz, sw, step):
    """(dz.sw, dz.dz, step.step) in float64 for three float32 vectors.

    NumPy arrays chunk by chunk (_chunks): the result depends on nothing but
    the inputs (not on the rank's thread count, as BLAS's ddot would), and
    no float64 copy of a whole vector is made. Device (CuPy) arrays are
    summed whole on their device; where the decisions need them alike on
    every rank (adaptive rho) the caller hands host copies."""
    if type(dz) is not np.ndarray:     # a device array (the CuPy stand-in's subclass too)
        return _dots_whole(dz, sw, step)
    return _in_order(_dots_whole(dz[s], sw[s], step[s]) for s in _chunks(dz.size))


def _dots_whole(dz, sw, step):
    f = [a.astype(np.float64) for a in (dz, sw, step)]
    return _dot(f[0], f[1]), _dot(f[0], f[0]), _dot(f[2], f[2])


def _chunks(m):
    """The _CHUNK-element slices of a vector of m: the host update's unit."""
    return [slice(s, s + _CHUNK) for s in range(0, m, _CHUNK)]


def _in_order(sums):
    """Per-chunk (dz.sw, dz.dz, step.step) added up chunk after chunk: the
    same bits however the chunks were computed (one thread or several)."""
    dz_sw = dz_dz = step2 = 0.0
    for a, b, c in sums:
        dz_sw, dz_dz, step2 = dz_sw + a, dz_dz + b, step2 + c
    return dz_sw, dz_dz, step2


class WorkerState:
    """What one worker keeps between blocks (`zeros`: cupy.zeros keeps the
    dual on the GPU, for device-resident consensus)."""

    def __init__(self, p, dtype, algo, zeros=np.zeros):
        self.u = zeros(p, dtype) if algo in ("admm", "ibt") else None
        self.w_own = None                 # easgd: the worker's own model
        self.w_hat = None                 # over-relaxed point of this block


class Consensus:
    """z0 may be a NumPy or a CuPy array: the update is written as one
    NumPy-API call per elementwise op (CuPy dispatches them, one kernel per
    op, no fused multiply-add), so a GPU worker's z is bitwise equal to the
    host z of the master. `to_host` (device arrays only) copies an array to
    NumPy: adaptive rho decides from float64 residuals that every rank must
    compute identically, so those dot products always run on the host."""

    def __init__(self, algo, z0, n_workers, acfg, to_host=None, threads=1):
        if algo not in BLOCK_ALGOS:
            raise ValueError(f"{algo!r} is not a block algorithm")
        if algo == "sgd" and n_workers != 1:
            raise ValueError("algorithm 'sgd' is the single-worker baseline: run "
                             "it without mpiexec (or -n 1); use ma/admm/bmuf/ibt/"
                             "easgd/ssgd with several workers")
        self.algo, self.n = algo, int(n_workers)
        dt = z0.dtype
        self.dtype = dt
        self.z = z0.copy()                # consensus model
        self.zg = z0.copy()               # start point / prox centre (bmuf, ibt)
        self.z_prev = z0.copy()
        self.v = np.zeros_like(z0)        # block momentum (bmuf, ibt)
        self.U = np.zeros_like(z0)        # sum of the workers' duals
        self.rho = float(acfg.get("rho", 0.01))
        self.l2 = float(acfg.get("l2", 0.0))
        self.alpha_or = float(acfg.get("over_relaxation", 1.0))
        from .config import DEFAULTS
        eta = float(acfg.get("block_momentum", DEFAULTS["algorithm"]["block_momentum"]))
        self.eta = 1.0 - 1.0 / self.n if eta < 0 else eta
        self.zeta = float(acfg.get("block_lr", 1.0))
        self.nesterov = algo == "ibt" or bool(acfg.get("nesterov", True))
        self.adaptive = bool(acfg.get("adaptive_rho", False)) and algo in ("admm", "ibt")
        self.mu, self.tau = float(acfg.get("rho_mu", 10.0)), float(acfg.get("rho_tau", 2.0))
        self.dual_reset = bool(acfg.get("dual_reset", False))
        self.easgd_alpha = float(acfg.get("easgd_beta", 0.9)) / self.n
        self.rho_scale = 1.0              # rho_old / rho_new of the last update
        self.blocks = 0
        self._h = to_host
        self.threads = max(1, int(threads))   # host arrays: chunks updated at once
        self._pool = None

    # -- what workers start from ------------------------------------------
    def start_point(self):
        return self.zg if self.algo in ("bmuf", "ibt") else self.z

    def centre(self):
        """Prox centre (admm: z, ibt: z_g); None: no prox term."""
        return {"admm": self.z, "ibt": self.zg}.get(self.algo)

    def worker_begin(self, ws, w):
        """Load the block's start into w (P,) in place."""
        if self.dual_reset and ws.u is not None:
            ws.u.fill(0)
        if self.algo == "easgd":
            if ws.w_own is None:
                ws.w_own = self.z.copy()
            np.copyto(w, ws.w_own)
        else:
            np.copyto(w, self.start_point())

    def extra_grad(self, ws, to_device=None):
        """g += rho*(w - c + u) for admm/ibt; None otherwise. With
        `to_device`, c and u are copied to the device once per block."""
        c = self.centre()
        if c is None:
            return None
        u = ws.u
        if to_device is not None:
            c, u = to_device(c), to_device(u)
        from .optim import Prox
        return Prox(c, u, self.dtype.type(self.rho))

    def contribution(self, ws, w, out):
        """Write worker i's share of S into out (P,); return ||w - z_s||^2."""
        zs = self.start_point()
        d = (w - zs).astype(np.float64)
        q = float(d @ d)
        if self.algo in ("admm", "ibt"):
            c = self.centre()
            if self.alpha_or != 1.0:
                a = self.dtype.type(self.alpha_or)
                ws.w_hat = a * w + (self.dtype.type(1) - a) * c
            else:
                ws.w_hat = w.copy()
            np.add(ws.w_hat, ws.u, out=out)
        elif self.algo == "easgd":
            np.subtract(w, self.z, out=out)
            ws.w_own = w.copy()
        else:
            np.copyto(out, w)
        return q

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
                self.U *= self.dtype.type(self.rho_scale)   # u scales by rho_old/rho_new
        self.blocks += 1
        return {"primal": primal, "dual": dual, "rho": rho_used}

    def _elementwise(self, S, sl):
        """The update's elementwise part on the elements `sl` of z, its
        start point, momentum, U and S; returns that slice's residual
        vectors (z - z_s, sum_w - N*z_s, z - z_prev), float32."""
        n, dt = self.n, self.dtype.type
        S, z, z_prev, U = S[sl], self.z[sl], self.z_prev[sl], self.U[sl]
        zg, v = self.zg[sl], self.v[sl]
        zs = (zg if self.algo in ("bmuf", "ibt") else z).copy()
        np.copyto(z_prev, z)
        if self.dual_reset:
            U.fill(0)                    # workers zeroed their u this block
        if self.algo in ("admm", "ibt"):
            sum_w = S - U                # sum of the (over-relaxed) w_i
        elif self.algo == "easgd":
            sum_w = S + dt(n) * z
        else:
            sum_w = S
        if self.algo in ("sgd", "ma"):
            np.multiply(S, dt(1.0 / n), out=z)
        elif self.algo == "admm":
            scale = n * self.rho / (self.l2 + n * self.rho)
            np.multiply(S, dt(scale / n), out=z)
        elif self.algo in ("bmuf", "ibt"):
            block_momentum(S, zg, v, z, 1.0 / n, self.eta, self.zeta, self.nesterov)
        elif self.algo == "easgd":
            z += dt(self.easgd_alpha) * S
        if self.algo in ("admm", "ibt"):
            np.subtract(S, dt(n) * z, out=U)
        # residuals: sum ||w_i - z||^2 from sum ||w_i - z_s||^2
        return z - zs, sum_w - dt(n) * zs, z - z_prev

    def _map(self, f, items):
        """[f(x) for x in items], over a pool of `threads` threads (NumPy
        releases the GIL inside each op); in order."""
        if self.threads <= 1 or len(items) < 2:
            return [f(x) for x in items]
        if self._pool is None:
            from concurrent.futures import ThreadPoolExecutor
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="consensus")
        return list(self._pool.map(f, items))

    def worker_end(self, ws, w):
        """Local updates after the consensus step (w: the worker's model)."""
        if self.algo in ("admm", "ibt"):
            dual_update(ws.u, ws.w_hat, self.z, self.rho_scale)
        elif self.algo == "easgd":
            # elastic pull towards the OLD z (symmetric with the z update)
            ws.w_own -= self.dtype.type(self.easgd_alpha) * (ws.w_own - self.z_prev)

    def state(self):
        return {"z": self.z, "zg": self.zg, "v": self.v, "U": self.U,
                "rho": self.rho, "blocks": self.blocks}
