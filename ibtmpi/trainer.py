"""The training driver: roles, the block loop, evaluation, metrics.

World size N+1 under MPI: rank 0 is the master (holds z, evaluates, logs,
writes the run directory, contributes zeros to the Allreduce), ranks 1..N
are workers. A single process is worker 0 and master at once (the N = 1
SGD baseline, same code path). ``run.simulate = N`` runs N logical workers
in one process: the same per-worker code, their packed buffers summed in
rank order instead of by MPI.

Per block: ONE packed Allreduce (``ssgd``: one per minibatch) of
  [ S (P) | loss_sum, samples, correct, sum ||w_i - z_s||^2, error, stop |
    compute s (N slots) | data-wait s (N slots) ]
float32, then every rank applies the same consensus update.
Tests: tests/unit/test_trainer.py (simulator), tests/mpi/test_trainer_mpi.py.
"""
from __future__ import annotations

import json
import math
import os
import sys
import time

import numpy as np

from . import comm as mpi
from .consensus import Consensus, WorkerState
from .dataset import Dataset
from .loader import WorkerData
from .model import Model
from .optim import SGD
from .schedule import Schedule, split_size_for

NS = 6                      # scalar slots: loss_sum, n, correct, q, error, stop


class Trainer:
    def __init__(self, cfg, log=print):
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
            raise ValueError("algorithm 'sgd' is the single-worker baseline: run it "
                             "without mpiexec (or with -n 1)")
        self.ds = Dataset(d["path"])
        tr = self.ds.split("train")
        split = split_size_for(d["block_size"] or None,
                               d["split_size"] or (None if d["block_size"] else 512), n)
        self.sched = Schedule(tr.n, n, split, d["batch"], d["seed"])
        h, w, c = self.ds.image_shape
        self.model = Model(cfg["model"]["layers"], (c, h, w), self.ds.n_classes,
                           seed=cfg["model"]["seed"])
        o = cfg["optim"]
        self.opt = SGD(self.model.params, o["lr"], o["momentum"], o["weight_decay"],
                       o["nesterov"])
        P = self.model.size
        self.P = P
        self.cons = None if self.algo == "ssgd" else Consensus(
            self.algo, self.model.params, n, a)
        self.states = {i: WorkerState(P, self.model.dtype, self.algo) for i in self.local}
        self.velocity = {i: np.zeros(P, self.model.dtype) for i in self.local}
        self.loaders = {i: WorkerData(tr, self.sched, i, self.ds.mean, self.ds.std,
                                      d["augment"], d["seed"], d["cache"])
                        for i in self.local}
        L = P + NS + 2 * n
        self.send = np.zeros(L, np.float32)
        self.recv = np.zeros(L, np.float32)
        self.total_blocks = max(1, math.ceil(r["passes"] * self.sched.blocks_per_pass))
        self.z = self.model.params.copy() if self.algo == "ssgd" else self.cons.z
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

    # -- helpers ------------------------------------------------------------
    def _eval_steps(self, data, params, out, batch=256):
        """Generator: evaluates params on (x, y) batch by batch, yielding in
        between, so the master can poll MPI; writes (loss, acc) into out."""
        from .data import normalize
        x, y = data
        np.copyto(self.eval_model.params, params)
        loss_sum, correct = 0.0, 0
        for s in range(0, len(y), batch):
            xb = normalize(x[s:s + batch], self.ds.mean, self.ds.std)
            l, acc = self.eval_model.evaluate(xb, y[s:s + batch], batch)
            loss_sum += l * len(xb)
            correct += round(acc * len(xb))
            yield
        out["loss"], out["acc"] = loss_sum / len(y), correct / len(y)

    def _run_steps(self, mbs):
        loss_sum, n, correct = 0.0, 0, 0
        for x, y in mbs:
            if len(y) == 0:
                continue
            loss, c = self.model.loss_and_grad(x, y)
            self.opt.step(self.model.grads)
            loss_sum += loss * len(y)
            n += len(y)
            correct += c
        return loss_sum, n, correct

    def _swap_in(self, i):
        # several simulated workers share one optimizer: swap their momentum
        if len(self.local) > 1:
            np.copyto(self.opt.v, self.velocity[i])

    def _swap_out(self, i):
        if len(self.local) > 1:
            np.copyto(self.velocity[i], self.opt.v)

    # -- one block ----------------------------------------------------------
    def _block_algo(self, k, work):
        p, b = self.sched.locate(k)
        P, n = self.P, self.n_workers
        send, recv = self.send, self.recv
        send.fill(0)
        vec = send[:P]
        tmp = np.empty(P, np.float32) if len(self.local) > 1 else None
        for i in self.local:
            t0 = time.perf_counter()
            mbs = self.loaders[i].block(p, b)
            t1 = time.perf_counter()
            self._swap_in(i)
            if self.cfg["optim"]["reset_momentum"]:
                self.opt.reset()
            ws = self.states[i]
            self.cons.worker_begin(ws, self.model.params)
            self.opt.extra_grad = self.cons.extra_grad(ws)
            loss_sum, cnt, corr = self._run_steps(mbs)
            out = tmp if tmp is not None else vec
            q = self.cons.contribution(ws, self.model.params, out)
            if tmp is not None:
                vec += tmp
            self._swap_out(i)
            t2 = time.perf_counter()
            send[P:P + 4] += np.array([loss_sum, cnt, corr, q], np.float32)
            send[P + NS + i] = t2 - t1
            send[P + NS + n + i] = t1 - t0
        mpi.allreduce_sum(send, recv, self.comm, work=work if self.is_master else None)
        diag = self.cons.update(recv[:P], float(recv[P + 3]))
        for i in self.local:
            self.cons.worker_end(self.states[i], self.model.params)
        return p, b, diag

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
            t_data[i] = time.perf_counter() - t0
        tot = np.zeros(NS + 2 * n, np.float64)
        w0 = self.model.params
        for s in range(steps):
            send.fill(0)
            for i in self.local:
                t0 = time.perf_counter()
                x, y = data[i][s]
                if len(y):
                    loss, c = self.model.loss_and_grad(x, y)
                    send[:P] += self.model.grads
                    send[P:P + 3] += np.array([loss * len(y), len(y), c], np.float32)
                send[P + NS + i] += time.perf_counter() - t0
                if s == 0:
                    send[P + NS + n + i] = t_data[i]
            mpi.allreduce_sum(send, recv, self.comm, work=work if self.is_master else None)
            g = recv[:P] * np.float32(1.0 / n)
            self.opt.step(g)            # same averaged gradient on every rank
            tot += recv[P:]
        np.copyto(self.z, w0)
        recv[P:] = tot
        return p, b, {"primal": 0.0, "dual": 0.0, "rho": 0.0}

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
                    self.send[:P] += self.model.grads
            mpi.allreduce_sum(self.send, self.recv, self.comm)
            self.opt.step(self.recv[:P] * np.float32(1.0 / n))
        self.opt.reset()
        self.cons = Consensus(self.algo, self.model.params, n, self.cfg["algorithm"])
        self.z = self.cons.z
        self.log(f"warm-up: {steps} gradient-allreduce steps before block 0")

    # -- the run --------------------------------------------------------------
    def run(self):
        cfg, r = self.cfg, self.cfg["run"]
        n, P = self.n_workers, self.P
        if self.is_master:
            os.makedirs(r["dir"], exist_ok=True)
            from .config import to_toml
            with open(os.path.join(r["dir"], "config.toml"), "w") as f:
                f.write(to_toml(cfg))
            self.metrics_f = open(os.path.join(r["dir"], "metrics.jsonl"), "w")
            self.log(f"{self.algo}: {n} worker(s){' (simulated)' if self.simulate else ''}, "
                     f"{self.sched.n} train images, split {self.sched.split_size}, "
                     f"batch {self.sched.batch}, {self.sched.blocks_per_pass} blocks/pass, "
                     f"{self.total_blocks} blocks, model {P:,d} parameters")
        eval_every = r["eval_every"] or self.sched.blocks_per_pass
        pending = None                 # (record, generator, out) evaluated while waiting
        bar = None
        if self.is_master and not r["quiet"] and sys.stderr.isatty():
            from tqdm import tqdm
            bar = tqdm(total=self.total_blocks, unit="block", leave=False)
        t_start = time.perf_counter()
        cpu_start = time.process_time()
        calls0, bytes0 = mpi.STATS["allreduce"], mpi.STATS["bytes"]
        images = 0
        step_fn = self._block_ssgd if self.algo == "ssgd" else self._block_algo
        if cfg["algorithm"]["warmup_steps"] and self.algo != "ssgd":
            self._warmup(cfg["algorithm"]["warmup_steps"])

        eval_cpu = [0.0]              # rank 0 CPU spent evaluating (useful work)

        def work():
            nonlocal pending
            if pending is None:
                return False
            c0 = time.process_time()
            try:
                next(pending[1])
                return True
            except StopIteration:
                self._emit(pending[0], pending[2])
                pending = None
                return False
            finally:
                eval_cpu[0] += time.process_time() - c0

        for k in range(self.total_blocks):
            t0 = time.perf_counter()
            p, b, diag = step_fn(k, work)
            # the master finishes any evaluation still pending from block k-1
            if pending is not None:
                c0 = time.process_time()
                for _ in pending[1]:
                    pass
                eval_cpu[0] += time.process_time() - c0
                self._emit(pending[0], pending[2])
                pending = None
            rv = self.recv[P:]
            loss_sum, cnt, corr = float(rv[0]), float(rv[1]), float(rv[2])
            comp = rv[NS:NS + n].astype(np.float64)
            wait = rv[NS + n:NS + 2 * n].astype(np.float64)
            wall = time.perf_counter() - t0
            images += cnt
            rec = {"block": k, "pass": p, "block_in_pass": b, "algorithm": self.algo,
                   "N": n, "train_loss": loss_sum / max(cnt, 1),
                   "train_acc": corr / max(cnt, 1), "samples": int(cnt),
                   "primal_residual": diag["primal"], "dual_residual": diag["dual"],
                   "rho": diag["rho"], "wall_s": wall,
                   "compute_max_s": float(comp.max()), "compute_mean_s": float(comp.mean()),
                   "data_wait_max_s": float(wait.max()), "data_wait_mean_s": float(wait.mean()),
                   "comm_s": max(wall - float(comp.max()) - float(wait.max()), 0.0),
                   "images_per_s": cnt / wall if wall > 0 else 0.0}
            if not np.isfinite(self.z).all() or not math.isfinite(rec["train_loss"]):
                raise FloatingPointError(
                    f"block {k}: non-finite loss or consensus model; lower "
                    f"optim.lr or raise algorithm.rho")
            if self.is_master:
                due = (k + 1) % eval_every == 0 or k + 1 == self.total_blocks
                if due and self.val is not None:
                    out = {}
                    gen = self._eval_steps(self.val, self.z, out)
                    if self.local or k + 1 == self.total_blocks:
                        c0 = time.process_time()
                        for _ in gen:         # nothing to overlap with: now
                            pass
                        eval_cpu[0] += time.process_time() - c0
                        self._emit(rec, out)
                    else:
                        pending = (rec, gen, out)
                else:
                    self._emit(rec, None)
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(loss=f"{rec['train_loss']:.3f}")
        if bar is not None:
            bar.close()
        wall = time.perf_counter() - t_start
        cpu = time.process_time() - cpu_start
        summary = {"algorithm": self.algo, "N": n, "blocks": self.total_blocks,
                   "passes": self.total_blocks / self.sched.blocks_per_pass,
                   "wall_s": wall, "rank0_cpu_s": cpu,
                   "rank0_cpu_share": cpu / wall if wall else 0.0,
                   "rank0_eval_cpu_s": eval_cpu[0],
                   # what rank 0 burns besides evaluating: waiting, updates, I/O
                   "rank0_other_cpu_share": (cpu - eval_cpu[0]) / wall if wall else 0.0,
                   "allreduce_calls": mpi.STATS["allreduce"] - calls0,
                   "allreduce_bytes": mpi.STATS["bytes"] - bytes0,
                   "images": int(images), "simulated": bool(self.simulate),
                   "world_size": 1 if self.simulate else mpi.world_size()}
        if self.is_master:
            if self.test is not None:
                out = {}
                for _ in self._eval_steps(self.test, self.z, out):
                    pass
                summary["test_loss"], summary["test_acc"] = out["loss"], out["acc"]
            last_val = [h for h in self.history if "val_acc" in h]
            if last_val:
                summary["val_acc"] = last_val[-1]["val_acc"]
            np.savez(os.path.join(r["dir"], "model.npz"), z=self.z,
                     input_shape=np.array(self.model.input_shape),
                     n_classes=np.array(self.model.n_classes))
            with open(os.path.join(r["dir"], "summary.json"), "w") as f:
                json.dump(summary, f, indent=1)
            self.metrics_f.close()
            if "test_acc" in summary:
                self.log(f"final test accuracy {summary['test_acc']:.4f} "
                         f"(loss {summary['test_loss']:.4f}) after {summary['passes']:.2f} "
                         f"pass(es), {wall:.1f} s; rank 0 CPU {summary['rank0_cpu_share']:.1%} "
                         f"({summary['rank0_other_cpu_share']:.1%} outside evaluation)")
        for ld in self.loaders.values():
            ld.close()
        self.summary = summary
        return summary

    def _emit(self, rec, val):
        if val:
            rec["val_loss"], rec["val_acc"] = val["loss"], val["acc"]
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
