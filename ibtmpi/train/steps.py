"""One block on this rank's workers (its Allreduce: exchange.py).

``block_algo``: every local worker loads its split, starts from the
algorithm's start point, runs its local steps with the algorithm's extra
gradient, packs its contribution, timings and memory into the packet;
then ONE Allreduce and the replicated consensus update on every rank.
``block_ssgd``: the per-step reference, a gradient Allreduce per
minibatch. ``warmup``: ssgd steps before block 0. Several simulated
workers in one process share one model and one optimizer: each worker's
optimizer state is swapped in and out through the optimizer's
``state()/load()``.
A mixin of train.trainer.Trainer (it reads the wiring the trainer sets up:
model, opt, cons, packet, exchange, control, loaders, sched, timeline).
Tests: tests/unit/test_trainer.py (the simulator), tests/mpi/test_trainer_mpi.py.
"""
from __future__ import annotations

import math
import sys
import time

import numpy as np

from .. import checkpoint as ckpt
from .. import comm as mpi
from .. import memory
from ..errors import Diverged
from .packet import FLAG_CKPT, FLAG_EARLY, FLAG_NONFINITE, FLAG_STOP


class BlockSteps:
    def _run_steps(self, mbs, feed=None):
        # on a GPU the loss and correct count stay on the device (no host
        # sync per step) and are read once, here at the end of the block;
        # with a feed (gpu_feed) the minibatches' copies run on their own
        # stream and each step waits only for its own
        stats = self.model.new_stats(self.cfg["data"]["batch"])
        n = 0
        if feed is not None:
            wait = self.dev.cp.cuda.get_current_stream().wait_event
            items = feed.upload(mbs)
        else:
            items = [(mb[0], mb[1], mb[2] if len(mb) > 2 else None, None) for mb in mbs]
        for x, y, ids, ev in items:
            if len(y) == 0:
                continue
            if ev is not None:
                wait(ev)
            self.model.step_grad(x, y, stats, ids)
            self.opt.step(self.model.grads)
            n += len(y)
        if feed is not None:
            feed.consumed(mbs)
        loss_sum, correct = self.model.read_stats(stats)
        return loss_sum, n, correct

    def _swap_in(self, i):
        # several simulated workers share one optimizer: swap their state
        if len(self.local) > 1:
            self.opt.load(self.opt_states[i])

    def _swap_out(self, i):
        if len(self.local) > 1:
            for k, buf in self.opt.state().items():
                self.opt_states[i][k][...] = self._host(buf)

    def _put_memory(self, i):
        """Worker i's memory high-water marks into its slots of the block's
        Allreduce (memory.py): this process's peak RSS, its CuPy pool."""
        self.packet.put("rss", i, memory.peak_rss_mib())
        if self.dev is not None:
            graphs = self.model.graphs
            held = self.dev.pool_bytes() + (graphs.pool_bytes() if graphs else 0)
            self.packet.put("pool", i, held / memory.MIB)

    def _block_algo(self, k, work):
        p, b = self.sched.locate(k)
        pk = self.packet
        pk.send.fill(0)
        vec = pk.model_out()
        tmp = np.empty(self.P, np.float32) if len(self.local) > 1 else None
        self._mark_flags(ckpt=False)
        for i in self.local:
            t0 = time.perf_counter()
            mbs = self.loaders[i].block(p, b)
            t1, c1 = time.perf_counter(), time.process_time()
            self.tl.span("data", t0, t1, 1 + i, block=k)
            self.control.enter("compute")
            self.control.faults.compute(self.rank, k)
            self.model.set_dropout_seed([self.cfg["data"]["seed"], k, i])
            self._swap_in(i)
            self.model.load_buffers(self.zbuf)   # every worker starts from the agreed ones
            if self.opt.reset_on_sync:           # optim.reset_state (optim.base)
                self.opt.reset()
            ws = self.states[i]
            # stage: the worker's w has a host image (pinned) unless the
            # consensus state lives on the same device as w
            stage = self.dev is not None and not self.device_state
            wh = self._w_host if stage else self.model.params
            self.cons.worker_begin(ws, wh)
            if stage:
                self.dev.to_device(wh, self.model.params)
            self.opt.extra_grad = self.cons.extra_grad(
                ws, to_device=self.dev.asarray if stage else None)
            staged = getattr(mbs, "slot", None) is not None   # through gpu_feed
            loss_sum, cnt, corr = self._run_steps(mbs, self.feeds[i] if staged else None)
            if stage:
                self.dev.to_host(self.model.params, wh)
            if self.control.faults.hit(self.rank, k, "nan"):
                loss_sum = float("nan")            # injected divergence (tests)
                wh[0] = np.nan
            out = tmp if tmp is not None else vec
            q = self.cons.contribution(ws, wh, out)
            self.model.buffer_moments(pk.out("buffers"))
            if tmp is not None:
                vec += tmp
            self._swap_out(i)
            t2, c2 = time.perf_counter(), time.process_time()
            self.tl.span("compute", t1, t2, 1 + i, block=k, cpu_s=round(c2 - c1, 6))
            pk.add_stats(loss_sum, cnt, corr, q)
            pk.put("compute", i, t2 - t1)
            pk.put("wait", i, t1 - t0)
            pk.put("cpu", i, c2 - c1)
            self._put_memory(i)
            if not (math.isfinite(loss_sum) and math.isfinite(q)
                    and np.isfinite(out).all() and np.isfinite(pk.out("buffers")).all()):
                pk.flag(1 + i, FLAG_NONFINITE)
        # the last checkpoint's write ran while this block computed: a worker
        # waits for it now, a master of its own once the workers are there
        if self.local:
            self._flag_checkpoint()
        self.control.enter("allreduce")
        t3, c3 = time.perf_counter(), time.process_time()
        S = self.exchange.reduce(work, k, None if self.local else self._flag_checkpoint,
                                 self.writes.max_s)
        t4 = self.exchange.t_reduced       # the block's end (honest wall time)
        self.tl.span("allreduce", t3, t4, self._lane, block=k,
                     cpu_s=round(time.process_time() - c3, 6))
        self._check_flags(k)
        self._agree_buffers()
        self.cons.set_outer_scale(self.lr_at.factor(k, self.cfg["algorithm"]["outer_schedule"]))
        diag = self.cons.update(S, pk.stat("q"))
        for i in self.local:
            self.cons.worker_end(self.states[i], None)
        self.tl.span("consensus", t4, time.perf_counter(), self._lane, block=k)
        return p, b, diag

    def _agree_buffers(self):
        """After the block's Allreduce: the buffers every rank sets from the
        workers' summed moments (Model.buffers_from_moments), bitwise the
        same on every rank and in the simulation."""
        if self.packet.B:
            self.sync.set_buffers(self.model.buffers_from_moments(
                self.packet.got("buffers"), self.n_workers), self.model)

    def _diverged(self, k, what, ranks):
        """Diverged for block k: what happened, which ranks, whether a good
        checkpoint is kept, and the exact command that resumes (or restarts)
        with a lower learning rate: lr and rho may change on a resume."""
        import shlex
        self.evaluator.finish()  # a checkpoint confirmed behind it gets its manifest
        done = ckpt.complete(self.run_dir)
        kept = (f"the last good checkpoint {ckpt.ckpt_dir(self.run_dir, done[-1])} is kept"
                if done else "no checkpoint was written before it (the rerun starts "
                "from block 0)")
        lr, rho = self.cfg["optim"]["lr"], self.cfg["algorithm"]["rho"]
        argv, i = [], 0                  # this command, less any optim.lr it set
        given = sys.argv[1:]
        while i < len(given):
            if (given[i] == "--set" and i + 1 < len(given)
                    and given[i + 1].startswith("optim.lr=")):
                i += 2
                continue
            argv.append(given[i])
            i += 1
        world = 1 if self.simulate else mpi.world_size()
        from ..launcher import rerun_prefix
        cmd = shlex.join(rerun_prefix(world) + argv) + f" --set optim.lr={lr / 2:g}"
        rho_hint = (f" or raise algorithm.rho (now {rho:g})" if self.A.uses_rho else "")
        err = Diverged(f"diverged at block {k} (rank(s) {ranks}): {what}; {kept}. Lower "
                       f"optim.lr (now {lr:g}){rho_hint}: a resume may change them, e.g. "
                       f"{cmd}")
        err.block, err.ranks = k, ranks
        return err

    def _my_flag_slots(self):
        return ([0] if self.is_master else []) + [1 + i for i in self.local]

    def _mark_flags(self, ckpt=True):
        """This rank's flag slots for the coming Allreduce; ckpt=False leaves
        the checkpoint's bit to _flag_checkpoint, after the compute."""
        if ckpt:
            self.writes.join()           # is the last checkpoint's file complete?
        fl = self.packet.out("flags")
        for j in self._my_flag_slots():
            v = 0
            if self.control.stop_requested:
                v |= FLAG_STOP
            if ckpt and self.writes.pending is not None:
                v |= FLAG_CKPT
            early = self.evaluator.history.early   # the master's decision (None elsewhere)
            if early is not None and self.control.block >= early[0]:
                v |= FLAG_EARLY
            fl[j] = v

    def _flag_checkpoint(self):
        """Right before the block's Allreduce: wait for the last checkpoint's
        write (it ran while this block computed) and say it is complete."""
        self.writes.join()
        if self.writes.pending is not None:
            fl = self.packet.out("flags")
            for j in self._my_flag_slots():
                fl[j] += FLAG_CKPT

    def _check_flags(self, k):
        f = self.packet.rflags()
        # confirm the previous checkpoint first: it was good when written
        if self.writes.pending is not None:
            done = self.writes.settle((f & FLAG_CKPT).all())
            if done is not None and self.is_master:
                self._manifest(done)
        bad = [j - 1 for j in range(1, len(f)) if f[j] & FLAG_NONFINITE]
        if bad:
            ranks = [b + 1 for b in bad] if (mpi.world_size() > 1 and not self.simulate) else [0]
            raise self._diverged(k, f"non-finite loss or model on worker(s) {bad}", ranks)
        self.control.agree(stop=(f & FLAG_STOP).any(), early=(f & FLAG_EARLY).any())

    def _block_ssgd(self, k, work):
        """Horovod-style: one fused Allreduce of the gradients per minibatch."""
        p, b = self.sched.locate(k)
        n, pk = self.n_workers, self.packet
        steps = self.sched.steps_in_block(b)
        data = {}
        t_data = {}
        for i in self.local:
            t0 = time.perf_counter()
            data[i] = self.loaders[i].block(p, b)
            t1 = time.perf_counter()
            t_data[i] = t1 - t0
            self.tl.span("data", t0, t1, 1 + i, block=k)
        s0 = pk.slots["stats"].start
        tot = np.zeros(pk.flags0 - s0, np.float64)       # stats and timings
        w0 = self.model.params
        gsum = pk.model_out()
        self.control.enter("compute")
        for s in range(steps):
            # ssgd: each step is a synchronous update, the schedule runs per step
            self.opt.lr = self.lr_at(k, s / steps, 1.0 / steps)
            pk.send.fill(0)
            gsum.fill(0)
            self._mark_flags()
            for i in self.local:
                t0, c0 = time.perf_counter(), time.process_time()
                x, y = data[i][s]
                self.model.load_buffers(self.zbuf)
                if len(y):
                    loss, c = self.model.loss_and_grad(x, y)
                    g = self.model.grads
                    gsum += g if self.device_state else self._host(g)
                    pk.add_stats(loss * len(y), len(y), c)
                self.model.buffer_moments(pk.out("buffers"))
                t1, c1 = time.perf_counter(), time.process_time()
                pk.add("compute", i, t1 - t0)
                pk.add("cpu", i, c1 - c0)
                self.tl.span("compute", t0, t1, 1 + i, block=k, step=s,
                             cpu_s=round(c1 - c0, 6))
                if s == 0:
                    pk.put("wait", i, t_data[i])
                if s == steps - 1:        # high-water marks: summed over steps once
                    self._put_memory(i)
                if len(y) and not math.isfinite(loss):
                    pk.flag(1 + i, FLAG_NONFINITE)
            self.control.enter("allreduce")
            t0, c0 = time.perf_counter(), time.process_time()
            S = self.exchange.reduce(work, k, write_s=self.writes.max_s)
            t1 = self.exchange.t_reduced        # the last step's: the block's end
            self.tl.span("allreduce", t0, t1, self._lane, block=k, step=s,
                         cpu_s=round(time.process_time() - c0, 6))
            self._check_flags(k)
            self._agree_buffers()
            g = S * np.float32(1.0 / n)
            # same averaged gradient on every rank
            self.opt.step(g if self.device_state else self._dev(g))
            tot += pk.recv[s0:pk.flags0]
        self.z[...] = self._host(w0)
        pk.recv[s0:pk.flags0] = tot
        return p, b, {"primal": 0.0, "dual": 0.0, "rho": 0.0,
                      "lr": self.lr_at(k, 0.0, 1.0 / steps)}     # its first step's

    def _warmup(self, steps):
        """`steps` ssgd steps (gradient Allreduce per step) on each worker's
        first minibatches of pass 0; every rank applies the same averaged
        gradient, so all end at the same model; the consensus restarts there."""
        P, n, pk = self.P, self.n_workers, self.packet
        mbs = {i: self.loaders[i].load(0, 0) for i in self.local}
        for s in range(steps):
            pk.send.fill(0)
            for i in self.local:
                x, y, *ids = mbs[i][s % len(mbs[i])]
                self.model.load_buffers(self.zbuf)
                if len(y):
                    self.model.loss_and_grad(x, y, *ids)
                    pk.send[:P] += self._host(self.model.grads)
                self.model.buffer_moments(pk.out("buffers"))
            mpi.allreduce_sum(pk.send, pk.recv, self.comm)
            self._agree_buffers()
            self.opt.step(self._dev(pk.recv[:P] * np.float32(1.0 / n)))
        self.opt.reset()
        self.sync.restart(self._new_consensus())
        self.log(f"warm-up: {steps} gradient-allreduce steps before block 0")
