"""Consensus algebra. The convex test proves the ADMM updates, not merely
that a loss goes down: on L2-regularised softmax regression split over 3
workers, admm (worker path: make_consensus + SGD with the prox hook) converges
to the centralised optimum computed independently by scipy's L-BFGS."""
import numpy as np
import pytest
from conftest import BLOCK
from scipy.optimize import minimize

from ibtmpi import consensus
from ibtmpi.consensus import vector
from ibtmpi.consensus import make_consensus, WorkerState
from ibtmpi.model import Model
from ibtmpi.optim import SGD


def problem(seed=0, n=90, shape=(1, 3, 3), k=4):
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((k, int(np.prod(shape)))) * 1.5
    y = np.arange(n) % k
    x = centers[y] + rng.standard_normal((n, centers.shape[1]))
    return x.reshape((n,) + shape), y


def test_admm_converges_to_centralised_optimum():
    x, y = problem()
    n, N, lam, rho = len(y), 3, 0.05, 0.5
    model = Model("softmax", x.shape[1:], 4, dtype=np.float64, seed=0)
    P = model.size

    def full_obj(w):
        np.copyto(model.params, w)
        loss, _ = model.loss_and_grad(x, y)
        return loss + 0.5 * lam * w @ w, model.grads + lam * w

    ref = minimize(full_obj, np.zeros(P), jac=True, method="L-BFGS-B",
                   options={"gtol": 1e-12, "ftol": 1e-15, "maxiter": 5000}).x

    # f_i = (n_i / n) * mean loss on worker i's part, so sum_i f_i = mean loss
    parts = np.array_split(np.arange(n), N)
    cons = make_consensus("admm", np.zeros(P), N, {"rho": rho, "l2": lam})
    states = [WorkerState(P, np.dtype(np.float64), "admm") for _ in range(N)]
    S = np.zeros(P)
    out = np.zeros(P)
    for block in range(400):
        S.fill(0)
        q = 0.0
        for i, idx in enumerate(parts):
            ws = states[i]
            cons.worker_begin(ws, model.params)
            opt = SGD(model.params, lr=0.5, momentum=0.0,
                      extra_grad=cons.extra_grad(ws))
            for _ in range(40):          # solve the prox subproblem (GD)
                model.loss_and_grad(x[idx], y[idx])
                g = model.grads * (len(idx) / n)
                opt.step(g)
            q += cons.contribution(ws, model.params, out)
            S += out
        diag = cons.update(S, q)
        for i in range(N):
            cons.worker_end(states[i], None)
    rel = np.linalg.norm(cons.z - ref) / np.linalg.norm(ref)
    assert rel < 1e-4, rel
    assert diag["primal"] < 1e-4 and diag["dual"] < 1e-4


def test_model_averaging_and_bmuf_algebra():
    z0 = np.zeros(3)
    w = [np.array([1.0, 2, 3]), np.array([3.0, 2, 1])]
    ma = make_consensus("ma", z0, 2, {})
    ma.update(w[0] + w[1], 0.0)
    np.testing.assert_allclose(ma.z, [2, 2, 2])
    # bmuf with eta=0.5, zeta=1: v = G; z = zg + G; zg = z + 0.5 v
    b = make_consensus("bmuf", z0, 2, {"block_momentum": 0.5, "nesterov": True})
    b.update(w[0] + w[1], 0.0)
    np.testing.assert_allclose(b.z, [2, 2, 2])
    np.testing.assert_allclose(b.outer.zg, [3, 3, 3])
    b.update(2 * np.array([3.0, 3, 3]), 0.0)   # workers did not move: G = 0
    np.testing.assert_allclose(b.outer.v, [1, 1, 1])      # 0.5 * 2
    np.testing.assert_allclose(b.z, [4, 4, 4])


@pytest.mark.parametrize("centred", [False, True])
def test_ibt_centred_duals_leave_the_move_to_the_outer_step(centred):
    """ibt's duals ride in S. Measured against the outer step's point z,
    they sum to N*((1 - zeta)*G - eta*v_before): the part of the consensus
    move the outer step did not take, less its last momentum, which S hands
    back the next block, so ibt does not take the outer step it is set to.
    Centred (measured against the consensus mean), they sum to zero, and
    the same worker moves give ibt bmuf's z, block after block."""
    n, P = 4, 6
    rng = np.random.default_rng(3)
    z0 = rng.standard_normal(P)
    a = {"block_lr": 0.7, "block_momentum": 0.5, "nesterov": True, "rho": 0.01,
         "centred_duals": centred}
    ibt, bm = make_consensus("ibt", z0, n, a), make_consensus("bmuf", z0, n, a)
    assert (ibt.zbar is not None) == centred
    states = [WorkerState(P, np.dtype(np.float64), "ibt") for _ in range(n)]
    for blk in range(5):
        moves = [rng.standard_normal(P) for _ in range(n)]
        S_i, S_b, out = np.zeros(P), np.zeros(P), np.zeros(P)
        for st, d in zip(states, moves):
            ibt.contribution(st, ibt.start_point() + d, out)
            S_i += out
            S_b += bm.start_point() + d
        G = S_i / n - ibt.start_point()
        v_before = ibt.outer.v.copy()
        ibt.update(S_i, 0.0)
        bm.update(S_b, 0.0)
        for st in states:
            ibt.worker_end(st, None)
        u_sum = sum(st.u for st in states)
        np.testing.assert_allclose(ibt.U, u_sum, atol=1e-12)
        if centred:
            np.testing.assert_allclose(u_sum, 0.0, atol=1e-12)
            np.testing.assert_allclose(ibt.z, bm.z, rtol=0, atol=1e-12)
        else:
            np.testing.assert_allclose(u_sum, n * (0.3 * G - 0.5 * v_before), atol=1e-12)
    if not centred:
        assert np.abs(ibt.z - bm.z).max() > 0.1
    line = ibt.describe_outer()
    assert line.startswith("outer step: sgd (eta 0.5, zeta 0.7, Nesterov")
    assert line.endswith("duals centred on the consensus mean") == centred
    assert ("hand 0.3 of each consensus move back" in line) != centred


def test_centred_duals_change_nothing_for_admm():
    """admm's z is the consensus mean: centring its duals is the same
    arithmetic, bit for bit."""
    n, P = 3, 5
    rng = np.random.default_rng(4)
    runs = [make_consensus("admm", np.zeros(P), n, {"rho": 0.1, "centred_duals": c})
            for c in (False, True)]
    assert runs[1].zbar is None
    sts = [[WorkerState(P, np.dtype(np.float64), "admm") for _ in range(n)] for _ in runs]
    for blk in range(3):
        ws = [rng.standard_normal(P) for _ in range(n)]
        for c, states in zip(runs, sts):
            S, out = np.zeros(P), np.zeros(P)
            for st, w in zip(states, ws):
                c.contribution(st, w, out)
                S += out
            c.update(S, 0.0)
            for st in states:
                c.worker_end(st, None)
    assert runs[0].z.tobytes() == runs[1].z.tobytes()
    assert all(a.u.tobytes() == b.u.tobytes() for a, b in zip(*sts))


def test_easgd_pull_is_symmetric():
    z0 = np.zeros(2)
    e = make_consensus("easgd", z0, 2, {"easgd_beta": 0.5})     # alpha = 0.25
    states = [WorkerState(2, np.dtype(np.float64), "easgd") for _ in range(2)]
    w = np.zeros(2)
    S = np.zeros(2)
    for i, wi in enumerate([np.array([4.0, 0]), np.array([0.0, 8])]):
        e.worker_begin(states[i], w)
        out = np.zeros(2)
        e.contribution(states[i], wi, out)
        S += out
    e.update(S, 0.0)
    np.testing.assert_allclose(e.z, [1, 2])
    for s in states:
        e.worker_end(s, None)
    np.testing.assert_allclose(states[0].w_own, [3, 0])
    np.testing.assert_allclose(states[1].w_own, [0, 6])


def test_residual_balancing_rescales_duals():
    c = make_consensus("admm", np.zeros(2), 2, {"rho": 1.0, "adaptive_rho": True})
    states = [WorkerState(2, np.dtype(np.float64), "admm") for _ in range(2)]
    S, q = np.zeros(2), 0.0
    ws_ = [np.array([10.0, -10.0]), np.array([-10.0, 10.0])]
    for st, w in zip(states, ws_):
        c.worker_begin(st, np.zeros(2))
        out = np.zeros(2)
        q += c.contribution(st, w, out)
        S += out
    d = c.update(S, q)
    # z stays 0 (dual residual 0), primal residual sqrt(400): rho *= tau
    assert d["dual"] == 0 and abs(d["primal"] - 20.0) < 1e-12
    assert c.rho == 2.0
    for st, w in zip(states, ws_):
        c.worker_end(st, None)
        np.testing.assert_allclose(st.u, (w - c.z) / 2)   # scaled by rho_old/rho_new
    np.testing.assert_allclose(c.U, states[0].u + states[1].u)


def test_sgd_needs_one_worker():
    with pytest.raises(ValueError, match="single-worker baseline"):
        make_consensus("sgd", np.zeros(2), 3, {})


def test_residuals_do_not_depend_on_the_ranks_thread_count():
    """Adaptive rho decides from the residuals on every rank; ranks with
    different BLAS thread budgets must compute them bit for bit alike
    (OpenBLAS's threaded ddot does not)."""
    from threadpoolctl import threadpool_limits
    P, n = 1_000_003, 4
    rng = np.random.default_rng(3)
    z0 = rng.standard_normal(P).astype(np.float32)
    S = (n * z0 + rng.standard_normal(P)).astype(np.float32)
    diags = []
    for threads in (1, 2, 4):
        c = make_consensus("admm", z0, n, {"rho": 0.1, "adaptive_rho": True})
        with threadpool_limits(threads):
            diags.append(c.update(S.copy(), 123.0))
    assert diags[0] == diags[1] == diags[2]


@pytest.mark.parametrize("m", [1, 1000, vector._CHUNK, 3 * vector._CHUNK + 17])
def test_residual_dots_against_exact_sums(m):
    """The chunked float64 products equal exactly rounded sums (math.fsum
    of the float64 products) to 1e-12, whatever the length against the
    chunk; the whole-vector path (device arrays) gives the same."""
    import math
    rng = np.random.default_rng(m)
    dz, sw, step = (rng.standard_normal(m).astype(np.float32) * 10 ** k for k in (0, 2, -3))
    got = consensus.residual_dots(dz, sw, step)
    f = [a.astype(np.float64) for a in (dz, sw, step)]
    exact = (math.fsum(f[0] * f[1]), math.fsum(f[0] * f[0]), math.fsum(f[2] * f[2]))
    for g, e in zip(got + vector._dots_whole(dz, sw, step), exact + exact):
        assert abs(g - e) <= 1e-12 * max(1.0, abs(e)), (g, e)


class _Device(np.ndarray):
    """A host array that update() takes for a device array (whole-vector
    path), as a GPU worker's CuPy arrays are."""


@pytest.mark.parametrize("algo", BLOCK + ["ibt-centred"])
def test_chunked_host_update_equals_the_whole_vector_one(algo):
    """The host update runs chunk by chunk (over threads); a GPU worker's
    runs on whole vectors. z, U and the momentum must be bitwise the same
    after several blocks, whatever the thread count, and so the diagnostics
    and rho with adaptive rho (admm, ibt: a device worker computes those
    residuals from host copies)."""
    n, P = 3, 3 * vector._CHUNK + 5
    rng = np.random.default_rng(7)
    z0 = rng.standard_normal(P).astype(np.float32)
    acfg = {"rho": 0.05, "adaptive_rho": True, "rho_mu": 1.5}
    if algo == "ibt-centred":
        algo, acfg = "ibt", {**acfg, "centred_duals": True, "block_lr": 0.7}
    runs = [make_consensus(algo, z0.view(_Device), n, acfg, to_host=np.asarray),
            make_consensus(algo, z0, n, acfg), make_consensus(algo, z0, n, acfg, threads=3)]
    for blk in range(4):
        S = (n * z0 + rng.standard_normal(P) * (blk + 1)).astype(np.float32)
        q = float(rng.uniform(1, 100))
        diags = [c.update(S.copy(), q) for c in runs]
        assert diags[1] == diags[2], (blk, diags)
        if runs[0].adaptive:          # decisions: the same bits on every rank
            assert diags[0] == diags[1], (blk, diags)
        else:                         # diagnostics only: the device sums whole
            assert diags[0] == pytest.approx(diags[1], rel=1e-12), (blk, diags)
        centred = ("zbar",) if getattr(runs[0], "zbar", None) is not None else ()
        for name in runs[0].vectors + ("z_prev",) + centred:   # z, and zg, v, U where kept
            got = [np.asarray(getattr(c, name)).tobytes() for c in runs]
            assert got[0] == got[1] == got[2], (blk, name)
    assert runs[1]._pool is None and runs[2]._pool is not None
