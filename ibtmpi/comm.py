"""MPI communication: the ONLY module that imports mpi4py.

World communicator facts and the node-local rank/size from
``Split_type(COMM_TYPE_SHARED)`` (launcher independent: mpirun, mpiexec and
srun all work); the one non-blocking, non-spinning Allreduce; the library's
own report on CUDA buffers (``cuda_support``). Buffers may be NumPy or, with
a CUDA-aware library, CuPy arrays (mpi4py reads __cuda_array_interface__;
the caller synchronizes the stream first). Test: tests/mpi/test_comm.py
under mpiexec -n 2 and -n 3.

Without a usable MPI (mpi4py missing, or installed without an MPI library
for it to load) a process that no launcher started runs as a one-rank world:
single-process training and ``--simulate`` need no MPI. A process that a
launcher started as one of several ranks raises MPIUnavailable instead of
running alone (each rank would train the whole job and overwrite the
others' files). Test: tests/unit/test_comm_serial.py.
"""
from __future__ import annotations

import os

from .errors import MPIUnavailable

try:
    from mpi4py import MPI
    MISSING = ""
except (ImportError, RuntimeError) as _e:   # RuntimeError: mpi4py found no libmpi
    MPI = None
    MISSING = (f"mpi4py could not be loaded ({type(_e).__name__}: "
               f"{str(_e).strip().splitlines()[0] if str(_e).strip() else ''})")


# set by the launchers in each rank's environment: Hydra/MPICH/Intel MPI and
# srun --mpi=pmi2 (PMI_SIZE), Open MPI (OMPI_COMM_WORLD_SIZE), any srun step
_LAUNCHER_SIZE = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_STEP_NUM_TASKS")


class _SerialComm:
    """COMM_WORLD of a process without MPI: one rank, collectives are copies."""

    def Get_size(self):
        return 1

    def Get_rank(self):
        return 0

    def bcast(self, obj, root=0):
        return obj

    def allgather(self, obj):
        return [obj]

    def Abort(self, code=1):
        os._exit(code)


def launcher_rank():
    """This process's rank as its launcher set it in the environment (0
    where none did): who speaks for the job when there is no MPI to ask."""
    for var in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"):
        v = os.environ.get(var, "")
        if v.isdigit():
            return int(v)
    return 0


def _serial():
    for var in _LAUNCHER_SIZE:
        v = os.environ.get(var, "")
        if v.isdigit() and int(v) > 1:
            raise MPIUnavailable(
                f"this process is one of {v} ranks ({var}={v}) but has no usable MPI: "
                f"{MISSING}. Install an MPI that mpi4py can load (pip install mpich, "
                f"or load your cluster's MPI module and rebuild mpi4py against it), "
                f"or run one process with --simulate N")
    return _SerialComm()


def world():
    return MPI.COMM_WORLD if MPI is not None else _serial()


def node_rank_size(comm=None):
    """(rank among the ranks on this node, number of ranks on this node).
    Also records whether those ranks share cores (cores_shared)."""
    global _CORES_SHARED
    comm = comm or world()
    if MPI is None:
        return 0, 1
    quiet_arrival(comm)
    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    try:
        masks = node.allgather(sorted(os.sched_getaffinity(0)))
        _CORES_SHARED = node.Get_size() > len(set().union(*map(set, masks)))
        return node.Get_rank(), node.Get_size()
    finally:
        node.Free()


def cores_shared():
    """Whether this node's ranks outnumber the cores they may run on (the
    union of their affinity masks, as node_rank_size found it): then a rank
    that waits for another should give up its core between polls
    (quiet_wait), as the one it waits for may need that core. None before
    node_rank_size ran."""
    return _CORES_SHARED


_CORES_SHARED = None


def library_version():
    if MPI is None:
        return f"none: {MISSING}; one process only (--simulate N needs no MPI)"
    return " ".join(MPI.Get_library_version().strip().splitlines()[0].split())


def _mpi_library_handles():
    """ctypes handles of the MPI shared libraries this process has loaded
    (found in /proc/self/maps; dlopen of a loaded library returns it)."""
    import ctypes
    names = ("libmpi.", "libmpi_", "libmpich.", "libmpich_")
    paths = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                p = line.split()[-1]
                if p.startswith("/") and any(n in p.rsplit("/", 1)[-1] for n in names) \
                        and p not in paths:
                    paths.append(p)
    except OSError:
        pass
    out = []
    for p in paths:
        try:
            out.append((p, ctypes.CDLL(p)))
        except OSError:
            pass
    try:                                   # symbols loaded RTLD_GLOBAL
        out.append(("(global)", ctypes.CDLL(None)))
    except OSError:
        pass
    return out


def cuda_support():
    """What the MPI library itself reports about CUDA buffers, WITHOUT trying
    a GPU transfer (which crashes a library that is not CUDA-aware):
    (True | False | None, how). Open MPI and MPICH >= 4.1 export
    MPIX_Query_cuda_support(); MPICH 4.0 has MPIX_GPU_query_support(CUDA, &v).
    None: the library offers neither query (it does not say), or there is
    no MPI at all."""
    import ctypes
    if MPI is None:
        return None, f"no MPI library ({MISSING})"
    for path, lib in _mpi_library_handles():
        fn = getattr(lib, "MPIX_Query_cuda_support", None)
        if fn is not None:
            fn.restype, fn.argtypes = ctypes.c_int, []
            v = int(fn())
            return v == 1, f"MPIX_Query_cuda_support() = {v}"
        fn = getattr(lib, "MPIX_GPU_query_support", None)
        if fn is not None:
            v = ctypes.c_int(0)
            fn.restype = ctypes.c_int
            fn.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
            if fn(0, ctypes.byref(v)) == 0:          # 0: MPIX_GPU_SUPPORT_CUDA
                return v.value == 1, f"MPIX_GPU_query_support(CUDA) = {v.value}"
    return None, "the MPI library has no CUDA-support query (MPIX_Query_cuda_support)"


# -- collectives -----------------------------------------------------------

# wait_s: in the wait for the other ranks (work_s of it spent in work(),
# the rest asleep); reduce_s: in the library's Allreduce
STATS = {"allreduce": 0, "bytes": 0, "wait_s": 0.0, "work_s": 0.0, "reduce_s": 0.0,
         "reduce_max_s": 0.0}


def allreduce_sum(send, recv, comm=None, work=None, sleep_max=0.005, count=True,
                  watch=None, last=None):
    """Sum `send` over all ranks into `recv` with ONE Allreduce.

    Every rank must call this. The wait for the other ranks is a
    non-blocking barrier: meanwhile `work()` is called (it returns False
    when it has nothing left to do), otherwise the rank sleeps with a
    back-off up to `sleep_max` seconds instead of spinning a core in a
    blocking MPI wait. `watch()`, if given, is called every round and may
    raise (the watchdog). Once every rank is there, `last()`, if given,
    may still change `send` (the master's flag for a checkpoint its thread
    was writing meanwhile), and the data moves in a non-blocking
    Iallreduce that this rank drives with back-to-back Tests (a round of
    the library's algorithm advances only inside an MPI call: polled with
    naps, an 8.8 MB one took 1.4 s on Open MPI 4.1 against milliseconds
    blocking; benchmarks/bench_allreduce_wait.py) for as long as a
    reduction has ever taken here (x4, at least SPIN_FLOOR_S); past that a
    rank has stopped inside it, and the wait naps as above instead of
    spinning a core until the watchdog ends the job. Device buffers (a
    CUDA-aware library) keep the blocking Allreduce: a library's
    non-blocking collectives need not take device memory.
    """
    import time
    comm = comm or world()
    if count:                      # block / minibatch reductions
        STATS["allreduce"] += 1
        STATS["bytes"] += send.nbytes
    else:                          # once-per-run syncs (final checkpoint)
        STATS["sync"] = STATS.get("sync", 0) + 1
    if comm.Get_size() == 1:
        if last is not None:
            last()
        np_copy(recv, send)
        return
    t0 = time.perf_counter()
    quiet_arrival(comm, sleep_max, work, watch)
    if last is not None:              # this rank's own work, not a wait for others
        tl = time.perf_counter()
        last()
        STATS["work_s"] += time.perf_counter() - tl
    t1 = time.perf_counter()
    if _on_host(send) and _on_host(recv):
        spin = max(SPIN_FLOOR_S, SPIN_FACTOR * STATS["reduce_max_s"])
        napped = quiet_wait(comm.Iallreduce(send, recv, op=MPI.SUM), spin, sleep_max)
    else:
        comm.Allreduce(send, recv, op=MPI.SUM)
        napped = False
    t2 = time.perf_counter()
    STATS["wait_s"] += t1 - t0
    STATS["reduce_s"] += t2 - t1
    if not napped:                 # a reduction with every rank running
        STATS["reduce_max_s"] = max(STATS["reduce_max_s"], t2 - t1)


SPIN_FLOOR_S = 0.05   # allreduce_sum: Test back to back for at least this long,
SPIN_FACTOR = 4.0     # or 4x the longest reduction so far, before napping


def _on_host(a):
    import numpy as np
    return isinstance(a, np.ndarray)


def quiet_wait(req, spin_s, sleep_max):
    """Complete `req`: Test back to back for `spin_s` seconds (each Test
    advances the library's rounds), then with a sleep back-off up to
    `sleep_max` (a rank stopped inside the collective: no core spun while
    it is; the watchdog's timer thread ends a wait that never completes).
    True when it had to nap. Between the quick Tests a rank gives up its
    core (sched_yield) only where the node's ranks share cores
    (cores_shared: 4 KiB reductions 2.5x faster, 3 ranks on 2 cores); with
    a core each, a yield hands the core to other work on the node and the
    round it waits for waits out that work's time slice (Open MPI, 2 ranks
    bound to 2 busy cores: the master fell behind its worker, and the
    carried-evaluation test's longest block took 0.3-0.8 s, not 0.1-0.3)."""
    import time
    t0 = time.perf_counter()
    give_way = _CORES_SHARED is not False
    while not req.Test():
        if time.perf_counter() - t0 > spin_s:
            break
        if give_way:               # a rank it waits for may share this core
            os.sched_yield()
    else:
        return False
    nap = 0.0002
    while not req.Test():
        time.sleep(nap)
        nap = min(nap * 2, sleep_max)
    return True


SETTLE_S = 0.002      # quiet_arrival: quick Tests after each slice of work


def quiet_arrival(comm=None, sleep_max=0.005, work=None, watch=None):
    """Wait until every rank of `comm` has arrived here, sleeping with a
    back-off instead of spinning: MPICH and Open MPI both busy-poll inside a
    blocking collective, so a rank that waits in one (the master at start,
    while workers load their data or compile kernels) would burn a core.
    Called before each blocking collective (the block's Allreduce and those
    below), which then completes at once. While waiting, `work()` is called
    until it returns False, and `watch()` (which may raise) every round."""
    import time
    comm = comm or world()
    if MPI is None or comm.Get_size() == 1:
        return
    req = comm.Ibarrier()
    nap = 0.0002
    while not req.Test():
        if watch is not None:
            watch()
        if work is not None:
            t0 = time.perf_counter()
            busy = work()
            STATS["work_s"] += time.perf_counter() - t0
            if busy:
                # the barrier advances one round per Test: before the next
                # slice of work, give the ranks that arrived meanwhile a
                # moment (2 ms of quick Tests) to complete it, so a rank
                # with work is late by at most one slice, not one slice per
                # round of the barrier (log2 of the ranks)
                t1 = time.perf_counter()
                while time.perf_counter() - t1 < SETTLE_S:
                    if req.Test():
                        return
                    time.sleep(0.00005)
                continue
        time.sleep(nap)
        nap = min(nap * 2, sleep_max)


def bcast(obj, root=0, comm=None):
    """A small Python object from root to every rank (start-up decisions)."""
    comm = comm or world()
    quiet_arrival(comm)
    return comm.bcast(obj, root=root)


def allgather(obj, comm=None):
    """One small Python object from every rank, to every rank (start-up)."""
    comm = comm or world()
    quiet_arrival(comm)
    return comm.allgather(obj)


def np_copy(dst, src):
    dst[...] = src


def self_comm():
    """A one-rank communicator: the simulator's 'Allreduce' is a copy."""
    return MPI.COMM_SELF if MPI is not None else _SerialComm()


# called before this process aborts the job: it ends knowingly, having
# said why (train.lifecycle.Lifeline's goodbye)
BEFORE_ABORT = []


def _before_abort():
    for f in BEFORE_ABORT:
        try:
            f()
        except Exception:
            pass


def abort(code=1, comm=None):
    """End the job from this rank. Its own line is printed before: the
    library's `Abort(code) on node ...` banner after it would be a second
    line a rank, so this rank's stderr goes to /dev/null first (the
    launcher's own messages are its process's, not this one's)."""
    import sys
    _before_abort()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
    except OSError:
        pass
    (comm or world()).Abort(code)


def world_size():
    return world().Get_size()


def world_rank():
    return world().Get_rank()


# -- watchdog arrivals (point-to-point, only when the watchdog is on) ---------

ARRIVE_TAG = 7301


def send_arrival(block, comm=None):
    """A worker tells rank 0 it reached block's Allreduce (non-blocking)."""
    import numpy as np
    comm = comm or world()
    buf = np.array([block], np.int64)
    return comm.Isend(buf, dest=0, tag=ARRIVE_TAG), buf


def post_arrivals(comm=None):
    """Rank 0: one receive per worker rank; returns {rank: (request, buf)}."""
    import numpy as np
    comm = comm or world()
    out = {}
    for r in range(1, comm.Get_size()):
        buf = np.zeros(1, np.int64)
        out[r] = (comm.Irecv(buf, source=r, tag=ARRIVE_TAG), buf)
    return out


def missing_arrivals(posted):
    return [r for r, (req, _) in posted.items() if not req.Test()]


def wait_all(reqs):
    if reqs:
        MPI.Request.Waitall(list(reqs))


def install_abort_hooks(rank):
    """Uncaught exceptions in any thread print the rank and abort the world
    (so no other rank waits forever); works without `python -m mpi4py`."""
    import sys
    import threading
    import traceback

    def hook(et, ev, tb):
        sys.stderr.write(f"[rank {rank}] uncaught exception:\n"
                         + "".join(traceback.format_exception(et, ev, tb)))
        sys.stderr.flush()
        if world().Get_size() > 1:
            _before_abort()
            world().Abort(1)

    sys.excepthook = hook
    threading.excepthook = lambda a: hook(a.exc_type, a.exc_value, a.exc_traceback)


def allreduce_sweep(sizes_bytes, reps=7, warmup=2):
    """Median wall seconds (max over ranks) of a float32 Allreduce per size:
    the measurements that calibrate the alpha-beta model (bench_scaling)."""
    import time
    import numpy as np
    if MPI is None:
        raise MPIUnavailable(f"the Allreduce sweep needs MPI: {MISSING}")
    w = MPI.COMM_WORLD
    out = []
    for n in sizes_bytes:
        x = np.ones(max(1, n // 4), np.float32)
        y = np.empty_like(x)
        times = []
        for r in range(reps + warmup):
            w.Barrier()
            t0 = time.perf_counter()
            w.Allreduce(x, y, op=MPI.SUM)
            dt = w.allreduce(time.perf_counter() - t0, op=MPI.MAX)
            if r >= warmup:
                times.append(dt)
        out.append({"bytes": int(n), "seconds": sorted(times)[len(times) // 2]})
    return out


def worker_local_rank(comm=None):
    """This rank's index among the WORKER ranks (world rank >= 1) on its node,
    from Split_type (launcher independent); -1 on the master. Collective:
    every rank of `comm` calls it."""
    comm = comm or world()
    me = comm.Get_rank()
    if MPI is None or comm.Get_size() == 1:
        return 0
    quiet_arrival(comm)             # collective: the master takes part too
    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=me)
    try:
        ranks = node.allgather(me)
    finally:
        node.Free()
    if me == 0:
        return -1
    return sorted(r for r in ranks if r != 0).index(me)
