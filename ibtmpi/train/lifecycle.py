"""A training job's life around the blocks: injected faults for the tests,
the time limit, stop signals, the profile and earlier jobs' error files
(the exceptions that end a job and their exit statuses: errors.py).

Nothing here knows an algorithm, a layer or MPI; the trainer asks.
Tests: tests/unit/test_faults.py, test_time_limit.py, test_profile.py,
tests/slurm/ci_slurm.sh (preemption and requeue).
"""
from __future__ import annotations

import errno
import os
import signal
import sys
import time

from ..errors import EXIT_INTERRUPTED, InjectedFault

TIME_MARGIN_S = 30.0        # kept free before a time limit, besides 2 blocks + a
                            # checkpoint (at most 5% of the time the run was given)


# run.watchdog_s = auto: no limit in a job's first block (start-up, caches,
# kernel compiles), then max(WATCHDOG_FLOOR_S, WATCHDOG_FACTOR x the
# slowest block so far, checkpoints and reports included). The floor may be
# lowered through the environment for tests of the watchdog itself.
WATCHDOG_FACTOR = 10.0
WATCHDOG_FLOOR_S = float(os.environ.get("IBTMPI_WATCHDOG_FLOOR_S", "60"))


WATCHDOG_GRACE_S = 2.0      # the in-Allreduce timer fires this much after the limit


FROZEN_GAP_S = 5.0    # a look at the clock this much later than due: this process was stopped


class OwnClock:
    """Seconds since it was made that this process ran: a gap between two
    looks longer than FROZEN_GAP_S is time it was stopped itself (SIGSTOP,
    a debugger) and does not count. A rank that was stopped and then
    continued (Open MPI continues the ranks it is about to end after
    another rank's Abort) does not blame the others for its own stop."""

    def __init__(self):
        self.t0 = self.last = time.monotonic()

    def __call__(self):
        now = time.monotonic()
        if now - self.last > FROZEN_GAP_S:
            self.t0 += now - self.last
        self.last = now
        return now - self.t0


class Alarm:
    """One daemon thread for the whole run that calls fire(*args) once an
    armed deadline passes, unless disarmed before: the master's guard over
    the block's reduction (a rank stopped inside it), armed per block (per
    step in ssgd) without starting a thread each time. It looks at the
    clock every second; time this process was stopped does not count
    (OwnClock)."""

    def __init__(self):
        import threading
        self._cv = threading.Condition()
        self._due = self._call = None
        threading.Thread(target=self._loop, name="allreduce-alarm", daemon=True).start()

    def arm(self, seconds, fire, *args):
        with self._cv:
            self._due, self._call = time.monotonic() + seconds, (fire, args)
            self._cv.notify()

    def disarm(self):
        with self._cv:
            self._due = None
            self._cv.notify()

    def _loop(self):
        while True:
            with self._cv:
                while self._due is None or time.monotonic() < self._due:
                    if self._due is None:
                        self._cv.wait()
                        continue
                    t = time.monotonic()
                    step = min(1.0, self._due - t)
                    self._cv.wait(step)
                    late = time.monotonic() - t - step
                    if late > FROZEN_GAP_S and self._due is not None:
                        self._due += late          # stopped itself meanwhile
                fire, args = self._call
                self._due = None
            fire(*args)


def stuck_ranks(placement):
    """{rank: 'stopped' | 'gone'} of the ranks on this node whose process is
    stopped (SIGSTOP, a debugger) or no longer there: from /proc, so only
    for this host's ranks; placement: the start-up [(host, pid, ...)]."""
    import socket
    host, out = socket.gethostname(), {}
    for r, row in enumerate(placement or ()):
        if row[0] != host:
            continue
        try:
            with open(f"/proc/{row[1]}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            out[r] = "gone"
            continue
        if state in ("T", "t"):
            out[r] = "stopped"
        elif state in ("Z", "X"):
            out[r] = "gone"
    return out


def process_age_s():
    """Seconds since this process started (Linux: /proc; elsewhere since
    ibtmpi was imported): the start-up's share of a run."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])     # starttime
        with open("/proc/uptime") as f:
            up = float(f.read().split()[0])
        return max(up - ticks / os.sysconf("SC_CLK_TCK"), 0.0)
    except (OSError, ValueError, IndexError):
        from .. import IMPORTED_AT
        return time.time() - IMPORTED_AT


WORKER_STAGGER_S = 3.0     # workers after rank 1 fire this much later (one line a job)


def worker_limit(limit):
    """How long a worker waits in a block's Allreduce before it ends the job
    itself (the master stopped or lost): past the master's own watchdog for
    the same block (limit, plus its grace), so a stuck worker is still the
    master's to name."""
    return limit + max(15.0, 0.25 * limit)


def watchdog_limit(setting, k, start, slowest):
    """Seconds block k may take under run.watchdog_s = setting (None: no
    limit; the same on every rank: workers send arrivals when not None)."""
    if setting == "auto":
        if k <= start:
            return None
        return max(WATCHDOG_FLOOR_S, WATCHDOG_FACTOR * slowest)
    return float(setting) or None


class Faults:
    """IBTMPI_FAULT=rank:block:phase: a fault the tests inject. Phases that
    raise where the trainer enters them (setup, compute, allreduce,
    evaluation, checkpoint) and special ones the trainer acts on: hang,
    nan, leak (from that block on), enospc, stop."""

    def __init__(self, text=None):
        text = os.environ.get("IBTMPI_FAULT", "") if text is None else text
        self.at = None
        if text:
            try:
                fr, fb, fp = text.split(":")
                self.at = (int(fr), int(fb), fp)
            except ValueError:
                raise ValueError(f"IBTMPI_FAULT must be rank:block:phase, got {text!r}") from None
        self.leaked = []

    def hit(self, rank, block, phase):
        return self.at is not None and self.at == (rank, block, phase)

    def enter(self, rank, block, phase):
        """Raise the injected fault if it targets this point."""
        if self.hit(rank, block, phase):
            raise InjectedFault(f"injected fault on rank {rank}, block {block}, "
                                f"phase {phase}")

    def compute(self, rank, block):
        """Inside a worker's compute: an injected hang (watchdog tests) or
        leak (memory-growth tests: 20 MB a block)."""
        if self.hit(rank, block, "hang"):
            time.sleep(3600)
        if self.at is not None and self.at[::2] == (rank, "leak") and block >= self.at[1]:
            import numpy as np
            self.leaked.append(np.ones(2_500_000))

    def stop_in_allreduce(self, rank, block):
        """phase "stop": the rank stops itself (SIGSTOP) after every rank
        passed the block's arrival barrier, inside its reduction (tests:
        the others must wait there without spinning a core)."""
        if self.hit(rank, block, "stop"):
            os.kill(os.getpid(), signal.SIGSTOP)

    def disk_full(self, rank, block, path):
        if self.hit(rank, block, "enospc"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)


class Deadline:
    """run.time_limit on the master: stop with a checkpoint before it. With
    less time left than two blocks (the stop takes effect after the next
    one, through its flags), a checkpoint and the margin, `due` says so;
    the job then ends with exit 75 like a preemption and the templates
    requeue it."""

    def __init__(self, spec, clock=time.time):
        self.at, self.source = resolve_deadline(spec, clock=clock)
        self.margin = (min(TIME_MARGIN_S, 0.05 * max(self.at - clock(), 0.0))
                       if self.at is not None else 0.0)
        self.ckpt_s = 0.0                # longest checkpoint write seen
        self.walls = []                  # recent block times

    def due(self, wall, log):
        """After each block: True when the run must stop after the next."""
        self.walls = (self.walls + [wall])[-5:]
        left = self.at - time.time()
        block = max(self.walls)
        if left < 2 * block + self.ckpt_s + self.margin:
            log(f"time limit in {max(left, 0):.0f} s ({self.source}); a block "
                f"takes up to {block:.3g} s: stopping after the next block with a "
                f"checkpoint")
            return True
        return False

    def text(self):
        end = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.at))
        return f"{end} ({self.source})"


def resolve_deadline(spec, env=None, clock=time.time):
    """(epoch seconds, where it came from) of the time limit, or (None, "").
    auto: the Slurm job's end, from SLURM_JOB_END_TIME (Slurm >= 23.02) or
    else `squeue -o %e` for SLURM_JOB_ID; none: no limit; a duration: that
    long from now (the run's start)."""
    from ..config import parse_duration
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


SECOND_PRESS_S = 1.0        # a terminal and the launcher both deliver one Ctrl-C


def weakly(obj, name):
    """obj.name(...) through a weak reference, for a part built with a
    callback into the trainer: the part keeps no reference cycle with it,
    so the trainer (and the HDF5 files its data set holds open) goes the
    moment its last user lets it go, not at the next garbage collection."""
    import weakref
    ref = weakref.ref(obj)

    def call(*args, **kwargs):
        return getattr(ref(), name)(*args, **kwargs)
    return call


class RunControl:
    """Where this rank's job is and what may end it: the block and phase (for
    every message that names them), the stop this rank asks for (a signal,
    the time limit) and what the block's flags made every rank agree on
    (stop, early stop), the deadline (the master's), the faults tests plant,
    and the block times the watchdog scales with. One per rank; the parts
    read it and say what happened through its methods; the signal handlers
    (install_stop_handlers) write only here."""

    def __init__(self, rank, time_limit=None, faults=None, total=0):
        self.rank = rank
        self.total = total               # the blocks the run trains to (run.passes)
        self.block, self.phase = -1, "setup"
        self.stop_requested = False      # this rank asks (signal, time limit)
        self.stop_reason = "a signal"
        self.interrupted = False         # the stop came from Ctrl-C: exit 130
        self.stop_agreed = False         # every rank: stop after this block
        self.early_agreed = False        # every rank: run.early_stop ends the run here
        self.start_block = 0             # this job's first block (the watchdog skips it)
        self.slowest_block_s = 0.0       # the longest block so far, all work in
        self.faults = faults if faults is not None else Faults()
        self.deadline = None             # only the master watches the clock
        if time_limit is not None:
            dl = Deadline(time_limit)
            self.deadline = dl if dl.at is not None else None

    def begin_job(self, start):
        self.start_block = start

    def end_at(self, total):
        """The run ends after `total` blocks (an early stop; or nothing is left
        to train: total = the start)."""
        self.total = total

    def begin_block(self, k):
        self.block = k

    def enter(self, phase):
        """Enter a phase; raise the injected fault if it targets this point."""
        self.phase = phase
        self.faults.enter(self.rank, self.block, phase)

    def at(self, phase, block=None):
        """Name where the job is without a fault point (a background write's
        failure is reported as its own block's)."""
        self.phase = phase
        if block is not None:
            self.block = block

    def request_stop(self, reason, interrupted=False):
        self.stop_requested = True
        self.stop_reason = reason
        self.interrupted = self.interrupted or interrupted

    def agree(self, stop, early):
        """What the block's flags said, the same on every rank."""
        self.stop_agreed, self.early_agreed = bool(stop), bool(early)

    def block_ended(self, seconds):
        self.slowest_block_s = max(self.slowest_block_s, seconds)

    def checkpoint_took(self, seconds):
        """The time limit keeps room for the longest checkpoint write."""
        if self.deadline is not None:
            self.deadline.ckpt_s = max(self.deadline.ckpt_s, seconds)


def install_stop_handlers(control, goodbye=None):
    """SIGTERM / SIGUSR1 ask for a checkpoint-and-stop at the end of the
    current block (all ranks agree through the block's Allreduce flags).
    The first Ctrl-C (SIGINT) does the same and ends with exit 130; a
    second one, more than SECOND_PRESS_S later, stops at once (the last
    complete checkpoint is kept; goodbye() first, where given: the job
    ended on purpose, it was not lost)."""
    import signal
    import threading
    old = {}
    if threading.current_thread() is threading.main_thread():
        def on_signal(signum, frame):
            control.stop_requested = True      # the reason stays the default
        first = []

        def on_interrupt(signum, frame):
            now = time.monotonic()
            if not first:
                first.append(now)
                control.request_stop("Ctrl-C (SIGINT)", interrupted=True)
                if control.rank == 0:
                    print(f"interrupted: stopping with a checkpoint at the end of this "
                          f"block (exit {EXIT_INTERRUPTED}); press Ctrl-C again to stop at "
                          f"once", file=sys.stderr, flush=True)
            elif now - first[0] > SECOND_PRESS_S:
                if control.rank == 0:
                    print(f"interrupted again: stopped at once in block {control.block}; "
                          f"the last complete checkpoint is kept (exit {EXIT_INTERRUPTED})",
                          file=sys.stderr, flush=True)
                sys.stdout.flush()
                if goodbye is not None:
                    goodbye()                      # ended on purpose, not lost
                os._exit(EXIT_INTERRUPTED)  # no MPI teardown to wait for or complain
        for sig in (signal.SIGTERM, signal.SIGUSR1):
            old[sig] = signal.signal(sig, on_signal)
        old[signal.SIGINT] = signal.signal(signal.SIGINT, on_interrupt)
    return old


def restore_handlers(old):
    import signal
    for sig, h in old.items():
        signal.signal(sig, h)


def start_profile(on):
    if not on:
        return None
    import cProfile
    prof = cProfile.Profile()
    prof.enable()
    return prof


def write_profile(prof, run_dir, rank, block, phase, top=40):
    """run.profile: this rank's cProfile, also when the run failed:
    RUN/profile-rank-R.txt (the `top` functions by cumulative time) and
    .pstats (for snakeviz, pstats, gprof2dot). A write error is reported,
    never raised over the run's own outcome."""
    import io
    import pstats
    prof.disable()
    base = os.path.join(run_dir, f"profile-rank-{rank:05d}")
    try:
        prof.dump_stats(base + ".pstats")
        text = io.StringIO()
        st = pstats.Stats(prof, stream=text)
        st.sort_stats("cumulative").print_stats(top)
        with open(base + ".txt", "w") as f:
            f.write(f"rank {rank}, block {block}, phase {phase}\n")
            f.write(text.getvalue())
    except OSError as e:
        print(f"[rank {rank}] run.profile: cannot write {base}.*: {e}", file=sys.stderr)


def keep_error(cfg, rank, msg):
    """RUN/error-rank-R.txt: the launcher may drop output on abort."""
    if cfg is None:
        return
    try:
        from ..fsutil import replace_file
        replace_file(os.path.join(cfg["run"]["dir"], f"error-rank-{rank}.txt"), msg + "\n")
    except OSError:
        pass


def retire_errors(run_dir, before):
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


# -- which rank was lost: a watcher per rank notes when its process ended -------
RANKS_DIR = ".ranks"
WATCHER = 'cat > "$1.out"; date +%s.%N > "$1.end"'
# bash's clock is a builtin: no fork and exec of `date` between the rank's
# end and the note of it, whose few ms of jitter could put another rank's
# note first under load
WATCHER_BASH = 'cat > "$1.out"; echo "${EPOCHREALTIME:-$(date +%s.%N)}" > "$1.end"'


class Lifeline:
    """A tiny watcher process (sh, cat, date) per rank of an MPI job that
    notes when the rank's process ended and whether it ended through
    Python's exit (it then says "ok" first). A rank the kernel killed
    (SIGKILL, the OOM killer) says nothing; when the launcher then kills
    the others, the lost rank is the one that ended first, which the next
    start and `ibtmpi status` name (the launcher's banner may not). The
    watcher runs in its own session, so a Ctrl-C to the job's process
    group leaves it; a launcher that kills a whole cgroup (srun) takes it
    along, and then nothing is named."""

    def __init__(self, run_dir, rank, host):
        import atexit
        import json
        import subprocess
        d = os.path.join(run_dir, RANKS_DIR)
        os.makedirs(d, exist_ok=True)
        self.base = os.path.join(d, f"rank-{rank}")
        for ext in (".out", ".end"):
            try:
                os.remove(self.base + ext)
            except FileNotFoundError:
                pass
        from ..fsutil import replace_file
        replace_file(self.base + ".json", json.dumps({"rank": rank, "host": host,
                                                      "pid": os.getpid()}))
        r, self.w = os.pipe()
        try:
            import shutil
            shell = shutil.which("bash")
            subprocess.Popen([shell, "-c", WATCHER_BASH, "sh", self.base] if shell else
                             ["sh", "-c", WATCHER, "sh", self.base], stdin=r,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True, close_fds=True)
        finally:
            os.close(r)
        atexit.register(self.goodbye)
        from .. import comm
        comm.BEFORE_ABORT.append(self.goodbye)    # an abort after its own message

    def goodbye(self):
        try:
            os.write(self.w, b"ok")
            os.close(self.w)
        except OSError:
            pass


def lost_rank(run_dir):
    """The rank of the last MPI job in run_dir that ended first when no rank
    said goodbye (all were killed: the first was lost, the launcher then
    killed the rest), as {rank, host, pid, lead_s} (lead_s: how long before
    the next rank ended), or None."""
    import glob
    import json
    ends = []
    for path in glob.glob(os.path.join(run_dir, RANKS_DIR, "rank-*.json")):
        base = path[:-5]
        try:
            info = json.load(open(path))
            end = float(open(base + ".end").read().strip())
            said = open(base + ".out").read().strip()
        except (OSError, ValueError):
            continue
        ends.append((end, said == "ok", info))
    ends.sort(key=lambda e: e[0])
    # a rank that ended knowingly (a normal end, or an abort after its own
    # message) explains the job's end: only where none did was one lost
    if len(ends) < 2 or any(said for _, said, _ in ends):
        return None
    first = ends[0][2]
    return {"rank": first["rank"], "host": first["host"], "pid": first["pid"],
            "lead_s": round(ends[1][0] - ends[0][0], 3)}


def lost_rank_text(lost):
    """Who ended the job, as far as the watchers' clocks tell. They cannot
    tell a killed rank from a killed launcher: a SIGHUP to mpiexec ends the
    ranks 0.2-10 ms apart, a SIGKILLed rank leads the others by 4-20 ms
    (measured on a loaded 2-core machine), so the text names both."""
    return (f"rank {lost['rank']} (pid {lost['pid']} on {lost['host']}) ended first, "
            f"{lost['lead_s']:.3f} s before the others, without a word: the rank was "
            f"killed (SIGKILL, the out-of-memory killer) or its node lost, or the "
            f"launcher ended the job (mpiexec killed, a second Ctrl-C, or hung up by a "
            f"closed terminal: run interactive jobs under nohup, tmux or sbatch)")


def agree_at_start(dev, ident, parts, gather):
    """([(host, pid, BLAS threads, device, CPU ids)] of every rank in rank
    order, each start-up part at its slowest rank): one allgather at the
    start, for the start line and summary.json. It also carries what every
    rank must share, checked here: the same ibtmpi and numpy (every rank
    computes z itself from the reduced sums), the same configuration and
    the same data (`ident`: a config file edited while the job started, a
    stale node-local copy of the data, another venv on one node). A
    mismatch stops every rank with exit 2. gather: MPI's allgather, or the
    one process's [x]."""
    import socket

    import numpy as np

    from .. import __version__
    from ..config import ConfigError
    from ..threads import current_blas_threads
    try:                        # the cores it may run on: a Slurm allocation's,
        cpus = tuple(sorted(os.sched_getaffinity(0)))     # or one bound core
    except AttributeError:                                # no affinity API (macOS)
        cpus = tuple(range(os.cpu_count() or 1))
    me = (socket.gethostname(), os.getpid(), current_blas_threads(), dev, cpus)
    ident = {"ibtmpi": __version__, "numpy": np.__version__, **ident}
    got = gather((me, ident, parts))
    # each start-up part at its slowest rank (the first block waits for it)
    slowest = {k: max(g[2].get(k, 0.0) for g in got) for k in parts}
    got = [g[:2] for g in got]
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
    return rows, slowest
