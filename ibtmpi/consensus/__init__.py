"""Consensus algorithms as plain array math (no MPI): docs/design.md section 3.

One module per algorithm, each a registered class (base.py: the block
protocol and the registry; vector.py: the shared vector math):

  sgd    z = w (N = 1, the baseline)
  ma     z = S/N,                      S = sum w_i           (average.py)
  admm   z = N*rho*avg/(l2 + N*rho),   S = sum (w^_i + u_i);  u_i += w^_i - z
  bmuf   G = S/N - z_g; v = eta*v + zeta*G; z = z_g + v; z_g = z + eta*v (NBM) or z
  ibt    as bmuf with S = sum (w^_i + u_i), prox centre z_g;  u_i += w^_i - z
  easgd  S = sum (w_i - z); z += alpha*S; w_i -= alpha*(w_i - z_old)
  ssgd   no consensus: a gradient Allreduce per minibatch (the trainer's steps)

Every block algorithm but easgd is a local objective (plain, or the ADMM
prox with duals) composed with an outer optimizer (outer.py: ``average``,
``sgd``), which ``algorithm.outer`` may swap. A new algorithm is one module
here with a class decorated by ``@register`` and one import line below.
Tests: tests/unit/test_consensus.py, tests/mpi/test_trainer_mpi.py.
"""
from .base import ALGORITHMS, Algorithm, BlockAlgorithm, WorkerState, register
from .outer import OUTER, OUTER_SCHEDULES, OuterOptimizer, register_outer
from .vector import block_momentum, dual_update, residual_dots
from . import sgd, ssgd, average, admm, bmuf, ibt, easgd  # noqa: F401  (registration)

BLOCK_ALGOS = tuple(n for n, c in ALGORITHMS.items() if not c.per_step)


def get(name):
    """The class of algorithm `name` (ValueError naming the known ones)."""
    if name not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r}; known: {', '.join(ALGORITHMS)}")
    return ALGORITHMS[name]


def make_consensus(algo, z0, n_workers, acfg, to_host=None, threads=1):
    """The consensus state and update of block algorithm `algo` from z0."""
    cls = get(algo)
    if cls.per_step:
        raise ValueError(f"{algo!r} is not a block algorithm")
    return cls(z0, n_workers, acfg, to_host=to_host, threads=threads)


__all__ = ["OUTER", "OUTER_SCHEDULES", "OuterOptimizer", "register_outer", "ALGORITHMS", "Algorithm", "BlockAlgorithm", "WorkerState", "register",
           "block_momentum", "dual_update", "residual_dots", "BLOCK_ALGOS", "get",
           "make_consensus"]
