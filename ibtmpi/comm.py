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
