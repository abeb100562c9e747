"""The training driver: roles, the block loop, evaluation, metrics.

World size N+1 under MPI: rank 0 is the master (holds z, evaluates, logs,
writes the run directory, contributes zeros to the Allreduce), ranks 1..N
are workers. A single process is worker 0 and master at once (the N = 1
SGD baseline, same code path). ``run.simulate = N`` runs N logical workers
in one process: the same per-worker code, their packed buffers summed in
rank order instead of by MPI.

Per block: ONE packed Allreduce (``ssgd``: one per minibatch) of
  [ S (P) | loss_sum, samples, correct, sum ||w_i - z_s||^2, 2 reserved |
    compute s (N slots) | data-wait s (N slots) | compute CPU s (N slots) |
    flags (master + N workers) ]
flags: 1 stop requested (signal), 2 non-finite, 4 checkpoint file written.
float32, then every rank applies the same consensus update.
Tests: tests/unit/test_trainer.py (simulator), tests/mpi/test_trainer_mpi.py.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import time

import numpy as np

from . import checkpoint as ckpt
from . import comm as mpi
from . import memory, runlock
from .monitor import (Progress, Starved, Stragglers, oversubscription_text,
                      placement_text)
from .status import eval_rank, ranges
from .config import DEFAULTS, ConfigError, digest
from .consensus import Consensus, WorkerState
from .dataset import Dataset
from .loader import WorkerData
from .model import Model
from .optim import SGD, LrSchedule
from .schedule import Schedule, split_size_for
from . import timeline

NS = 6                      # scalar slots: loss_sum, n, correct, q, (2 reserved)
FLAG_STOP, FLAG_NONFINITE, FLAG_CKPT, FLAG_EARLY = 1, 2, 4, 8
EXIT_PREEMPTED = 75         # checkpointed after SIGTERM/SIGUSR1: resubmit to resume
EXIT_DIVERGED = 4
BEST = "model-best.npz"
LR_KEYS = ("schedule", "milestones", "gamma", "decay_passes", "final_ratio",
           "warmup_passes")
TIME_MARGIN_S = 30.0        # kept free before a time limit, besides 2 blocks + a
                            # checkpoint (at most 5% of the time the run was given)


class Preempted(Exception):
    """All ranks agreed to stop after a signal; a checkpoint was written."""


class Diverged(Exception):
    """Non-finite loss or model; the last good checkpoint is kept."""


class WatchdogTimeout(RuntimeError):
    """A block ran past run.watchdog_s; names the ranks that had not arrived."""


class InjectedFault(RuntimeError):
    """Raised by IBTMPI_FAULT=rank:block:phase (tests of fail-fast)."""


class Trainer:
    def __init__(self, cfg, log=print, device_ops=None, gpu_buffers=False):
        """device_ops: a backend.GpuOps for the workers' compute (the master,
        which has no worker, always stays on the host). gpu_buffers (from
        backend.resolve_cuda_aware; real MPI runs with a GPU worker only):
        the worker hands its device buffer to a CUDA-aware Allreduce;
        otherwise that buffer is staged through pinned host memory. A GPU
        worker under MPI keeps its consensus state on the GPU either way
        (device_state)."""
        self.t_created = time.time()     # older error files are an earlier job's
        self._leaked = []                # IBTMPI_FAULT=rank:block:leak (tests)
        self.cfg = cfg
        self.log = log
        d, r, a = cfg["data"], cfg["run"], cfg["algorithm"]
        self.algo = a["name"]
        size, rank = mpi.world_size(), mpi.world_rank()
        self.simulate = int(r["simulate"])
        self.comm = None
        if self.simulate:                 # one process, whatever the world is
            size, rank = 1, 0
            self.comm = mpi.self_comm()
        if self.simulate:
            self.n_workers, self.local = self.simulate, list(range(self.simulate))
        elif size == 1:
            self.n_workers, self.local = 1, [0]
        else:
            self.n_workers = size - 1
            self.local = [] if rank == 0 else [rank - 1]
        self.rank = rank
        self.is_master = rank == 0
        n = self.n_workers
        if self.algo == "sgd" and n != 1:
            how = (f"this is --simulate {self.simulate}: drop it" if self.simulate else
                   f"this job has {n} workers: run it without mpiexec (or with -n 1)")
            raise ValueError(f"algorithm 'sgd' is the single-worker baseline; {how}, or "
                             f"pick a parallel algorithm (ssgd, ma, admm, bmuf, ibt, easgd)")
        self.ds = Dataset(d["path"])
        if r["early_stop"] and "val" not in self.ds.splits:
            raise ConfigError(f"run.early_stop needs a val split; {d['path']} has "
                              f"{', '.join(self.ds.splits)}")
        tr = self.ds.split("train")
        split = split_size_for(d["block_size"] or None,
                               d["split_size"] or (None if d["block_size"] else 512), n)
        self.sched = Schedule(tr.n, n, split, d["batch"], d["seed"])
        h, w, c = self.ds.image_shape
        # Workers compute on the device when one is given. A GPU worker under
        # MPI keeps its consensus state (z, its dual) and the block's packed
        # buffer on its GPU (device_state) and updates z there; the MPI
        # library gets that buffer itself where it is CUDA-aware
        # (gpu_buffers), else a pinned host copy (P floats down and P up a
        # block). The master's state is on the host, and so is that of
        # simulated or single-process GPU workers (their w is staged through
        # a pinned host image); z is bitwise equal everywhere
        # (consensus.Consensus). Where a GPU worker's consensus was on the
        # host, the update's NumPy passes over P floats took as long as the
        # block's compute (the H200 check: 64-79 ms against 53-58 ms).
        self.dev = device_ops if self.local else None
        self.device_state = bool(self.dev is not None and not self.simulate and size > 1)
        self.gpu_buffers = bool(gpu_buffers and self.device_state)
        self.model = Model(cfg["model"]["layers"], (c, h, w), self.ds.n_classes,
                           seed=cfg["model"]["seed"], ops=self.dev)
        o = cfg["optim"]
        self.opt = SGD(self.model.params, o["lr"], o["momentum"], o["weight_decay"],
                       o["nesterov"], ops=self.dev)
        P = self.model.size
        self.P = P
        pinned = self.dev is not None and not self.gpu_buffers
        host_empty = self.dev.pinned_empty if pinned else (lambda m: np.empty(m, np.float32))
        # host image of a worker's w, where its consensus state is on the host
        self._w_host = (host_empty(P) if self.dev is not None and not self.device_state
                        else None)
        self.cons = None if self.algo == "ssgd" else self._new_consensus()
        zeros = self.dev.cp.zeros if self.device_state else np.zeros
        self.states = {i: WorkerState(P, self.model.dtype, self.algo, zeros)
                       for i in self.local}
        self.velocity = {i: np.zeros(P, self.model.dtype) for i in self.local}
        self.loaders = {i: WorkerData(tr, self.sched, i, self.ds.mean, self.ds.std,
                                      d["augment"], d["seed"], d["cache"])
                        for i in self.local}
        # per worker: compute s, data wait s, compute CPU s, peak RSS MiB,
        # GPU pool MiB (memory.py); then the flag slots [master, worker 0..N-1]
        self.F0 = P + NS + 5 * n
        L = self.F0 + 1 + n
        self.send, self.recv = host_empty(L), host_empty(L)   # pinned: one DMA each way
        self.send.fill(0)
        self.recv.fill(0)
        if self.device_state:            # the block's packed buffer on the GPU
            self._send_d = self.dev.cp.zeros(L, np.float32)
            self._recv_d = self.dev.cp.zeros(L, np.float32)
        self.total_blocks = max(1, math.ceil(r["passes"] * self.sched.blocks_per_pass))
        self.lr_at = LrSchedule(o, self.sched.blocks_per_pass, r["passes"])
        self.z = (np.array(self._host(self.model.params)) if self.algo == "ssgd"
                  else self.cons.z)
        self.val = self.test = None
        if self.is_master:
            for name in ("val", "test"):
                if name in self.ds.splits:
                    sp = self.ds.split(name)
                    setattr(self, name, (sp.read_all(), sp.labels))
            self.eval_model = Model(cfg["model"]["layers"], (c, h, w),
                                    self.ds.n_classes)
        self.metrics_f = None
        self.history = []
        self.best = None                 # master: the best evaluation so far
        self.ref = None                  # master: early stop's reference evaluation
        self.since_ref = 0               # master: evaluations since then
        self.block, self.phase = -1, "setup"
        self.stop_requested = False
        self.stop_agreed = False
        self.early = None                # master: (block, reason) of run.early_stop
        self.early_agreed = False        # every rank: stop after this block
        self.tl = timeline.Off()         # run.timeline: this rank's trace events
        self._lane = 0 if self.is_master or not self.local else 1 + self.local[0]
        self.stop_reason = "a signal"
        # only the master watches the clock; the flags carry its stop to all
        self.deadline, self.deadline_src = (resolve_deadline(r["time_limit"])
                                            if rank == 0 else (None, ""))
        self._margin = (min(TIME_MARGIN_S, 0.05 * max(self.deadline - time.time(), 0.0))
                        if self.deadline is not None else 0.0)
        self._ckpt_s = 0.0               # longest checkpoint write seen (master)
        self._walls = []                 # recent block times (master)
        self.pending_ckpt = None         # block whose files await confirmation
        self.pending_ok = False
        self.init_note = ""              # model.init: where the start came from
        self.run_dir = r["dir"]
        self.cfg_hash = run_hash(cfg)
        self.data_fp = digest(self.ds.meta)   # what the data is, wherever it lives
        fault = os.environ.get("IBTMPI_FAULT", "")
        self.fault = None
        if fault:
            try:
                fr, fb, fp = fault.split(":")
                self.fault = (int(fr), int(fb), fp)
            except ValueError:
                raise ValueError(f"IBTMPI_FAULT must be rank:block:phase, got {fault!r}") from None

    # -- helpers ------------------------------------------------------------
    def _new_consensus(self):
        """From the model's current parameters: on the GPU with device_state,
        else on the host."""
        a = self.cfg["algorithm"]
        if self.device_state:
            return Consensus(self.algo, self.model.params.copy(), self.n_workers, a,
                             to_host=self.dev.asnumpy)
        # on the host its passes over P floats share the rank's BLAS threads
        # (run.threads): the master's update bounds a block once GPU workers
        # compute faster than it
        from .threads import current_blas_threads
        return Consensus(self.algo, self._host(self.model.params), self.n_workers, a,
                         threads=current_blas_threads() or 1)

    def _host(self, a):
        return a if self.dev is None else self.dev.asnumpy(a)

    def _put(self, dst, src):
        """Copy host array src into dst (a host or, with device_state, a device
        array)."""
        if self.dev is None or not self.dev.on_device(dst):
            np.copyto(dst, src)
        else:
            self.dev.to_device(src, dst)

    def _dev(self, a):
        return a if self.dev is None else self.dev.asarray(a)

    def _at(self, phase):
        """Enter a phase; raise the injected fault if it targets this point."""
        self.phase = phase
        if self.fault and self.fault == (self.rank, self.block, phase):
            raise InjectedFault(f"injected fault on rank {self.rank}, block "
                                f"{self.block}, phase {phase}")

    def _flags(self):
        return self.send[self.F0:]

    def _rflags(self):
        return self.recv[self.F0:].astype(np.int64)

    def _eval_steps(self, data, params, out, batch=256):
        """Generator: evaluates params on (x, y) batch by batch, yielding in
        between, so the master can poll MPI; writes (loss, acc) into out."""
        from .serial import evaluate_steps
        np.copyto(self.eval_model.params, params)
        return evaluate_steps(self.eval_model, data[0], data[1], self.ds.mean,
                              self.ds.std, out, batch)

    def _run_steps(self, mbs):
        # on a GPU the loss and correct count stay on the device (no host
        # sync per step) and are read once, here at the end of the block
        stats = self.model.new_stats(self.cfg["data"]["batch"])
        n = 0
        for x, y in mbs:
            if len(y) == 0:
                continue
            self.model.step_grad(x, y, stats)
            self.opt.step(self.model.grads)
            n += len(y)
        loss_sum, correct = self.model.read_stats(stats)
        return loss_sum, n, correct

    def _swap_in(self, i):
        # several simulated workers share one optimizer: swap their momentum
        if len(self.local) > 1:
            self.opt.v[...] = self._dev(self.velocity[i])

    def _swap_out(self, i):
        if len(self.local) > 1:
            self.velocity[i][...] = self._host(self.opt.v)

    def _put_memory(self, i):
        """Worker i's memory high-water marks into its slots of the block's
        Allreduce (memory.py): this process's peak RSS, its CuPy pool."""
        P, n = self.P, self.n_workers
        self.send[P + NS + 3 * n + i] = memory.peak_rss_mib()
        if self.dev is not None:
            self.send[P + NS + 4 * n + i] = self.dev.pool_bytes() / memory.MIB

    # -- one block ----------------------------------------------------------
    def _block_algo(self, k, work):
        p, b = self.sched.locate(k)
        P, n = self.P, self.n_workers
        send, recv = self.send, self.recv
        send.fill(0)
        vec = self._send_d[:P] if self.device_state else send[:P]
        tmp = np.empty(P, np.float32) if len(self.local) > 1 else None
        self._mark_flags()
        for i in self.local:
            t0 = time.perf_counter()
            mbs = self.loaders[i].block(p, b)
            t1, c1 = time.perf_counter(), time.process_time()
            self.tl.span("data", t0, t1, 1 + i, block=k)
            self._at("compute")
            if self.fault and self.fault == (self.rank, k, "hang"):
                time.sleep(3600)                   # injected hang (watchdog tests)
            self.model.set_dropout_seed([self.cfg["data"]["seed"], k, i])
            self._swap_in(i)
            if self.cfg["optim"]["reset_momentum"]:
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
            loss_sum, cnt, corr = self._run_steps(mbs)
            if stage:
                self.dev.to_host(self.model.params, wh)
            if self.fault and self.fault[::2] == (self.rank, "leak") and k >= self.fault[1]:
                self._leaked.append(np.ones(2_500_000))    # injected leak: 20 MB a block
            if self.fault and self.fault == (self.rank, k, "nan"):
                loss_sum = float("nan")            # injected divergence (tests)
                wh[0] = np.nan
            out = tmp if tmp is not None else vec
            q = self.cons.contribution(ws, wh, out)
            if tmp is not None:
                vec += tmp
            self._swap_out(i)
            t2, c2 = time.perf_counter(), time.process_time()
            self.tl.span("compute", t1, t2, 1 + i, block=k, cpu_s=round(c2 - c1, 6))
            send[P:P + 4] += np.array([loss_sum, cnt, corr, q], np.float32)
            send[P + NS + i] = t2 - t1
            send[P + NS + n + i] = t1 - t0
            send[P + NS + 2 * n + i] = c2 - c1
            self._put_memory(i)
            if not (math.isfinite(loss_sum) and math.isfinite(q)
                    and np.isfinite(out).all()):
                send[self.F0 + 1 + i] += FLAG_NONFINITE
        self._at("allreduce")
        t3, c3 = time.perf_counter(), time.process_time()
        S = self._reduce_packed(work, k)
        t4 = time.perf_counter()
        self.tl.span("allreduce", t3, t4, self._lane, block=k,
                     cpu_s=round(time.process_time() - c3, 6))
        self._check_flags(k)
        diag = self.cons.update(S, float(recv[P + 3]))
        for i in self.local:
            self.cons.worker_end(self.states[i], None)
        self.tl.span("consensus", t4, time.perf_counter(), self._lane, block=k)
        return p, b, diag

    def _reduce_packed(self, work, k):
        """The block's one Allreduce of the packed buffer; returns the reduced
        S (P,). With device_state the buffer's P model floats are on the
        device. With gpu_buffers (CUDA-aware MPI) its host tail (statistics,
        timings, flags) goes up first, the stream is synchronized before MPI
        reads it, and only the reduced tail comes back; without, the P
        floats come down into the pinned host buffer, whose sum goes back
        up."""
        P = self.P
        if not self.device_state:
            self._reduce(self.send, self.recv, work, k)
            return self.recv[:P]
        if not self.gpu_buffers:
            self.dev.to_host(self._send_d[:P], self.send[:P])   # waits for the stream
            self._reduce(self.send, self.recv, work, k)
            self.dev.to_device(self.recv[:P], self._recv_d[:P])
            return self._recv_d[:P]
        self.dev.to_device(self.send[P:], self._send_d[P:])
        self.dev.synchronize()
        self._reduce(self._send_d, self._recv_d, work, k)
        self.dev.to_host(self._recv_d[P:], self.recv[P:])
        return self._recv_d[:P]

    def _reduce(self, send, recv, work, k):
        """The block's Allreduce; with run.watchdog_s the master aborts a
        block past the limit, naming the ranks that had not arrived."""
        limit = self.cfg["run"]["watchdog_s"]
        # Workers are on the critical path (they compute right after): they
        # poll on a short leash; the master sleeps longer (< 5% of a core).
        nap = 0.005 if self.is_master and not self.local else 0.0005
        if not limit or self.simulate or mpi.world_size() == 1:
            mpi.allreduce_sum(send, recv, self.comm, work=work if self.is_master else None,
                              sleep_max=nap)
            return
        if self.is_master:
            posted = mpi.post_arrivals()
            t0 = time.perf_counter()

            def watch():
                if time.perf_counter() - t0 > limit:
                    missing = mpi.missing_arrivals(posted)
                    raise WatchdogTimeout(
                        f"block {k} ran past run.watchdog_s = {limit:g} s; rank(s) "
                        f"{missing} had not arrived at the Allreduce")
            mpi.allreduce_sum(send, recv, self.comm, work=work, watch=watch)
            mpi.wait_all([req for req, _ in posted.values()])
        else:
            req, _buf = mpi.send_arrival(k)
            mpi.allreduce_sum(send, recv, self.comm, sleep_max=nap)
            mpi.wait_all([req])

    def _mark_flags(self):
        """This rank's flag slots for the coming Allreduce."""
        fl = self._flags()
        mine = [0] if self.is_master else []
        mine += [1 + i for i in self.local]
        for j in mine:
            v = 0
            if self.stop_requested:
                v |= FLAG_STOP
            if self.pending_ckpt is not None and self.pending_ok:
                v |= FLAG_CKPT
            if self.early is not None and self.block >= self.early[0]:
                v |= FLAG_EARLY
            fl[j] = v

    def _check_flags(self, k):
        f = self._rflags()
        # confirm the previous checkpoint first: it was good when written
        if self.pending_ckpt is not None:
            if (f & FLAG_CKPT).all() and self.is_master:
                self._manifest(self.pending_ckpt)
            self.pending_ckpt = None
        bad = [j - 1 for j in range(1, len(f)) if f[j] & FLAG_NONFINITE]
        if bad:
            ranks = [b + 1 for b in bad] if (mpi.world_size() > 1 and not self.simulate) else [0]
            raise Diverged(
                f"block {k}: non-finite loss or model on worker(s) {bad} (rank(s) "
                f"{ranks}); the last good checkpoint is kept. Lower optim.lr or raise "
                f"algorithm.rho")
        self.stop_agreed = bool((f & FLAG_STOP).any())
        self.early_agreed = bool((f & FLAG_EARLY).any())

    def _block_ssgd(self, k, work):
        """Horovod-style: one fused Allreduce of the gradients per minibatch."""
        p, b = self.sched.locate(k)
        P, n = self.P, self.n_workers
        send, recv = self.send, self.recv
        steps = self.sched.steps_in_block(b)
        data = {}
        t_data = {}
        for i in self.local:
            t0 = time.perf_counter()
            data[i] = self.loaders[i].block(p, b)
            t1 = time.perf_counter()
            t_data[i] = t1 - t0
            self.tl.span("data", t0, t1, 1 + i, block=k)
        tot = np.zeros(self.F0 - P, np.float64)
        w0 = self.model.params
        gsum = self._send_d[:P] if self.device_state else send[:P]
        self._at("compute")
        for s in range(steps):
            # ssgd: each step is a synchronous update, the schedule runs per step
            self.opt.lr = self.lr_at(k, s / steps, 1.0 / steps)
            send.fill(0)
            gsum.fill(0)
            self._mark_flags()
            for i in self.local:
                t0, c0 = time.perf_counter(), time.process_time()
                x, y = data[i][s]
                if len(y):
                    loss, c = self.model.loss_and_grad(x, y)
                    g = self.model.grads
                    gsum += g if self.device_state else self._host(g)
                    send[P:P + 3] += np.array([loss * len(y), len(y), c], np.float32)
                t1, c1 = time.perf_counter(), time.process_time()
                send[P + NS + i] += t1 - t0
                send[P + NS + 2 * n + i] += c1 - c0
                self.tl.span("compute", t0, t1, 1 + i, block=k, step=s,
                             cpu_s=round(c1 - c0, 6))
                if s == 0:
                    send[P + NS + n + i] = t_data[i]
                if s == steps - 1:        # high-water marks: summed over steps once
                    self._put_memory(i)
                if len(y) and not math.isfinite(loss):
                    send[self.F0 + 1 + i] += FLAG_NONFINITE
            self._at("allreduce")
            t0, c0 = time.perf_counter(), time.process_time()
            S = self._reduce_packed(work, k)
            self.tl.span("allreduce", t0, time.perf_counter(), self._lane, block=k, step=s,
                         cpu_s=round(time.process_time() - c0, 6))
            self._check_flags(k)
            g = S * np.float32(1.0 / n)
            # same averaged gradient on every rank
            self.opt.step(g if self.device_state else self._dev(g))
            tot += recv[P:self.F0]
        self.z[...] = self._host(w0)
        recv[P:self.F0] = tot
        return p, b, {"primal": 0.0, "dual": 0.0, "rho": 0.0,
                      "lr": self.lr_at(k, 0.0, 1.0 / steps)}     # its first step's

    def _warmup(self, steps):
        """`steps` ssgd steps (gradient Allreduce per step) on each worker's
        first minibatches of pass 0; every rank applies the same averaged
        gradient, so all end at the same model; the consensus restarts there."""
        P, n = self.P, self.n_workers
        mbs = {i: self.loaders[i].load(0, 0) for i in self.local}
        for s in range(steps):
            self.send.fill(0)
            for i in self.local:
                x, y = mbs[i][s % len(mbs[i])]
                if len(y):
                    self.model.loss_and_grad(x, y)
                    self.send[:P] += self._host(self.model.grads)
            mpi.allreduce_sum(self.send, self.recv, self.comm)
            self.opt.step(self._dev(self.recv[:P] * np.float32(1.0 / n)))
        self.opt.reset()
        self.cons = self._new_consensus()
        self.z = self.cons.z
        self.log(f"warm-up: {steps} gradient-allreduce steps before block 0")

    # -- checkpoints -----------------------------------------------------------
    def _state_spec(self):
        """{name: (shape, dtype)} of this rank's checkpoint arrays."""
        P, f32 = (self.P,), np.float32
        spec = {}
        if self.is_master and self.cons is not None:
            spec.update(z=(P, f32), zg=(P, f32), v=(P, f32), U=(P, f32),
                        rho=((), np.float64), cons_blocks=((), np.int64))
        if self.algo == "ssgd":
            spec.update(params=(P, f32), opt_v=(P, f32))
        for i in self.local:
            if self.algo in ("admm", "ibt"):
                spec[f"u_{i}"] = (P, f32)
            if self.algo == "easgd":
                spec[f"w_own_{i}"] = (P, f32)
            if self.algo != "ssgd":
                spec[f"v_{i}"] = (P, f32)
        return spec

    def _state_arrays(self):
        a = {}
        if self.is_master and self.cons is not None:
            c = self.cons
            a.update(z=c.z, zg=c.zg, v=c.v, U=c.U, rho=np.float64(c.rho),
                     cons_blocks=np.int64(c.blocks))
        if self.algo == "ssgd":
            a.update(params=self._host(self.model.params), opt_v=self._host(self.opt.v))
        for i in self.local:
            ws = self.states[i]
            if self.algo in ("admm", "ibt"):
                a[f"u_{i}"] = self._host(ws.u)
            if self.algo == "easgd":
                a[f"w_own_{i}"] = self._host(ws.w_own)
            if self.algo != "ssgd":
                a[f"v_{i}"] = (self.velocity[i] if len(self.local) > 1
                               else self._host(self.opt.v))
        return a

    def _checkpoint(self, k):
        self._at("checkpoint")
        if not np.isfinite(self.z).all():
            raise Diverged(f"block {k}: the consensus model is not finite; not "
                           f"checkpointing it (the last good checkpoint is kept)")
        if self.fault and self.fault == (self.rank, k, "enospc"):
            import errno             # injected full disk (tests)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC),
                          os.path.join(ckpt.ckpt_dir(self.run_dir, k), ckpt.rank_file(self.rank)))
        ckpt.write_rank(self.run_dir, k, self.rank, self._state_arrays())
        self.pending_ckpt, self.pending_ok = k, True

    def _manifest(self, k):
        world = 1 if self.simulate else mpi.world_size()
        ckpt.write_manifest(self.run_dir, k, {
            "config_hash": self.cfg_hash, "config": hashed_config(self.cfg),
            "dataset": self.data_fp, "algorithm": self.algo,
            "n_workers": self.n_workers, "world_size": world,
            "simulate": self.simulate, "files": [ckpt.rank_file(r) for r in range(world)],
            "blocks_per_pass": self.sched.blocks_per_pass,
            "passes_done": (k + 1) / self.sched.blocks_per_pass},
            keep=self.cfg["run"]["keep_checkpoints"])

    def _final_sync(self):
        """One small collective after the run's last checkpoint, so the
        master writes its manifest only when every rank has its file."""
        if self.pending_ckpt is None:
            return
        n = len(self.recv) - self.F0
        send = np.zeros(n, np.float32)
        recv = np.zeros(n, np.float32)
        mine = ([0] if self.is_master else []) + [1 + i for i in self.local]
        for j in mine:
            send[j] = FLAG_CKPT if self.pending_ok else 0
        mpi.allreduce_sum(send, recv, self.comm, count=False)
        if (recv.astype(np.int64) & FLAG_CKPT).all() and self.is_master:
            self._manifest(self.pending_ckpt)
        self.pending_ckpt = None

    def _resume_candidates(self):
        """Complete checkpoints to resume from, newest first ([]: start
        fresh); CheckpointError where run.resume or the newest checkpoint
        forbids it (another configuration, worker count or dataset)."""
        mode = self.cfg["run"]["resume"]
        done = ckpt.complete(self.run_dir)
        if not done:
            if mode == "always":
                raise ckpt.CheckpointError(
                    f"--resume: {self.run_dir} holds no complete checkpoint")
            return []
        k = done[-1]
        where = ckpt.ckpt_dir(self.run_dir, k)
        if mode == "never":
            raise ckpt.CheckpointError(
                f"{self.run_dir} holds checkpoints (newest {where}); use another "
                f"run.dir, or resume with run.resume=auto")
        m = ckpt.read_manifest(self.run_dir, k)
        world = 1 if self.simulate else mpi.world_size()
        if m.get("n_workers") != self.n_workers or m.get("world_size") != world:
            raise ckpt.CheckpointError(
                f"{where} was written by {m.get('n_workers')} worker(s) in "
                f"{m.get('world_size')} process(es); this run has {self.n_workers} in "
                f"{world}. Resuming with another worker count is not supported "
                f"(duals and data ranges are per worker): relaunch with the same "
                f"count, or start a new run from this one's model: another run.dir "
                f"and --set model.init={self.run_dir}")
        if m.get("config_hash") not in (self.cfg_hash, run_hash(self.cfg, legacy=True)):
            what = (isinstance(m.get("config"), dict)
                    and config_diff(m["config"], hashed_config(self.cfg))
                    or "model, data, algorithm or optimizer differ")
            raise ckpt.CheckpointError(
                f"{where} was written by another configuration ({what}); run with "
                f"the checkpoint's settings to resume, or use another run.dir to "
                f"start fresh")
        if m.get("dataset", self.data_fp) != self.data_fp:
            raise ckpt.CheckpointError(
                f"{where} was written for another dataset: "
                f"{self.ds.path}/dataset.json differs from the one the run started "
                f"with (regenerated or replaced?); use another run.dir to start fresh")
        return done[::-1]

    def _restore(self, dry=False):
        """Block to start from: 0, or one past the newest complete checkpoint
        that every rank can read. Under MPI rank 0 lists the candidates and
        broadcasts them (a rank with a stale view of the run directory, NFS
        attribute caches or a manifest written just after it looked, must not
        resume elsewhere), and all ranks agree on each attempt (allgather of
        the read errors): a checkpoint damaged on any rank is set aside as
        damaged-ckpt-* and the previous complete one is used."""
        dist = not (self.simulate or mpi.world_size() == 1)
        if not dist:
            cands = self._resume_candidates()
        else:
            res = None
            if self.is_master:
                try:
                    res = ("ok", self._resume_candidates())
                except ckpt.CheckpointError as e:
                    res = ("error", str(e))
            res = mpi.bcast(res)
            if res[0] == "error":
                raise ckpt.CheckpointError(res[1])
            cands = res[1]
        errs = []
        for k in cands:
            err = None
            try:
                self._load_state(k)
            except ckpt.CheckpointError as e:
                err = f"rank {self.rank}: {e}"
            errs = [e for e in (mpi.allgather(err) if dist else [err]) if e]
            if not errs:
                return k + 1
            where = ckpt.ckpt_dir(self.run_dir, k)
            if dry:
                self.log(f"checkpoint {where} cannot be read ({'; '.join(errs)}); a run "
                         f"would set it aside and try the previous complete checkpoint")
            elif self.is_master:
                aside = os.path.join(os.path.dirname(where), "damaged-" + os.path.basename(where))
                if os.path.exists(aside):
                    aside += f".{time.time_ns()}"
                os.replace(where, aside)
                self.log(f"checkpoint {where} cannot be read ({'; '.join(errs)}); set "
                         f"aside as {aside}, trying the previous complete checkpoint")
        if cands:
            raise ckpt.CheckpointError(
                f"no complete checkpoint in {self.run_dir} could be read (last: "
                f"{'; '.join(errs)}); use another run.dir to start fresh")
        self._init_from_model(dist)
        return 0

    def _init_from_model(self, dist):
        """model.init, for a run that starts at block 0: w of every worker
        and z from a trained model's z (duals and momenta stay zero). Every
        rank reads the file; all of them fail together (ConfigError, exit 2)
        when any one cannot, e.g. a path its node does not see."""
        path = self.cfg["model"]["init"]
        if not path:
            return
        from .outputs import TrainedModelError, load_trained
        err, t, fp = None, None, None
        try:
            t = load_trained(path)
            err = self._init_mismatch(t)
            fp = hashlib.sha256(t.model.params.tobytes()).hexdigest()
        except TrainedModelError as e:
            err = str(e)
        every = mpi.allgather((err, fp)) if dist else [(err, fp)]
        bad = [i for i, (e, _) in enumerate(every) if e]
        if bad:
            who = f" (rank(s) {bad})" if dist else ""
            raise ConfigError(f"model.init: {every[bad[0]][0]}{who}")
        other = [i for i, (_, f) in enumerate(every) if f != every[0][1]]
        if other:
            raise ConfigError(f"model.init: rank(s) {other} read another model from "
                              f"{path} than rank 0 (another file at that path on their "
                              f"node?); every rank must start from the same z")
        z = t.model.params                 # float32 on the host (load_trained)
        self.model.params[...] = self._dev(z)
        if self.algo == "ssgd":
            self.z[...] = z
        else:
            self.cons = self._new_consensus()
            self.z = self.cons.z
        notes = []
        if t.classes != list(self.ds.classes):
            notes.append(f"its classes {t.classes} are this data's {list(self.ds.classes)} "
                         f"by position")
        if not (np.allclose(t.mean, self.ds.mean, atol=1e-3) and
                np.allclose(t.std, self.ds.std, atol=1e-3)):
            notes.append("it was trained with another normalisation (mean/std); this "
                         "run normalises with this data's")
        self.init_note = (f"initialised from {t.source}"
                          + (": " + "; ".join(notes) if notes else ""))

    def _placement(self):
        """[(host, pid, BLAS threads, device, CPU ids)] of every rank, rank order: one
        allgather at the start, for the start line and summary.json. It
        also carries what every rank must share, checked here: the same
        ibtmpi and numpy (every rank computes z itself from the reduced
        sums), the same configuration and the same data (a config file
        edited while the job started, a stale node-local copy of the data,
        another venv on one node). A mismatch stops every rank with exit 2."""
        import socket
        from . import __version__
        from .threads import current_blas_threads
        dev = "-" if not self.local else (
            "cpu" if self.dev is None else f"gpu {self.dev.device_id()}")
        try:                        # the cores it may run on: a Slurm allocation's,
            cpus = tuple(sorted(os.sched_getaffinity(0)))     # or one bound core
        except AttributeError:                                # no affinity API (macOS)
            cpus = tuple(range(os.cpu_count() or 1))
        me = (socket.gethostname(), os.getpid(), current_blas_threads(), dev, cpus)
        ident = {"ibtmpi": __version__, "numpy": np.__version__,
                 "configuration": self.cfg_hash, "dataset": self.data_fp}
        dist = not (self.simulate or mpi.world_size() == 1)
        got = mpi.allgather((me, ident)) if dist else [(me, ident)]
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

    def sharing(self):
        """Worker processes on this rank's GPU (on the CPU: its node), itself
        included; 1 before the start-up allgather or in one process."""
        rows = getattr(self, "placement", None)
        if not rows or len(rows) <= self.rank or not self.local:
            return 1
        host, dev = rows[self.rank][0], rows[self.rank][3]
        return sum(1 for r in rows if r[0] == host and r[3] == dev)

    def _growth_text(self, p, key, i, first, now):
        what = "peak RSS" if key == "peak_rss_mib" else "CuPy pool"
        return (f"memory: {self._workers_text([i])}: {what} grew from {first:.0f} MiB at "
                f"the end of this job's first pass to {now:.0f} MiB at the end of pass "
                f"{p + 1}, and in each of the last two passes: a leak? ({key} in "
                f"metrics.jsonl has it block by block)")

    def _workers_text(self, ws):
        """'worker 3 (rank 4 on node7)', 'worker(s) 0-3 (rank(s) 1-4 on a, b)'."""
        one = len(ws) == 1
        where = f"worker {ws[0]}" if one else f"worker(s) {ranges(ws)}"
        if not self.simulate and len(self.placement) > ws[-1] + 1:
            hosts = ", ".join(sorted({self.placement[i + 1][0] for i in ws}))
            ranks = f"rank {ws[0] + 1}" if one else f"rank(s) {ranges([i + 1 for i in ws])}"
            where += f" ({ranks} on {hosts})"
        return where

    def _straggler_text(self, i, hits, ratio):
        return (f"{self._workers_text([i])} computed longest in {hits} of the last "
                f"{self.stragglers.window} blocks, {ratio:.2f}x the median worker: "
                f"every block waits for it at the Allreduce (a slower or shared node, "
                f"a throttled GPU?); metrics.jsonl has slowest_worker per block")

    def _starved_text(self, starved, when):
        ws = sorted(starved)
        share = sorted(starved.values())[len(ws) // 2]
        their = "its" if len(ws) == 1 else "their"
        return (f"{self._workers_text(ws)} had a core for only {share:.0%} of {their} "
                f"compute time (median) in {when}: the node runs more busy threads "
                f"than it has cores (ranks x run.threads, or other jobs), so time per "
                f"block measures the wait for cores, not the computation; "
                f"compute_cpu_s in metrics.jsonl has it per block")

    def _environment(self):
        """What a run needs to be compared months later: versions, the MPI
        library and where every rank ran (this process's last start)."""
        import platform
        from . import __version__
        return {"ibtmpi": __version__, "python": platform.python_version(),
                "numpy": np.__version__, "mpi": mpi.library_version(),
                "ranks": [{"rank": i, "host": h, "pid": p, "blas_threads": t, "device": d,
                           "cores": len(c)} for i, (h, p, t, d, c) in enumerate(self.placement)]}

    def _init_mismatch(self, t):
        """Why trained model t cannot start this run's model, or None."""
        m = self.model
        if t.model.input_shape != m.input_shape:
            return (f"{t.source} takes {t.model.input_shape} inputs (C, H, W), this "
                    f"data has {m.input_shape}")
        if t.model.n_classes != m.n_classes:
            return (f"{t.source} has {t.model.n_classes} classes, this data "
                    f"{m.n_classes}")
        mine = [l.describe() for l in m.layers]
        theirs = [l.describe() for l in t.model.layers]
        if mine != theirs or t.model.size != m.size:
            return (f"{t.source} has other layers ({t.layers!r}, {t.model.size:,d} "
                    f"parameters) than model.layers = {self.cfg['model']['layers']!r} "
                    f"({m.size:,d})")
        if sorted(t.classes) == sorted(self.ds.classes) and t.classes != list(self.ds.classes):
            return (f"{t.source} orders the same classes differently ({t.classes} "
                    f"against this data's {list(self.ds.classes)}): its outputs would "
                    f"name the wrong classes")
        return None

    def _load_state(self, k):
        """This rank's state from checkpoint k (CheckpointError if unreadable)."""
        where = ckpt.ckpt_dir(self.run_dir, k)
        if self.cons is not None:
            z0 = ckpt.read_rank(os.path.join(where, ckpt.rank_file(0)), {
                k_: v for k_, v in {
                    "z": ((self.P,), np.float32), "zg": ((self.P,), np.float32),
                    "v": ((self.P,), np.float32), "U": ((self.P,), np.float32),
                    "rho": ((), np.float64), "cons_blocks": ((), np.int64)}.items()})
            c = self.cons
            for name in ("z", "zg", "v", "U"):
                self._put(getattr(c, name), z0[name])
            c.rho, c.blocks = float(z0["rho"]), int(z0["cons_blocks"])
        mine = ckpt.read_rank(os.path.join(where, ckpt.rank_file(self.rank)),
                              self._state_spec())
        if self.algo == "ssgd":
            self.model.params[...] = self._dev(mine["params"])
            self.opt.v[...] = self._dev(mine["opt_v"])
            self.z[...] = mine["params"]
        for i in self.local:
            ws = self.states[i]
            if self.algo in ("admm", "ibt"):
                self._put(ws.u, mine[f"u_{i}"])
            if self.algo == "easgd":
                ws.w_own = (self._dev(mine[f"w_own_{i}"]) if self.device_state
                            else mine[f"w_own_{i}"].copy())
            if self.algo != "ssgd":
                np.copyto(self.velocity[i], mine[f"v_{i}"])
                if len(self.local) == 1:
                    self.opt.v[...] = self._dev(mine[f"v_{i}"])

    # -- the run --------------------------------------------------------------
    def _work(self):
        """The master's useful work while waiting: one batch of the pending
        evaluation. Returns False when there is nothing to do."""
        if self._pending_eval is None:
            return False
        c0, t0 = time.process_time(), time.perf_counter()
        try:
            next(self._pending_eval[1])
            self.tl.span("evaluation", t0, time.perf_counter(), 0,
                         block=self._pending_eval[0]["block"])
            return True
        except StopIteration:
            self._emit(self._pending_eval[0], self._pending_eval[2])
            self._pending_eval = None
            return False
        finally:
            self.eval_cpu += time.process_time() - c0

    def _end_timeline(self):
        """The run's last collective (_final_sync); with run.timeline every
        rank closes its file before it, so the master merges complete files
        after it, also across nodes on NFS (close-to-open)."""
        self.tl.close()
        self._final_sync()
        if self.is_master and isinstance(self.tl, timeline.Timeline):
            path, n = timeline.merge(self.run_dir, {"run_dir": self.run_dir,
                                                    "algorithm": self.algo})
            self.log(f"timeline: {path} ({n} spans; open in https://ui.perfetto.dev "
                     f"or chrome://tracing)")

    def _finish_eval(self):
        if self._pending_eval is not None:
            self.phase = "evaluation"
            while self._work():
                pass

    def _check_deadline(self, wall):
        """Master, after each block: with less time left than two blocks
        (the stop takes effect after the next one, through its flags), a
        checkpoint and the margin, ask every rank to stop; the job ends
        with exit 75 like a preemption and the templates requeue it."""
        self._walls = (self._walls + [wall])[-5:]
        left = self.deadline - time.time()
        block = max(self._walls)
        if left < 2 * block + self._ckpt_s + self._margin:
            self.stop_requested = True
            self.stop_reason = f"the time limit ({self.deadline_src})"
            self.log(f"time limit in {max(left, 0):.0f} s ({self.deadline_src}); a block "
                     f"takes up to {block:.3g} s: stopping after the next block with a "
                     f"checkpoint")

    def _deadline_text(self):
        end = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.deadline))
        return f"{end} ({self.deadline_src})"

    def plan(self):
        """What run() would do, checked the way run() checks it, with nothing
        trained or written (train --dry-run): the run directory's lock, which
        checkpoint it would resume from (every rank reads its own file), the
        schedule and the traffic. Every rank must call it; the master gets
        the lines to print, the workers []."""
        lock = runlock.probe(self.run_dir) if self.is_master else None
        self.placement = self._placement()
        start = self._restore(dry=True)
        if not (self.simulate or mpi.world_size() == 1):
            mpi.allgather(None)        # every rank got this far: only then "would start"
        if not self.is_master:
            return []
        s, r, n = self.sched, self.cfg["run"], self.n_workers
        ds = self.ds
        h, w, c = ds.image_shape
        if self.simulate:
            how = f"{n} workers simulated in one process"
        elif mpi.world_size() > 1:
            how = f"{n} workers, {mpi.world_size()} processes (rank 0 the master)"
        else:
            how = "1 worker, one process (the baseline)"
        splits = ", ".join(f"{k} {ds.split(k).n:,d}" for k in ds.splits)
        per_pass = s.steps_per_pass() if self.algo == "ssgd" else s.blocks_per_pass
        mib = self.send.size * 4 / 2**20
        every = r["checkpoint_every"] or s.blocks_per_pass
        if start:
            resume = (f"resume from {ckpt.ckpt_dir(self.run_dir, start - 1)} "
                      f"(block {start} of {self.total_blocks})")
        else:
            resume = "start from block 0" + (f", {self.init_note}" if self.init_note else "")
        warn = oversubscription_text(self.placement)
        return [
            "dry run: nothing trained, nothing written; the job would start as follows",
            f"  job: {self.algo}, {how}; workers compute on "
            f"{'gpu' if self.dev is not None else 'cpu'}",
            f"  data: {ds.path}: {splits} images {h}x{w}x{c}, {ds.n_classes} classes",
            f"  blocks: split {s.split_len(0, 0):,d} per worker (block "
            f"{sum(s.split_len(i, 0) for i in range(n)):,d}), "
            f"batch {s.batch}, {s.max_range:,d} samples per worker: {s.blocks_per_pass} "
            f"blocks per pass, {s.steps_in_block(0)} steps per block; {self.total_blocks} "
            f"blocks for {r['passes']:g} pass(es)",
            f"  model: {self.cfg['model']['layers']}, {self.P:,d} parameters "
            f"({self.P * 4 / 2**20:.1f} MiB float32)",
            f"  {self.lr_at.describe() or 'lr: constant ' + format(self.lr_at.lr, 'g')}",
            f"  communication: {per_pass} Allreduce(s) per pass "
            f"({'one per step' if self.algo == 'ssgd' else 'one per block'}) of "
            f"{self.send.size:,d} floats ({mib:.1f} MiB): {per_pass * mib:.1f} MiB per pass",
            f"  checkpoints: every {every} block(s), {r['keep_checkpoints']} kept; {resume}",
            "  evaluation: " + (
                "none (no val split)" if "val" not in ds.splits else
                f"z on val every {r['eval_every'] or s.blocks_per_pass} block(s)"
                + ("; the best kept as model-best.npz" if r["keep_best"] else "")
                + (f"; early stop after {r['early_stop']} evaluations without a better "
                   f"one" + (f" (val accuracy up by more than {r['early_stop_delta']:g})"
                             if r["early_stop_delta"] else "") if r["early_stop"] else "")),
            "  " + placement_text(self.placement),
            *([f"  {warn}"] if warn else []),
            f"  run.dir: {self.run_dir}: "
            + ("free" if lock is None else f"its lock would be taken over ({lock})"),
            "  time limit: " + ("none" if self.deadline is None else
                                f"{self._deadline_text()}: stops with a checkpoint before it"),
        ] + (["  diagnostics: " + "; ".join(
            t for t, on in (("cProfile of every rank (profile-rank-R.txt, .pstats)",
                             r["profile"]),
                            (f"timeline of every rank ({timeline.MERGED})", r["timeline"]))
            if on)] if r["profile"] or r["timeline"] else [])

    def run(self):
        """Train to the end (or to a preemption); the master holds the run
        directory (runlock) from before it reads the checkpoints to the end."""
        lock = runlock.acquire(self.run_dir) if self.is_master else None
        if lock is not None and lock.took_over:
            self.log(f"took over {lock.path}: {lock.took_over}")
        if lock is not None:
            _retire_errors(self.run_dir, self.t_created)
        prof = None
        if self.cfg["run"]["profile"]:
            import cProfile
            prof = cProfile.Profile()
            prof.enable()
        try:
            return self._run()
        finally:
            if prof is not None:
                prof.disable()
                self._write_profile(prof)
            if lock is not None:
                lock.release()

    def _write_profile(self, prof, top=40):
        """run.profile: this rank's cProfile, also when the run failed:
        RUN/profile-rank-R.txt (the `top` functions by cumulative time) and
        .pstats (for snakeviz, pstats, gprof2dot). A write error is reported,
        never raised over the run's own outcome."""
        import io
        import pstats
        base = os.path.join(self.run_dir, f"profile-rank-{self.rank:05d}")
        try:
            prof.dump_stats(base + ".pstats")
            text = io.StringIO()
            st = pstats.Stats(prof, stream=text)
            st.sort_stats("cumulative").print_stats(top)
            with open(base + ".txt", "w") as f:
                f.write(f"rank {self.rank}, block {self.block}, phase {self.phase}\n")
                f.write(text.getvalue())
        except OSError as e:
            print(f"[rank {self.rank}] run.profile: cannot write {base}.*: {e}",
                  file=sys.stderr)

    def _run(self):
        cfg, r = self.cfg, self.cfg["run"]
        n, P = self.n_workers, self.P
        self.placement = self._placement()
        start = self.start = self._restore()
        if self.is_master and start:
            self._read_history(start)
        # a run that stopped early (run.early_stop) and is run again: its
        # last checkpoint is the stop block, nothing is left to train
        done = self.is_master and self.early is not None and self.early[0] < start
        # run.timeline: the master names this job's segment before the bcast,
        # so no rank has opened its file when a fresh start clears old ones
        seg = (timeline.new_segment(self.run_dir, start)
               if self.is_master and r["timeline"] and not done else None)
        if not (self.simulate or mpi.world_size() == 1):
            done, seg = mpi.bcast((done, seg))
        if done:
            self.total_blocks = start
            self.early_agreed = True
        if self.is_master:
            self._open_run_dir(start)
        self._pending_eval = None      # (record, generator, out)
        self.eval_cpu = 0.0            # rank 0 CPU spent evaluating (useful work)
        eval_every = r["eval_every"] or self.sched.blocks_per_pass
        every = r["checkpoint_every"] or self.sched.blocks_per_pass
        bar = None
        if self.is_master and not r["quiet"] and sys.stderr.isatty():
            from tqdm import tqdm
            bar = tqdm(total=self.total_blocks, initial=start, unit="block", leave=False)
        # no terminal (a batch job's log): a progress line every progress_s
        progress = Progress(self.total_blocks, start, r["progress_s"], self.log) \
            if self.is_master and bar is None and not r["quiet"] else None
        self.stragglers = Stragglers(n)
        self.growth = memory.MemoryGrowth()
        # CPU workers (GPU workers' host threads may rightly sleep in compute);
        # one process (simulation, N = 1) has one placement row
        rows = self.placement
        self.starved = Starved([i for i in range(n)
                                if rows[i + 1 if len(rows) > 1 else 0][3] == "cpu"])
        t_start = time.perf_counter()
        cpu_start = time.process_time()
        calls0, bytes0 = mpi.STATS["allreduce"], mpi.STATS["bytes"]
        images = 0
        step_fn = self._block_ssgd if self.algo == "ssgd" else self._block_algo
        if cfg["algorithm"]["warmup_steps"] and self.algo != "ssgd" and not start:
            self.opt.lr = self.lr_at(0)
            self._warmup(cfg["algorithm"]["warmup_steps"])
        if seg is not None:
            role = "master" if self.is_master else f"worker {self.local[0]}"
            self.tl = timeline.Timeline(
                self.run_dir, seg, self.rank, f"rank {self.rank} ({role})",
                {**({0: "master"} if self.is_master else {}),
                 **{1 + i: f"worker {i}" for i in self.local}})
        old = _install_stop_handlers(self)
        try:
            for k in range(start, self.total_blocks):
                self.block = k
                self.opt.lr = self.lr_at(k)
                t0 = time.perf_counter()
                p, b, diag = step_fn(k, self._work)
                self._finish_eval()     # whatever the wait did not finish
                rv = self.recv[P:]
                loss_sum, cnt, corr = float(rv[0]), float(rv[1]), float(rv[2])
                comp = rv[NS:NS + n].astype(np.float64)
                wait = rv[NS + n:NS + 2 * n].astype(np.float64)
                cpu = rv[NS + 2 * n:NS + 3 * n].astype(np.float64)
                rss, pool = rv[NS + 3 * n:NS + 4 * n], rv[NS + 4 * n:NS + 5 * n]
                wall = time.perf_counter() - t0
                images += cnt
                rec = {"block": k, "blocks_total": self.total_blocks, "pass": p,
                       "block_in_pass": b, "algorithm": self.algo,
                       "N": n, "train_loss": loss_sum / max(cnt, 1),
                       "train_acc": corr / max(cnt, 1), "samples": int(cnt),
                       "primal_residual": diag["primal"], "dual_residual": diag["dual"],
                       "rho": diag["rho"], "lr": diag.get("lr", self.opt.lr),
                       "wall_s": wall,
                       "time": round(time.time(), 3),      # when the block ended
                       "compute_max_s": float(comp.max()),
                       "compute_mean_s": float(comp.mean()),
                       "data_wait_max_s": float(wait.max()),
                       "data_wait_mean_s": float(wait.mean()),
                       "comm_s": max(wall - float(comp.max()) - float(wait.max()), 0.0),
                       "images_per_s": cnt / wall if wall > 0 else 0.0,
                       "slowest_worker": int(comp.argmax()),
                       "compute_s": [round(float(c), 6) for c in comp],
                       # CPU seconds of the worker's process in the same span:
                       # below compute_s when it waited for a core (more ranks
                       # than cores) or a GPU, above it with BLAS threads
                       "compute_cpu_s": [round(float(c), 6) for c in cpu],
                       # high-water marks of each worker's process (memory.py)
                       "peak_rss_mib": [round(float(m), 1) for m in rss]}
                if pool.any():
                    rec["gpu_pool_mib"] = [round(float(m), 1) for m in pool]
                if not np.isfinite(self.z).all():
                    raise Diverged(f"block {k}: the consensus model z is not finite; "
                                   f"the last good checkpoint is kept. Lower optim.lr "
                                   f"or raise algorithm.rho")
                if self.early_agreed:     # run.early_stop: this block is the last
                    self.total_blocks = k + 1
                last = k + 1 == self.total_blocks
                if self.is_master:
                    slow = self.stragglers.block(comp)
                    if slow is not None:
                        self.log(self._straggler_text(*slow))
                    starved = self.starved.block(comp, cpu)
                    if self.starved.now:      # for `ibtmpi status` of a live run
                        rec["starved"] = self.starved.now
                    if starved:
                        self.log(self._starved_text(
                            starved, f"{self.starved.need}+ of the last "
                                     f"{self.starved.window} blocks"))
                    due = (k + 1) % eval_every == 0 or last
                    if due and self.val is not None:
                        self._at("evaluation")
                        out = {}
                        self._pending_eval = (rec, self._eval_steps(self.val, self.z, out), out)
                        if self.local or last:      # nothing to overlap with: now
                            self._finish_eval()
                    else:
                        self._emit(rec, None)
                    if bar is not None:
                        bar.update(1)
                        bar.set_postfix(loss=f"{rec['train_loss']:.3f}")
                    if progress is not None and not last:
                        progress.block_done(k, rec, self.sched.blocks_per_pass)
                    if b + 1 == self.sched.blocks_per_pass:
                        for found in self.growth.pass_done(rec):
                            self.log(self._growth_text(p, *found))
                if self.deadline is not None and not (last or self.stop_requested):
                    self._check_deadline(wall)
                if (k + 1) % every == 0 or last or self.stop_agreed:
                    self._finish_eval()            # metrics line k before checkpoint k
                    tc = time.perf_counter()
                    self._checkpoint(k)
                    t1 = time.perf_counter()
                    self._ckpt_s = max(self._ckpt_s, t1 - tc)
                    self.tl.span("checkpoint", tc, t1, self._lane, block=k)
                self.tl.flush()
                if self.early_agreed:
                    break
                if self.stop_agreed and not last:
                    self._end_timeline()
                    raise Preempted(f"stopped by {self.stop_reason} after block {k}; "
                                    f"checkpoint {ckpt.ckpt_dir(self.run_dir, k)} written; "
                                    f"run the same command again to resume")
            self._end_timeline()
        finally:
            self.tl.close()
            _restore_handlers(old)
            if bar is not None:
                bar.close()
            for ld in self.loaders.values():
                ld.close()
            if self.metrics_f is not None:
                self.metrics_f.flush()
        return self._finish(t_start, cpu_start, calls0, bytes0, images)

    def _read_history(self, start):
        """Master, resuming at `start`: the metrics lines of the blocks the
        checkpoint covers, and from them the best evaluation so far and any
        early stop, as the first attempt saw them."""
        mpath = os.path.join(self.run_dir, "metrics.jsonl")
        kept = []
        if os.path.exists(mpath):
            for line in open(mpath):
                try:
                    rec = json.loads(line)
                except ValueError:
                    break              # a torn last line
                if rec.get("block", -1) < start:
                    kept.append(rec)
        self.history = kept
        for rec in kept:
            if "val_acc" in rec:
                self._on_evaluation(rec, write=False)

    def _open_run_dir(self, start):
        r = self.cfg["run"]
        from .config import to_toml
        os.makedirs(r["dir"], exist_ok=True)
        with open(os.path.join(r["dir"], "config.toml"), "w") as f:
            f.write(to_toml(self.cfg))
        mpath = os.path.join(r["dir"], "metrics.jsonl")
        if start:
            with open(mpath, "w") as f:
                f.writelines(json.dumps(x) + "\n" for x in self.history)
            self.log(f"resuming from {ckpt.ckpt_dir(r['dir'], start - 1)} "
                     f"(block {start} of {self.total_blocks})")
        else:                          # a fresh start: no stale best of another run
            try:
                os.remove(os.path.join(r["dir"], BEST))
            except FileNotFoundError:
                pass
        if self.deadline is not None:
            self.log(f"time limit {self._deadline_text()}: the run stops with a "
                     f"checkpoint before it (exit 75) and resumes when run again")
        self.metrics_f = open(mpath, "a" if start else "w")
        self.log(f"{self.algo}: {self.n_workers} worker(s)"
                 f"{' (simulated)' if self.simulate else ''}, "
                 f"{self.sched.n} train images, split {self.sched.split_size}, "
                 f"batch {self.sched.batch}, {self.sched.blocks_per_pass} blocks/pass, "
                 f"{self.total_blocks} blocks, model {self.P:,d} parameters")
        if self.init_note and not start:
            self.log(f"model.init: {self.init_note}")
        if self.lr_at.describe():
            self.log(self.lr_at.describe())
        self.log(placement_text(self.placement))
        warn = oversubscription_text(self.placement)
        if warn:
            self.log(warn)

    def _finish(self, t_start, cpu_start, calls0, bytes0, images):
        r = self.cfg["run"]
        wall = time.perf_counter() - t_start
        cpu = time.process_time() - cpu_start
        summary = {"algorithm": self.algo, "N": self.n_workers, "blocks": self.total_blocks,
                   "passes": self.total_blocks / self.sched.blocks_per_pass,
                   "wall_s": wall, "rank0_cpu_s": cpu,
                   "rank0_cpu_share": cpu / wall if wall else 0.0,
                   "rank0_eval_cpu_s": self.eval_cpu,
                   # what rank 0 burns besides evaluating: waiting, updates, I/O
                   "rank0_other_cpu_share": (cpu - self.eval_cpu) / wall if wall else 0.0,
                   "allreduce_calls": mpi.STATS["allreduce"] - calls0,
                   "allreduce_bytes": mpi.STATS["bytes"] - bytes0,
                   "images": int(images), "simulated": bool(self.simulate),
                   "world_size": 1 if self.simulate else mpi.world_size(),
                   # wall_s is this process's; a resumed run's blocks before
                   # start ran in earlier ones: their time is in the metrics
                   "resumed_at_block": self.start,
                   "blocks_wall_s": float(sum(h["wall_s"] for h in self.history)),
                   # per worker, over every block so far: its compute wall
                   # seconds and its process's CPU seconds in them
                   **_per_worker_totals(self.history, self.n_workers),
                   **_per_worker_peaks(self.history, self.n_workers),
                   "rank0_peak_rss_mib": round(memory.peak_rss_mib(), 1),
                   # worker -> blocks in which it computed longest, >= 1.25x the median
                   "straggler_blocks": {str(i): c for i, c in
                                        sorted(self.stragglers.counts.items())},
                   # worker -> blocks in which its process had a core less
                   # than STARVED_SHARE of its compute time
                   "starved_blocks": {str(i): c for i, c in
                                      sorted(self.starved.counts.items())},
                   # figure -> {worker: [MiB at the first pass end, MiB later]}
                   # of the workers whose memory kept growing (a leak?)
                   "memory_growth": {k: {str(i): v for i, v in sorted(d.items())}
                                     for k, d in self.growth.found.items()},
                   "environment": self._environment()}
        trained = self.total_blocks - self.start
        late = self.starved.summary(trained) if self.is_master else None
        if late:               # a run too short for the live report
            self.log(self._starved_text(late, f"{min(self.starved.counts[i] for i in late)} "
                                              f"of the {trained} blocks of this run"))
        done = os.path.join(r["dir"], "summary.json")
        if self.is_master and self.start >= self.total_blocks and os.path.exists(done):
            # nothing trained: the finished run's summary stays as it was
            with open(done) as f:
                summary = json.load(f)
            self.metrics_f.close()
            acc = (f" (test accuracy {summary['test_acc']:.4f})"
                   if "test_acc" in summary else "")
            if self.early_agreed:
                self.log(f"{r['dir']} stopped early after block {self.start - 1} "
                         f"(run.early_stop){acc}: nothing to train, its summary and model "
                         f"are kept. Use another run.dir to train again")
            else:
                self.log(f"{r['dir']} already holds {self.start} trained blocks, this run "
                         f"asks for {self.total_blocks}{acc}: nothing to train, its "
                         f"summary and model are kept. Raise run.passes to train on, or "
                         f"use another run.dir")
        elif self.is_master:
            self.phase = "evaluation"
            if self.test is not None:
                out = {}
                for _ in self._eval_steps(self.test, self.z, out):
                    pass
                summary["test_loss"], summary["test_acc"] = out["loss"], out["acc"]
            last_val = [h for h in self.history if "val_acc" in h]
            if last_val:
                summary["val_acc"] = last_val[-1]["val_acc"]
            save_model(os.path.join(r["dir"], "model.npz"), self.z, self.model,
                       self.ds, self.cfg)
            if self.best is not None:
                summary["best"] = self._best_summary(summary)
            if self.early_agreed and self.early is not None:
                summary["stopped_early"] = {"after_block": self.total_blocks - 1,
                                            "reason": self.early[1]}
                self.log(f"early stop (run.early_stop): {self.early[1]}; stopped after "
                         f"block {self.total_blocks - 1}")
            with open(done, "w") as f:
                json.dump(summary, f, indent=1)
            self.metrics_f.close()
            if "test_acc" in summary:
                self.log(f"final test accuracy {summary['test_acc']:.4f} "
                         f"(loss {summary['test_loss']:.4f}) after {summary['passes']:.2f} "
                         f"pass(es), {wall:.1f} s; rank 0 CPU {summary['rank0_cpu_share']:.1%} "
                         f"({summary['rank0_other_cpu_share']:.1%} outside evaluation)")
            mem = memory.memory_line(summary)
            if mem:
                self.log(mem)
            b = summary.get("best")
            if b and b["block"] != self.total_blocks - 1:
                self.log(f"best val accuracy {b['val_acc']:.4f} at block {b['block']} (pass "
                         f"{b['pass'] + 1}); final {summary['val_acc']:.4f}"
                         + (f"; {b['file']}: test accuracy {b['test_acc']:.4f}"
                            if "test_acc" in b else ""))
        self.summary = summary
        return summary

    def _emit(self, rec, val):
        if val:
            rec["val_loss"], rec["val_acc"] = val["loss"], val["acc"]
            self._on_evaluation(rec)
        self.history.append(rec)
        self.metrics_f.write(json.dumps(rec) + "\n")
        self.metrics_f.flush()
        bpp = self.sched.blocks_per_pass
        if rec["block_in_pass"] == bpp - 1 or rec["block"] + 1 == self.total_blocks:
            blocks = [h for h in self.history if h["pass"] == rec["pass"]]
            loss = sum(h["train_loss"] * h["samples"] for h in blocks) / max(
                1, sum(h["samples"] for h in blocks))
            msg = (f"pass {rec['pass'] + 1}: train loss {loss:.4f}, "
                   f"{sum(h['wall_s'] for h in blocks):.1f} s")
            if "val_acc" in rec:
                msg += f", val acc {rec['val_acc']:.4f}"
            self.log(msg)

    def _best_summary(self, summary):
        """summary.json's "best": the block with the best val accuracy, and
        its model's test accuracy (the final one's where that is the last)."""
        b = dict(self.best)
        path = os.path.join(self.run_dir, BEST)
        if not (self.cfg["run"]["keep_best"] and os.path.exists(path)):
            return b
        b["file"] = path
        if self.test is None:
            return b
        if b["block"] == self.total_blocks - 1:
            b["test_loss"], b["test_acc"] = summary["test_loss"], summary["test_acc"]
            return b
        out = {}
        with np.load(path) as f:
            z = f["z"]
        for _ in self._eval_steps(self.test, z, out):
            pass
        b["test_loss"], b["test_acc"] = out["loss"], out["acc"]
        return b

    def _on_evaluation(self, rec, write=True):
        """Master, at each evaluation (write=False: replaying those of a
        resumed run): a z with higher val accuracy than every earlier one
        (equal accuracy: lower val loss) is written to RUN/model-best.npz;
        the evaluated z is the evaluation model's (the consensus has moved
        on while the evaluation overlapped the next block). run.early_stop
        counts the evaluations since the last one that was better than its
        reference: the same order, or with run.early_stop_delta = d a val
        accuracy higher by more than d (the reference is then the last
        evaluation that was: small gains add up until together they clear d)."""
        r = self.cfg["run"]
        b = self.best
        if b is None or eval_rank(rec) > eval_rank(b):
            self.best = {k: rec[k] for k in ("block", "pass", "val_acc", "val_loss")}
            if write and r["keep_best"]:
                save_model(os.path.join(self.run_dir, BEST), self.eval_model.params,
                           self.model, self.ds, self.cfg)
        d, ref = r["early_stop_delta"], self.ref
        if ref is None or (rec["val_acc"] > ref["val_acc"] + d if d else
                           eval_rank(rec) > eval_rank(ref)):
            self.ref, self.since_ref = rec, 0
            return
        self.since_ref += 1
        p = r["early_stop"]
        if p and self.since_ref >= p and self.early is None:
            # this evaluation may end while block k+1 runs, after k+1's
            # flags went out: the stop rides on block k+2's flags, in every
            # run alike (MPI, simulation, resumed), so it ends after k+2
            than = (f"above {ref['val_acc']:.4f} + {d:g}" if d else
                    f"better than {ref['val_acc']:.4f}")
            self.early = (rec["block"] + 2, f"no val accuracy {than} (block "
                          f"{ref['block']}) in {p} evaluations")


def run_hash(cfg, legacy=False):
    return digest(hashed_config(cfg, legacy))


def config_diff(old, new, show=6):
    """'section.key: A in the checkpoint, B now' for each key of two
    hashed_config() dicts that differs (at most `show`, then a count)."""
    def flat(c):
        return {f"{s}.{k}": v for s, t in c.items() for k, v in t.items()}
    a, b = flat(old), flat(new)
    absent = "(not set)"
    for key in set(a) ^ set(b):        # left out at its default (hashed_config)
        sec, k = key.split(".", 1)
        if k in DEFAULTS.get(sec, {}):
            a.setdefault(key, DEFAULTS[sec][k])
            b.setdefault(key, DEFAULTS[sec][k])
    diffs = [f"{key}: {json.dumps(a.get(key, absent))} in the checkpoint, "
             f"{json.dumps(b.get(key, absent))} now"
             for key in sorted(set(a) | set(b)) if a.get(key, absent) != b.get(key, absent)]
    more = f"; and {len(diffs) - show} more" if len(diffs) > show else ""
    return "; ".join(diffs[:show]) + more


def hashed_config(cfg, legacy=False):
    """What determines the computation (as a dict; run_hash digests it),
    not operational keys (passes, threads, quiet, eval/checkpoint cadence,
    run dir, watchdog, cuda_aware, progress_s, time_limit, profile,
    timeline, keep_best, early_stop, early_stop_delta) nor where the data
    lives: data.path may move (a copy staged to node-local scratch after a
    requeue); the manifest's dataset fingerprint says whether it is the
    same data. Keys added later are left out at their defaults, so older
    checkpoints keep their digest. legacy: the digest of checkpoints
    written before that (path included, no cuda_aware key), still accepted
    on resume."""
    import copy
    c = copy.deepcopy(cfg)
    for key in ("passes", "quiet", "threads", "eval_every", "resume", "dir",
                "checkpoint_every", "keep_checkpoints", "simulate", "watchdog_s",
                "cuda_aware", "progress_s", "time_limit", "profile", "keep_best",
                "early_stop", "early_stop_delta", "timeline"):
        c["run"].pop(key, None)
    c["model"].pop("init", None)       # only a fresh start reads it
    o = c["optim"]
    if o["schedule"] == "cosine" and not o["decay_passes"]:
        o["decay_passes"] = float(cfg["run"]["passes"])   # what 0 resolves to
    for key in LR_KEYS:                # added later: older checkpoints lack them
        if o.get(key) == DEFAULTS["optim"][key]:
            o.pop(key)
    if not legacy:
        c["data"].pop("path", None)
    return c


def resolve_deadline(spec, env=None, clock=time.time):
    """(epoch seconds, where it came from) of the time limit, or (None, "").
    auto: the Slurm job's end, from SLURM_JOB_END_TIME (Slurm >= 23.02) or
    else `squeue -o %e` for SLURM_JOB_ID; none: no limit; a duration: that
    long from now (the run's start)."""
    from .config import parse_duration
    env = os.environ if env is None else env
    secs = parse_duration(spec)
    if secs is not None:
        return clock() + secs, f"run.time_limit = {spec}"
    if str(spec).strip().lower() != "auto":
        return None, ""
    end = env.get("SLURM_JOB_END_TIME", "")
    if end.isdigit() and int(end) > 0:
        return float(end), f"the end of Slurm job {env.get('SLURM_JOB_ID', '?')}"
    job = env.get("SLURM_JOB_ID", "")
    if job.isdigit():
        import subprocess
        try:
            out = subprocess.run(["squeue", "-h", "-j", job, "-o", "%e"], capture_output=True,
                                 text=True, timeout=20).stdout.strip()
            t = time.mktime(time.strptime(out, "%Y-%m-%dT%H:%M:%S"))
            return t, f"the end of Slurm job {job}, from squeue"
        except (OSError, subprocess.SubprocessError, ValueError, OverflowError):
            pass           # no squeue, an unlimited job (UNLIMITED), an old format
    return None, ""


def _install_stop_handlers(trainer):
    """SIGTERM / SIGUSR1 ask for a checkpoint-and-stop at the end of the
    current block (all ranks agree through the block's Allreduce flags)."""
    import signal
    import threading
    old = {}
    if threading.current_thread() is threading.main_thread():
        def on_signal(signum, frame):
            trainer.stop_requested = True
        for sig in (signal.SIGTERM, signal.SIGUSR1):
            old[sig] = signal.signal(sig, on_signal)
    return old


def _restore_handlers(old):
    import signal
    for sig, h in old.items():
        signal.signal(sig, h)


def _per_worker_totals(history, n):
    """summary.json's worker_compute_s / worker_cpu_s: per worker sums over
    the metrics lines that have both (lines from before compute_cpu_s
    existed, in a resumed run, are left out of both)."""
    h = [r for r in history if "compute_cpu_s" in r]
    return {key: [round(sum(r[src][i] for r in h), 3) for i in range(n)]
            for key, src in (("worker_compute_s", "compute_s"), ("worker_cpu_s", "compute_cpu_s"))}


def _retire_errors(run_dir, before):
    """Move the error-rank-*.txt an earlier job left (written before
    `before`) to RUN/old-errors/, named by when they were written, so those
    in RUN are this job's alone (`ibtmpi status`: failed) and the earlier
    ones are kept to read."""
    import glob
    for path in glob.glob(os.path.join(run_dir, "error-rank-*.txt")):
        try:
            t = os.path.getmtime(path)
            if t >= before:
                continue
            old = os.path.join(run_dir, "old-errors")
            os.makedirs(old, exist_ok=True)
            stamp = time.strftime("%Y%m%dT%H%M%S", time.localtime(t))
            os.replace(path, os.path.join(old, f"{os.path.basename(path)[:-4]}-{stamp}.txt"))
        except OSError:
            pass                  # gone meanwhile, or a read-only dir: status copes


def _per_worker_peaks(history, n):
    """summary.json's worker_peak_rss_mib (and, on GPUs, worker_gpu_pool_mib):
    per worker the largest figure of the run's metrics lines, earlier jobs
    of a resumed run included."""
    out = {}
    for key, src in (("worker_peak_rss_mib", "peak_rss_mib"),
                     ("worker_gpu_pool_mib", "gpu_pool_mib")):
        h = [r[src] for r in history if src in r]
        if h:
            out[key] = [max(r[i] for r in h) for i in range(n)]
    return out


def save_model(path, z, model, ds, cfg):
    """The trained model, self-contained and pickle-free: parameters, layer
    spec, input shape, classes and the normalisation it was trained with."""
    tmp = path + f".tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        np.savez(f, format=np.array("ibtmpi-model-1"), z=z,
                 input_shape=np.array(model.input_shape, np.int64),
                 classes=np.array(json.dumps(ds.classes)),
                 layers=np.array(json.dumps(cfg["model"]["layers"])),
                 mean=np.asarray(ds.mean, np.float64), std=np.asarray(ds.std, np.float64),
                 algorithm=np.array(cfg["algorithm"]["name"]))
    os.replace(tmp, path)
