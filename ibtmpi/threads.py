"""BLAS thread count per process.

Default: the usable cores of this process divided by the MPI ranks on the
node, at least 1, so ``mpiexec -n 3`` on 2 cores does not oversubscribe.
If the launcher already pinned the process to fewer cores than the node
has, those cores are the budget. Applied with threadpoolctl (OpenBLAS,
MKL, OpenMP alike). Test: tests/unit/test_threads.py, tests/mpi/test_comm.py.
"""
from __future__ import annotations

import os

from threadpoolctl import threadpool_info, threadpool_limits

_limiter = None


def usable_cores():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:          # not Linux
        return os.cpu_count() or 1


def default_threads(ranks_on_node, cores=None, node_cores=None):
    """Threads per rank: pinned budget if pinned, else node cores / ranks."""
    cores = usable_cores() if cores is None else cores
    node_cores = (os.cpu_count() or cores) if node_cores is None else node_cores
    if cores < node_cores:          # launcher bound us to a subset
        return max(1, cores)
    return max(1, cores // max(1, ranks_on_node))


def configure(threads="auto", ranks_on_node=None):
    """Limit BLAS/OpenMP pools; returns the thread count applied."""
    global _limiter
    if threads in (None, "auto", 0):
        if ranks_on_node is None:
            from . import comm
            ranks_on_node = comm.node_rank_size()[1]
        n = default_threads(ranks_on_node)
    else:
        n = int(threads)
        if n < 1:
            raise ValueError(f"threads must be >= 1 or 'auto', got {threads!r}")
    _limiter = threadpool_limits(limits=n)
    from .ops import conv_taps          # its chunk threads follow the BLAS's
    conv_taps.set_threads(n)
    return n


def current_blas_threads():
    pools = [p for p in threadpool_info() if p.get("user_api") == "blas"]
    return pools[0]["num_threads"] if pools else None
