"""The training driver: roles, wiring, and the block loop.

World size N+1 under MPI: rank 0 is the master (holds z, evaluates, logs,
writes the run directory, contributes zeros to the Allreduce), ranks 1..N
are workers. A single process is worker 0 and master at once (the N = 1
SGD baseline, same code path). ``run.simulate = N`` runs N logical workers
in one process: the same per-worker code, their packed buffers summed in
rank order instead of by MPI.

Per block ONE packed Allreduce (packet.py; ``ssgd``: one per minibatch),
then every rank applies the same consensus update. The parts, one concern
each: steps.py (one block on this rank's workers), state.py (checkpoints,
resume, model.init), master.py (rank 0's evaluation, metrics, reports),
lifecycle.py (RunControl: block, phase, stop flags, time limit, faults; signals, profile), entry.py (the launch
and exit statuses). The algorithm, the optimizer and the layers come from
their registries (consensus/, optim/, layers/); nothing here names one.
Tests: tests/unit/test_trainer.py (simulator), tests/mpi/test_trainer_mpi.py.
"""
from __future__ import annotations

import math
import os
import time

import numpy as np

from .. import checkpoint as ckpt
from .. import comm as mpi
from .. import consensus, optim, recipe, runlock, timeline
from ..config import ConfigError
from ..data import input_norm
from ..dataset import Dataset
from ..loader import WorkerData
from ..model import Model
from ..schedule import Schedule, split_size_for
from . import lifecycle
from ..errors import Preempted
from .exchange import BlockExchange
from .state import CheckpointState, CheckpointWrites
from .lifecycle import RunControl
from .master import MasterReports
from .packet import BlockPacket
from .steps import BlockSteps


class ConsensusState:
    """What every rank holds alike between blocks: the algorithm's consensus
    object (None under ssgd), the consensus model z (its z, or ssgd's own
    host copy of the model) and the agreed buffers (BatchNorm's running
    statistics, host float32). The consensus restarts whole (warm-up,
    model.init); the buffers change after every Allreduce and on a resume."""

    def __init__(self, cons, z, zbuf):
        self.cons, self.z, self.zbuf = cons, z, zbuf

    def restart(self, cons):
        """A new consensus object: z is its z from now on."""
        self.cons, self.z = cons, cons.z

    def set_buffers(self, zbuf, model):
        """The agreed buffers, loaded into `model` at once."""
        self.zbuf = zbuf
        model.load_buffers(zbuf)


class Trainer(BlockSteps, CheckpointState, MasterReports):
    def __init__(self, cfg, log=print, device_ops=None, gpu_buffers=False, master_ops=None):
        """device_ops: a backend.GpuOps for the workers' compute (the master,
        which has no worker, computes nothing). gpu_buffers (from
        backend.resolve_cuda_aware; real MPI runs only): a rank whose
        consensus state is on a GPU hands its device buffer to a
        CUDA-aware Allreduce; otherwise that buffer is staged through
        pinned host memory. A GPU worker under MPI keeps its consensus
        state on the GPU either way (device_state). master_ops: the GPU a
        master of its own has (entry.py): it evaluates there
        (run.eval_device) and keeps its consensus state and updates z there
        (run.master_device, block algorithms); a process with workers
        evaluates on theirs."""
        self.t_created = time.time()     # older error files are an earlier job's
        self.cfg, self.log = cfg, log
        d, r = cfg["data"], cfg["run"]
        self.algo = cfg["algorithm"]["name"]
        self.A = consensus.get(self.algo)        # the algorithm's class
        self._roles(int(r["simulate"]))
        # where this rank's start-up goes (summary.json startup_parts)
        self.startup_parts = {"launch and imports": lifecycle.process_age_s()}
        t0 = time.perf_counter()
        self.ds = Dataset(d["path"])
        if r["early_stop"] and "val" not in self.ds.splits:
            raise ConfigError(f"run.early_stop needs a val split; {d['path']} has "
                              f"{', '.join(self.ds.splits)}")
        n, tr = self.n_workers, self.ds.split("train")
        split = split_size_for(d["block_size"] or None,
                               d["split_size"] or (None if d["block_size"] else 512), n)
        # algorithm.recipe: the settings for this N where the user set none
        self.cfg, self.recipe_set = recipe.apply(cfg, n, min(split, tr.n // n))
        cfg, d = self.cfg, self.cfg["data"]
        try:                             # data.normalize: the inputs' mean and std
            self.norm_mean, self.norm_std = input_norm(cfg, self.ds)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        self.sched = Schedule(tr.n, n, split, d["batch"], d["seed"])
        t1 = time.perf_counter()
        self._wire_compute(device_ops, gpu_buffers, master_ops)
        t2 = time.perf_counter()
        self.eval_ops = master_ops if master_ops is not None else self.dev
        # GPU workers get uint8 minibatches (a quarter of the bytes to
        # upload) and normalise them on the device (kernels/input.cu); under
        # the block algorithms through a feed (gpu_feed: pinned memory, a
        # copy stream, the augmentation on the device too)
        self.feeds = {}
        if self.dev is not None and not self.A.per_step:
            from ..gpu_feed import DeviceFeed
            last = self.sched.blocks_per_pass - 1
            copy = self.dev.cp.cuda.Stream(non_blocking=True)
            self.feeds = {i: DeviceFeed(self.dev, max(self.sched.split_len(i, 0),
                                                      self.sched.split_len(i, last)),
                                        self.ds.image_shape, copy)
                          for i in self.local}
        self.loaders = {i: WorkerData(tr, self.sched, i, self.norm_mean, self.norm_std,
                                      d["augment"], d["seed"], d["cache"],
                                      raw=self.dev is not None,
                                      device_aug=i in self.feeds,
                                      stage=self.feeds[i].stage if i in self.feeds else None)
                        for i in self.local}
        self.startup_parts.update({"model": t2 - t1,        # data: open + cache fill
                                   "data": (t1 - t0) + (time.perf_counter() - t2)})
        if self.dev is not None:
            from ..gpu_graphs import set_gpu_math
            set_gpu_math(self.dev.cp, r["gpu_math"])
            self.model.use_graphs(r["cuda_graphs"], self.log)
        self.model.set_input_norm(self.norm_mean, self.norm_std)
        self.total_blocks = max(1, math.ceil(r["passes"] * self.sched.blocks_per_pass))
        self.lr_at = optim.LrSchedule(cfg["optim"], self.sched.blocks_per_pass, r["passes"])
        # block, phase, stop flags, the time limit (only the master watches the
        # clock; the flags carry its stop to all), planted faults
        self.control = RunControl(self.rank, r["time_limit"] if self.rank == 0 else None)
        self.writes = CheckpointWrites(r["dir"], self.rank, self.control)
        # the block's one Allreduce and its watchdog
        self.exchange = BlockExchange(
            self.packet, self.comm, self.control, rank=self.rank, is_master=self.is_master,
            has_workers=bool(self.local), one_process=not self.dist,
            per_step=self.A.per_step, watchdog=r["watchdog_s"],
            state_device=self.sdev, gpu_buffers=self.gpu_buffers,
            placement=lifecycle.weakly(self, "_placement_rows"), cfg=cfg)
        self._master_setup()             # the evaluator and the records
        self.tl = timeline.Off()         # run.timeline: this rank's trace events
        self._lane = 0 if self.is_master or not self.local else 1 + self.local[0]
        self.run_dir = r["dir"]
        self._identities(cfg)            # and what a resume finds (state.py)

    def _roles(self, simulate):
        """Who this process is: n_workers, its local workers, master or not."""
        size, rank = mpi.world_size(), mpi.world_rank()
        self.simulate, self.comm = simulate, None
        if simulate:                      # one process, whatever the world is
            size, rank = 1, 0
            self.comm = mpi.self_comm()
            self.n_workers, self.local = simulate, list(range(simulate))
        elif size == 1:
            self.n_workers, self.local = 1, [0]
        else:
            self.n_workers = size - 1
            self.local = [] if rank == 0 else [rank - 1]
        self.rank, self.is_master = rank, rank == 0
        n = self.n_workers
        how = (f"this is --simulate {simulate}: drop it" if simulate else
               f"this job has {n} workers: run it without mpiexec (or with -n 1)")
        self.A.check_workers(n, how)

    def _wire_compute(self, device_ops, gpu_buffers, master_ops=None):
        """Model, optimizer, consensus, worker states and the block packet.

        Workers compute on the device when one is given. A rank under MPI
        whose consensus state is on a GPU (device_state: a GPU worker's on
        its GPU; a master's of its own on its GPU under run.master_device)
        keeps it (z, the duals) and the block's packed buffer there and
        updates z there; the MPI library gets that buffer itself where it is
        CUDA-aware (gpu_buffers), else a pinned host copy (P floats down and
        P up a block). The state of simulated or single-process GPU workers
        is on the host (their w is staged through a pinned host image), and
        so is a master's without a GPU; z is bitwise equal everywhere
        (consensus/). Where a GPU worker's consensus was on the host, the
        update's NumPy passes over P floats took as long as the block's
        compute (the H200 check: 64-79 ms against 53-58 ms); a master's own
        host update (13-45 ms a block for the reference CNN) is on the
        critical path once GPU workers compute faster."""
        cfg = self.cfg
        h, w, c = self.ds.image_shape
        self.dev = device_ops if self.local else None
        self.sdev = self._state_device(master_ops)     # None: the host
        self.device_state = self.sdev is not None
        self.gpu_buffers = bool(gpu_buffers and self.device_state)
        self.model = Model(cfg["model"]["layers"], (c, h, w), self.ds.n_classes,
                           seed=cfg["model"]["seed"], ops=self.dev)
        self.opt = optim.make(cfg["optim"], self.model.params, ops=self.dev)
        self.P = P = self.model.size
        pinned = self._ops is not None and not self.gpu_buffers
        host_empty = self._ops.pinned_empty if pinned else (lambda m: np.empty(m, np.float32))
        # host image of a worker's w, where its consensus state is on the host
        self._w_host = (host_empty(P) if self.dev is not None and not self.device_state
                        else None)
        cons = None if self.A.per_step else self._new_consensus()
        zeros = self.sdev.cp.zeros if self.device_state else np.zeros
        self.states = ({} if cons is None else
                       {i: cons.new_worker(P, self.model.dtype, zeros) for i in self.local})
        # each local worker's optimizer state between its blocks (host)
        self.opt_states = {i: {k: np.zeros(s, dt) for k, (s, dt) in
                               self.opt.state_spec().items()} for i in self.local}
        self.packet = BlockPacket(P, self.n_workers, host_empty,
                                  zeros if self.device_state else None,
                                  B=self.model.n_buffers)
        # z, and the buffers every rank agrees on (BatchNorm's running
        # statistics, averaged by the block's Allreduce): host float32 (B,)
        z = np.array(self._host(self.model.params)) if cons is None else cons.z
        self.sync = ConsensusState(cons, z, np.array(self._host(self.model.buffers),
                                                     np.float32))

    @property
    def z(self):
        """The consensus model (P,): the run's result."""
        return self.sync.z

    @property
    def cons(self):
        return self.sync.cons

    @property
    def zbuf(self):
        return self.sync.zbuf

    def _state_device(self, master_ops):
        """The GpuOps whose GPU holds this rank's consensus state, or None
        (the host): only under MPI; a worker's GPU; a master's of its own
        (master_ops) under run.master_device auto or gpu, for a block
        algorithm (ssgd's master holds no consensus state)."""
        if self.simulate or mpi.world_size() == 1:
            return None
        if self.local:
            return self.dev
        want = self.cfg["run"]["master_device"]
        if want == "gpu" and master_ops is None:
            raise ConfigError("run.master_device = gpu, but the master (rank 0) has no GPU "
                              "(it has one where the workers compute on GPUs and its node "
                              "has one); use auto or cpu")
        return None if want == "cpu" or self.A.per_step else master_ops

    @property
    def _ops(self):
        """The GpuOps of this rank's device arrays (the workers' model, or a
        master's consensus state), or None."""
        return self.dev if self.dev is not None else self.sdev

    # -- helpers ------------------------------------------------------------
    def _new_consensus(self):
        """From the model's current parameters: on the GPU with device_state
        (a master's of its own: uploaded), else on the host."""
        a = self.cfg["algorithm"]
        if self.device_state:
            return consensus.Consensus(self.algo, self.sdev.asarray(self.model.params),
                                       self.n_workers, a, to_host=self.sdev.asnumpy)
        # on the host its passes over P floats share the rank's BLAS threads
        # (run.threads): the master's update bounds a block once GPU workers
        # compute faster than it
        from ..threads import current_blas_threads
        return consensus.Consensus(self.algo, self._host(self.model.params),
                                   self.n_workers, a, threads=current_blas_threads() or 1)

    def _host(self, a):
        """a on the host (a itself where it is there already)."""
        ops = self._ops
        return a if ops is None or not ops.on_device(a) else ops.asnumpy(a)

    def _put(self, dst, src):
        """Copy host array src into dst (a host or, with device_state, a device
        array)."""
        ops = self._ops
        if ops is None or not ops.on_device(dst):
            np.copyto(dst, src)
        else:
            ops.to_device(src, dst)

    def _dev(self, a):
        return a if self.dev is None else self.dev.asarray(a)

    @property
    def dist(self):
        """Ranks in more than one process (collectives go over MPI)."""
        return not (self.simulate or mpi.world_size() == 1)

    def _placement(self):
        """[(host, pid, BLAS threads, device, CPU ids)] of every rank, rank order: one
        allgather at the start, for the start line and summary.json. It
        also carries what every rank must share, checked here: the same
        ibtmpi and numpy (every rank computes z itself from the reduced
        sums), the same configuration and the same data (a config file
        edited while the job started, a stale node-local copy of the data,
        another venv on one node). A mismatch stops every rank with exit 2."""
        import socket
        from .. import __version__
        from ..threads import current_blas_threads
        dev = "-" if not self.local else (
            "cpu" if self.dev is None else f"gpu {self.dev.device_id()}")
        try:                        # the cores it may run on: a Slurm allocation's,
            cpus = tuple(sorted(os.sched_getaffinity(0)))     # or one bound core
        except AttributeError:                                # no affinity API (macOS)
            cpus = tuple(range(os.cpu_count() or 1))
        me = (socket.gethostname(), os.getpid(), current_blas_threads(), dev, cpus)
        ident = {"ibtmpi": __version__, "numpy": np.__version__,
                 "configuration": self.cfg_hash, "dataset": self.data_fp}
        parts = self.startup_parts
        got = mpi.allgather((me, ident, parts)) if self.dist else [(me, ident, parts)]
        # each start-up part at its slowest rank (the first block waits for it)
        self.startup_parts = {k: max(g[2].get(k, 0.0) for g in got) for k in parts}
        got = [g[:2] for g in got]
        rows = [r for r, _ in got]
        bad = [(i, k) for i, (_, other) in enumerate(got) for k in ident
               if other.get(k) != got[0][1].get(k)]
        if bad:
            ranks = sorted({i for i, _ in bad})
            what = sorted({k for _, k in bad})
            i = ranks[0]
            eg = ", ".join(f"{k} {got[i][1].get(k)} against {got[0][1].get(k)}" for k in what)
            raise ConfigError(
                f"the ranks do not agree at start: rank(s) {ranks} differ from rank 0 in "
                f"{', '.join(what)} (rank {i} on {rows[i][0]}: {eg}). Every rank must run "
                f"the same ibtmpi and numpy (one environment on a shared file system), "
                f"read the same configuration and the same data")
        return rows

    def _work(self):
        """The master's useful work while it waits in an Allreduce: a batch
        of its evaluation (MasterEvaluator.work)."""
        return self.evaluator.work()

    def _placement_rows(self):
        """Every rank's placement row, once the start-up allgather gave them."""
        return getattr(self, "placement", None)

    def sharing(self):
        """Worker processes on this rank's GPU (on the CPU: its node), itself
        included; 1 before the start-up allgather or in one process."""
        rows = getattr(self, "placement", None)
        if not rows or len(rows) <= self.rank or not self.local:
            return 1
        host, dev = rows[self.rank][0], rows[self.rank][3]
        return sum(1 for r in rows if r[0] == host and r[3] == dev)

    # -- the run --------------------------------------------------------------
    def run(self):
        """Train to the end (or to a preemption); the master holds the run
        directory (runlock) from before it reads the checkpoints to the end."""
        lock = runlock.acquire(self.run_dir) if self.is_master else None
        if lock is not None and lock.took_over:
            self.log(f"took over {lock.path}: {lock.took_over}")
        if lock is not None:
            lifecycle.retire_errors(self.run_dir, self.t_created)
        prof = lifecycle.start_profile(self.cfg["run"]["profile"])
        try:
            return self._run()
        finally:
            if prof is not None:
                lifecycle.write_profile(prof, self.run_dir, self.rank, self.control.block,
                                        self.control.phase)
            if lock is not None:
                lock.release()

    def _start(self):
        """Placement, resume point, run directory, reports: (the block to
        start from, this job's timeline segment or None)."""
        r = self.cfg["run"]
        lost = (lifecycle.lost_rank(self.run_dir)         # the previous job's, before
                if self.is_master and self.dist else None)  # this one's watchers start
        self.placement = self._placement()
        if self.dist:
            self.lifeline = lifecycle.Lifeline(self.run_dir, self.rank, self.placement[self.rank][0])
        if lost:
            self.log(f"the previous job in {self.run_dir} ended when "
                     f"{lifecycle.lost_rank_text(lost)}")
        start = self.start = self._restore()
        if self.is_master and start:            # reshaped: every line of the run so far
            self._read_history(float("inf") if self.reshape else start)
        # a run that stopped early (run.early_stop) and is run again: its
        # last checkpoint is the stop block, nothing is left to train
        early = self.evaluator.history.early
        done = self.is_master and early is not None and early[0] < start
        # run.timeline: the master names this job's segment before the bcast,
        # so no rank has opened its file when a fresh start clears old ones
        seg = (timeline.new_segment(self.run_dir, start)
               if self.is_master and r["timeline"] and not done else None)
        if self.dist:
            done, seg = mpi.bcast((done, seg))
        if done:
            self.total_blocks = start
            self.control.agree(stop=False, early=True)
        if self.is_master:
            self._open_run_dir(start)
        self._start_reports(start)
        return start, seg

    def _startup_line(self):
        """Launch to training, split (each part at its slowest rank; the
        rest: the ranks' agreement, placement and resume)."""
        parts = self.startup_parts
        rest = max(self.startup_s - sum(parts.values()), 0.0)
        self.startup_parts = {**{k: round(v, 3) for k, v in parts.items()},
                              "agreement and resume": round(rest, 3)}
        if self.is_master:
            self.log(f"start-up {self.startup_s:.1f} s: " + ", ".join(
                f"{k} {v:.1f} s" for k, v in self.startup_parts.items()))

    def _warm_up_and_trace(self, start, seg):
        """algorithm.warmup_steps before block 0; run.timeline's files."""
        warm = self.cfg["algorithm"]["warmup_steps"]
        if warm and not self.A.per_step and not start:
            self.opt.lr = self.lr_at(0)
            self._warmup(warm)
        if seg is not None:
            role = "master" if self.is_master else f"worker {self.local[0]}"
            self.tl = timeline.Timeline(
                self.run_dir, seg, self.rank, f"rank {self.rank} ({role})",
                {**({0: "master"} if self.is_master else {}),
                 **{1 + i: f"worker {i}" for i in self.local}})

    def _run(self):
        start, seg = self._start()
        t_start, cpu_start = time.perf_counter(), time.process_time()
        stats_start = dict(mpi.STATS)    # block 0's waits and work: warm-up's in
        calls0, bytes0 = mpi.STATS["allreduce"], mpi.STATS["bytes"]
        images = 0
        step_fn = self._block_ssgd if self.A.per_step else self._block_algo
        self._warm_up_and_trace(start, seg)
        lifeline = getattr(self, "lifeline", None)
        old = lifecycle.install_stop_handlers(
            self.control, goodbye=lifeline.goodbye if lifeline is not None else None)
        self.control.begin_job(start)
        t_end = time.perf_counter()
        # honest time: block k's wall runs from the end of block k-1 (its
        # Allreduce and update) to its own end on the master, everything in
        # between included; the first from the start of training
        self.t_boundary, self.stats_boundary = t_start, stats_start
        self.startup_s = lifecycle.process_age_s() - (time.perf_counter() - t_start)
        self._startup_line()
        # a diverging model overflows: the non-finite checks say so in one
        # line, NumPy's RuntimeWarnings must not flood the log before it
        err_old = np.seterr(over="ignore", invalid="ignore", divide="ignore")
        try:
            for k in range(start, self.total_blocks):
                self.control.begin_block(k)
                self.opt.lr = self.lr_at(k)
                p, b, diag = step_fn(k, self._work)
                rec = self._record(k, p, b, diag, *self._block_times())
                self.evaluator.settle()  # what the wait did not finish, or carry it
                images += rec["samples"]
                if not np.isfinite(self.z).all():
                    raise self._diverged(k, "the consensus model z is not finite", "all")
                ctl = self.control
                if ctl.early_agreed:      # run.early_stop: this block is the last
                    self.total_blocks = k + 1
                last = k + 1 == self.total_blocks
                if self.is_master:
                    self._report_block(k, p, b, rec, last)
                if ctl.deadline is not None and not (last or ctl.stop_requested):
                    if ctl.deadline.due(rec["wall_s"], self.log):
                        ctl.request_stop(f"the time limit ({ctl.deadline.source})")
                self._maybe_checkpoint(k, last)
                now = time.perf_counter()    # block end to block end: the watchdog's scale
                ctl.block_ended(now - t_end)
                t_end = now
                if ctl.early_agreed:
                    break
                if ctl.stop_agreed and not last:
                    self._end_timeline()
                    raise Preempted(f"stopped by {ctl.stop_reason} after block {k}; "
                                    f"checkpoint {ckpt.ckpt_dir(self.run_dir, k)} written; "
                                    f"run the same command again to resume")
            self._end_timeline()
            self.tail_s = time.perf_counter() - self.t_boundary   # after the last block
        finally:
            np.seterr(**err_old)
            self.tl.close()
            lifecycle.restore_handlers(old)
            self._close_reports()
            for ld in self.loaders.values():
                ld.close()
        return self._finish(t_start, cpu_start, calls0, bytes0, images)

    def _block_times(self):
        """(wall, master busy, master slack) of the block that just ended:
        wall from the previous block's end, a block ending when its (last)
        Allreduce returns on the master, the update after it counted in the
        next block, so that the master's own update does not shift a
        boundary past the workers' start of their next compute; slack the
        master's sleep in the wait for the workers; busy the rest but the
        Allreduce itself."""
        now, st = self.exchange.t_reduced, mpi.STATS
        wall = now - self.t_boundary
        d = {k: st[k] - self.stats_boundary.get(k, 0.0) for k in ("wait_s", "work_s", "reduce_s")}
        slack = max(d["wait_s"] - d["work_s"], 0.0)
        busy = max(wall - slack - d["reduce_s"], 0.0)
        self.t_boundary, self.stats_boundary = now, dict(st)
        return wall, busy, slack

    def _maybe_checkpoint(self, k, last):
        every = self.cfg["run"]["checkpoint_every"] or self.sched.blocks_per_pass
        if (k + 1) % every == 0 or last or self.control.stop_agreed:
            if last or self.control.stop_agreed:     # (else its manifest waits for it)
                self.evaluator.finish()
            tc = time.perf_counter()
            self._checkpoint(k)
            t1 = time.perf_counter()
            self.control.checkpoint_took(t1 - tc)
            self.tl.span("checkpoint", tc, t1, self._lane, block=k)
        self.tl.flush()
