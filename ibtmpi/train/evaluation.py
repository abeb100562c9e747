"""Rank 0's evaluation of z (MasterEvaluator): where it runs (run.eval_device:
the GPU the rank has, or the CPU), its batches interleaved with the waits
for the workers (`work`, called by comm.allreduce_sum while the master
waits) and carried across as many blocks as it takes (`settle`;
CarriedEvaluation: the metrics lines behind it and the manifest of a
checkpoint taken meanwhile wait for its line), the best model it keeps and
the early stop it decides (EvalHistory). Three parts of their own, built
from explicit arguments; the trainer's master.MasterSide writes the
evaluated line (`_emit`).
Tests: tests/unit/test_keep_best.py, test_device_path.py (eval_device),
tests/mpi/test_trainer_mpi.py (the carried evaluation).
"""
from __future__ import annotations

import os
import time

import numpy as np

from ..model import Model
from ..monitor import eval_rank

BEST = "model-best.npz"


class EvalHistory:
    """The evaluations of z so far as run.keep_best and run.early_stop read
    them: the best (the block with the highest val accuracy; equal accuracy:
    the lower val loss), early stop's reference and the evaluations since
    it, and the early stop decided (block, reason). No files and no model:
    the master's evaluation writes model-best.npz when `observe` says so."""

    def __init__(self, patience=0, delta=0.0):
        self.patience, self.delta = patience, delta
        self.best = None                 # {block, pass, val_acc, val_loss}
        self.ref = None                  # early stop's reference evaluation
        self.since_ref = 0               # evaluations since then
        self.early = None                # (block to stop after, reason)

    def observe(self, rec):
        """One evaluation's metrics line; True when it is the best so far.
        The early stop counts the evaluations since the last one that was
        better than its reference: the same order, or with delta = d a val
        accuracy higher by more than d (the reference is then the last
        evaluation that was: small gains add up until together they clear
        d). The evaluation of block k may end while block k+1 runs, after
        k+1's flags went out: the stop rides on block k+2's flags, in every
        run alike (MPI, simulation, resumed), so it ends after k+2."""
        better = self.best is None or eval_rank(rec) > eval_rank(self.best)
        if better:
            self.best = {k: rec[k] for k in ("block", "pass", "val_acc", "val_loss")}
        d, ref = self.delta, self.ref
        if ref is None or (rec["val_acc"] > ref["val_acc"] + d if d else
                           eval_rank(rec) > eval_rank(ref)):
            self.ref, self.since_ref = rec, 0
            return better
        self.since_ref += 1
        p = self.patience
        if p and self.since_ref >= p and self.early is None:
            than = (f"above {ref['val_acc']:.4f} + {d:g}" if d else
                    f"better than {ref['val_acc']:.4f}")
            self.early = (rec["block"] + 2, f"no val accuracy {than} (block "
                          f"{ref['block']}) in {p} evaluations")
        return better


class CarriedEvaluation:
    """The master's evaluation in flight: its batches run in the waits for
    the workers (`work`, from comm.allreduce_sum), across as many blocks as
    it takes; the metrics lines of the blocks behind it, and the manifests
    of checkpoints confirmed meanwhile, wait for its line so both stay in
    block order. emit(rec, out) writes a metrics line, manifest(k) a
    checkpoint's manifest; span(t0, t1, block) is the timeline's."""

    def __init__(self, emit, manifest, span):
        self.emit, self.manifest, self.span = emit, manifest, span
        self.pending = None              # (record, generator, out)
        self.queued = []                 # metrics lines waiting behind it
        self.deferred = []               # checkpoints confirmed once those are out
        self.cpu_s = 0.0                 # rank 0 CPU spent evaluating (useful work)

    def start(self, rec, steps, out):
        self.pending = (rec, steps, out)

    def line(self, rec):
        """A block's metrics line: now, or behind the evaluation in flight."""
        if self.pending is not None:
            self.queued.append(rec)
        else:
            self.emit(rec, None)

    def confirm(self, k):
        """Checkpoint k's manifest: now, or once the lines up to k are out."""
        if self.pending is not None:
            self.deferred.append(k)
        else:
            self.manifest(k)

    def work(self):
        """One batch of the evaluation in flight; False when there is none
        (its line, and those behind it, are then written)."""
        if self.pending is None:
            return False
        c0, t0 = time.process_time(), time.perf_counter()
        try:
            next(self.pending[1])
            self.span(t0, time.perf_counter(), self.pending[0]["block"])
            return True
        except StopIteration:
            self.emit(self.pending[0], self.pending[2])
            self.pending = None
            queued, self.queued = self.queued, []
            for rec in queued:
                self.emit(rec, None)
            deferred, self.deferred = self.deferred, []
            for k in deferred:
                self.manifest(k)
            return False
        finally:
            self.cpu_s += time.process_time() - c0


class MasterEvaluator:
    """Rank 0's evaluation of z, a part of its own: the val and test data
    and the evaluation model (where run.eval_device puts it), the history
    of evaluations (EvalHistory: the best, the early stop), the evaluation
    carried across the waits (CarriedEvaluation) and the best model file.
    Every rank builds one; only the master's holds data. Built from
    explicit arguments: host(a) brings a rank array to the host; sync is
    the ConsensusState (the agreed buffers); norm the inputs' (mean, std);
    save_best(params, buffers) writes RUN/model-best.npz; emit, manifest
    and span are CarriedEvaluation's."""

    def __init__(self, cfg, ds, *, is_master, has_workers, eval_ops, host, sync, norm,
                 control, save_best, emit, manifest, span):
        r = cfg["run"]
        self.run_dir, self.keep_best = r["dir"], r["keep_best"]
        self.carry = not (has_workers or r["early_stop"])   # see settle()
        self.host, self.sync, self.norm, self.control = host, sync, norm, control
        self.save_best = save_best
        self.val = self.test = self.eval_model = None
        if is_master:
            for name in ("val", "test"):
                if name in ds.splits:
                    sp = ds.split(name)
                    setattr(self, name, (sp.read_all(), sp.labels))
            h, w, c = ds.image_shape
            self.eval_model = Model(cfg["model"]["layers"], (c, h, w), ds.n_classes,
                                    ops=self._ops(r["eval_device"], eval_ops))
        self.history = EvalHistory(r["early_stop"], r["early_stop_delta"])
        self.carried = CarriedEvaluation(emit, manifest, span)

    @staticmethod
    def _ops(where, ops):
        """Where the master evaluates (run.eval_device): auto on the GPU
        this rank has (a one-process GPU run's, or a master's of its own on
        a GPU node: entry.py), else on the CPU; gpu where it has none is an
        error. The logits agree with the CPU model's to float32 rounding
        (different summation orders), so accuracies can differ by an image
        whose top two logits tie within it."""
        from ..config import ConfigError
        ops = None if where == "cpu" else ops
        if where == "gpu" and ops is None:
            raise ConfigError("run.eval_device = gpu, but the evaluating rank (rank 0) "
                              "has no GPU; use auto or cpu")
        return ops

    def _host_params(self, a):
        ops = self.eval_model.device_ops
        return a if ops is None else ops.asnumpy(a)

    def steps(self, data, params, out, batch=256, buffers=None):
        """Generator: evaluates params (with buffers, z's by default) on
        (x, y) batch by batch, yielding in between, so the master can poll
        MPI; writes (loss, acc) into out."""
        from ..serial import evaluate_steps
        m = self.eval_model     # params: the host's, or z on the master's GPU (its own)
        m.params[...] = (self.host(params) if m.device_ops is None
                         else m.device_ops.asarray(params))
        m.load_buffers(self.sync.zbuf if buffers is None else buffers)
        return evaluate_steps(m, data[0], data[1], self.norm[0], self.norm[1], out, batch)

    def work(self):
        """The master's useful work while waiting: one batch of the pending
        evaluation. Returns False when there is nothing to do."""
        return self.carried.work()

    def settle(self):
        """After a block: finish the pending evaluation, unless it may be
        carried into the next blocks' waits. A master of its own carries
        it (its batches run while it waits for the workers; the metrics
        lines behind it wait for its line, so their order stays the block
        order, and so do the manifests of checkpoints taken meanwhile), so
        a long evaluation never holds the workers at the next Allreduce;
        not under run.early_stop, whose decision must come at the block it
        always came at. The last block, a stop and the next due evaluation
        finish it first."""
        if not self.carry:
            self.finish()

    def finish(self):
        if self.carried.pending is not None:
            self.control.at("evaluation")
            while self.work():
                pass

    def best_summary(self, summary, last_block):
        """summary.json's "best": the block with the best val accuracy, and
        its model's test accuracy (the final one's where that is the last)."""
        b = dict(self.history.best)
        path = os.path.join(self.run_dir, BEST)
        if not (self.keep_best and os.path.exists(path)):
            return b
        b["file"] = path
        if self.test is None:
            return b
        if b["block"] == last_block:
            b["test_loss"], b["test_acc"] = summary["test_loss"], summary["test_acc"]
            return b
        out = {}
        with np.load(path) as f:
            z = f["z"]
            buffers = f["buffers"] if "buffers" in f.files else None   # its own statistics
        for _ in self.steps(self.test, z, out, buffers=buffers):
            pass
        b["test_loss"], b["test_acc"] = out["loss"], out["acc"]
        return b

    def observe(self, rec, write=True):
        """Master, at each evaluation (write=False: replaying those of a
        resumed run): the history decides (EvalHistory); a new best is
        written to RUN/model-best.npz. The evaluated z is the evaluation
        model's (the consensus has moved on while the evaluation overlapped
        the next block)."""
        if self.history.observe(rec) and write and self.keep_best:
            self.save_best(self._host_params(self.eval_model.params),
                           self._host_params(self.eval_model.buffers))
