"""BLAS thread count per process.

Default: the usable cores of this process divided by the MPI ranks on the
node, at least 1, so ``mpiexec -n 3`` on 2 cores does not oversubscribe.
If the launcher already pinned the process to fewer cores than the node
has, those cores are the budget. On a node that is not pinned, the cores
other work keeps busy (the 1-minute load average, less half a core of
noise) are left out of the budget: OpenBLAS threads that fight other
processes for cores spin and wait (a lone run on a loaded 2-core machine
took 22.5 s at 2 threads, 5.0-7.1 s at 1, the same result). Applied with
threadpoolctl (OpenBLAS, MKL, OpenMP alike). Test:
tests/unit/test_threads.py, tests/mpi/test_comm.py.
"""
from __future__ import annotations

import os

from threadpoolctl import threadpool_info, threadpool_limits

_limiter = None
LOAD_NOISE = 0.5      # of the load average: a shell, a monitor, this job's own start
chosen = {}           # configure(): what auto chose from (threads, load, note)


def usable_cores():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:          # not Linux
        return os.cpu_count() or 1


def load_average():
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return 0.0


def default_threads(ranks_on_node, cores=None, node_cores=None, load=0.0):
    """Threads per rank: the pinned budget if pinned, else the node's cores
    that other work leaves free (`load`: its 1-minute load average) divided
    by the ranks on the node; at least 1."""
    cores = usable_cores() if cores is None else cores
    node_cores = (os.cpu_count() or cores) if node_cores is None else node_cores
    if cores < node_cores:          # launcher bound us to a subset
        return max(1, cores)
    free = max(1, int(cores - max(0.0, load - LOAD_NOISE) + 0.5))
    return max(1, min(cores, free) // max(1, ranks_on_node))


def configure(threads="auto", ranks_on_node=None):
    """Limit BLAS/OpenMP pools; returns the thread count applied."""
    global _limiter
    if threads in (None, "auto", 0):
        if ranks_on_node is None:
            from . import comm
            ranks_on_node = comm.node_rank_size()[1]
        load = load_average()
        n = default_threads(ranks_on_node, load=load)
        idle = default_threads(ranks_on_node)
        chosen.update(threads=n, load=load, note=None if n == idle else (
            f"run.threads auto: {n} BLAS thread(s) a rank, not {idle}: the node's load "
            f"({load:.1f}) keeps cores busy; set run.threads to choose"))
    else:
        n = int(threads)
        chosen.update(threads=n, load=None, note=None)
        if n < 1:
            raise ValueError(f"threads must be >= 1 or 'auto', got {threads!r}")
    _limiter = threadpool_limits(limits=n)
    chosen["configured"] = n            # ops/conv_taps' chunk threads follow it
    return n


def current_blas_threads():
    pools = [p for p in threadpool_info() if p.get("user_api") == "blas"]
    return pools[0]["num_threads"] if pools else None
