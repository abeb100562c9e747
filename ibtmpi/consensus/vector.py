"""The consensus updates' vector math: plain NumPy-API array code (CuPy
arrays go through the same calls), no MPI, no algorithm names.

dual_update and block_momentum are update steps; residual_dots
and the chunk helpers compute the float64 residual sums in an order that
depends on nothing but the inputs, so every rank decides alike.
Tests: tests/unit/test_consensus.py.
"""
from __future__ import annotations

import numpy as np

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
