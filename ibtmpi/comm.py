"""MPI communication: the ONLY module that imports mpi4py.

For now: world communicator facts and the node-local rank/size from
``Split_type(COMM_TYPE_SHARED)`` (launcher independent: mpirun, mpiexec and
srun all work). Test: tests/mpi/test_comm.py under mpiexec -n 2 and -n 3.
"""
from __future__ import annotations

from mpi4py import MPI


def world():
    return MPI.COMM_WORLD


def node_rank_size(comm=None):
    """(rank among the ranks on this node, number of ranks on this node)."""
    comm = comm or MPI.COMM_WORLD
    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    try:
        return node.Get_rank(), node.Get_size()
    finally:
        node.Free()


def library_version():
    return MPI.Get_library_version().strip().splitlines()[0]


# -- collectives -----------------------------------------------------------

STATS = {"allreduce": 0, "bytes": 0, "wait_s": 0.0}


def allreduce_sum(send, recv, comm=None, work=None, sleep_max=0.005, count=True):
    """Sum `send` over all ranks into `recv` with ONE non-blocking Allreduce.

    Every rank must call this (blocking and non-blocking collectives never
    match). While waiting, `work()` is called (it returns False when it has
    nothing left to do); otherwise the rank sleeps with a back-off up to
    `sleep_max` seconds instead of spinning a core in MPI_Wait.
    """
    import time
    comm = comm or MPI.COMM_WORLD
    if count:                      # block / minibatch reductions
        STATS["allreduce"] += 1
        STATS["bytes"] += send.nbytes
    else:                          # once-per-run syncs (final checkpoint)
        STATS["sync"] = STATS.get("sync", 0) + 1
    if comm.Get_size() == 1:
        np_copy(recv, send)
        return
    t0 = time.perf_counter()
    req = comm.Iallreduce(send, recv, op=MPI.SUM)
    nap = 0.0002
    while not req.Test():
        if work is not None and work():
            continue
        time.sleep(nap)
        nap = min(nap * 2, sleep_max)
    STATS["wait_s"] += time.perf_counter() - t0


def np_copy(dst, src):
    dst[...] = src


def self_comm():
    """A one-rank communicator: the simulator's 'Allreduce' is a copy."""
    return MPI.COMM_SELF


def abort(code=1, comm=None):
    (comm or MPI.COMM_WORLD).Abort(code)


def world_size():
    return MPI.COMM_WORLD.Get_size()


def world_rank():
    return MPI.COMM_WORLD.Get_rank()
