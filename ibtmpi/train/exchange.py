"""The block's one Allreduce of the packed buffer, and the watchdog over it.

``BlockExchange.reduce`` hands the block's packet (packet.py) to MPI (or
sums it in one process) and returns the reduced model part S. Under MPI
with run.watchdog_s the master aborts a block past the limit, naming the
ranks that had not arrived; a timer thread (lifecycle.Alarm) ends the job
when a rank stopped inside the library's Allreduce; the workers keep a
later deadline of their own for a master that stopped or was lost. One
line, kept in RUN/error-rank-R.txt for `ibtmpi status`, and exit 1.
Built from explicit arguments; it reads the run's state only through the
RunControl it is given (the watchdog's scale) and the callables it gets.
Tests: tests/unit/test_job_endings.py, test_hangs.py, test_faults.py,
tests/mpi/test_trainer_mpi.py.
"""
from __future__ import annotations

import os
import sys
import time

from .. import comm as mpi
from ..errors import WatchdogTimeout
from . import lifecycle
from .lifecycle import (WATCHDOG_FACTOR, WATCHDOG_FLOOR_S, WATCHDOG_GRACE_S, WORKER_STAGGER_S,
                        Alarm, stuck_ranks, watchdog_limit, worker_limit)


class BlockExchange:
    """packet: the BlockPacket; comm: the communicator (mpi.self_comm() in
    one process); control: the rank's RunControl; rank, is_master,
    has_workers (this rank computes); one_process (a simulation or a world
    of one: no watchdog); per_step (ssgd: an Allreduce every minibatch);
    watchdog: run.watchdog_s; state_device (the GpuOps holding the
    consensus state, or None) and gpu_buffers (MPI reads device memory);
    placement(): every rank's placement row once known (for the stuck
    ranks /proc shows); cfg: where the error files go."""

    def __init__(self, packet, comm, control, *, rank, is_master, has_workers, one_process,
                 per_step, watchdog, state_device, gpu_buffers, placement, cfg):
        self.packet, self.comm, self.control = packet, comm, control
        self.rank, self.is_master, self.has_workers = rank, is_master, has_workers
        self.one_process, self.per_step, self.watchdog = one_process, per_step, watchdog
        self.sdev, self.gpu_buffers = state_device, gpu_buffers
        self.placement, self.cfg = placement, cfg
        self.alarm = None                # lifecycle.Alarm over the reduction
        self.t_reduced = 0.0             # when this rank's last Allreduce returned

    def reduce(self, work, k, last=None, write_s=0.0):
        """The block's one Allreduce of the packed buffer; returns the
        reduced S (P,), on the device where the state is (BlockPacket.reduce).
        work(): the master's useful work while it waits; last(): see
        comm.allreduce_sum (a master of its own); what it sets in the host
        tail goes up to the device buffer after it, where that is what MPI
        reads (gpu_buffers). write_s: the longest checkpoint write so far
        (a block waits for the last one's, the watchdog allows it)."""
        pk, dev = self.packet, self.sdev
        if last is not None and self.gpu_buffers:
            def last(first=last):
                first()
                pk.push_tail(dev)
        S = pk.reduce(lambda s, r: self._allreduce(s, r, work, k, last, write_s), dev,
                      self.gpu_buffers)
        self.t_reduced = time.perf_counter()
        return S

    def _allreduce(self, send, recv, work, k, last, write_s):
        setting = self.watchdog
        ctl = self.control
        limit = watchdog_limit(setting, k, ctl.start_block, ctl.slowest_block_s)
        if limit and setting == "auto":   # a block waits for the last checkpoint's write
            limit += 2 * write_s
        # Workers are on the critical path (they compute right after): they
        # poll on a short leash; the master sleeps longer (< 5% of a core),
        # except under a per-step algorithm (ssgd), whose Allreduce follows
        # every minibatch: a 5 ms nap there delayed each step by up to 5 ms
        # (66 steps a pass: a third of a second per pass on the simulated
        # cluster).
        nap = (0.005 if self.is_master and not self.has_workers and not self.per_step
               else 0.0005)
        if not limit or self.one_process:
            mpi.allreduce_sum(send, recv, self.comm, work=work if self.is_master else None,
                              sleep_max=nap, last=last)
            return
        if self.is_master:
            posted = mpi.post_arrivals()
            ran = lifecycle.OwnClock()
            why = (f"run.watchdog_s = {limit:g} s" if setting != "auto" else
                   f"the watchdog's limit of {limit:.0f} s (run.watchdog_s = auto: "
                   f"{WATCHDOG_FACTOR:g}x the slowest block so far, at least "
                   f"{WATCHDOG_FLOOR_S:g} s)")

            def watch():
                if ran() > limit:
                    missing = mpi.missing_arrivals(posted)
                    raise WatchdogTimeout(
                        f"block {k} ran past {why}; rank(s) {missing} had not arrived "
                        f"at the Allreduce{self._stuck_text()}")
            # a rank stopped after it arrived blocks everyone inside the
            # library's Allreduce, where watch() is not called: a timer thread
            # ends the job then
            if self.alarm is None:
                self.alarm = Alarm()
            self.alarm.arm(limit + WATCHDOG_GRACE_S, self._hung_in_allreduce, k, why)
            try:
                mpi.allreduce_sum(send, recv, self.comm, work=work, watch=watch, last=last,
                                  sleep_max=nap)
                mpi.wait_all([req for req, _ in posted.values()])
            finally:
                self.alarm.disarm()
        else:
            # the master's watchdog names a stuck worker; a stuck master (or
            # a node lost under it) is the workers' to find: a timer thread,
            # as the master's, later than the master's would fire, so where
            # the master is alive it speaks first. Rank 1 fires first and
            # the others a little later: one line for the job.
            if self.alarm is None:
                self.alarm = Alarm()
            wait = worker_limit(limit) + (0 if self.rank == 1 else WORKER_STAGGER_S)
            self.alarm.arm(wait, self._master_lost, k, wait)
            if ctl.faults.at is not None:       # tests: a stop inside the reduction
                def last(first=last):
                    ctl.faults.stop_in_allreduce(self.rank, k)
                    if first is not None:
                        first()
            try:
                req, _buf = mpi.send_arrival(k)
                mpi.allreduce_sum(send, recv, self.comm, sleep_max=nap, last=last)
                mpi.wait_all([req])
            finally:
                self.alarm.disarm()

    def _stuck_text(self):
        """'; rank 2 (worker 1) is stopped' for this node's ranks /proc knows."""
        stuck = stuck_ranks(self.placement())
        return "".join(f"; rank {r} (worker {r - 1}) is {what}" for r, what in stuck.items())

    def _master_lost(self, k, waited):
        """Worker, timer thread: block k's Allreduce has not completed in
        `waited` seconds and the master's watchdog has not ended the job:
        the master is stopped, hung or lost. One line (kept for `ibtmpi
        status`), and the job is aborted (exit 1)."""
        stuck = stuck_ranks(self.placement())
        said = (f"rank 0 (the master) is {stuck[0]}" if 0 in stuck else
                "the master (rank 0) did not end it: stopped, hung or its node lost")
        msg = (f"[rank {self.rank}] ibtmpi train: hung rank: block {k} waited {waited:.0f} s "
               f"for its Allreduce; {said}"
               + "".join(f"; rank {r} (worker {r - 1}) is {w}" for r, w in stuck.items() if r)
               + ". The job is aborted; complete checkpoints are kept (rerun to resume); "
                 "run.watchdog_s sets the limit (0: off)")
        print(msg, file=sys.stderr, flush=True)
        lifecycle.keep_error(self.cfg, self.rank, msg)
        try:
            mpi.abort(1)
        finally:
            os._exit(1)

    def _hung_in_allreduce(self, k, why):
        """Master, timer thread: every rank arrived but the block's Allreduce
        has not completed past the limit: one line, kept for `ibtmpi
        status`, and the job is aborted (exit 1)."""
        stuck = self._stuck_text()
        msg = (f"[rank 0] ibtmpi train: hung rank: block {k} ran past {why}; every rank "
               f"had reached the Allreduce but it did not complete"
               + (stuck or " (a rank stopped or lost inside it)")
               + ". The job is aborted; complete checkpoints are kept (rerun to resume); "
                 "run.watchdog_s sets the limit (0: off)")
        print(msg, file=sys.stderr, flush=True)
        lifecycle.keep_error(self.cfg, 0, msg)
        try:
            mpi.abort(1)
        finally:
            os._exit(1)


class BlockClock:
    """Honest block times on this rank. Block k's wall runs from the end of
    block k-1 to its own end, everything in between included (the first
    from the start of training); a block ends when its (last) Allreduce
    returns (exchange.t_reduced), the update after it counted in the next
    block, so the master's own update does not shift a boundary past the
    workers' start of their next compute. lap(): block end to block end,
    the checkpoint included (the watchdog's scale)."""

    def __init__(self, exchange, t_start, stats_start):
        self.exchange = exchange
        self.t_boundary, self.stats_boundary = t_start, stats_start
        self.t_lap = time.perf_counter()

    def block(self):
        """(wall, master busy, master slack) of the block that just ended:
        slack the master's sleep in the wait for the workers; busy the rest
        but the Allreduce itself."""
        now, st = self.exchange.t_reduced, mpi.STATS
        wall = now - self.t_boundary
        d = {k: st[k] - self.stats_boundary.get(k, 0.0) for k in ("wait_s", "work_s", "reduce_s")}
        slack = max(d["wait_s"] - d["work_s"], 0.0)
        busy = max(wall - slack - d["reduce_s"], 0.0)
        self.t_boundary, self.stats_boundary = now, dict(st)
        return wall, busy, slack

    def lap(self):
        now = time.perf_counter()
        d, self.t_lap = now - self.t_lap, now
        return d

    def tail(self):
        """Since the last block's end: its checkpoint, metrics, final sync."""
        return time.perf_counter() - self.t_boundary
