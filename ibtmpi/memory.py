"""Memory figures of a rank and the out-of-memory report.

Each worker puts two numbers per block into the block's Allreduce (two
float32 slots of its own, nothing extra on the wire worth counting): its
process's peak resident set (host) and the bytes CuPy's memory pool holds
on its GPU (0 on the CPU). Both are high-water marks: they size a run
(how large data.batch, how many workers per GPU or node) and, growing block
after block, show a leak. The master writes them to metrics.jsonl
(peak_rss_mib, gpu_pool_mib), summary.json and its end-of-run line, and
names a worker whose figures keep growing pass after pass (MemoryGrowth).

A rank that runs out of memory (CuPy's OutOfMemoryError and NumPy's
allocation error are both MemoryError) ends the job with EXIT_NO_MEMORY and
one line saying where and what to change, not a traceback.
"""
import resource
import sys

MIB = 2 ** 20


def peak_rss_mib():
    """This process's peak resident set in MiB: Linux's VmHWM, the high-water
    mark of this program's memory. Elsewhere ru_maxrss (KiB, bytes on
    macOS), which Linux carries over exec from the parent: a process
    started by a large one would report the parent's peak."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r / (MIB if sys.platform == "darwin" else 1024)


def _mib(x):
    return f"{x:.1f}" if x < 10 else f"{x:.0f}"


def mib_range(values):
    """'310 MiB' or '300-320 MiB' for a list of MiB figures."""
    lo, hi = _mib(min(values)), _mib(max(values))
    return f"{lo} MiB" if lo == hi else f"{lo}-{hi} MiB"


def worker_peaks_text(rss_mib, pool_mib=0):
    """'a worker's peak RSS up to X MiB[, its CuPy pool up to Y MiB]' for
    the largest figures of a metrics line (progress lines, ibtmpi status)."""
    text = f"a worker's peak RSS up to {mib_range([rss_mib])}"
    if pool_mib:
        text += f", its CuPy pool up to {mib_range([pool_mib])}"
    return text


def memory_line(summary):
    """The end-of-run line on memory from summary.json's figures, or None
    (a summary from before they were kept)."""
    rss = summary.get("worker_peak_rss_mib")
    if not rss:
        return None
    line = f"memory: workers' peak RSS {mib_range(rss)}"
    gpu = summary.get("worker_gpu_pool_mib")
    if gpu:
        line += f", CuPy pool on their GPUs {mib_range(gpu)}"
    if summary.get("rank0_peak_rss_mib"):
        line += f"; rank 0 peak RSS {summary['rank0_peak_rss_mib']:.0f} MiB"
    return line


class MemoryGrowth:
    """Master: a worker whose memory keeps growing pass after pass (a
    leak). The figures are high-water marks: the first pass fills the
    caches and the first evaluation (which runs during the second pass, and
    in the worker's own process when N = 1) adds its buffers, so a steady
    run raises them in the first two passes and then stays flat. The
    comparison starts at the end of the second pass: a worker whose peak
    RSS (or CuPy pool) rose in each of the last RISES passes, by GROWTH x
    and MIN_MIB in all, is named once per figure."""
    GROWTH, MIN_MIB, RISES, SETTLE = 1.10, 32, 3, 2
    KEYS = ("peak_rss_mib", "gpu_pool_mib")

    def __init__(self):
        self.ends = []          # per pass end: {key: [MiB per worker]}
        self.found = {}         # key -> {worker: [at the start of the rises, now]}

    def pass_done(self, rec):
        """At a pass's last block: [(key, worker, first, now)] newly found."""
        self.ends.append({k: list(rec[k]) for k in self.KEYS if rec.get(k)})
        if len(self.ends) < self.SETTLE + self.RISES:
            return []
        window = self.ends[-self.RISES - 1:]       # RISES + 1 pass ends
        out = []
        for key, vals in window[-1].items():
            if any(key not in e for e in window):
                continue
            for i in range(len(vals)):
                seq = [e[key][i] for e in window]
                a, v = seq[0], seq[-1]
                if (all(y > x for x, y in zip(seq, seq[1:])) and v >= self.GROWTH * a
                        and v - a >= self.MIN_MIB and i not in self.found.get(key, {})):
                    self.found.setdefault(key, {})[i] = [a, v]
                    out.append((key, i, a, v))
        return out


def oom_text(err, rank, phase, block, batch, gpu=None, pool_mib=None, sharing=1,
             master=False):
    """The one-line report of a rank that ran out of memory. gpu: the device
    ordinal of a GPU worker (None: host memory); pool_mib: what its CuPy pool
    held; sharing: worker processes on that GPU (or node); master: the rank
    has no worker (it holds z, the val and test splits, and evaluates)."""
    where = f"GPU {gpu}" if gpu is not None else "host memory"
    held = f"; its CuPy pool held {_mib(pool_mib)} MiB" if pool_mib is not None else ""
    unit = "GPU" if gpu is not None else "node"
    fix = (f"Lower data.batch (now {batch}; it is part of the configuration, so train "
           f"in a new run.dir)")
    if master and gpu is not None:
        fix = ("The master keeps z and its consensus state on this GPU "
               "(run.master_device) and evaluates there: set run.master_device=cpu and "
               "run.eval_device=cpu, or give rank 0 a GPU with more free memory")
    elif master:
        fix = ("The master holds the val and test splits in memory and evaluates 256 "
               "images at a time: give rank 0 a node (or a share of one) with more "
               "memory, or make the val and test splits smaller")
    elif sharing > 1:
        fix += (f", or put fewer worker processes on each {unit} ({sharing} share this "
                f"one; the same configuration resumes from its last complete checkpoint)")
    return (f"[rank {rank}] ibtmpi train: out of memory ({where}) in block {block}, "
            f"phase {phase}: {str(err).rstrip('.')}{held}. {fix}")
