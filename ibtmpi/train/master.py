"""Rank 0's side of a run: the block records and metrics lines, progress
and the straggler / starvation / memory reports, the start and plan text,
summary.json. Its evaluation of z (batch by batch in the waits for the
workers, carried across blocks), the best model and early stop are
train/evaluation.py's.
Tests: tests/unit/test_trainer.py, test_keep_best.py, test_stragglers.py,
test_dry_run.py, test_status.py.
"""
from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

from .. import checkpoint as ckpt
from .. import comm as mpi
from .. import memory, recipe, timeline
from ..fsutil import open_append, read_jsonl, replace_file
from ..monitor import (MasterLate, Progress, Starved, Stragglers,
                       master_late_recent, master_late_text, oversubscription_text,
                       placement_text, ranges)
from ..outputs import save_model
from .plan import split_note

from .evaluation import BEST, MasterEvaluator
from .lifecycle import weakly


class MasterSide:
    """Rank 0's side of a run, built from explicit arguments: its evaluator
    (MasterEvaluator), the block records (`record`: every rank builds the
    line the same way), the metrics lines, the run directory's files, the
    live reports and summary.json. On a worker rank it builds the records
    and does nothing else. The run's extent (start, total blocks) is the
    RunControl's; sync the ConsensusState (z, the consensus object, the
    agreed buffers); ckpt the Checkpointer (the resume's notes); opt the
    local optimizer (its lr when an algorithm reports none); host(a) a
    rank array on the host; manifest(k) writes checkpoint k's manifest."""

    def __init__(self, cfg, ds, *, is_master, local, n_workers, simulate, sched, packet,
                 model, opt, lr_at, sync, ckpt, control, host, eval_ops, norm, manifest,
                 device_state, single_worker, recipe_set, log):
        self.cfg, self.ds, self.is_master, self.local = cfg, ds, is_master, local
        self.n_workers, self.simulate, self.sched, self.packet = n_workers, simulate, sched, packet
        self.model, self.opt, self.lr_at, self.sync, self.ckpt = model, opt, lr_at, sync, ckpt
        self.control, self.host, self.log = control, host, log
        self.device_state, self.single_worker = device_state, single_worker
        self.recipe_set = recipe_set
        self.algo, self.run_dir = cfg["algorithm"]["name"], cfg["run"]["dir"]
        self.evaluator = MasterEvaluator(
            cfg, ds, is_master=is_master, has_workers=bool(local), eval_ops=eval_ops,
            host=host, sync=sync, norm=norm, control=control,
            save_best=weakly(self, "_save_best"), emit=weakly(self, "_emit"),
            manifest=manifest, span=weakly(self, "_eval_span"))
        self.metrics_f = self.tb = self.bar = self.progress = None
        self.history = []                # this run's metrics lines (a resume's earlier ones too)
        self.placement = []              # every rank's row (placed)
        self.tl = timeline.Off()
        self._chance_said = False

    def placed(self, rows):
        """Every rank's placement row, once the start-up allgather gave them."""
        self.placement = rows

    def trace(self, tl):
        self.tl = tl

    def _save_best(self, params, buffers):
        save_model(os.path.join(self.run_dir, BEST), params, self.model, self.ds, self.cfg,
                   buffers)

    def _eval_span(self, t0, t1, k):
        self.tl.span("evaluation", t0, t1, 0, block=k)

    def start_reports(self, start):
        """Progress (a bar on a terminal, lines in a batch log), straggler,
        starvation and memory-growth watches, the pending evaluation."""
        r, n = self.cfg["run"], self.n_workers
        if self.is_master and not r["quiet"] and sys.stderr.isatty():
            from tqdm import tqdm
            self.bar = tqdm(total=self.control.total, initial=start, unit="block",
                            leave=False)
        # no terminal (a batch job's log): a progress line every progress_s
        self.progress = Progress(self.control.total, start, r["progress_s"], self.log) \
            if self.is_master and self.bar is None and not r["quiet"] else None
        self.stragglers = Stragglers(n)
        self.master_late = MasterLate()
        self.growth = memory.MemoryGrowth()
        # CPU workers (GPU workers' host threads may rightly sleep in compute);
        # one process (simulation, N = 1) has one placement row
        rows = self.placement
        self.starved = Starved([i for i in range(n)
                                if rows[i + 1 if len(rows) > 1 else 0][3] == "cpu"])

    def close(self):
        if self.bar is not None:
            self.bar.close()
        if self.metrics_f is not None:
            self.metrics_f.flush()
        if self.tb is not None:
            self.tb.close()
            self.tb = None

    def record(self, k, p, b, diag, wall, busy=0.0, slack=0.0):
        """Block k's metrics line from the reduced packet (every rank)."""
        pk, n = self.packet, self.n_workers
        loss_sum, cnt, corr = pk.stat("loss_sum"), pk.stat("samples"), pk.stat("correct")
        comp, wait, cpu = pk.reduced("compute"), pk.reduced("wait"), pk.reduced("cpu")
        rss, pool = pk.got("rss"), pk.got("pool")
        rec = {"block": k, "blocks_total": self.control.total, "pass": p,
               "block_in_pass": b, "algorithm": self.algo,
               "N": n, "train_loss": loss_sum / max(cnt, 1),
               "train_acc": corr / max(cnt, 1), "samples": int(cnt),
               "primal_residual": diag["primal"], "dual_residual": diag["dual"],
               "rho": diag["rho"], "lr": diag.get("lr", self.opt.lr),
               "wall_s": wall,             # end of block k-1 to end of block k
               # rank 0: its own work in that span (update, evaluation batches,
               # checkpoint, metrics) and its sleep waiting for the workers
               "master_busy_s": round(busy, 6), "master_slack_s": round(slack, 6),
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
        if "overshoot" in diag:             # the guard fired (consensus/outer.py)
            rec["outer_overshoot"] = {k: float(v) for k, v in diag["overshoot"].items()}
        note = self.ckpt.take_change_note()       # the first block of a resume that changed keys
        if note:
            rec["config_changed"] = note
        return rec

    def report_block(self, k, p, b, rec, last):
        """Master, after block k: the live reports, the evaluation of z
        (overlapped with the next block where a worker runs here too: no),
        the metrics line, progress."""
        comp = self.packet.reduced("compute")
        cpu = self.packet.reduced("cpu")
        slow = self.stragglers.block(comp)
        if slow is not None:
            self.log(self._straggler_text(*slow))
        if not self.local:        # a master of its own: did the workers wait for it?
            if self.master_late.block(rec["master_busy_s"], rec["compute_max_s"],
                                      rec["data_wait_max_s"]):
                self.log("master: " + master_late_text(master_late_recent(
                    self.history + [rec]) or {
                        "blocks": sum(self.master_late.recent),
                        "of": len(self.master_late.recent),
                        "busy_s": rec["master_busy_s"], "compute_s": rec["compute_max_s"]}))
        else:
            rec["master_is_worker"] = True      # one process: its busy time is compute too
        starved = self.starved.block(comp, cpu)
        if self.starved.now:      # for `ibtmpi status` of a live run
            rec["starved"] = self.starved.now
        if starved:
            self.log(self._starved_text(
                starved, f"{self.starved.need}+ of the last "
                         f"{self.starved.window} blocks"))
        eval_every = self.cfg["run"]["eval_every"] or self.sched.blocks_per_pass
        due = (k + 1) % eval_every == 0 or last
        ev = self.evaluator
        if due and ev.val is not None:
            ev.finish()                 # one evaluation at a time
            self.control.enter("evaluation")
            out = {}
            ev.carried.start(rec, ev.steps(ev.val, self.sync.z, out), out)
            if self.local or last:      # nothing to overlap with: now
                ev.finish()
        else:
            ev.carried.line(rec)        # behind a carried evaluation's line, or now
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(loss=f"{rec['train_loss']:.3f}")
        if self.progress is not None and not last:
            self.progress.block_done(k, rec, self.sched.blocks_per_pass)
        if b + 1 == self.sched.blocks_per_pass:
            for found in self.growth.pass_done(rec):
                self.log(self._growth_text(p, *found))

    def merge_timeline(self):
        """After the run's last collective (Trainer._end_timeline): the
        master merges every rank's complete timeline file."""
        if self.is_master and isinstance(self.tl, timeline.Timeline):
            path, n = timeline.merge(self.run_dir, {"run_dir": self.run_dir,
                                                    "algorithm": self.algo})
            self.log(f"timeline: {path} ({n} spans; open in https://ui.perfetto.dev "
                     f"or chrome://tracing)")

    def read_history(self, start):
        """Master, resuming at `start`: the metrics lines of the blocks the
        checkpoint covers, and from them the best evaluation so far and any
        early stop, as the first attempt saw them."""
        mpath = os.path.join(self.run_dir, "metrics.jsonl")
        kept = [rec for rec in read_jsonl(mpath) if rec.get("block", -1) < start]
        self.history = kept
        for rec in kept:
            if "val_acc" in rec:
                self.evaluator.observe(rec, write=False)

    def open_run_dir(self, start):
        r = self.cfg["run"]
        from ..config import to_toml
        os.makedirs(r["dir"], exist_ok=True)
        # never through a link planted in the run directory (start-up refuses
        # them; these writes cannot follow one made since)
        replace_file(os.path.join(r["dir"], "config.toml"), to_toml(self.cfg))
        mpath = os.path.join(r["dir"], "metrics.jsonl")
        if start:
            with open_append(mpath, truncate=True) as f:
                f.writelines(json.dumps(x) + "\n" for x in self.history)
            if not self.ckpt.reshape:              # a reshape said where it continues
                self.log(f"resuming from {ckpt.ckpt_dir(r['dir'], start - 1)} "
                         f"({start}/{self.control.total} blocks done; next: block {start})")
        else:                          # a fresh start: no stale best of another run
            try:
                os.remove(os.path.join(r["dir"], BEST))
            except FileNotFoundError:
                pass
        if self.control.deadline is not None:
            self.log(f"time limit {self.control.deadline.text()}: the run stops with a "
                     f"checkpoint before it (exit 75) and resumes when run again")
        self.metrics_f = open_append(mpath, truncate=not start)
        self.tb = None
        if r["tensorboard"]:               # checked at start-up (config.validate)
            from ..tensorboard import Writer
            self.tb = Writer(r["dir"])
        self.log(f"{self.algo}: {self.n_workers} worker(s)"
                 f"{' (simulated)' if self.simulate else ''}, "
                 f"{self.sched.n} train images, split {self.sched.split_len(0, 0)}"
                 f"{split_note(self.sched)}, "
                 f"batch {self.sched.batch}, {self.sched.blocks_per_pass} blocks/pass, "
                 f"{self.control.total} blocks, model {self.model.size:,d} parameters")
        if self.recipe_set:
            self.log(recipe.describe(self.n_workers, self.recipe_set))
        if self.n_workers == 1 and not self.single_worker:
            self.log(f"one worker: this is {self.algo} with N = 1, not the single-worker "
                     f"baseline the docs and benchmarks compare against (plain SGD: "
                     f"--set algorithm.name=sgd)")
        if self.ds.unchecked:
            self.log(f"warning: {', '.join(self.ds.unchecked[:3])}"
                     f"{' ...' if len(self.ds.unchecked) > 3 else ''} in {self.ds.path} have "
                     f"no checksums: a damaged row would be read without an error "
                     f"(re-create the data set with `ibtmpi prep` to add them)")
        if self.ckpt.init_note and not start:
            self.log(f"model.init: {self.ckpt.init_note}")
        if self.lr_at.describe():
            self.log(self.lr_at.describe())
        cons = self.sync.cons
        outer = (cons.describe_outer(self.cfg["algorithm"]["outer_schedule"])
                 if cons is not None else None)
        if outer:
            self.log(outer)
        self.log(placement_text(self.placement))
        if self.device_state:       # a master of its own on its GPU
            self.log(f"the master keeps z and the consensus state on its GPU and updates "
                     f"them there (run.master_device = {self.cfg['run']['master_device']})")
        warn = oversubscription_text(self.placement)
        if warn:
            self.log(warn)

    def _summary(self, wall, cpu, calls0, bytes0, images, times):
        """summary.json's figures of this job (the test evaluation's are
        added by finish)."""
        passes = {}
        for h in self.history:             # honest pass times: block ends to block ends
            passes[h["pass"]] = passes.get(h["pass"], 0.0) + h["wall_s"]
        start = self.control.start_block
        if passes and self.history[-1]["block"] >= start:
            # the last block's own tail (its checkpoint, metrics) ends the last pass
            passes[self.history[-1]["pass"]] += times["tail_s"]
        total = self.control.total
        summary = {"algorithm": self.algo, "N": self.n_workers, "blocks": total,
                   "parameters": self.model.size,
                   "passes": total / self.sched.blocks_per_pass,
                   "wall_s": wall, "rank0_cpu_s": cpu,
                   "rank0_cpu_share": cpu / wall if wall else 0.0,
                   "rank0_eval_cpu_s": self.evaluator.carried.cpu_s,
                   # what rank 0 burns besides evaluating: waiting, updates, I/O
                   "rank0_other_cpu_share": (cpu - self.evaluator.carried.cpu_s) / wall if wall else 0.0,
                   "allreduce_calls": mpi.STATS["allreduce"] - calls0,
                   "allreduce_bytes": mpi.STATS["bytes"] - bytes0,
                   "images": int(images), "simulated": bool(self.simulate),
                   # where rank 0 kept z and updated it (run.master_device)
                   "master_consensus": "gpu" if self.device_state else "cpu",
                   "world_size": 1 if self.simulate else mpi.world_size(),
                   # wall_s is this process's; a resumed run's blocks before
                   # start ran in earlier ones: their time is in the metrics
                   "resumed_at_block": start,
                   "blocks_wall_s": float(sum(h["wall_s"] for h in self.history)),
                   # launch to the first block (imports, data, model, the
                   # start-up collectives), the last block's own tail (its
                   # checkpoint, metrics), and each pass's blocks summed
                   "startup_s": round(times["startup_s"], 3),
                   "startup_parts": times["startup_parts"],
                   "tail_s": round(times["tail_s"], 6),
                   "pass_s": [round(passes[p], 6) for p in sorted(passes)],
                   "master_busy_s": float(sum(h.get("master_busy_s", 0.0)
                                              for h in self.history)),
                   "master_late_blocks": self.master_late.count,
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
                   # figure -> {worker: [MiB where its rises began, MiB when named]}
                   # of the workers whose memory kept growing (a leak?)
                   "memory_growth": {k: {str(i): v for i, v in sorted(d.items())}
                                     for k, d in self.growth.found.items()},
                   "environment": self._environment()}
        return summary

    def finish(self, t_start, cpu_start, calls0, bytes0, images, times):
        """summary.json (the master's; the workers' is returned alike),
        the final test evaluation and model.npz, the closing lines. times:
        startup_s, startup_parts, tail_s (the last block's own tail)."""
        r = self.cfg["run"]
        wall = time.perf_counter() - t_start
        summary = self._summary(wall, time.process_time() - cpu_start, calls0, bytes0, images,
                                times)
        total, start = self.control.total, self.control.start_block
        trained = total - start
        late = self.starved.summary(trained) if self.is_master else None
        if late:               # a run too short for the live report
            self.log(self._starved_text(late, f"{min(self.starved.counts[i] for i in late)} "
                                              f"of the {trained} blocks of this run"))
        done = os.path.join(r["dir"], "summary.json")
        if self.is_master and start >= total and os.path.exists(done):
            # nothing trained: the finished run's summary stays as it was
            with open(done) as f:
                summary = json.load(f)
            self.metrics_f.close()
            acc = (f" (test accuracy {summary['test_acc']:.4f})"
                   if "test_acc" in summary else "")
            if self.control.early_agreed:
                self.log(f"{r['dir']} stopped early after block {start - 1} "
                         f"(run.early_stop){acc}: nothing to train, its summary and model "
                         f"are kept. Use another run.dir to train again")
            else:
                self.log(f"{r['dir']} already holds {start} trained blocks, this run "
                         f"asks for {total}{acc}: nothing to train, its "
                         f"summary and model are kept. Raise run.passes to train on, or "
                         f"use another run.dir")
        elif self.is_master:
            self.control.at("evaluation")
            t_eval = time.perf_counter()
            ev = self.evaluator
            if ev.test is not None:
                out = {}
                for _ in ev.steps(ev.test, self.sync.z, out):
                    pass
                summary["test_loss"], summary["test_acc"] = out["loss"], out["acc"]
            summary["final_eval_s"] = round(time.perf_counter() - t_eval, 6)
            last_val = [h for h in self.history if "val_acc" in h]
            if last_val:
                summary["val_acc"] = last_val[-1]["val_acc"]
            save_model(os.path.join(r["dir"], "model.npz"), self.host(self.sync.z), self.model,
                       self.ds, self.cfg, self.sync.zbuf)
            if ev.history.best is not None:
                summary["best"] = ev.best_summary(summary, total - 1)
            early = ev.history.early
            if self.control.early_agreed and early is not None:
                summary["stopped_early"] = {"after_block": total - 1,
                                            "reason": early[1]}
                self.log(f"early stop (run.early_stop): {early[1]}; stopped after "
                         f"block {total - 1}")
            replace_file(done, json.dumps(summary, indent=1))
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
            if b and b["block"] != total - 1:
                self.log(f"best val accuracy {b['val_acc']:.4f} at block {b['block']} (pass "
                         f"{b['pass'] + 1}); final {summary['val_acc']:.4f}"
                         + (f"; {b['file']}: test accuracy {b['test_acc']:.4f}"
                            if "test_acc" in b else ""))
        return summary

    def _emit(self, rec, val):
        if val:
            rec["val_loss"], rec["val_acc"] = val["loss"], val["acc"]
            self.evaluator.observe(rec)
        self._overshoot_check(rec)
        self.history.append(rec)
        self.metrics_f.write(json.dumps(rec) + "\n")
        self.metrics_f.flush()
        if self.tb is not None:
            self.tb.block(rec)
        bpp = self.sched.blocks_per_pass
        if rec["block_in_pass"] == bpp - 1 or rec["block"] + 1 == self.control.total:
            blocks = [h for h in self.history if h["pass"] == rec["pass"]]
            loss = sum(h["train_loss"] * h["samples"] for h in blocks) / max(
                1, sum(h["samples"] for h in blocks))
            msg = (f"pass {rec['pass'] + 1}: train loss {loss:.4f}, "
                   f"{sum(h['wall_s'] for h in blocks):.1f} s")
            if "val_acc" in rec:
                msg += f", val acc {rec['val_acc']:.4f}"
            self.log(msg)
            self._chance_check(rec["pass"], loss)

    def _chance_check(self, p, loss):
        """Once a run, from its second pass on: a pass whose training loss is
        not below ln(classes) (less 1%), the loss of a net that predicts
        every class alike, has learned nothing so far (most often: dead
        ReLUs from too large a step before the first consensus, or a step
        too small to move); the run goes on, but says so rather than train
        to the end at chance."""
        chance = np.log(self.ds.n_classes)
        if p < 1 or self._chance_said or loss < 0.99 * chance:
            return
        self._chance_said = True
        self.log(f"warning: pass {p + 1}'s training loss {loss:.4f} is no better than "
                 f"that of a net that predicts each of the {self.ds.n_classes} classes "
                 f"alike (ln {self.ds.n_classes} = {chance:.4f}): it has learned nothing "
                 f"so far. Check optim.lr (now {self.cfg['optim']['lr']:g}): too large a "
                 f"step can kill the ReLUs before the first consensus (optim.warmup_passes "
                 f"= 1 guards against that), too small a one moves nothing. The run goes on")

    def _overshoot_check(self, rec):
        """What the outer step's overshoot guard found at this block (every
        rank decided it alike from the reduced loss: consensus/outer.py,
        OvershootGuard): the line names the settings, and the back-off
        (algorithm.overshoot_backoff) or what to change."""
        found = rec.get("outer_overshoot")
        if found is None:
            return
        cons, a, k = self.sync.cons, self.cfg["algorithm"], rec["block"]
        what = (f"warning: the outer step overshoots: block {k}'s training loss "
                f"{rec['train_loss']:.4f} is up from {found['low']:.4f} for two blocks, with "
                f"the outer step amplifying the workers' mean {cons.outer_gain():.3g}x "
                f"(algorithm.block_momentum {a['block_momentum']:g}, block_lr "
                f"{a['block_lr']:g})")
        if a["overshoot_backoff"]:
            self.log(f"{what}: backed off to the plain average's gain from block {k + 1} "
                     f"(zeta x {found['factor']:.3g}, the block momentum dropped: "
                     f"algorithm.overshoot_backoff); lower algorithm.block_momentum or "
                     f"block_lr for the next run")
        else:
            self.log(f"{what}. Lower algorithm.block_momentum or block_lr (a resume may "
                     f"change them), or ramp them in (algorithm.outer_schedule = warmup). "
                     f"The run goes on")

    def _growth_text(self, p, key, i, first, now):
        what = "peak RSS" if key == "peak_rss_mib" else "CuPy pool"
        n = memory.MemoryGrowth.RISES
        return (f"memory: {self._workers_text([i])}: {what} grew from {first:.0f} MiB at "
                f"the end of pass {p + 1 - n} to {now:.0f} MiB at the end of pass "
                f"{p + 1}, in each of these {n} passes: a leak? ({key} in "
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
                f"block measures the wait for cores, not the computation "
                f"(--set run.threads=1 stops BLAS threads fighting for them); "
                f"compute_cpu_s in metrics.jsonl has it per block")

    def _environment(self):
        """What a run needs to be compared months later: versions, the MPI
        library and where every rank ran (this process's last start)."""
        import platform
        from .. import __version__
        return {"ibtmpi": __version__, "python": platform.python_version(),
                "numpy": np.__version__, "mpi": mpi.library_version(),
                "ranks": [{"rank": i, "host": h, "pid": p, "blas_threads": t, "device": d,
                           "cores": len(c)} for i, (h, p, t, d, c) in enumerate(self.placement)]}


def _per_worker_totals(history, n):
    """summary.json's worker_compute_s / worker_cpu_s: per worker sums over
    the metrics lines that have both (lines from before compute_cpu_s
    existed, in a resumed run, are left out of both, as are a reshaped
    run's lines of another worker count)."""
    h = [r for r in history if "compute_cpu_s" in r and len(r.get("compute_s", ())) == n
         and len(r["compute_cpu_s"]) == n]
    return {key: [round(sum(r[src][i] for r in h), 3) for i in range(n)]
            for key, src in (("worker_compute_s", "compute_s"), ("worker_cpu_s", "compute_cpu_s"))}


def _per_worker_peaks(history, n):
    """summary.json's worker_peak_rss_mib (and, on GPUs, worker_gpu_pool_mib):
    per worker the largest figure of the run's metrics lines, earlier jobs
    of a resumed run included."""
    out = {}
    for key, src in (("worker_peak_rss_mib", "peak_rss_mib"),
                     ("worker_gpu_pool_mib", "gpu_pool_mib")):
        h = [r[src] for r in history if len(r.get(src, ())) == n]   # this count's
        if h:
            out[key] = [max(r[i] for r in h) for i in range(n)]
    return out
