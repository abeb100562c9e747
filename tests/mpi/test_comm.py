"""Node-local rank discovery and thread defaults under a real launcher;
the flat parameter vector as a single Allreduce buffer."""
import hashlib

import numpy as np
import pytest
from mpi4py import MPI

from ibtmpi import comm, threads
from ibtmpi.model import Model

pytestmark = pytest.mark.mpi(min_size=2)


def test_node_rank_size_from_split_type():
    w = MPI.COMM_WORLD
    r, n = comm.node_rank_size()
    # single-node launch: the node communicator is the world
    assert n == w.Get_size()
    ranks = w.allgather(r)
    assert sorted(ranks) == list(range(n))


def test_auto_threads_divide_the_node():
    n_local = comm.node_rank_size()[1]
    got = threads.configure("auto")
    assert got == threads.default_threads(n_local)
    assert threads.current_blas_threads() == got
    # never more threads in total than usable cores (unless 1 each)
    assert got == 1 or got * n_local <= threads.usable_cores()


def test_flat_params_allreduce_as_one_buffer():
    w = MPI.COMM_WORLD
    m = Model("tiny", (3, 16, 16), 5, seed=0)
    local = m.params * np.float32(w.Get_rank() + 1)
    out = np.empty_like(local)
    w.Allreduce(local, out, op=MPI.SUM)
    k = w.Get_size() * (w.Get_size() + 1) // 2
    np.testing.assert_allclose(out, m.params * k, rtol=1e-6)
    # all ranks hold the same bytes afterwards
    digests = w.allgather(hashlib.sha256(out.tobytes()).hexdigest())
    assert len(set(digests)) == 1
