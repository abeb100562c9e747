"""One training run per run directory.

Two jobs writing into one run.dir (the same sbatch submitted twice, a sweep
whose runs share a directory) would overwrite each other's checkpoints and
interleave their metrics. The master therefore holds RUN/.lock while it
trains: a small JSON file naming the host, pid and batch job, created with
O_EXCL (which works on NFS and Lustre, where flock may not), refreshed by a
heartbeat thread and removed when the run ends, whether it finished, failed
or was preempted.

A lock left behind by a process that cannot remove it (SIGKILL, a node that
died) is taken over when it is provably stale:
- its process is gone (same host, pid no longer running), or
- it belongs to this same batch job (a Slurm requeue keeps SLURM_JOB_ID:
  the earlier incarnation of the job has ended), on another host or with a
  dead pid, or
- its heartbeat is older than STALE_S (a holder on another host that
  stopped refreshing it).
Otherwise the run stops at once with a message naming the holder.

Taking over is a lock of its own: RUN/.lock.break, created with O_EXCL.
Only its holder may replace the stale lock, and only after reading again
that it is still the one it judged stale; every other starter waits and
judges again (then finds the new, live holder). Without it two starters
that both judged the same dead lock stale would both replace it and both
read back their own token in turn. A breaker left by a starter that died
in those microseconds expires after BREAK_STALE_S.
"""
import json
import os
import socket
import threading
import time
import uuid

from .errors import RunDirBusy

NAME = ".lock"
HEARTBEAT_S = 60.0      # the holder refreshes the lock's mtime this often
STALE_S = 600.0         # no refresh for this long: the holder is gone
BREAK_STALE_S = 10.0    # a take-over lock this old was left by a dead starter
ACQUIRE_S = 30.0        # how long a starter keeps trying while others race it


def _job_id():
    for var in ("SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID"):
        if os.environ.get(var):
            return f"{var.split('_')[0].lower()}:{os.environ[var]}"
    return None


def _pid_alive(pid):
    """Whether process `pid` of this host still runs. A zombie does not: a
    rank killed by its launcher's abort stays one until it is reaped, which
    can be after mpiexec has returned."""
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError, TypeError, OverflowError):
        return True            # exists but not ours / unreadable: assume alive
    try:
        with open(f"/proc/{int(pid)}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True            # no procfs: os.kill's answer stands
    return state not in ("Z", "X")


def _stale(holder, age, me):
    """Why the holder's lock may be taken over, or None while it is live."""
    same_host = holder.get("host") == me["host"]
    alive_here = same_host and _pid_alive(holder.get("pid"))
    if same_host and holder.get("pid") == me["pid"]:
        return "held by this process"
    if same_host and not alive_here:
        return f"process {holder.get('pid')} is no longer running"
    if me["job"] and holder.get("job") == me["job"] and not alive_here:
        return f"left by an earlier run of this job ({me['job']}, requeued)"
    if age > STALE_S:
        return f"no heartbeat for {age:.0f} s"
    return None


class RunLock:
    def __init__(self, run_dir):
        self.path = os.path.join(run_dir, NAME)
        self.me = {"host": socket.gethostname(), "pid": os.getpid(), "job": _job_id(),
                   "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                   "token": uuid.uuid4().hex}
        self.took_over = None
        self._stop = threading.Event()
        self._thread = None

    def _create(self):
        fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        with os.fdopen(fd, "w") as f:
            json.dump(self.me, f)
            f.flush()
            os.fsync(f.fileno())

    def _read(self):
        """(holder dict, seconds since its last heartbeat); the dict is empty
        for a lock still being written by its creator, or unreadable."""
        age = time.time() - os.stat(self.path).st_mtime     # FileNotFoundError: gone
        try:
            with open(self.path) as f:
                return json.load(f), age
        except FileNotFoundError:
            raise
        except (OSError, ValueError):
            return {}, age

    def inspect(self):
        """(holder, seconds since its heartbeat, why it may be taken over or
        None while the holder is live); FileNotFoundError where there is no
        lock."""
        holder, age = self._read()
        why = _stale(holder, age, self.me) if holder else (
            f"unreadable, no heartbeat for {age:.0f} s" if age > STALE_S else None)
        return holder, age, why

    def verdict(self):
        """Why the existing lock may be taken over; RunDirBusy while its
        holder is live; FileNotFoundError where there is none."""
        holder, age, why = self.inspect()
        if why is None:
            raise RunDirBusy(self._busy_message(holder, age))
        return why

    def acquire(self):
        import random
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        give_up = time.monotonic() + ACQUIRE_S
        while True:
            try:
                self._create()
                break
            except FileExistsError:
                pass
            try:
                holder, age, why = self.inspect()
            except FileNotFoundError:
                continue                     # released meanwhile
            if why is None:
                raise RunDirBusy(self._busy_message(holder, age))
            if self._take_over(holder):
                self.took_over = why
                break
            if time.monotonic() > give_up:
                raise RunDirBusy(f"could not take {self.path}: other runs keep taking "
                                 f"it over (or {self.path}.break is left behind)")
            time.sleep(0.02 + 0.05 * random.random())   # another starter is at it
        try:                                 # whoever holds it now: say so if not us
            holder, _ = self._read()
        except FileNotFoundError:
            holder = {}
        if holder.get("token") != self.me["token"]:
            raise RunDirBusy(self._busy_message(holder, 0.0))
        self._thread = threading.Thread(target=self._beat, name="ibtmpi-runlock",
                                        daemon=True)
        self._thread.start()
        return self

    def _take_over(self, stale):
        """Replace the lock judged stale (holder dict `stale`) with ours,
        holding the take-over lock; False where another starter holds that,
        or the lock is no longer the stale one (judge again)."""
        brk = self.path + ".break"
        try:
            os.close(os.open(brk, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        except FileExistsError:
            try:
                if time.time() - os.stat(brk).st_mtime > BREAK_STALE_S:
                    os.remove(brk)           # its starter died while taking over
            except FileNotFoundError:
                pass
            return False
        try:
            try:
                now, _ = self._read()
            except FileNotFoundError:
                return False                 # released: create it afresh
            if now != stale:
                return False                 # taken over already: judge the new one
            tmp = f"{self.path}.{self.me['token']}"
            with open(tmp, "w") as f:
                json.dump(self.me, f)
            os.replace(tmp, self.path)
            return True
        finally:
            try:
                os.remove(brk)
            except FileNotFoundError:
                pass

    def _beat(self):
        while not self._stop.wait(HEARTBEAT_S):
            try:
                os.utime(self.path)
            except OSError:
                pass                         # removed under us, or the fs hiccuped

    def release(self):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        try:
            holder, _ = self._read()
            if holder.get("token") == self.me["token"]:
                os.remove(self.path)
        except OSError:
            pass

    def _busy_message(self, holder, age):
        run_dir = os.path.dirname(self.path)
        who = f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}"
        if holder.get("job"):
            who += f" (batch job {holder['job']})"
        return (f"run.dir {run_dir} is in use by {who}, started {holder.get('started', '?')}, "
                f"heartbeat {age:.0f} s ago. Two runs in one directory would overwrite "
                f"each other's checkpoints: wait for it to end, use another run.dir, or, "
                f"if that process is gone (a node that died), delete {self.path}")


def acquire(run_dir):
    """Hold run_dir for this process until .release(); RunDirBusy if a live
    run holds it."""
    return RunLock(run_dir).acquire()


def probe(run_dir):
    """What acquire() would find, taking nothing (train --dry-run): None for
    a free directory, the reason a stale lock would be taken over, or
    RunDirBusy."""
    try:
        return RunLock(run_dir).verdict()
    except FileNotFoundError:
        return None
