"""How this rank's workers train between syncs, one class per kind of sync,
chosen once by the trainer (the algorithm's ``per_step``):

``BlockSync``: every local worker loads its split, starts from the
algorithm's start point, runs its local steps with the algorithm's extra
gradient, packs its contribution, timings and memory into the packet;
then ONE Allreduce (exchange.py) and the replicated consensus update on
every rank. It owns the algorithm's per-worker state (duals, easgd's own
model). ``StepSync``: the per-step reference (ssgd), a gradient Allreduce
per minibatch; z is its host copy of the model.
Each says what of its state a checkpoint keeps (``master_spec``,
``rank_spec``, ``rank_arrays``) and loads it back (``load``,
``load_reshaped``, ``start_from``), so the checkpointer names no algorithm.
Tests: tests/unit/test_trainer.py (the simulator), tests/unit/test_workers.py,
tests/mpi/test_trainer_mpi.py.
"""
from __future__ import annotations

import math
import sys
import time

import numpy as np

from .. import checkpoint as ckpt
from .. import comm as mpi
from .. import timeline
from ..errors import Diverged
from .packet import FLAG_NONFINITE


class _Sync:
    """What both kinds share: the parts they are built from."""

    def __init__(self, workers, sync, packet, exchange, flags, control, sched, lr_at, *,
                 n_workers, lane, host, device_state, writes):
        self.workers, self.sync, self.packet = workers, sync, packet
        self.exchange, self.flags, self.control = exchange, flags, control
        self.sched, self.lr_at, self.n_workers = sched, lr_at, n_workers
        self.lane, self.host, self.device_state, self.writes = lane, host, device_state, writes
        self.tl = timeline.Off()         # run.timeline: set once the job's segment is known

    def trace(self, tl):
        self.tl = tl

    def agree_buffers(self):
        """After the block's Allreduce: the buffers every rank sets from the
        workers' summed moments (Model.buffers_from_moments), bitwise the
        same on every rank and in the simulation."""
        if self.packet.B:
            m = self.workers.model
            self.sync.set_buffers(m.buffers_from_moments(self.packet.got("buffers"),
                                                         self.n_workers), m)

    def _load_model(self, params):
        self.workers.model.params[...] = self.workers.to_dev(params)


class BlockSync(_Sync):
    """Block methods (every algorithm but ssgd): ONE Allreduce per block.
    zeros: the allocator of the per-worker state (the consensus state's
    device's); seed: data.seed (dropout's per-block seeds); outer_schedule:
    algorithm.outer_schedule; new_consensus: () -> a consensus object from
    the model's parameters (after the warm-up)."""

    per_step = False
    carried = ("the consensus model z and its outer state (block momentum, start point), "
               "BatchNorm's statistics, the learning-rate schedule's position")
    fresh = "each worker's dual and local optimizer state start at zero"

    def __init__(self, *a, zeros, seed, outer_schedule, new_consensus, comm, log, **kw):
        super().__init__(*a, **kw)
        self.seed, self.outer_schedule = seed, outer_schedule
        self.new_consensus, self.comm, self.log = new_consensus, comm, log
        m = self.workers.model
        self.states = {i: self.sync.cons.new_worker(m.size, m.dtype, zeros)
                       for i in self.workers.local}

    def block(self, k, work):
        """Block k on this rank's workers, its Allreduce (the master does
        `work` while it waits) and the consensus update: (pass, block of
        the pass, the update's diagnostics)."""
        p, b = self.sched.locate(k)
        pk, wg, cons = self.packet, self.workers, self.sync.cons
        pk.send.fill(0)
        vec = pk.model_out()
        tmp = np.empty(wg.model.size, np.float32) if len(wg.local) > 1 else None
        self.flags.mark(ckpt=False)
        for i in wg.local:
            out = tmp if tmp is not None else vec
            self._worker(k, p, b, i, out)
            if tmp is not None:
                vec += tmp
        # the last checkpoint's write ran while this block computed: a worker
        # waits for it now, a master of its own once the workers are there
        if wg.local:
            self.flags.checkpoint_written()
        self.control.enter("allreduce")
        t3, c3 = time.perf_counter(), time.process_time()
        S = self.exchange.reduce(work, k, None if wg.local else self.flags.checkpoint_written,
                                 self.writes.max_s)
        t4 = self.exchange.t_reduced       # the block's end (honest wall time)
        self.tl.span("allreduce", t3, t4, self.lane, block=k,
                     cpu_s=round(time.process_time() - c3, 6))
        self.flags.check(k)
        self.agree_buffers()
        cons.set_outer_scale(self.lr_at.factor(k, self.outer_schedule))
        diag = cons.update(S, pk.stat("q"))
        # the overshoot guard (consensus/outer.py): the block's loss, every rank alike
        over = cons.observe(pk.stat("loss_sum") / max(pk.stat("samples"), 1), k, self.lr_at.warm)
        if over is not None:
            diag["overshoot"] = over
        for i in wg.local:
            cons.worker_end(self.states[i], None)
        self.tl.span("consensus", t4, time.perf_counter(), self.lane, block=k)
        return p, b, diag

    def _worker(self, k, p, b, i, out):
        """Worker i's part of block k: its steps from the start point, its
        contribution into `out`, its stats, times and flags into the packet."""
        pk, wg, cons, ctl = self.packet, self.workers, self.sync.cons, self.control
        t0 = time.perf_counter()
        mbs = wg.loaders[i].block(p, b)
        t1, c1 = time.perf_counter(), time.process_time()
        self.tl.span("data", t0, t1, 1 + i, block=k)
        ctl.enter("compute")
        ctl.faults.compute(ctl.rank, k)
        wg.model.set_dropout_seed([self.seed, k, i])
        wg.swap_in(i)
        wg.model.load_buffers(self.sync.zbuf)   # every worker starts from the agreed ones
        if wg.opt.reset_on_sync:                 # optim.reset_state (optim.base)
            wg.opt.reset()
        ws = self.states[i]
        # the worker's w has a host image (pinned) unless the consensus
        # state lives on the same device as w
        wh = wg.w_host if wg.stage else wg.model.params
        cons.worker_begin(ws, wh)
        if wg.stage:
            wg.dev.to_device(wh, wg.model.params)
        wg.opt.extra_grad = cons.extra_grad(ws, to_device=wg.dev.asarray if wg.stage else None)
        staged = getattr(mbs, "slot", None) is not None   # through gpu_feed
        loss_sum, cnt, corr = wg.run_steps(mbs, wg.feeds[i] if staged else None)
        if wg.stage:
            wg.dev.to_host(wg.model.params, wh)
        if ctl.faults.hit(ctl.rank, k, "nan"):
            loss_sum = float("nan")              # injected divergence (tests)
            wh[0] = np.nan
        q = cons.contribution(ws, wh, out)
        wg.model.buffer_moments(pk.out("buffers"))
        wg.swap_out(i)
        t2, c2 = time.perf_counter(), time.process_time()
        self.tl.span("compute", t1, t2, 1 + i, block=k, cpu_s=round(c2 - c1, 6))
        pk.add_stats(loss_sum, cnt, corr, q)
        pk.put("compute", i, t2 - t1)
        pk.put("wait", i, t1 - t0)
        pk.put("cpu", i, c2 - c1)
        wg.memory_into(pk, i)
        if not (math.isfinite(loss_sum) and math.isfinite(q)
                and np.isfinite(out).all() and np.isfinite(pk.out("buffers")).all()):
            pk.flag(1 + i, FLAG_NONFINITE)

    def warm_up(self, steps):
        """algorithm.warmup_steps: `steps` ssgd steps (a gradient Allreduce
        each) on each worker's first minibatches of pass 0; every rank
        applies the same averaged gradient, so all end at the same model;
        the consensus restarts there."""
        pk, wg, n = self.packet, self.workers, self.n_workers
        P = wg.model.size
        mbs = {i: wg.loaders[i].load(0, 0) for i in wg.local}
        for s in range(steps):
            pk.send.fill(0)
            for i in wg.local:
                x, y, *ids = mbs[i][s % len(mbs[i])]
                wg.model.load_buffers(self.sync.zbuf)
                if len(y):
                    wg.model.loss_and_grad(x, y, *ids)
                    pk.send[:P] += self.host(wg.model.grads)
                wg.model.buffer_moments(pk.out("buffers"))
            mpi.allreduce_sum(pk.send, pk.recv, self.comm)
            self.agree_buffers()
            wg.opt.step(wg.to_dev(pk.recv[:P] * np.float32(1.0 / n)))
        wg.opt.reset()
        self.sync.restart(self.new_consensus())
        self.log(f"warm-up: {steps} gradient-allreduce steps before block 0")

    # -- what a checkpoint keeps ------------------------------------------------
    def master_spec(self):
        """{name: (shape, dtype)} of the state the master's file keeps for
        every rank (the consensus object's)."""
        return self.sync.cons.state_spec()

    def master_arrays(self):
        return {k: self.host(v) for k, v in self.sync.cons.state().items()}

    def rank_spec(self):
        """This rank's own state: each local worker's, named <key>_<worker>."""
        cons, opt = self.sync.cons, self.workers.opt
        spec = {}
        for i in self.workers.local:
            spec.update({f"{k}_{i}": v for k, v in cons.worker_spec().items()})
            spec.update({f"{k}_{i}": v for k, v in opt.state_spec().items()})
        return spec

    def rank_arrays(self):
        cons, a = self.sync.cons, {}
        for i in self.workers.local:
            a.update({f"{k}_{i}": self.host(v)
                      for k, v in cons.worker_state(self.states[i]).items()})
            a.update({f"{k}_{i}": v for k, v in self.workers.opt_state(i).items()})
        return a

    def load(self, master, mine, put):
        """From a checkpoint: the master file's consensus state (`master`:
        read as master_spec says) and this rank's own (`mine`)."""
        cons, wg = self.sync.cons, self.workers
        cons.load(master, put)
        new = wg.to_dev if self.device_state else (lambda a: a.copy())
        keys = list(wg.opt.state_spec())
        for i in wg.local:
            cons.worker_load(self.states[i], {k: mine[f"{k}_{i}"]
                                              for k in cons.worker_spec()}, new)
            wg.load_opt_state(i, {k: mine[f"{k}_{i}"] for k in keys})

    def reshaped_spec(self):
        """What a checkpoint of another worker count gives, from its master's
        file."""
        return self.master_spec()

    def load_reshaped(self, master, put):
        """From another worker count's checkpoint: what is per model; the
        duals (and their sum) start afresh."""
        self.sync.cons.load(master, put)
        U = getattr(self.sync.cons, "U", None)
        if U is not None:
            U.fill(0)

    def start_from(self, z):
        """model.init: every worker and z start at z (host float32)."""
        self._load_model(z)
        self.sync.restart(self.new_consensus())

    def set_rho(self, rho):
        """A resume changed algorithm.rho: the scaled duals follow it."""
        self.sync.cons.set_rho(rho, [self.states[i] for i in self.workers.local])


class StepSync(_Sync):
    """ssgd, Horovod-style: one fused Allreduce of the gradients per
    minibatch; every rank applies the same averaged gradient, and z is its
    host copy of the model after each block."""

    per_step = True
    carried = ("the model and its optimizer state, BatchNorm's statistics, the "
               "learning-rate schedule's position")
    fresh = "nothing is per worker"

    def block(self, k, work):
        p, b = self.sched.locate(k)
        n, pk, wg = self.n_workers, self.packet, self.workers
        steps = self.sched.steps_in_block(b)
        data, t_data = {}, {}
        for i in wg.local:
            t0 = time.perf_counter()
            data[i] = wg.loaders[i].block(p, b)
            t1 = time.perf_counter()
            t_data[i] = t1 - t0
            self.tl.span("data", t0, t1, 1 + i, block=k)
        s0 = pk.slots["stats"].start
        tot = np.zeros(pk.flags0 - s0, np.float64)       # stats and timings
        w0 = wg.model.params
        gsum = pk.model_out()
        self.control.enter("compute")
        for s in range(steps):
            # each step is a synchronous update: the schedule runs per step
            wg.opt.lr = self.lr_at(k, s / steps, 1.0 / steps)
            pk.send.fill(0)
            gsum.fill(0)
            self.flags.mark()
            for i in wg.local:
                self._step(k, s, steps, i, data[i][s], gsum,
                           t_data[i] if s == 0 else None)
            self.control.enter("allreduce")
            t0, c0 = time.perf_counter(), time.process_time()
            S = self.exchange.reduce(work, k, write_s=self.writes.max_s)
            t1 = self.exchange.t_reduced        # the last step's: the block's end
            self.tl.span("allreduce", t0, t1, self.lane, block=k, step=s,
                         cpu_s=round(time.process_time() - c0, 6))
            self.flags.check(k)
            self.agree_buffers()
            g = S * np.float32(1.0 / n)
            # same averaged gradient on every rank
            wg.opt.step(g if self.device_state else wg.to_dev(g))
            tot += pk.recv[s0:pk.flags0]
        self.sync.z[...] = self.host(w0)
        pk.recv[s0:pk.flags0] = tot
        return p, b, {"primal": 0.0, "dual": 0.0, "rho": 0.0,
                      "lr": self.lr_at(k, 0.0, 1.0 / steps)}     # its first step's

    def _step(self, k, s, steps, i, xy, gsum, t_data):
        """Worker i's gradient of step s into gsum; its stats and times."""
        pk, wg = self.packet, self.workers
        t0, c0 = time.perf_counter(), time.process_time()
        x, y = xy
        wg.model.load_buffers(self.sync.zbuf)
        loss = 0.0
        if len(y):
            loss, c = wg.model.loss_and_grad(x, y)
            g = wg.model.grads
            gsum += g if self.device_state else self.host(g)
            pk.add_stats(loss * len(y), len(y), c)
        wg.model.buffer_moments(pk.out("buffers"))
        t1, c1 = time.perf_counter(), time.process_time()
        pk.add("compute", i, t1 - t0)
        pk.add("cpu", i, c1 - c0)
        self.tl.span("compute", t0, t1, 1 + i, block=k, step=s, cpu_s=round(c1 - c0, 6))
        if t_data is not None:
            pk.put("wait", i, t_data)
        if s == steps - 1:        # high-water marks: summed over steps once
            wg.memory_into(pk, i)
        if len(y) and not math.isfinite(loss):
            pk.flag(1 + i, FLAG_NONFINITE)

    def warm_up(self, steps):
        """ssgd has no consensus to warm up (algorithm.warmup_steps is a
        block method's)."""

    def master_spec(self):
        return {}

    def master_arrays(self):
        return {}

    def rank_spec(self):
        """The model and its optimizer state: the same on every rank."""
        spec = {"params": ((self.workers.model.size,), np.float32)}
        spec.update({f"opt_{k}": v for k, v in self.workers.opt.state_spec().items()})
        return spec

    def rank_arrays(self):
        wg = self.workers
        a = {"params": self.host(wg.model.params)}
        a.update({f"opt_{k}": self.host(v) for k, v in wg.opt.state().items()})
        return a

    def load(self, master, mine, put):
        wg = self.workers
        self._load_model(mine["params"])
        wg.opt.load({k: mine[f"opt_{k}"] for k in wg.opt.state_spec()})
        self.sync.z[...] = mine["params"]

    def reshaped_spec(self):
        return self.rank_spec()

    def load_reshaped(self, master, put):
        self.load(None, master, put)

    def start_from(self, z):
        self._load_model(z)
        self.sync.z[...] = z

    def set_rho(self, rho):
        pass


def diverged(k, what, ranks, *, run_dir, lr, rho, uses_rho, world):
    """Diverged for block k: what happened, which ranks, whether a good
    checkpoint is kept, and the exact command that resumes (or restarts)
    with a lower learning rate: lr and rho may change on a resume."""
    import shlex
    done = ckpt.complete(run_dir)
    kept = (f"the last good checkpoint {ckpt.ckpt_dir(run_dir, done[-1])} is kept"
            if done else "no checkpoint was written before it (the rerun starts "
            "from block 0)")
    argv, i = [], 0                  # this command, less any optim.lr it set
    given = sys.argv[1:]
    while i < len(given):
        if (given[i] == "--set" and i + 1 < len(given)
                and given[i + 1].startswith("optim.lr=")):
            i += 2
            continue
        argv.append(given[i])
        i += 1
    from ..launcher import rerun_prefix
    cmd = shlex.join(rerun_prefix(world) + argv) + f" --set optim.lr={lr / 2:g}"
    rho_hint = f" or raise algorithm.rho (now {rho:g})" if uses_rho else ""
    err = Diverged(f"diverged at block {k} (rank(s) {ranks}): {what}; {kept}. Lower "
                   f"optim.lr (now {lr:g}){rho_hint}: a resume may change them, e.g. "
                   f"{cmd}")
    err.block, err.ranks = k, ranks
    return err
