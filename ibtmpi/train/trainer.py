"""The training driver: roles, wiring, and the block loop.

World size N+1 under MPI: rank 0 is the master (holds z, evaluates, logs,
writes the run directory, contributes zeros to the Allreduce), ranks 1..N
are workers. A single process is worker 0 and master at once (the N = 1
SGD baseline, same code path). ``run.simulate = N`` runs N logical workers
in one process: the same per-worker code, their packed buffers summed in
rank order instead of by MPI.

Per block ONE packed Allreduce (packet.py; ``ssgd``: one per minibatch),
then every rank applies the same consensus update. The Trainer wires
parts built from explicit arguments, one concern each (docs/architecture.md):
WorkerGroup (workers.py: model, optimizer, loaders), BlockSync or StepSync
(steps.py: the sync between workers, chosen once), BlockPacket and
BlockFlags (packet.py), BlockExchange and BlockClock (exchange.py: the
Allreduce, its watchdog, honest block times), Checkpointer (state.py:
checkpoints, resume, model.init), MasterSide (master.py: rank 0's records,
reports, evaluation), RunControl (lifecycle.py: block, phase, extent, stop
flags, time limit, faults); entry.py launches it and maps every ending to
an exit status. The algorithm, the optimizer and the layers come from
their registries (consensus/, optim/, layers/); nothing here names one.
Tests: tests/unit/test_trainer.py (simulator), tests/mpi/test_trainer_mpi.py.
"""
from __future__ import annotations

import math
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
from .lifecycle import weakly
from ..errors import Preempted
from .exchange import BlockClock, BlockExchange
from .state import Checkpointer, CheckpointWrites
from .lifecycle import RunControl
from .master import MasterSide
from .packet import BlockFlags, BlockPacket
from .steps import BlockSync, StepSync, diverged
from .workers import WorkerGroup, host_fn, put_fn


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


class Trainer:
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
        self.algo_cls = consensus.get(self.algo)        # the algorithm's class
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
        # GPU workers get the stored uint8 (or uint16) minibatches (a quarter
        # (a half) of the bytes to upload) and normalise them on the device (kernels/input.cu); under
        # the block algorithms through a feed (gpu_feed: pinned memory, a
        # copy stream, the augmentation on the device too)
        feeds = {}
        if self.dev is not None and not self.algo_cls.per_step:
            from ..gpu_feed import DeviceFeed
            last = self.sched.blocks_per_pass - 1
            copy = self.dev.cp.cuda.Stream(non_blocking=True)
            feeds = {i: DeviceFeed(self.dev, max(self.sched.split_len(i, 0),
                                                 self.sched.split_len(i, last)),
                                   self.ds.image_shape, copy, self.ds.dtype)
                     for i in self.local}
        loaders = {i: WorkerData(tr, self.sched, i, self.norm_mean, self.norm_std,
                                 d["augment"], d["seed"], d["cache"],
                                 raw=self.dev is not None,
                                 device_aug=i in feeds,
                                 stage=feeds[i].stage if i in feeds else None)
                   for i in self.local}
        # this rank's workers: model, optimizer, loaders, feeds
        self.workers = WorkerGroup(self.local, self.model, self.opt, loaders, feeds, self.dev,
                                   self._w_host, d["batch"])
        self.startup_parts.update({"model": t2 - t1,        # data: open + cache fill
                                   "data": (t1 - t0) + (time.perf_counter() - t2)})
        if self.dev is not None:
            from ..gpu_graphs import set_gpu_math
            set_gpu_math(self.dev.cp, r["gpu_math"])
            self.model.use_graphs(r["cuda_graphs"], self.log)
        self.model.set_input_norm(self.norm_mean, self.norm_std)
        self.lr_at = optim.LrSchedule(cfg["optim"], self.sched.blocks_per_pass, r["passes"])
        # block, phase, the run's extent, stop flags, the time limit (only the
        # master watches the clock; the flags carry its stop to all), faults
        self.control = RunControl(self.rank, r["time_limit"] if self.rank == 0 else None,
                                  total=max(1, math.ceil(r["passes"]
                                                         * self.sched.blocks_per_pass)))
        self.writes = CheckpointWrites(r["dir"], self.rank, self.control)
        # the block's one Allreduce and its watchdog
        self.exchange = BlockExchange(
            self.packet, self.comm, self.control, rank=self.rank, is_master=self.is_master,
            has_workers=bool(self.local), one_process=not self.dist,
            per_step=self.algo_cls.per_step, watchdog=r["watchdog_s"],
            state_device=self.sdev, gpu_buffers=self.gpu_buffers,
            placement=lifecycle.weakly(self, "_placement_rows"), cfg=cfg)
        self.run_dir = r["dir"]
        self.tl = timeline.Off()         # run.timeline: this rank's trace events
        self._lane = 0 if self.is_master or not self.local else 1 + self.local[0]
        self._wire_parts(cfg)

    def _wire_parts(self, cfg):
        """The flags, the sync between workers, the checkpointer and the
        master's side, each from explicit arguments."""
        # this rank's flag slots of the Allreduce, and the sync between workers:
        # per block (the algorithm's consensus) or per step (ssgd), chosen once
        self.flags = BlockFlags(
            self.packet, self.control, self.writes,
            ([0] if self.is_master else []) + [1 + i for i in self.local],
            early=weakly(self, "_early"),
            confirm=weakly(self, "_manifest") if self.is_master else None,
            diverged=weakly(self, "_diverged"), dist=self.dist)
        parts = (self.workers, self.sync, self.packet, self.exchange, self.flags,
                 self.control, self.sched, self.lr_at)
        common = dict(n_workers=self.n_workers, lane=self._lane, host=host_fn(self._ops),
                      device_state=self.device_state, writes=self.writes)
        if self.algo_cls.per_step:
            self.blocks = StepSync(*parts, **common)
        else:
            self.blocks = BlockSync(
                *parts, **common, zeros=self.sdev.cp.zeros if self.device_state else np.zeros,
                seed=cfg["data"]["seed"], outer_schedule=cfg["algorithm"]["outer_schedule"],
                new_consensus=weakly(self, "_new_consensus"), comm=self.comm, log=self.log)
        # checkpoints, the resume and model.init (state.py)
        self.ckpt = Checkpointer(
            cfg, self.ds, rank=self.rank, is_master=self.is_master, n_workers=self.n_workers,
            local=self.local, simulate=self.simulate, comm=self.comm, sched=self.sched,
            packet=self.packet, blocks=self.blocks,
            sync=self.sync, model=self.model, norm=(self.norm_mean, self.norm_std),
            writes=self.writes, control=self.control, put=put_fn(self._ops), log=self.log,
            diverged=weakly(self, "_diverged"))
        # rank 0's evaluation, records, reports and files (every rank builds the records)
        self.master = MasterSide(
            cfg, self.ds, is_master=self.is_master, local=self.local,
            n_workers=self.n_workers, simulate=self.simulate, sched=self.sched,
            packet=self.packet, model=self.model, opt=self.opt, lr_at=self.lr_at,
            sync=self.sync, ckpt=self.ckpt, control=self.control, host=host_fn(self._ops),
            eval_ops=self.eval_ops, norm=(self.norm_mean, self.norm_std),
            manifest=self.ckpt.write_manifest, device_state=self.device_state,
            single_worker=self.algo_cls.single_worker, recipe_set=self.recipe_set, log=self.log)

    @property
    def total_blocks(self):
        """The blocks this run trains to (RunControl)."""
        return self.control.total

    @property
    def start(self):
        """This job's first block."""
        return self.control.start_block

    @property
    def evaluator(self):
        return self.master.evaluator

    @property
    def history(self):
        """The run's metrics lines so far (MasterSide)."""
        return self.master.history

    def _early(self):
        """The master's early-stop decision (block, reason), or None."""
        return self.master.evaluator.history.early

    def plan(self):
        """--dry-run: the lines saying what the run would do (train/plan.py)."""
        from .plan import plan_lines
        return plan_lines(self)

    def place(self):
        """The start-up allgather (_placement): every rank's row, kept."""
        self.placement = self._placement()
        self.master.placed(self.placement)
        return self.placement

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
        self.algo_cls.check_workers(n, how)

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
        (consensus/). On the host the update's passes over P floats can
        take as long as a GPU worker's block (docs/benchmarks.md, "On a
        GPU" and "The consensus update on the host")."""
        cfg = self.cfg
        h, w, c = self.ds.image_shape
        self.dev = device_ops if self.local else None
        self.sdev = self._state_device(master_ops)     # None: the host
        self.device_state = self.sdev is not None
        self.gpu_buffers = bool(gpu_buffers and self.device_state)
        self.model = Model(cfg["model"]["layers"], (c, h, w), self.ds.n_classes,
                           seed=cfg["model"]["seed"], ops=self.dev)
        self.opt = optim.make(cfg["optim"], self.model.params, ops=self.dev,
                              head_start=self.model.head_start())
        P = self.model.size
        pinned = self._ops is not None and not self.gpu_buffers
        host_empty = self._ops.pinned_empty if pinned else (lambda m: np.empty(m, np.float32))
        # host image of a worker's w, where its consensus state is on the host
        self._w_host = (host_empty(P) if self.dev is not None and not self.device_state
                        else None)
        cons = None if self.algo_cls.per_step else self._new_consensus()
        zeros = self.sdev.cp.zeros if self.device_state else np.zeros
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
        return None if want == "cpu" or self.algo_cls.per_step else master_ops

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
            return consensus.make_consensus(self.algo, self.sdev.asarray(self.model.params),
                                       self.n_workers, a, to_host=self.sdev.asnumpy)
        # on the host its passes over P floats share the rank's BLAS threads
        # (run.threads): the master's update bounds a block once GPU workers
        # compute faster than it
        from ..threads import current_blas_threads
        return consensus.make_consensus(self.algo, self._host(self.model.params),
                                   self.n_workers, a, threads=current_blas_threads() or 1)

    def _host(self, a):
        """a on the host (a itself where it is there already)."""
        return host_fn(self._ops)(a)

    def _put(self, dst, src):
        """Copy host array src into dst (a host or, with device_state, a device
        array)."""
        put_fn(self._ops)(dst, src)

    def _diverged(self, k, what, ranks):
        """Diverged for block k (steps.diverged), after the evaluation in
        flight: a checkpoint confirmed behind it gets its manifest."""
        self.evaluator.finish()
        return diverged(k, what, ranks, run_dir=self.run_dir, lr=self.cfg["optim"]["lr"],
                        rho=self.cfg["algorithm"]["rho"], uses_rho=self.algo_cls.uses_rho,
                        world=1 if self.simulate else mpi.world_size())

    @property
    def dist(self):
        """Ranks in more than one process (collectives go over MPI)."""
        return not (self.simulate or mpi.world_size() == 1)

    def _placement(self):
        """Every rank's placement row, and the start-up parts at their
        slowest rank (agree_at_start)."""
        dev = "-" if not self.local else (
            "cpu" if self.dev is None else f"gpu {self.dev.device_id()}")
        rows, self.startup_parts = lifecycle.agree_at_start(
            dev, {"configuration": self.ckpt.cfg_hash, "dataset": self.ckpt.data_fp},
            self.startup_parts, mpi.allgather if self.dist else (lambda x: [x]))
        return rows

    def _manifest(self, k):
        """Confirm checkpoint k: its manifest, once every metrics line up to
        block k is written. While an evaluation is carried across the
        waits (MasterEvaluator.settle) the lines behind it are not, so
        the manifest waits for it (a resume from k finds lines 0..k)."""
        self.evaluator.carried.confirm(k)

    def _eval_batch(self):
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
        self.place()
        if self.dist:
            self.lifeline = lifecycle.Lifeline(self.run_dir, self.rank, self.placement[self.rank][0])
        if lost:
            self.log(f"the previous job in {self.run_dir} ended when "
                     f"{lifecycle.lost_rank_text(lost)}")
        start = self.ckpt.restore()
        self.control.begin_job(start)
        if self.is_master and start:            # reshaped: every line of the run so far
            self.master.read_history(float("inf") if self.ckpt.reshape else start)
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
            self.control.end_at(start)
            self.control.agree(stop=False, early=True)
        if self.is_master:
            self.master.open_run_dir(start)
        self.master.start_reports(start)
        return start, seg

    def _startup_line(self, startup_s):
        """Launch to training, split (each part at its slowest rank; the
        rest: the ranks' agreement, placement and resume)."""
        parts = self.startup_parts
        rest = max(startup_s - sum(parts.values()), 0.0)
        self.startup_parts = {**{k: round(v, 3) for k, v in parts.items()},
                              "agreement and resume": round(rest, 3)}
        if self.is_master:
            self.log(f"start-up {startup_s:.1f} s: " + ", ".join(
                f"{k} {v:.1f} s" for k, v in self.startup_parts.items()))

    def _warm_up_and_trace(self, start, seg):
        """algorithm.warmup_steps before block 0; run.timeline's files."""
        warm = self.cfg["algorithm"]["warmup_steps"]
        if warm and not start:
            self.opt.lr = self.lr_at(0)
            self.blocks.warm_up(warm)
        if seg is not None:
            role = "master" if self.is_master else f"worker {self.local[0]}"
            self.tl = timeline.Timeline(
                self.run_dir, seg, self.rank, f"rank {self.rank} ({role})",
                {**({0: "master"} if self.is_master else {}),
                 **{1 + i: f"worker {i}" for i in self.local}})
            self.blocks.trace(self.tl)
            self.master.trace(self.tl)

    def _run(self):
        start, seg = self._start()
        t_start, cpu_start = time.perf_counter(), time.process_time()
        stats0 = dict(mpi.STATS)         # block 0's waits and work: warm-up's in
        calls0, bytes0 = mpi.STATS["allreduce"], mpi.STATS["bytes"]
        self._warm_up_and_trace(start, seg)
        lifeline = getattr(self, "lifeline", None)
        old = lifecycle.install_stop_handlers(
            self.control, goodbye=lifeline.goodbye if lifeline is not None else None)
        clock = BlockClock(self.exchange, t_start, stats0)     # honest block times
        startup_s = lifecycle.process_age_s() - (time.perf_counter() - t_start)
        self._startup_line(startup_s)
        # a diverging model overflows: the non-finite checks say so in one
        # line, NumPy's RuntimeWarnings must not flood the log before it
        err_old = np.seterr(over="ignore", invalid="ignore", divide="ignore")
        ctl, images = self.control, 0
        try:
            for k in range(start, ctl.total):
                ctl.begin_block(k)
                self.opt.lr = self.lr_at(k)
                p, b, diag = self.blocks.block(k, self._eval_batch)     # its one Allreduce
                rec = self.master.record(k, p, b, diag, *clock.block())
                self.evaluator.settle()  # what the wait did not finish, or carry it
                images += rec["samples"]
                if not np.isfinite(self.z).all():
                    raise self._diverged(k, "the consensus model z is not finite", "all")
                if ctl.early_agreed:      # run.early_stop: this block is the last
                    ctl.end_at(k + 1)
                last = k + 1 == ctl.total
                if self.is_master:
                    self.master.report_block(k, p, b, rec, last)
                self._watch_deadline(rec["wall_s"], last)
                self._maybe_checkpoint(k, last)
                ctl.block_ended(clock.lap())   # block end to block end: the watchdog's
                if ctl.early_agreed:
                    break
                if ctl.stop_agreed and not last:
                    self._end_timeline()
                    raise Preempted(f"stopped by {ctl.stop_reason} after block {k}; "
                                    f"checkpoint {ckpt.ckpt_dir(self.run_dir, k)} written; "
                                    f"run the same command again to resume")
            self._end_timeline()
            tail_s = clock.tail()        # after the last block
        finally:
            np.seterr(**err_old)
            self.tl.close()
            lifecycle.restore_handlers(old)
            self.master.close()
            self.workers.close()
        self.summary = self.master.finish(
            t_start, cpu_start, calls0, bytes0, images,
            {"startup_s": startup_s, "startup_parts": self.startup_parts, "tail_s": tail_s})
        return self.summary

    def _watch_deadline(self, wall_s, last):
        """The time limit (the master's clock): a stop at the next block's
        flags, with room for a checkpoint."""
        ctl = self.control
        if ctl.deadline is not None and not (last or ctl.stop_requested):
            if ctl.deadline.due(wall_s, self.log):
                ctl.request_stop(f"the time limit ({ctl.deadline.source})")

    def _end_timeline(self):
        """The run's last collective (Checkpointer.final_sync); with
        run.timeline every rank closes its file before it, so the master
        merges complete files after it, also across nodes on NFS
        (close-to-open)."""
        self.tl.close()
        self.ckpt.final_sync(self._manifest)
        self.master.merge_timeline()

    def _maybe_checkpoint(self, k, last):
        every = self.cfg["run"]["checkpoint_every"] or self.sched.blocks_per_pass
        if (k + 1) % every == 0 or last or self.control.stop_agreed:
            if last or self.control.stop_agreed:     # (else its manifest waits for it)
                self.evaluator.finish()
            tc = time.perf_counter()
            self.ckpt.write(k)
            t1 = time.perf_counter()
            self.control.checkpoint_took(t1 - tc)
            self.tl.span("checkpoint", tc, t1, self._lane, block=k)
        self.tl.flush()

