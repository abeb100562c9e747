"""Memory figures (memory.py): each worker's peak RSS and CuPy pool ride the
block's Allreduce into metrics.jsonl and summary.json; a rank out of memory
ends the job with EXIT_NO_MEMORY and one line, not a traceback."""
import json
import os
import subprocess
import sys
import time

import pytest
from conftest import MPIEXEC, mpiexec, train_args
from ibtmpi.testing.fakecupy import POOL, FakeCupy

from ibtmpi import errors, memory
from ibtmpi.backend import GpuOps
from ibtmpi.config import load
from ibtmpi.train import Trainer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STANDIN = os.path.join(ROOT, "tests", "standin")
needs_mpi = pytest.mark.skipif(not os.path.exists(MPIEXEC), reason="no mpiexec beside this Python")


def lines(run):
    return [json.loads(x) for x in open(os.path.join(run, "metrics.jsonl"))]


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux /proc")
def test_peak_rss_sees_an_allocation():
    """A process's peak RSS covers its resident set (VmRSS) after it
    touched 80 MB more, and so exceeds the resident set before by that;
    started by this (large) pytest process, it is its own peak, not the
    parent's (ru_maxrss would carry that over exec)."""
    r = subprocess.run([sys.executable, "-c",
                        "import numpy as np; from ibtmpi import memory\n"
                        "def rss():\n"
                        "    for x in open('/proc/self/status'):\n"
                        "        if x.startswith('VmRSS:'): return int(x.split()[1]) / 1024\n"
                        "a = rss(); b = np.ones(10_000_000); c = rss()\n"
                        "print(a, c, memory.peak_rss_mib())"],
                       capture_output=True, text=True, timeout=60, check=True)
    before, after, peak = map(float, r.stdout.split())
    assert after - before > 70
    assert after - 1 <= peak < after + 200, (before, after, peak)


def test_texts():
    assert memory.mib_range([310.2, 309.8]) == "310 MiB"
    assert memory.mib_range([0.93, 12.4, 300]) == "0.9-300 MiB"
    assert memory.memory_line({}) is None
    assert memory.memory_line({"worker_peak_rss_mib": [300, 320], "worker_gpu_pool_mib":
                               [500.4, 500.2], "rank0_peak_rss_mib": 90}) == (
        "memory: workers' peak RSS 300-320 MiB, CuPy pool on their GPUs 500 MiB; "
        "rank 0 peak RSS 90 MiB")
    t = memory.oom_text(MemoryError("Out of memory allocating 1,024 bytes."), 3, "compute",
                        7, 64, gpu=1, pool_mib=2048.0, sharing=4)
    assert t.startswith("[rank 3] ibtmpi train: out of memory (GPU 1) in block 7, phase "
                        "compute: Out of memory allocating 1,024 bytes; its CuPy pool "
                        "held 2048 MiB. Lower data.batch (now 64;")
    assert "fewer worker processes on each GPU (4 share this one" in t
    host = memory.oom_text(MemoryError("Unable to allocate 8 GiB"), 1, "data", 0, 16)
    assert "out of memory (host memory)" in host and "share" not in host
    master = memory.oom_text(MemoryError("Unable to allocate 8 GiB"), 0, "evaluation", 3,
                             16, master=True)
    assert "phase evaluation: Unable to allocate 8 GiB. The master holds the val" in master
    assert "data.batch" not in master
    mgpu = memory.oom_text(MemoryError("Out of memory allocating 8 bytes."), 0, "consensus",
                           3, 16, gpu=0, pool_mib=10.0, master=True)
    assert "out of memory (GPU 0)" in mgpu and "run.master_device=cpu" in mgpu


def test_gpu_pool_figure_is_the_pools_high_water(small_dataset, tmp_path):
    """In one process (2 simulated workers on the stand-in), the last metrics
    line's gpu_pool_mib is what the pool holds at the end (a high-water
    mark); summary.json keeps the run's largest; host runs have none."""
    POOL.free_all_blocks()                     # this run's mark, not an earlier test's
    cfg = load(None, [f"data.path={small_dataset}", "algorithm.name=ibt",
                      "data.split_size=40", "data.batch=16", "model.layers=tiny",
                      "run.passes=0.5", "run.quiet=true", f"run.dir={tmp_path / 'd'}",
                      "run.simulate=2", "run.threads=1",
                      # the workers' figure: an evaluation on the device after
                      # the last block would add to the pool
                      "run.eval_device=cpu"])
    t = Trainer(cfg, log=lambda m: None, device_ops=GpuOps(cp=FakeCupy()))
    t.run()
    recs = lines(tmp_path / "d")
    # the default pool and the CUDA graphs' own (their captured scratch)
    held = (POOL.total_bytes() + t.model.graphs.pool_bytes()) / memory.MIB
    assert held > 0 and t.model.graphs.pool_bytes() > 0
    assert recs[-1]["gpu_pool_mib"] == [pytest.approx(held, abs=0.06)] * 2
    assert t.summary["worker_gpu_pool_mib"] == [max(r["gpu_pool_mib"][i] for r in recs)
                                                for i in range(2)]
    assert t.summary["worker_peak_rss_mib"] == recs[-1]["peak_rss_mib"]
    cfg["run"]["dir"] = str(tmp_path / "h")
    h = Trainer(cfg, log=lambda m: None)
    h.run()
    assert "gpu_pool_mib" not in lines(tmp_path / "h")[-1]
    assert "worker_gpu_pool_mib" not in h.summary
    assert h.summary["worker_peak_rss_mib"][0] > 10


def test_out_of_gpu_memory_in_one_process(small_dataset, tmp_path):
    """The stand-in's pool refuses past its limit (CuPy's set_limit): the
    run ends with exit status 71 and one line naming the GPU, block and
    phase, no traceback; RUN/error-rank-0.txt keeps it, so `ibtmpi
    status` calls the run failed."""
    run = tmp_path / "r"
    env = dict(os.environ, PYTHONPATH=STANDIN, CUPY_GPU_MEMORY_LIMIT="300000")
    r = subprocess.run([sys.executable, "-m", "ibtmpi", "train", "--device", "gpu",
                        "--simulate", "2"] + train_args(small_dataset, run, passes=0.5),
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == errors.EXIT_NO_MEMORY, r.stdout[-2000:] + r.stderr[-2000:]
    assert ("[rank 0] ibtmpi train: out of memory (GPU 0) in block 0, phase compute: "
            "Out of memory allocating") in r.stderr
    assert "limit set to: 300,000 bytes" in r.stderr
    assert "Traceback" not in r.stderr
    assert "out of memory (GPU 0)" in (run / "error-rank-0.txt").read_text()
    s = subprocess.run([sys.executable, "-m", "ibtmpi", "status", str(run)],
                       capture_output=True, text=True, timeout=60)
    assert "failed" in s.stdout and "error-rank-0.txt" in s.stdout


@needs_mpi
def test_out_of_gpu_memory_on_one_worker_ends_the_job(small_dataset, tmp_path):
    """mpiexec: a master without GPU, two GPU workers sharing device 0, the
    second one's pool limited: it reports (naming the 2 processes on its
    GPU), every rank ends, nobody waits in the Allreduce."""
    from ibtmpi import launcher
    run = tmp_path / "r"
    args = ["-m", "ibtmpi", "train", "--device", "gpu"] + train_args(small_dataset, run)
    cmd = launcher.command(3, MPIEXEC)
    for i, extra in enumerate([[], [f"PYTHONPATH={STANDIN}"],
                               [f"PYTHONPATH={STANDIN}", "CUPY_GPU_MEMORY_LIMIT=300000"]]):
        cmd += ([":"] if i else []) + ["-n", "1", "env"] + (extra or ["PYTHONPATH="]) + \
            [sys.executable] + args
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert time.time() - t0 < 60
    assert r.returncode == errors.EXIT_NO_MEMORY, r.stdout[-2000:] + r.stderr[-2000:]
    assert "[rank 2] ibtmpi train: out of memory (GPU 0) in block 0, phase compute" in r.stderr
    assert "fewer worker processes on each GPU (2 share this one" in r.stderr
    assert "Traceback" not in r.stderr
    assert (run / "error-rank-2.txt").exists()


@needs_mpi
def test_each_workers_peak_rss_is_its_own(small_dataset, tmp_path):
    """mpiexec -n 3 on the CPU, worker 1's process holding 400 MB more than
    worker 0's: metrics.jsonl and summary.json put the difference on worker
    1; the end line reports the range."""
    run = tmp_path / "r"
    args = ["train"] + train_args(small_dataset, run, passes=1)
    heavy = [sys.executable, "-c",
             "import sys, runpy, numpy as np; ballast = np.ones(50_000_000); "
             "sys.argv = ['ibtmpi'] + sys.argv[1:]; "
             "runpy.run_module('ibtmpi', run_name='__main__', alter_sys=True)"]
    cmd = mpiexec(2, 1) + [sys.executable, "-m", "ibtmpi"] + args + \
        [":", "-n", "1"] + heavy + args
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    recs = lines(run)
    for rec in recs:
        w0, w1 = rec["peak_rss_mib"]
        assert w1 - w0 > 330, rec["peak_rss_mib"]          # 381 MiB of ballast
        assert "gpu_pool_mib" not in rec
    s = json.loads((run / "summary.json").read_text())
    assert s["worker_peak_rss_mib"] == [max(r["peak_rss_mib"][i] for r in recs)
                                        for i in range(2)]
    assert s["rank0_peak_rss_mib"] < s["worker_peak_rss_mib"][1] - 300
    assert "memory: workers' peak RSS " in r.stdout


def test_evaluate_out_of_gpu_memory_names_batch_and_a_smaller_one_works(
        small_dataset, tmp_path):
    """`ibtmpi evaluate --device gpu` on the stand-in with a limited pool:
    at --batch 256 the im2col buffer does not fit, exit 71 with one line
    naming GPU 0 and the batch; at --batch 2 it fits and the report is the
    CPU one's (the batch size does not change a prediction)."""
    run = tmp_path / "run"
    subprocess.run([sys.executable, "-m", "ibtmpi", "train", "--simulate", "2"]
                   + train_args(small_dataset, run, passes=0.5), check=True,
                   capture_output=True, timeout=120)

    def evaluate(*extra, limit=None):
        env = dict(os.environ, PYTHONPATH=STANDIN)
        if limit:
            env["CUPY_GPU_MEMORY_LIMIT"] = str(limit)
        return subprocess.run([sys.executable, "-m", "ibtmpi", "evaluate", str(run)]
                              + list(extra), env=env, capture_output=True, text=True,
                              timeout=120)
    r = evaluate("--device", "gpu", limit=200_000)
    assert r.returncode == errors.EXIT_NO_MEMORY, r.stdout[-2000:] + r.stderr[-2000:]
    assert "[rank 0] ibtmpi evaluate: out of memory (GPU 0): Out of memory" in r.stderr
    assert r.stderr.rstrip().endswith("Lower --batch (now 256)")
    assert "Traceback" not in r.stderr
    small = evaluate("--device", "gpu", "--batch", "2", limit=200_000)
    cpu = evaluate()
    assert small.returncode == 0 and cpu.returncode == 0, small.stderr[-2000:]
    assert small.stdout == cpu.stdout
    bad = evaluate("--batch", "0")
    assert bad.returncode == 2 and "--batch must be at least 1, got 0" in bad.stderr


def test_memory_growth_names_a_worker_growing_pass_after_pass():
    g = memory.MemoryGrowth()

    def end(rss, pool=None):
        rec = {"peak_rss_mib": rss}
        if pool:
            rec["gpu_pool_mib"] = pool
        return g.pass_done(rec)
    assert end([100, 100], [500, 500]) == []          # pass 1: caches filling
    assert end([150, 100], [500, 900]) == []          # pass 2: + the first evaluation
    assert end([160, 100], [500, 900]) == []          # passes 3-4: too early to say
    assert end([170, 101], [500, 900]) == []
    # pass 5: worker 0's RSS rose in each of the last 3 passes, 150 -> 200
    # (1.33x, +50 MiB); worker 1's pool stayed at 900
    assert end([200, 102], [500, 900]) == [("peak_rss_mib", 0, 150, 200)]
    assert end([230, 103], [500, 900]) == []          # named once
    assert g.found == {"peak_rss_mib": {0: [150, 200]}}
    flat = memory.MemoryGrowth()                               # a steady run: flat marks
    assert [flat.pass_done({"peak_rss_mib": [300.0]}) for _ in range(6)] == [[]] * 6


def test_memory_growth_no_alarm_for_the_first_evaluation_and_a_late_step():
    """An 8-pass N = 1 run measured on 2026-12-04: 205 MiB after pass 1,
    the first evaluation's buffers in pass 2, then a steady run with one
    small rise at the end: no leak (it named one before)."""
    g = memory.MemoryGrowth()
    said = [g.pass_done({"peak_rss_mib": [v]})
            for v in (205, 467, 470, 470, 470, 471, 479, 479)]
    assert said == [[]] * 8
    # rises in each of the last 3 passes, but under 10% in all: no leak
    g = memory.MemoryGrowth()
    said = [g.pass_done({"peak_rss_mib": [v]}) for v in (200, 400, 410, 420, 430)]
    assert said == [[]] * 5


@needs_mpi
@pytest.mark.parametrize("leak", [True, False])
def test_a_leaking_worker_is_named_and_a_steady_one_is_not(small_dataset, tmp_path, leak):
    """mpiexec -n 3, 5 passes of 6 blocks; with IBTMPI_FAULT=2:0:leak worker
    1 keeps 20 MB more every block: named (rank 2) after pass 5, once, in
    summary.json and by `ibtmpi status` too; without it nobody is."""
    run = tmp_path / "r"
    env = dict(os.environ, **({"IBTMPI_FAULT": "2:0:leak"} if leak else {}))
    r = subprocess.run(mpiexec(3) + [sys.executable, "-m", "ibtmpi", "train"]
                       + train_args(small_dataset, run, passes=5), env=env,
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    s = json.loads((run / "summary.json").read_text())
    said = [x for x in r.stdout.splitlines() if "a leak?" in x]
    st = subprocess.run([sys.executable, "-m", "ibtmpi", "status", str(run)],
                        capture_output=True, text=True, timeout=60).stdout
    if leak:
        assert "; worker 1: memory kept growing pass after pass (a leak?)" in st, st
        assert len(said) == 1, r.stdout
        assert said[0].startswith("memory: worker 1 (rank 2 on ")
        assert "peak RSS grew from " in said[0] and "at the end of pass 5" in said[0]
        first, now = s["memory_growth"]["peak_rss_mib"]["1"]
        assert now - first > 300                   # 6 blocks x 20 MB a pass, 3 passes
        assert list(s["memory_growth"]["peak_rss_mib"]) == ["1"]
    else:
        assert said == [] and s["memory_growth"] == {}
        assert "kept growing" not in st and "a worker's peak RSS up to" in st
