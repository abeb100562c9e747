"""The gpu-marked suite (tests/gpu) run here through the CuPy stand-in, so a
mistake in those tests shows up in CI rather than during the scarce run on
a real GPU. The stand-in follows CuPy's rules (fakecupy.DeviceArray: host
arrays rejected where CuPy rejects them, copies on asarray, 0-d device
results), but its arithmetic is the CPU's: this checks the tests, not the
GPU."""
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
BOOT = f"""
import sys

import pytest
sys.path.insert(0, {HERE!r})
import pytest
from ibtmpi.testing import fakecupy
from ibtmpi import backend
backend.gpu_status = lambda: (True, "CuPy stand-in")
class StandIn(backend.GpuOps):
    def __init__(self, cp=None):
        super().__init__(cp=fakecupy.FakeCupy())
backend.GpuOps = StandIn
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "-m", "gpu", "-o", "addopts=",
                      {os.path.join(HERE, "..", "gpu")!r}]))
"""


def test_gpu_suite_passes_on_the_stand_in():
    r = subprocess.run([sys.executable, "-c", BOOT], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    last = r.stdout.strip().splitlines()[-1]
    assert "passed" in last and "skipped" not in last and "failed" not in last, last


def test_gpu_step_benchmark_runs_on_the_stand_in(tmp_path, monkeypatch, capsys):
    """benchmarks/bench_gpu_step.py, the figure the real-GPU run exists for,
    runs end to end here (tiny batches, one timed step; our side through the
    stand-in). PyTorch without CUDA, as here, costs its column, not ours."""
    import importlib.util
    import json
    sys.path.insert(0, HERE)
    from ibtmpi.testing import fakecupy
    from ibtmpi import backend

    class StandIn(backend.GpuOps):
        def __init__(self, cp=None):
            super().__init__(cp=fakecupy.FakeCupy())
    monkeypatch.setattr(backend, "GpuOps", StandIn)
    path = os.path.join(HERE, "..", "..", "benchmarks", "bench_gpu_step.py")
    spec = importlib.util.spec_from_file_location("bench_gpu_step", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "step.json"
    bench.main(["--batches", "2,3", "--steps", "1", "--warmup", "1", "--json", str(out)])
    rows = json.loads(out.read_text())
    assert [r["batch"] for r in rows] == [2, 3]
    assert all(r["ours_img_s"] > 0 for r in rows)
    text = capsys.readouterr().out
    assert text.count("\n| 2 |") + text.count("\n| 3 |") == 2, text
    # op by op: every op of the reference CNN's step, once per layer, and
    # the parts add up to the synchronized step
    split = rows[0]["ours_ms_per_op"]
    calls = {op: c for op, (c, _) in split.items()}
    assert calls["conv2d_forward"] == calls["conv2d_backward"] == 3
    assert calls["maxpool_forward"] == calls["maxpool_backward"] == 3
    assert calls["linear_forward"] == calls["linear_backward"] == 2
    # the three ReLUs after the pools run inside them (layers.fuse_for_device)
    assert calls["relu_forward"] == calls["relu_backward"] == 1
    assert calls["sgd_update"] >= 1
    parts = sum(ms for op, (_, ms) in split.items() if op != "step (synchronized)")
    assert parts == pytest.approx(split["step (synchronized)"][1], rel=1e-6)
    assert "our step at batch 3, op by op" in text


def test_gpu_host_side_benchmark_runs_and_counts_the_launches():
    """benchmarks/bench_gpu_host.py (in its own process: it makes the
    stand-in's kernels no-ops): one row per batch, the reference step's
    14 GEMMs and our kernels' launches."""
    path = os.path.join(HERE, "..", "..", "benchmarks", "bench_gpu_host.py")
    r = subprocess.run([sys.executable, path, "--batches", "4,8", "--steps", "2",
                        "--warmup", "1"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = [line.split("|")[1:-1] for line in r.stdout.splitlines()[2:]]
    assert [int(x[0]) for x in rows] == [4, 8]
    assert all(float(x[1]) > 0 and float(x[3]) == 14 for x in rows), r.stdout
    assert float(rows[0][2]) == 26            # as test_launchers_host counts at batch 4
