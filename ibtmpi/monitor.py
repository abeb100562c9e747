"""What the master reports about a live run besides the metrics: progress
lines for batch logs, stragglers (the worker every block waits for), CPU
workers that wait for cores, and where the ranks run; and the rules those
reports share with `ibtmpi status`, `bench` and `plot` (eval_rank,
slow_worker, mostly, ...). Used by train/master.py and status.py;
tests: tests/unit/test_stragglers.py, test_placement.py, test_timeline.py.
"""
from __future__ import annotations

import time

from .memory import worker_peaks_text


def hms(s):
    """Seconds as H:MM:SS (progress lines, status)."""
    s = int(round(s))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


SLOW_RATIO = 1.25         # a block's slowest worker straggles at this x its median
STARVED_SHARE = 0.6       # a CPU worker whose process had a core for less of
                          # its compute time waited for cores (oversubscribed)
REPORT_WINDOW, REPORT_NEED = 10, 8     # a straggling or starved worker is reported
                                       # live when so in 8 of the last 10 blocks


def eval_rank(rec):
    """How evaluations compare (larger is better): val accuracy, then lower
    val loss. One rule for model-best.npz, early stopping, status and plot."""
    return rec["val_acc"], -rec.get("val_loss", 0.0)


def ranges(ranks):
    """[0, 1, 2, 5] -> '0-2,5'."""
    out, i = [], 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        out.append(f"{ranks[i]}" if i == j else f"{ranks[i]}-{ranks[j]}")
        i = j + 1
    return ",".join(out)


def mostly(count, blocks):
    """A worker starved in `count` of `blocks` blocks counts as starved in the
    run: half of them or more, at least 2. The trainer's end-of-run report
    and status/bench use this one rule."""
    return count >= max(2, blocks / 2)


def starved_workers(summary):
    """{workers, blocks, of} of a finished run's CPU workers that had a core
    for under STARVED_SHARE of their compute time in half its blocks or
    more (summary.json starved_blocks: the trainer's count, made knowing
    which workers were on CPUs), else None."""
    trained = summary.get("blocks", 0) - summary.get("resumed_at_block", 0)
    starved = {int(w): c for w, c in (summary.get("starved_blocks") or {}).items()
               if mostly(c, trained)}
    if not starved:
        return None
    return {"workers": sorted(starved), "blocks": min(starved.values()), "of": trained}


def starved_recent(recs, window=REPORT_WINDOW, need=REPORT_NEED):
    """{workers, blocks, of, last} of the workers starved (metrics `starved`:
    the trainer's per-block list, made knowing which workers are on CPUs)
    in `need` of the last `window` blocks, else None: the live report's
    rule, for a run that is still going or was cut off."""
    recent = recs[-window:]
    counts = {}
    for r in recent:
        for w in r.get("starved", ()):
            counts[w] = counts.get(w, 0) + 1
    hit = {w: c for w, c in counts.items() if c >= need}
    if not hit:
        return None
    return {"workers": sorted(hit), "blocks": min(hit.values()), "of": len(recent),
            "last": True}


def slow_worker(comp, ratio=SLOW_RATIO):
    """(worker, its compute / the median worker's) when the slowest of
    `comp` (compute seconds per worker) took at least `ratio` times the
    median, else None. The trainer's live report and status both use it."""
    import statistics
    if len(comp) < 2:
        return None
    i = max(range(len(comp)), key=comp.__getitem__)
    med = statistics.median(comp)
    if med > 0 and comp[i] >= ratio * med:
        return i, comp[i] / med
    return None


class Progress:
    """A line per `every_s` seconds for logs that are not a terminal (Slurm
    output files): where the run is, the block's train loss, the throughput
    and the time left at the rate so far; none for a pass's last block (the
    pass line follows). every_s = 0: no lines."""

    def __init__(self, total, start, every_s, log, clock=time.perf_counter):
        self.total, self.start, self.every, self.log, self.clock = \
            total, start, every_s, log, clock
        self.t0 = self.last = clock()
        self.images = 0

    def block_done(self, k, rec, blocks_per_pass):
        self.images += rec["samples"]
        now = self.clock()
        if rec["block_in_pass"] + 1 == blocks_per_pass:
            self.last = now            # the pass line reports this block
            return
        if not self.every or now - self.last < self.every:
            return
        self.last = now
        done, left = k + 1 - self.start, self.total - (k + 1)
        el = now - self.t0
        mem = ""
        if rec.get("peak_rss_mib"):       # a leak shows as this growing
            mem = "; " + worker_peaks_text(max(rec["peak_rss_mib"]),
                                           max(rec.get("gpu_pool_mib") or [0]))
        self.log(f"block {k + 1}/{self.total} (pass {rec['pass'] + 1}, "
                 f"{rec['block_in_pass'] + 1}/{blocks_per_pass}): train loss "
                 f"{rec['train_loss']:.4f}, {self.images / max(el, 1e-9):.0f} img/s, "
                 f"{hms(el)} elapsed, about {hms(el / done * left)} left{mem}")


class Stragglers:
    """Master: which worker holds the blocks back. A worker straggles in a
    block when slow_worker names it (it computed longest, at least
    1.25x the median worker); once one has straggled in `need` of the last
    `window` blocks, block() names it (once per worker). Every block waits
    for its slowest worker at the Allreduce, so this is the worker to look at."""

    def __init__(self, n, window=REPORT_WINDOW, need=REPORT_NEED):
        self.n, self.window, self.need = n, window, need
        self.recent = []                 # straggler index or None, last `window` blocks
        self.counts = {}                 # worker -> blocks it straggled in
        self.reported = set()

    def block(self, comp):
        """comp: compute seconds per worker; returns (worker, blocks, ratio)
        the first time a worker crosses the threshold, else None."""
        found = slow_worker([float(c) for c in comp])
        slow = None if found is None else found[0]
        if slow is not None:
            self.counts[slow] = self.counts.get(slow, 0) + 1
        self.recent = (self.recent + [slow])[-self.window:]
        if slow is None or slow in self.reported or self.recent.count(slow) < self.need:
            return None
        self.reported.add(slow)
        return slow, self.recent.count(slow), found[1]


def master_late(busy, compute_max, data_wait_max=0.0):
    """The master delayed the block: its own work between two Allreduces
    (update, evaluation batches, checkpoint, metrics) outlasted what kept
    the slowest worker from the Allreduce (its data wait and compute), by
    5% and a millisecond at least."""
    return busy > 1.05 * (compute_max + data_wait_max) + 1e-3


class MasterLate:
    """Master (a rank of its own): the blocks in which the workers waited
    for it (master_late); once it was late in `need` of the last `window`
    blocks, block() says so, once per run (docs/design.md section 10: the master
    must not be the critical path)."""

    def __init__(self, window=REPORT_WINDOW, need=REPORT_NEED):
        self.window, self.need = window, need
        self.recent = []                 # late or not, the last `window` blocks
        self.count = 0                   # blocks it was late in, this job
        self.reported = False

    def block(self, busy, compute_max, data_wait_max=0.0):
        """True the first time the master is late in `need` of `window` blocks."""
        late = master_late(busy, compute_max, data_wait_max)
        self.count += late
        self.recent = (self.recent + [late])[-self.window:]
        if self.reported or sum(self.recent) < self.need:
            return False
        self.reported = True
        return True


def master_late_recent(recs, window=REPORT_WINDOW, need=REPORT_NEED):
    """{blocks, of, busy_s, compute_s} (medians over the late blocks) when
    the master was late in `need` of the last `window` metrics lines."""
    import statistics
    rows = [r for r in recs[-window:] if "master_busy_s" in r and not r.get("master_is_worker")]
    late = [r for r in rows if master_late(r["master_busy_s"], r["compute_max_s"],
                                           r.get("data_wait_max_s", 0.0))]
    if len(rows) < window // 2 or len(late) < need:
        return None
    return {"blocks": len(late), "of": len(rows),
            "busy_s": statistics.median(r["master_busy_s"] for r in late),
            "compute_s": statistics.median(r["compute_max_s"] for r in late)}


def master_late_text(late):
    return (f"the master's own work between two Allreduces (update, evaluation, "
            f"checkpoint, metrics) outlasted the workers' compute in {late['blocks']} of "
            f"the last {late['of']} blocks ({late['busy_s'] * 1e3:.1f} ms against "
            f"{late['compute_s'] * 1e3:.1f} ms, medians): the workers wait for it")


class Starved:
    """Master: CPU workers that wait for a core. A worker is starved in a
    block when its process had the CPU for less than STARVED_SHARE of a
    compute time of at least min_s; once workers are starved in `need` of
    the last `window` blocks, block() returns {worker: median share} of
    them, once per run."""

    def __init__(self, workers, window=REPORT_WINDOW, need=REPORT_NEED, min_s=0.05):
        self.workers, self.window, self.need, self.min_s = workers, window, need, min_s
        self.recent = []                 # {worker: share} of the last `window` blocks
        self.counts = {}                 # worker -> blocks it was starved in
        self.now = []                    # the workers starved in the last block
        self.reported = False

    def block(self, comp, cpu):
        now = {i: float(cpu[i]) / float(comp[i]) for i in self.workers
               if comp[i] >= self.min_s and cpu[i] < STARVED_SHARE * comp[i]}
        self.now = sorted(now)
        for i in now:
            self.counts[i] = self.counts.get(i, 0) + 1
        self.recent = (self.recent + [now])[-self.window:]
        if self.reported:
            return None
        hits = {i: sorted(r[i] for r in self.recent if i in r) for i in self.workers}
        out = {i: v[len(v) // 2] for i, v in hits.items() if len(v) >= self.need}
        self.reported = bool(out)
        return out or None

    def summary(self, blocks):
        """At the end, when block() never reported: {worker: median share}
        of the workers starved in at least half of `blocks` (>= 2)."""
        if self.reported:
            return None
        out = {}
        for i, c in self.counts.items():
            shares = sorted(r[i] for r in self.recent if i in r)
            if mostly(c, blocks) and shares:
                out[i] = shares[len(shares) // 2]
        return out or None


def placement_text(rows, show=4):
    """One line on where the ranks run, from _placement's rows (host, pid,
    BLAS threads, device, usable cores): nodes with their ranks (the first
    `show` nodes), BLAS threads and devices."""
    hosts = {}
    for r, row in enumerate(rows):
        hosts.setdefault(row[0], []).append(r)
    shown = [f"{h} [{ranges(rs)}]" for h, rs in list(hosts.items())[:show]]
    if len(hosts) > show:
        shown.append(f"... {len(hosts) - show} more")
    threads = sorted({row[2] for row in rows if row[2] is not None})
    devs = [row[3] for row in rows if row[3] != "-"]
    kinds = sorted({d.split()[0] for d in devs})
    gpus = {(row[0], row[3]) for row in rows if row[3].startswith("gpu")}
    return (f"placement: {len(rows)} rank(s) on {len(hosts)} node(s): {', '.join(shown)}; "
            f"BLAS threads per rank {'/'.join(map(str, threads)) or '?'}; workers on "
            f"{'/'.join(kinds) or 'cpu'}"
            + (f" ({len(gpus)} GPU(s) for {len(devs)} worker(s))" if gpus else ""))


def oversubscription_text(rows):
    """A warning when a node's CPU workers run more BLAS threads than the
    cores they may run on (the union of their affinity masks: a Slurm
    allocation's cores, or the cores the launcher bound them to), else
    None. The master, which mostly sleeps, is not counted."""
    busy, cpus = {}, {}
    for host, _pid, thr, dev, ids in rows:
        if dev == "cpu":
            busy[host] = busy.get(host, 0) + (thr or 1)
            cpus.setdefault(host, set()).update(ids)
    over = [(h, b, len(cpus[h])) for h, b in busy.items() if b > len(cpus[h])]
    if not over:
        return None
    eg = ", ".join(f"{h}: {b} worker threads on {c} cores" for h, b, c in over[:3])
    more = f" and {len(over) - 3} more node(s)" if len(over) > 3 else ""
    return (f"oversubscribed: {eg}{more}. Workers will wait for cores, so time per "
            f"block is not computation and speedups are not the algorithm's; for timing, "
            f"run at most one worker thread per core (fewer ranks, or run.threads)")
