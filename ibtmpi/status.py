"""`ibtmpi status RUN...`: what a run directory's job is doing, read from the
files the run keeps (no MPI, no data): finished (summary.json), running
(a live RUN/.lock: host, pid, batch job, heartbeat), failed
(RUN/error-rank-*.txt: the last job's; earlier jobs' are moved to
RUN/old-errors/ when a job starts), or stopped (preempted or
killed: the checkpoint a rerun resumes from). Progress and time left come
from metrics.jsonl."""
import glob
import json
import os
import re

from . import checkpoint as ckpt
from . import runlock
from .memory import MemoryGrowth, worker_peaks_text
from .monitor import (STARVED_SHARE, eval_rank, hms, master_late_recent, master_late_text,
                      ranges, slow_worker, starved_recent,
                      starved_workers)


def _metrics(run_dir):
    from .fsutil import read_jsonl
    return read_jsonl(os.path.join(run_dir, "metrics.jsonl"))


def straggler(recs, window=20, share=0.8):
    """{worker, blocks, of, ratio} when one worker was slow_worker in
    `share` of the last `window` blocks of metrics (their per-worker
    compute_s), else None."""
    import statistics
    rows = [r["compute_s"] for r in recs[-window:] if len(r.get("compute_s") or ()) > 1]
    if len(rows) < window // 2:
        return None
    ratios = {}
    for c in rows:
        slow = slow_worker(c)
        if slow is not None:
            ratios.setdefault(slow[0], []).append(slow[1])
    if not ratios:
        return None
    i = max(ratios, key=lambda w: len(ratios[w]))
    if len(ratios[i]) < share * len(rows):
        return None
    return {"worker": i, "blocks": len(ratios[i]), "of": len(rows),
            "ratio": statistics.median(ratios[i])}


def growing(recs):
    """The workers whose memory kept growing pass after pass (the master's
    MemoryGrowth rule replayed over the metrics lines at pass ends)."""
    bpp = max(r.get("block_in_pass", 0) for r in recs) + 1
    g = MemoryGrowth()
    for r in recs:
        if r.get("block_in_pass") == bpp - 1:
            g.pass_done(r)
    return sorted({i for found in g.found.values() for i in found})


# the line an ibtmpi train that diverged keeps in RUN/error-rank-0.txt
DIVERGED = re.compile(r"ibtmpi train: diverged at block (\d+) \(rank\(s\) ([^)]*)\)")


def error_reason(path, limit=300):
    """What an error-rank-R.txt says in one line: the line itself (out of
    memory), or a traceback's heading and its last line, the exception."""
    try:
        with open(path, errors="replace") as f:
            lines = [x.strip() for x in f.read(1 << 16).splitlines() if x.strip()]
    except OSError:
        return None
    if not lines:
        return None
    text = lines[0] if len(lines) == 1 else f"{lines[0].rstrip(':')}: {lines[-1]}"
    return text if len(text) <= limit else text[:limit - 3] + "..."


def inspect(run_dir):
    """A dict describing the run: state (finished | running | failed |
    stopped | not started) and what is known about it."""
    if not os.path.isdir(run_dir):
        raise FileNotFoundError(f"{run_dir} is not a directory")
    if os.path.exists(os.path.join(run_dir, "dataset.json")):
        raise FileNotFoundError(f"{run_dir} is a dataset (it holds dataset.json), not a "
                                f"run directory")
    recs = _metrics(run_dir)
    done = ckpt.complete(run_dir)
    # the last line's block: a run reshaped to another worker count keeps
    # the lines of the count before, under its own numbering
    info = {"run_dir": run_dir, "blocks_done": recs[-1].get("block", len(recs) - 1) + 1
            if recs else 0,
            "last_checkpoint": done[-1] if done else None}
    if recs:
        last = recs[-1]
        info.update(algorithm=last.get("algorithm"), N=last.get("N"),
                    blocks_total=last.get("blocks_total"), passes_done=last.get("pass", 0) + 1,
                    train_loss=last.get("train_loss"))
        vals = [r for r in recs if "val_acc" in r]
        if vals:
            info["val_acc"] = vals[-1]["val_acc"]
            best = max(vals, key=eval_rank)
            if best is not vals[-1] and best["val_acc"] > vals[-1]["val_acc"]:
                info["best"] = {"block": best["block"], "val_acc": best["val_acc"]}
        recent = [r["wall_s"] for r in recs[-10:] if "wall_s" in r]
        if recent:
            info["block_s"] = sum(recent) / len(recent)
        slow = straggler(recs)
        if slow:
            info["straggler"] = slow
        late = master_late_recent(recs)
        if late:
            info["master_late"] = late
        if last.get("peak_rss_mib"):          # the workers' high-water marks
            info["memory"] = {"rss_mib": max(last["peak_rss_mib"]),
                              "gpu_pool_mib": max(last.get("gpu_pool_mib") or [0])}
            leaks = growing(recs)
            if leaks:
                info["memory"]["growing"] = leaks
    try:
        with open(os.path.join(run_dir, "summary.json")) as f:
            summary = json.load(f)
    except (OSError, ValueError):
        summary = None
    try:
        holder, age, stale = runlock.RunLock(run_dir).inspect()
        live = stale is None
    except FileNotFoundError:
        holder, age, live = None, None, False
    # the last job's: each job moves its predecessors' to RUN/old-errors/
    errors = sorted(glob.glob(os.path.join(run_dir, "error-rank-*.txt")))
    if live:
        info.update(state="running", holder=holder, heartbeat_s=age)
    elif summary is not None and (not recs or summary.get("blocks") == info["blocks_done"]):
        info.update(state="finished", test_acc=summary.get("test_acc"),
                    blocks_total=summary.get("blocks"), wall_s=summary.get("wall_s"))
        if summary.get("stopped_early"):
            info["stopped_early"] = summary["stopped_early"]
        b = summary.get("best") or {}
        if "test_acc" in b and b.get("block") != (summary.get("blocks") or 0) - 1:
            info["best_test"] = b
    elif errors:
        info.update(state="failed", errors=errors, reason=error_reason(errors[0]))
    elif holder is not None:
        info.update(state="stopped", holder=holder, heartbeat_s=age)
    elif recs:
        info["state"] = "stopped"
    else:
        info["state"] = "not started"
    if info["state"] in ("stopped", "not started"):
        from .train.lifecycle import lost_rank
        lost = lost_rank(run_dir)          # a rank killed without a word (SIGKILL)
        if lost:
            info["lost_rank"] = lost
    # workers that waited for cores: a finished run's whole-run count, else
    # the live report's rule over the last blocks
    starved = (starved_workers(summary) if info["state"] == "finished"
               else starved_recent(recs))
    if starved:
        info["starved"] = starved
    return info


def _who(ws):
    """'worker 3' or 'workers 0-2,5'."""
    return f"worker {ws[0]}" if len(ws) == 1 else f"workers {ranges(ws)}"


def describe(info):
    """One line (and the next step where there is one) for `info`."""
    total = info.get("blocks_total")
    k = info["blocks_done"]
    prog = f"{k}/{total} blocks ({k / total:.0%})" if total else f"{k} blocks"
    bits = []
    if info.get("val_acc") is not None:
        bits.append(f"val acc {info['val_acc']:.4f}")
    if info.get("train_loss") is not None:
        bits.append(f"train loss {info['train_loss']:.4f}")
    what = f"{info.get('algorithm')}, N={info.get('N')}" if info.get("algorithm") else ""
    state = info["state"]
    resume = (f"a rerun resumes from {ckpt.ckpt_dir(info['run_dir'], info['last_checkpoint'])}"
              if info.get("last_checkpoint") is not None else "a rerun starts from block 0")
    if state == "running":
        h = info["holder"]
        who = f"pid {h.get('pid')} on {h.get('host')}" + (
            f", {h['job']}" if h.get("job") else "")
        left = ""
        if total and info.get("block_s"):
            left = f", about {hms((total - k) * info['block_s'])} left"
        line = (f"running ({who}; heartbeat {info['heartbeat_s']:.0f} s ago): {prog}"
                f"{left}")
    elif state == "finished":
        acc = f", test acc {info['test_acc']:.4f}" if info.get("test_acc") is not None else ""
        wall = f" in {hms(info['wall_s'])}" if info.get("wall_s") else ""
        line = f"finished: {prog}{acc}{wall}"
        if info.get("stopped_early"):
            line += f" (stopped early: {info['stopped_early']['reason']})"
        bits = []
        b = info.get("best_test")
        if b:
            bits.append(f"model-best.npz (block {b['block']}, val acc {b['val_acc']:.4f}): "
                        f"test acc {b['test_acc']:.4f}")
    elif state == "failed" and DIVERGED.search(info.get("reason") or ""):
        m = DIVERGED.search(info["reason"])
        line = (f"diverged at block {m.group(1)} (rank(s) {m.group(2)}) after {prog} "
                f"(see {os.path.basename(info['errors'][0])}); {resume}")
    elif state == "failed":
        names = ", ".join(os.path.basename(e) for e in info["errors"])
        why = f": {info['reason']}" if info.get("reason") else ""
        line = f"failed after {prog}{why} (see {names}); {resume}"
    elif state == "stopped" and info.get("lost_rank"):
        from .train.lifecycle import lost_rank_text
        line = (f"stopped after {prog}: {lost_rank_text(info['lost_rank'])}; {resume}")
    elif state == "stopped":
        line = f"stopped after {prog}, not running; {resume}"
    else:
        line = "not started (no block done)"
    if what:
        line = f"{what}: {line}"
    if info.get("best") and state != "finished":
        bits.append(f"best val acc {info['best']['val_acc']:.4f} at block "
                    f"{info['best']['block']}")
    mem = info.get("memory")
    if mem and state in ("running", "finished"):
        line += "; " + worker_peaks_text(mem["rss_mib"], mem["gpu_pool_mib"])
    if mem and mem.get("growing"):
        line += f"; {_who(mem['growing'])}: memory kept growing pass after pass (a leak?)"
    if bits:
        line += "; " + ", ".join(bits)
    st = info.get("starved")
    if st:
        who = _who(st["workers"])
        line += (f"; {who} waited for cores (CPU under {STARVED_SHARE:.0%} of compute "
                 f"time) in {st['blocks']} of {'the last ' if st.get('last') else ''}"
                 f"{st['of']} blocks")
    slow = info.get("straggler")
    if slow:
        line += (f"; worker {slow['worker']} computed longest in {slow['blocks']} of the "
                 f"last {slow['of']} blocks ({slow['ratio']:.2f}x the median worker)")
    if info.get("master_late"):
        line += "; " + master_late_text(info["master_late"])
    return f"{info['run_dir']}: {line}"
