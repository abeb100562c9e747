"""The host-side benchmark scripts run and print their tables (tiny sizes:
they check the scripts, not the figures, which are in docs/benchmarks.md)."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
BIN = os.path.dirname(sys.executable)


def rows(text):
    return [[c.strip() for c in line.split("|")[1:-1]] for line in text.splitlines()
            if line.startswith("| ") and not line.startswith("| algorithm")
            and not line.startswith("| bytes")]


def test_consensus_benchmark():
    r = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "bench_consensus.py"),
                        "--p", "200003", "--reps", "2", "--threads", "3"],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]      # it asserts z is the same all 3 ways
    got = rows(r.stdout)
    assert [x[0] for x in got] == ["ma", "admm", "bmuf", "ibt", "easgd"], r.stdout
    assert all(min(map(float, x[1:4])) > 0 and x[4].endswith("x") for x in got), r.stdout


@pytest.mark.skipif(not os.path.exists(os.path.join(BIN, "mpiexec")),
                    reason="no mpiexec beside this Python")
def test_allreduce_wait_benchmark():
    """Under mpiexec -n 2: the three ways at each size, and the sum right
    (the script asserts it on every call)."""
    from ibtmpi import launcher
    cmd = launcher.command(2, os.path.join(BIN, "mpiexec")) + [
        "-n", "2", sys.executable, os.path.join(ROOT, "benchmarks", "bench_allreduce_wait.py"),
        "--reps", "1"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    got = rows(r.stdout)
    assert [int(x[0].replace(",", "")) for x in got] == [4096, 2 ** 20, 8767840, 2 ** 25]
    assert all(len(x) == 5 and x[4].endswith("x") for x in got), r.stdout


def test_node_scaling_benchmark():
    """Two processes of pure compute, pinned and with the prefetch thread:
    the table has a row per N with positive rates and the CPU sets."""
    r = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks",
                                                     "bench_node_scaling.py"),
                        "--ns", "1,2", "--seconds", "0.5", "--placements", "cores",
                        "--prefetch", "on"], capture_output=True, text=True, timeout=300,
                       cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "hardware threads per core" in r.stdout
    got = [x for x in rows(r.stdout) if x and x[0].isdigit()]
    assert [x[0] for x in got] == ["1", "2"], r.stdout
    assert all(float(x[1]) > 0 and float(x[4]) > 0 for x in got), r.stdout
