"""The --dry-run plan: what a run would do, from what its start checks.

`plan_lines(trainer)` does what a start does up to the first block (the
placement and its agreement check, the resume choice, the run-directory
lock probe) and returns the lines to print on rank 0 ([] elsewhere).
Tests: tests/unit/test_dry_run.py.
"""
from __future__ import annotations

from .. import checkpoint as ckpt
from .. import comm as mpi
from .. import recipe, runlock, timeline
from ..monitor import oversubscription_text, placement_text


def plan_lines(t):
    """What run() would do, checked the way run() checks it, with nothing
    trained or written (train --dry-run): the run directory's lock, which
    checkpoint it would resume from (every rank reads its own file), the
    schedule and the traffic. Every rank must call it; the master gets
    the lines to print, the workers []."""
    lock = runlock.probe(t.run_dir) if t.is_master else None
    t.place()
    start = t.ckpt.restore(dry=True)
    if not (t.simulate or mpi.world_size() == 1):
        mpi.allgather(None)        # every rank got this far: only then "would start"
    if not t.is_master:
        return []
    s, r, n = t.sched, t.cfg["run"], t.n_workers
    ds = t.ds
    h, w, c = ds.image_shape
    if t.simulate:
        how = f"{n} workers simulated in one process"
    elif mpi.world_size() > 1:
        how = f"{n} workers, {mpi.world_size()} processes (rank 0 the master)"
    else:
        how = "1 worker, one process (the baseline)"
    splits = ", ".join(f"{k} {ds.split(k).n:,d}" for k in ds.splits)
    per_pass = s.steps_per_pass() if t.algo_cls.per_step else s.blocks_per_pass
    mib = t.packet.size * 4 / 2**20
    every = r["checkpoint_every"] or s.blocks_per_pass
    rs = t.ckpt.reshape
    if start and rs:
        resume = (f"continue {ckpt.ckpt_dir(t.run_dir, rs['block'])} of "
                  f"{rs['from_n']} worker(s) with {t.n_workers} at block {start} of "
                  f"{t.total_blocks} (run.resume = reshape)")
    elif start:
        resume = (f"resume from {ckpt.ckpt_dir(t.run_dir, start - 1)} "
                  f"({start}/{t.total_blocks} blocks done; next: block {start})")
    else:
        resume = "start from block 0" + (f", {t.ckpt.init_note}" if t.ckpt.init_note else "")
    warn = oversubscription_text(t.placement)
    outer = (t.cons.describe_outer(t.cfg["algorithm"]["outer_schedule"])
             if t.cons is not None else None)
    return [
        "dry run: nothing trained, nothing written; the job would start as follows",
        f"  job: {t.algo}, {how}; workers compute on "
        f"{'gpu' if t.dev is not None else 'cpu'}",
        f"  data: {ds.path}: {splits} images {h}x{w}x{c}, {ds.n_classes} classes",
        f"  blocks: split {s.split_len(0, 0):,d} per worker{split_note(s)} (block "
        f"{sum(s.split_len(i, 0) for i in range(n)):,d}), "
        f"batch {s.batch}, {s.max_range:,d} samples per worker: {s.blocks_per_pass} "
        f"blocks per pass, {s.steps_in_block(0)} steps per block; {t.total_blocks} "
        f"blocks for {r['passes']:g} pass(es)",
        f"  model: {t.cfg['model']['layers']}, {t.model.size:,d} parameters "
        f"({t.model.size * 4 / 2**20:.1f} MiB float32)",
        f"  {t.lr_at.describe() or 'lr: constant ' + format(t.lr_at.lr, 'g')}",
        *([f"  {recipe.describe(n, t.recipe_set)}"] if t.recipe_set else []),
        *([f"  {outer}"] if outer else []),
        "  communication: " + (
            "none (one process: the block's packet is summed in place, no MPI)"
            if n == 1 and not t.simulate and mpi.world_size() == 1 else
            f"{per_pass} Allreduce(s) per pass "
            f"({'one per step' if t.algo_cls.per_step else 'one per block'}) of "
            f"{t.packet.size:,d} floats ({mib:.1f} MiB): {per_pass * mib:.1f} MiB "
            f"per pass" + (" in an MPI run (simulated here: no MPI)"
                           if t.simulate else "")),
        f"  checkpoints: every {every} block(s), {r['keep_checkpoints']} kept; {resume}",
        "  evaluation: " + (
            "none (no val split)" if "val" not in ds.splits else
            f"z on val every {r['eval_every'] or s.blocks_per_pass} block(s)"
            + ("; the best kept as model-best.npz" if r["keep_best"] else "")
            + (f"; early stop after {r['early_stop']} evaluations without a better "
               f"one" + (f" (val accuracy up by more than {r['early_stop_delta']:g})"
                         if r["early_stop_delta"] else "") if r["early_stop"] else "")),
        "  " + placement_text(t.placement),
        *([f"  {warn}"] if warn else []),
        f"  run.dir: {t.run_dir}: "
        + ("free" if lock is None else f"its lock would be taken over ({lock})"),
        "  time limit: " + ("none" if t.control.deadline is None else
                            f"{t.control.deadline.text()}: stops with a checkpoint before it"),
    ] + (["  diagnostics: " + "; ".join(
        t for t, on in (("cProfile of every rank (profile-rank-R.txt, .pstats)",
                         r["profile"]),
                        (f"timeline of every rank ({timeline.MERGED})", r["timeline"]))
        if on)] if r["profile"] or r["timeline"] else [])


def split_note(s):
    """Where the asked split is more than a worker's range: say so."""
    if s.split_size <= s.min_range:
        return ""
    return (f" (data.split_size {s.split_size:,d} is more than a worker's "
            f"{s.min_range:,d} samples: each worker takes its whole range, one "
            f"block per pass)")
