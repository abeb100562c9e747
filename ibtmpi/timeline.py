"""run.timeline: what every rank did when, as Chrome trace events.

Each rank streams its own RUN/timeline/from-block-SSSSSS/rank-RRRRR.json
(S: the block this job started from; a second job from the same block,
after one that failed, gets from-block-SSSSSS-try02; the trace event format's JSON array
form, whose closing bracket is optional, so the file of a rank that failed
mid-run still opens in chrome://tracing or Perfetto) and flushes it once per
block. At the end of a job (finished or preempted) the master merges the
files of every job of the run so far (a requeued run's jobs lie apart on
the wall clock) into RUN/timeline.json, one process per rank and one lane
per worker:

  data         the worker's wait for its block's minibatches
  compute      its local steps (ssgd: one span per step)
  allreduce    the block's Allreduce, waiting for the slowest worker included
  consensus    the consensus update that follows it
  evaluation   one batch of the master's evaluation of z (nested in its
               allreduce span when it overlapped the wait)
  checkpoint   this rank's checkpoint file

Times are perf_counter readings moved onto the wall clock once per process,
so ranks on one node line up to well under a millisecond and ranks on
different nodes as well as their clocks agree (NTP: about a millisecond).
"""
from __future__ import annotations

import json
import os
import time

DIR = "timeline"
MERGED = "timeline.json"


def rank_file(run_dir, segment, rank):
    return os.path.join(run_dir, DIR, segment, f"rank-{rank:05d}.json")


def segments(run_dir):
    """{segment: [rank files]} of the jobs traced in run_dir, in the order
    they ran (by start block, then try)."""
    import glob
    out = {}
    for d in sorted(glob.glob(os.path.join(run_dir, DIR, "from-block-*"))):
        if os.path.isdir(d):
            out[os.path.basename(d)] = sorted(glob.glob(os.path.join(d, "rank-*.json")))
    return out


def new_segment(run_dir, start):
    """Master, before any rank opens its file (the name is broadcast): the
    segment of a job starting at block `start`. A fresh start (block 0)
    replaces whatever run the directory held: its segments and merged file
    go. A resume keeps every earlier job, a failed try from the same
    checkpoint too (the new one is from-block-S-tryNN)."""
    import shutil
    base = os.path.join(run_dir, DIR)
    if start == 0:
        shutil.rmtree(base, ignore_errors=True)
        try:
            os.remove(os.path.join(run_dir, MERGED))
        except FileNotFoundError:
            pass
    name, n = f"from-block-{start:06d}", 1
    while os.path.exists(os.path.join(base, name)):
        n += 1
        name = f"from-block-{start:06d}-try{n:02d}"
    return name


class Timeline:
    """One rank's event stream. lanes: {lane: name} (lane 0: the rank's own
    work; lane 1 + i: worker i)."""

    def __init__(self, run_dir, segment, rank, title, lanes):
        os.makedirs(os.path.join(run_dir, DIR, segment), exist_ok=True)
        self.path = rank_file(run_dir, segment, rank)
        from .fsutil import open_append
        self.f = open_append(self.path, truncate=True)
        self.rank = rank
        self.off = time.time() - time.perf_counter()
        self.f.write("[\n")
        self._meta("process_name", 0, {"name": title})
        self._meta("process_sort_index", 0, {"sort_index": rank})
        for lane, name in sorted(lanes.items()):
            self._meta("thread_name", lane, {"name": name})
            self._meta("thread_sort_index", lane, {"sort_index": lane})

    def _meta(self, kind, lane, args):
        self._write({"name": kind, "ph": "M", "pid": self.rank, "tid": lane, "args": args})

    def _write(self, ev):
        self.f.write(json.dumps(ev, separators=(",", ":")) + ",\n")

    def span(self, name, t0, t1, lane=0, **args):
        """A complete event from perf_counter readings t0 to t1."""
        self._write({"name": name, "ph": "X", "pid": self.rank, "tid": lane,
                     "ts": round((t0 + self.off) * 1e6, 1),
                     "dur": round(max(t1 - t0, 0.0) * 1e6, 1), "args": args})

    def flush(self):
        self.f.flush()

    def close(self):
        if not self.f.closed:
            self.f.close()


class Off:
    """run.timeline = false: the same calls, nothing recorded."""
    def span(self, *a, **k):
        pass

    flush = close = span


def read_events(path):
    """The events of one rank's file, complete or cut off mid-line."""
    events = []
    with open(path) as f:
        for line in f:
            line = line.strip().rstrip(",")
            if line in ("[", "]", ""):
                continue
            try:
                events.append(json.loads(line))
            except ValueError:
                break            # the line being written when the rank died
    return events


def merge(run_dir, meta=None):
    """RUN/timeline.json from every traced job's rank files (replaced
    whole); returns its path and the span count."""
    events = []
    for files in segments(run_dir).values():
        for p in files:
            events += read_events(p)
    out = os.path.join(run_dir, MERGED)
    doc = {"traceEvents": events, "displayTimeUnit": "ms", "otherData": meta or {}}
    tmp = out + f".tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
    os.replace(tmp, out)
    return out, sum(e["ph"] == "X" for e in events)
