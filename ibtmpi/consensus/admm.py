"""Global-consensus ADMM (``admm``), Boyd et al. 2011 section 7.1, scaled form.

  worker  f_i(w) + rho/2 ||w - z + u_i||^2         (prox centre z)
  z       N*rho*avg/(l2 + N*rho),  S = sum (w^_i + u_i)
  dual    u_i += w^_i - z
(w^ = a*w + (1-a)*centre: over-relaxation; a = 1 by default.) sum_i u_i is
tracked on every rank as U = S - N*z (no extra collective), which gives
the primal residual. ``ProxAlgorithm`` below is the dual algorithms'
shared local objective: admm composes it with the ``average`` outer
optimizer (outer.py), ibt with ``sgd``; the prox centre is the outer
optimizer's start point (z for ``average``).
With another outer optimizer the duals measured against its z sum to
N*(c*S - z) = N*((1 - zeta)*G - eta*v): S hands that back the next block,
so the outer step taken is not the one set. ``algorithm.centred_duals``
measures them against the mean c*S instead (``zbar``; U is then 0 but for
rounding), and for ``average``, where z is that mean, changes nothing.
Tests: tests/unit/test_consensus.py (convergence to the centralised optimum
of a convex problem), tests/mpi/test_trainer_mpi.py.
"""
from __future__ import annotations

import numpy as np

from ..settings import Key, declare, non_negative
from .base import BlockAlgorithm, register
from .vector import dual_update

MU_TAU_WHY = "algorithm.rho_mu and rho_tau must be > 1"
declare(
    "algorithm",
    Key("rho", 0.01, "ADMM penalty (admm, ibt)", check=lambda v: v > 0,
        why="{where} must be > 0, got {v}", tunable=True),
    Key("l2", 0.0, "lambda of the consensus L2 term (admm z-update)", check=non_negative,
        why="{where} must be >= 0", tunable=True),
    Key("adaptive_rho", False, "residual balancing (Boyd et al. 3.4.1)", tunable=True),
    Key("rho_mu", 10.0, "", check=lambda v: v > 1, why=MU_TAU_WHY, tunable=True, shown="10"),
    Key("rho_tau", 2.0, "", check=lambda v: v > 1, why=MU_TAU_WHY, tunable=True, shown="2",
        joins=True),
    Key("over_relaxation", 1.0, "alpha in [1, 1.8] (admm, ibt)",
        check=lambda v: 1.0 <= v <= 1.8, why="{where} must be in [1, 1.8]", tunable=True),
    Key("dual_reset", False, "zero the duals at every block", tunable=True),
    Key("centred_duals", False, "ibt: the duals follow the consensus mean (ADMM's z-update), "
        "not the outer step's point, so they sum to zero and the outer step alone moves z",
        added=True, tunable=True),
)


class ProxAlgorithm(BlockAlgorithm):
    """A worker minimises f_i(w) + rho/2 ||w - c + u_i||^2 about the centre c
    and keeps a scaled dual u_i; sum_i u_i is U on every rank."""

    dual = True
    uses_rho = True
    worker_vectors = ("u",)

    def setup(self, z0, a):
        self.U = np.zeros_like(z0)        # sum of the workers' duals
        self.alpha_or = float(a["over_relaxation"])
        # centred duals: the consensus mean of the block (no state: every
        # update writes it before the workers' worker_end reads it)
        centred = bool(a["centred_duals"]) and self.outer.name != "average"
        self.zbar = np.zeros_like(z0) if centred else None

    def centre(self):
        return self.start_point()

    def describe_outer(self, schedule="none"):
        line = super().describe_outer(schedule)
        if line is None:
            return None
        if self.zbar is not None:
            return line + "; duals centred on the consensus mean"
        zeta = float(getattr(self.outer, "zeta", 1.0))
        if zeta != 1.0:        # docs/design.md section 3
            line += (f"; the duals, measured against z, hand {1 - zeta:.3g} of each "
                     f"consensus move back a block later (algorithm.centred_duals = true "
                     f"takes the step as set)")
        return line

    def worker_begin(self, ws, w):
        if self.dual_reset:
            ws.u.fill(0)
        super().worker_begin(ws, w)

    def extra_grad(self, ws, to_device=None):
        """g += rho*(w - c + u). With `to_device`, c and u are copied to the
        device once per block."""
        from ..optim import Prox
        c, u = self.centre(), ws.u
        if to_device is not None:
            c, u = to_device(c), to_device(u)
        return Prox(c, u, self.dtype.type(self.rho))

    def contribution(self, ws, w, out):
        q = self._distance(w)
        c = self.centre()
        if self.alpha_or != 1.0:
            a = self.dtype.type(self.alpha_or)
            ws.w_hat = a * w + (self.dtype.type(1) - a) * c
        else:
            ws.w_hat = w.copy()
        np.add(ws.w_hat, ws.u, out=out)
        return q

    def _sum_w(self, S, sl):
        """sum of the (over-relaxed) w_i on sl, before U moves on."""
        U = self.U[sl]
        if self.dual_reset:
            U.fill(0)                    # workers zeroed their u this block
        return S - U

    def _track_duals(self, S, sl, c):
        """U = S - N*t, t the point the duals are measured against: z, or
        with centred duals the consensus mean c*S (then U is 0 but for
        rounding)."""
        t = self.z
        if self.zbar is not None:
            t = self.zbar
            np.multiply(S, self.dtype.type(c), out=t[sl])
        np.subtract(S, self.dtype.type(self.n) * t[sl], out=self.U[sl])

    def rescale_duals(self, scale):
        self.U *= self.dtype.type(scale)

    def worker_end(self, ws, w):
        dual_update(ws.u, ws.w_hat, self.z if self.zbar is None else self.zbar,
                    self.rho_scale)


@register
class ADMM(ProxAlgorithm):
    name = "admm"
    summary = "global-consensus ADMM: z = avg(w_i + u_i) (with l2: shrunk); u_i += w_i - z"
    vectors = ("z", "U")
    default_outer = "average"

    def setup(self, z0, a):
        super().setup(z0, a)
        self.l2 = float(a["l2"])

    def _step(self, S, sl):
        sum_w = self._sum_w(S, sl)
        n = self.n
        scale = n * self.rho / (self.l2 + n * self.rho)
        self.outer.step(S, scale / n, sl)         # the mean: z's minimiser
        self._track_duals(S, sl, scale / n)
        return sum_w
