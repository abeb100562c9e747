"""Node-local rank discovery and thread defaults under a real launcher;
the flat parameter vector as a single Allreduce buffer."""
import hashlib

import numpy as np
import pytest
from mpi4py import MPI

from ibtmpi import comm, threads
from ibtmpi.model import Model

pytestmark = pytest.mark.mpi(min_size=2)
W = MPI.COMM_WORLD


def test_node_rank_size_from_split_type():
    w = MPI.COMM_WORLD
    r, n = comm.node_rank_size()
    # single-node launch: the node communicator is the world
    assert n == w.Get_size()
    ranks = w.allgather(r)
    assert sorted(ranks) == list(range(n))


def test_worker_local_rank_is_collective_and_skips_the_master():
    """Every rank calls it (it was once a collective the master skipped:
    `--device gpu` under mpiexec hung at start). Single node: workers are
    numbered 0..size-2 in rank order, the master gets -1."""
    got = W.allgather(comm.worker_local_rank())
    assert got == [-1] + list(range(W.Get_size() - 1))


def test_auto_threads_divide_the_node():
    n_local = comm.node_rank_size()[1]
    got = threads.configure("auto")
    assert got == threads.default_threads(n_local, load=threads.chosen["load"])
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


@pytest.mark.parametrize("call", ["allreduce_sum", "allgather", "bcast", "node_rank_size"])
def test_a_rank_waiting_for_late_ranks_does_not_spin(call):
    """The workers arrive 1.5 s late; rank 0's CPU time while it waits stays
    far below the wait (MPICH and Open MPI busy-poll in blocking collectives:
    a plain comm.allgather here costs rank 0 the full 1.5 s of CPU)."""
    import time
    W.Barrier()
    if W.Get_rank():
        time.sleep(1.5)
    t0, c0 = time.perf_counter(), time.process_time()
    if call == "allreduce_sum":
        x = np.ones(4, np.float32)
        comm.allreduce_sum(x, np.empty_like(x), count=False)
    elif call == "allgather":
        comm.allgather(W.Get_rank())
    elif call == "bcast":
        comm.bcast("z", root=0)
    else:
        comm.node_rank_size()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    if W.Get_rank() == 0:
        assert wall > 1.0
        assert cpu < 0.3 * wall, f"{call}: rank 0 used {cpu:.2f} s CPU in {wall:.2f} s"


class _Recording:
    """A communicator that records which of its methods are called."""

    def __init__(self, comm_):
        self.comm, self.calls = comm_, []

    def __getattr__(self, name):
        self.calls.append(name)
        return getattr(self.comm, name)


def test_allreduce_moves_the_data_once_every_rank_has_arrived():
    """allreduce_sum waits for late ranks in a non-blocking barrier (doing
    the caller's work, then sleeping) and moves the data with ONE
    Iallreduce after it, driven by back-to-back Tests (a polled Iallreduce
    advances its rounds only inside MPI_Test: Open MPI 4.1 took 1.4 s for
    the reference model's 8.8 MB with 5 ms naps; docs/benchmarks.md).
    Rank 0's time splits into the wait for the late ranks and the data
    movement, which its long naps (0.2 s here) do not stretch."""
    import time
    n, me = W.Get_size(), W.Get_rank()
    x = np.full(2 ** 18, me + 1, np.float32)
    y = np.empty_like(x)
    rec = _Recording(W)
    jobs = []

    def work():                     # 5 pieces of work, then nothing left
        if len(jobs) == 5:
            return False
        jobs.append(time.sleep(0.01))
        return True
    W.Barrier()
    if me:
        time.sleep(0.6)
    wait0, reduce0 = comm.STATS["wait_s"], comm.STATS["reduce_s"]
    # naps as in the trainer: the master's long, the workers' short
    comm.allreduce_sum(x, y, rec, work=work if me == 0 else None,
                       sleep_max=0.2 if me == 0 else 0.0005, count=False)
    assert (y == n * (n + 1) // 2).all()
    assert rec.calls.count("Iallreduce") == 1 and "Allreduce" not in rec.calls
    assert rec.calls.index("Ibarrier") < rec.calls.index("Iallreduce")
    if me == 0:
        assert len(jobs) == 5
        assert comm.STATS["wait_s"] - wait0 > 0.45
        assert comm.STATS["reduce_s"] - reduce0 < 0.15, comm.STATS


def test_a_rank_late_inside_the_reduction_is_waited_for_with_naps():
    """A rank that arrives, then stops before its share of the reduction
    (here: sleeps 1.5 s between the barrier and its Iallreduce, as
    SIGSTOP does): the others Test back to back for the spin budget, then
    nap (little CPU), and get the right sum; a reduction that had to nap
    does not raise the budget."""
    import time
    n, me = W.Get_size(), W.Get_rank()
    x = np.full(2 ** 16, me + 1, np.float32)
    y = np.empty_like(x)
    W.Barrier()
    top = comm.STATS["reduce_max_s"]
    t0, c0 = time.perf_counter(), time.process_time()
    comm.allreduce_sum(x, y, W, sleep_max=0.005, count=False,
                       last=(lambda: time.sleep(1.5)) if me == n - 1 else None)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    assert (y == n * (n + 1) // 2).all()
    if me == 0:
        assert wall > 1.2
        assert cpu < 0.3 * wall, f"rank 0 used {cpu:.2f} s CPU in {wall:.2f} s"
        assert comm.STATS["reduce_max_s"] == top


@pytest.mark.parametrize("overlap", [True, False])
def test_ranks_share_cores_where_their_affinity_masks_hold_fewer(monkeypatch, overlap):
    """node_rank_size records whether the node's ranks outnumber the union
    of their affinity masks: every rank on core 0 shares; a core each (the
    launcher's binding, or a node with cores to spare) does not. The test
    ranks all run on one node."""
    import os
    me = W.Get_rank()
    monkeypatch.setattr(comm, "_CORES_SHARED", None)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0} if overlap else {me})
    assert comm.node_rank_size()[1] == W.Get_size()
    assert comm.cores_shared() is (overlap and W.Get_size() > 1)


class _Request:
    """Completes on its k-th Test."""

    def __init__(self, k):
        self.k = k

    def Test(self):
        self.k -= 1
        return self.k <= 0


@pytest.mark.parametrize("shared,yields", [(True, 4), (None, 4), (False, 0)])
def test_quick_tests_give_up_the_core_only_where_ranks_share_cores(monkeypatch, shared, yields):
    """quiet_wait's quick Tests: a sched_yield after each where the ranks
    share cores (or node_rank_size never ran), none where each has a core
    of its own (a yield would hand it to other work on the node)."""
    calls = []
    monkeypatch.setattr(comm, "_CORES_SHARED", shared)
    monkeypatch.setattr(comm.os, "sched_yield", lambda: calls.append(1))
    assert comm.quiet_wait(_Request(5), 10.0, 0.005) is False
    assert len(calls) == yields
