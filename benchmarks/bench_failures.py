#!/usr/bin/env python
"""Every failure mode of docs/reliability.md, provoked for real: exit status,
seconds from the fault to the exit, and how many lines the user reads.

Each case runs `mpiexec -n 3` (master + 2 workers) of the tiny model on a
3,000-image 32x32 synthetic set (or `ibtmpi prep` for the data cases) and
injects its fault: a bad key, a damaged shard, a NaN, SIGSTOP / SIGKILL /
SIGINT of a process, a full disk. The time is measured from the fault (the
signal, or the start for faults present from the start) to the command's
exit. The hung-rank case waits for the default watchdog (run.watchdog_s =
auto: at least 60 s) unless --quick, which lowers that floor to 3 s.

Usage: python benchmarks/bench_failures.py [--quick] [--only REGEX]
Needs root for the full-disk case (a 3 MiB tmpfs); it is skipped otherwise.
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

PY = sys.executable
MPIEXEC = os.path.join(os.path.dirname(PY), "mpiexec")


def train_cmd(data, run, *sets, n=3, passes=400):
    base = {"data.path": data, "model.layers": "tiny", "data.split_size": 40,
            "data.batch": 16, "run.passes": passes, "run.dir": run, "run.threads": 1,
            "run.progress_s": 0, "run.checkpoint_every": 5}
    args = []
    for k, v in base.items():
        args += ["--set", f"{k}={v}"]
    for s in sets:
        args += ["--set", s]
    return ([MPIEXEC, "-n", str(n)] if n > 1 else []) + [PY, "-m", "ibtmpi", "train"] + args


def rank_pid(run, rank, wait=30.0):
    """The pid of rank `rank` of the job training into run, from the file
    each rank of an MPI job writes at its start (RUN/.ranks/rank-R.json)."""
    path = os.path.join(run, ".ranks", f"rank-{rank}.json")
    t0 = time.time()
    while time.time() - t0 < wait:
        try:
            return json.load(open(path))["pid"]
        except (OSError, ValueError, KeyError):
            time.sleep(0.1)
    return None


def run_case(cmd, env=None, fault=None, group=False, timeout=300):
    """(exit status, seconds from the fault to the exit, output lines)."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=dict(os.environ, **(env or {})), start_new_session=group)
    t0 = time.perf_counter()
    lines = []
    if fault is not None:
        for line in p.stdout:          # training has started
            lines.append(line)
            if line.startswith("placement:"):
                break
        time.sleep(1.0)
        fault(p)
        t0 = time.perf_counter()
    out, err = p.communicate(timeout=timeout)
    dt = time.perf_counter() - t0
    text = "".join(lines) + out + err
    return p.returncode, dt, text


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="the hung-rank case with a 3 s watchdog floor instead of 60 s")
    ap.add_argument("--only", help="only the cases whose name matches")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="bench_failures-")
    data = os.path.join(tmp, "data")
    subprocess.run([PY, "-m", "ibtmpi", "prep", "synth", data, "--n", "3000", "--size", "32",
                    "--shards", "2", "--quiet"], check=True)
    rows = []

    def case(name, *args, **kw):
        if a.only and not re.search(a.only, name):
            return
        rc, dt, text = run_case(*args, **kw)
        said = [x for x in text.splitlines() if "ibtmpi" in x or "interrupted" in x
                or "rank" in x]
        rows.append((name, rc, dt, len(text.strip().splitlines()),
                     (said[-1] if said else text.strip().splitlines()[-1:] or [""])[:110]))
        print(f"{name}: exit {rc} in {dt:.2f} s", flush=True)

    def run_dir(name):
        return os.path.join(tmp, name)

    case("bad key (optim.lr=inf)", train_cmd(data, run_dir("a"), "optim.lr=inf"))
    damaged = os.path.join(tmp, "damaged")
    shutil.copytree(data, damaged)
    shard = sorted(f for f in os.listdir(damaged) if f.startswith("train-"))[-1]
    with open(os.path.join(damaged, shard), "r+b") as f:
        f.seek(os.path.getsize(f.name) // 2)
        f.write(os.urandom(64))
    case("damaged shard (64 random bytes)", train_cmd(damaged, run_dir("b"), "data.cache=disk"))
    case("NaN on worker 1", train_cmd(data, run_dir("c")), env={"IBTMPI_FAULT": "2:12:nan"})
    floor = {"IBTMPI_WATCHDOG_FLOOR_S": "3"} if a.quick else {}
    case("SIGSTOP of worker 1 (watchdog auto)", train_cmd(data, run_dir("d")), env=floor,
         fault=lambda p: os.kill(rank_pid(run_dir("d"), 2), signal.SIGSTOP))
    case("SIGKILL of worker 1", train_cmd(data, run_dir("e")),
         fault=lambda p: os.kill(rank_pid(run_dir("e"), 2), signal.SIGKILL))
    case("Ctrl-C (SIGINT to the job)", train_cmd(data, run_dir("f")), group=True,
         fault=lambda p: os.killpg(p.pid, signal.SIGINT))
    case("SIGTERM to worker 1", train_cmd(data, run_dir("g")),
         fault=lambda p: os.kill(rank_pid(run_dir("g"), 2), signal.SIGTERM))
    for d in ("d", "e"):                # a stopped rank left behind by a failed case
        pid = rank_pid(run_dir(d), 2, wait=0)
        try:
            if pid:
                os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if os.geteuid() == 0 and (not a.only or re.search(a.only, "full disk")):
        mnt = os.path.join(tmp, "full")
        os.makedirs(mnt)
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", mnt]).returncode == 0:
            try:
                case("prep synth onto a full disk", [PY, "-m", "ibtmpi", "prep", "synth",
                                                     os.path.join(mnt, "ds"), "--n", "3000",
                                                     "--size", "32", "--quiet"])
            finally:
                subprocess.run(["umount", "-l", mnt])
    print("\n| failure | exit status | seconds to exit | output lines | last line |")
    print("|---|---|---|---|---|")
    for name, rc, dt, n, last in rows:
        print(f"| {name} | {rc} | {dt:.2f} | {n} | {last.replace('|', '/')} |")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
