"""The host-side benchmark scripts run and print their tables (tiny sizes:
they check the scripts, not the figures, which are in docs/benchmarks.md)."""
import os
import subprocess
import sys

import pytest
from conftest import BLOCK

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
BIN = os.path.dirname(sys.executable)


def rows(text):
    return [[c.strip() for c in line.split("|")[1:-1]] for line in text.splitlines()
            if line.startswith("| ") and not line.startswith("| algorithm")
            and not line.startswith("| bytes")]


@pytest.mark.parametrize("gpu", [False, True])
def test_consensus_benchmark(gpu):
    """gpu: the update on CuPy arrays too (the stand-in here: its times mean
    nothing, the bits must be the host's)."""
    env = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "tests", "standin")} if gpu else None
    r = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "bench_consensus.py"),
                        "--p", "200003", "--reps", "2", "--threads", "3"]
                       + (["--gpu"] if gpu else []),
                       capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert r.returncode == 0, r.stderr[-2000:]      # it asserts z is the same every way
    got = rows(r.stdout)
    assert [x[0] for x in got] == BLOCK, r.stdout
    assert all(min(map(float, x[1:4])) > 0 and x[4].endswith("x") for x in got), r.stdout
    assert all(len(x) == 5 + gpu for x in got), r.stdout


@pytest.mark.skipif(not os.path.exists(os.path.join(BIN, "mpiexec")),
                    reason="no mpiexec beside this Python")
def test_allreduce_wait_benchmark():
    """Under mpiexec -n 2: the four ways at each size with their two ratios,
    and the sum right (the script asserts it on every call)."""
    from ibtmpi import launcher
    cmd = launcher.command(2, os.path.join(BIN, "mpiexec")) + [
        "-n", "2", sys.executable, os.path.join(ROOT, "benchmarks", "bench_allreduce_wait.py"),
        "--reps", "1"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    got = rows(r.stdout)
    assert [int(x[0].replace(",", "")) for x in got] == [4096, 2 ** 20, 8767840, 2 ** 25]
    assert all(len(x) == 7 and x[5].endswith("x") and x[6].endswith("x") for x in got), r.stdout


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


def test_scaling_model_puts_the_master_in_the_block_pipeline():
    """The master's work overlaps the workers' compute: only what exceeds it
    lengthens the block, and the bottleneck names the longer stage; a run's
    metrics give the time per sample and the master's work per block."""
    from ibtmpi import scaling as b
    P = 1_000_000
    st = b.block_stages(32, 155, 1e-4, P, 0.0, 0.0, u_worker=1e-3, t_master=5e-3,
                        u_master=2e-3)
    assert st["compute"] == pytest.approx(155e-4 + 1e-3)
    assert st["master"] == pytest.approx(7e-3)
    assert b.block_time(st) == pytest.approx(st["compute"] + st["allreduce"])
    assert b.bottleneck(st) == "compute"
    slow = b.block_stages(32, 155, 1e-4, P, 0.0, 0.0, 1e-3, 0.05, 0.01)
    assert b.bottleneck(slow) == "master" and b.block_time(slow) == pytest.approx(0.06)
    lines = [{"compute_max_s": 0.2, "samples": 200, "master_busy_s": 0.05}] * 5
    ts, busy, serial = b.run_inputs(lines, 2)
    assert ts == pytest.approx(0.2 / 100) and busy == pytest.approx(0.05) and not serial
    one = [dict(l, master_is_worker=True, master_busy_s=0.26) for l in lines]
    ts, busy, serial = b.run_inputs(one, 2)
    assert serial and busy == pytest.approx(0.06)


def test_torch_twin_of_an_avgpool_model_computes_our_forward():
    """bench_step.torch_net gives PyTorch the same architecture: an avgpool
    layer becomes nn.AvgPool2d(k, stride), and with our weights copied in
    the twin's logits are ours."""
    torch = pytest.importorskip("torch")
    import importlib.util
    import numpy as np
    from ibtmpi.model import Model
    spec = [{"type": "conv", "out": 3, "k": 3, "pad": 1}, "relu",
            {"type": "avgpool", "k": 3, "stride": 2}, {"type": "avgpool", "k": 2},
            "flatten", {"type": "linear"}]
    path = os.path.join(ROOT, "benchmarks", "bench_step.py")
    mod = importlib.util.spec_from_file_location("bench_step", path)
    bench = importlib.util.module_from_spec(mod)
    mod.loader.exec_module(bench)
    net = bench.torch_net(spec, (2, 11, 10), 4)
    pools = [l for l in net if isinstance(l, torch.nn.AvgPool2d)]
    assert [(p.kernel_size, p.stride, p.padding) for p in pools] == [(3, 2, 0), (2, 2, 0)]
    m = Model(spec, (2, 11, 10), 4, seed=2)
    assert len(list(net.parameters())) == 4           # conv and linear weight, bias
    with torch.no_grad():
        for t, ours in zip(net.parameters(), (p for l in m.layers for p in l.params)):
            t.copy_(torch.from_numpy(ours))
    x = np.random.default_rng(0).standard_normal((3, 2, 11, 10)).astype(np.float32)
    got = net(torch.from_numpy(x)).detach().numpy()
    np.testing.assert_allclose(got, m.forward(x), rtol=1e-5, atol=1e-6)


def _holdout(tmp_path):
    """A 300-image held-out set of another seed."""
    from ibtmpi.data_prep.prep import prep_synth
    hold = str(tmp_path / "hold")
    prep_synth(hold, n=300, size=16, seed=11, shards=1, quiet=True)
    return hold


def _paper(out, data, hold):
    """The paper script's command over the small set at N = 2 and 4."""
    return [sys.executable, os.path.join(ROOT, "benchmarks", "paper_experiment.py"),
            "--out", str(out), "--data", data, "--holdout", hold, "--ns", "2,4"]


def test_paper_experiment_runs_its_grid_in_order_and_reports(small_dataset, tmp_path):
    """benchmarks/paper_experiment.py, tiny: seed 0's grid, then seed 1's
    without bmuf (--bmuf-seeds 1), two at a time; the report's fixed-block
    tables on the held-out set; a rerun keeps every run."""
    hold = _holdout(tmp_path)
    out = tmp_path / "paper"
    cmd = _paper(out, small_dataset, hold) + [
           "--algos", "ibt,bmuf", "--seeds", "2", "--bmuf-seeds", "1", "--passes", "1",
           "--block", "80", "--batch", "10", "--streams", "2", "--threads", "1",
           "--set", "model.layers=tiny"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    names = ["t2-sgd-1", "t2-ibt-2", "t2-bmuf-2", "t2-ibt-4", "t2-bmuf-4",
             "t2-sgd-1-s1", "t2-ibt-2-s1", "t2-ibt-4-s1"]
    assert sorted(os.listdir(out)) == sorted(names + ["report"])
    starts = [line.split()[1].rstrip(":") for line in r.stdout.splitlines()
              if line.endswith(": start")]
    assert sorted(starts) == sorted(names) and set(starts[:5]) == set(names[:5])
    md = (out / "report" / "report.md").read_text()
    assert "## T2: fixed block of 80 samples" in md and "| ibt | - |" in md
    assert f"## T2 on the held-out set {hold}" in md
    assert "ibt within 0.3 pt of N = 1 on these images: N = 2" in md
    assert "## T1" not in md and "## T3" not in md      # no T1 runs: no empty tables
    from ibtmpi.config import tomllib
    with open(out / "t2-ibt-4-s1" / "config.toml", "rb") as f:
        cfg = tomllib.load(f)
    assert (cfg["data"]["block_size"], cfg["data"]["batch"], cfg["model"]["seed"],
            cfg["optim"]["schedule"], cfg["run"]["simulate"]) == (80, 10, 1, "cosine", 4)
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert again.returncode == 0 and again.stdout.count("done earlier") == len(names)
    # a run that failed (in an earlier invocation) is named in the report
    os.remove(out / "t2-ibt-4-s1" / "summary.json")
    (out / "t2-ibt-4-s1" / "failed.json").write_text('{"exit": 3}')
    rep = subprocess.run(cmd + ["--report-only"], capture_output=True, text=True,
                         timeout=600, cwd=ROOT)
    assert rep.returncode == 0, rep.stderr[-2000:]
    assert "## Failed runs" in rep.stdout and "- t2-ibt-4-s1: exit 3" in rep.stdout


def test_paper_experiment_recipe_study(small_dataset, tmp_path):
    """--recipe: every recipe at every N next to the N = 1 run of its seed,
    a value in braces computed for the run's N and passes, and the table of
    test accuracy and held-out gap per recipe and N."""
    hold = _holdout(tmp_path)
    out = tmp_path / "study"
    cmd = _paper(out, small_dataset, hold) + [
           "--seeds", "1", "--passes", "1", "--block", "80", "--batch", "10",
           "--streams", "2", "--threads", "1", "--set", "model.layers=tiny",
           "--recipe", "plain=ma",
           "--recipe", "gain=ibt algorithm.block_momentum={1-1/N} optim.lr={0.01*sqrt(N)}"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    names = ["base-sgd-1", "plain-ma-2", "gain-ibt-2", "plain-ma-4", "gain-ibt-4"]
    assert sorted(os.listdir(out)) == sorted(names + ["report"])
    from ibtmpi.config import tomllib
    with open(out / "gain-ibt-4" / "config.toml", "rb") as f:
        cfg = tomllib.load(f)
    assert cfg["algorithm"]["block_momentum"] == 0.75 and cfg["optim"]["lr"] == 0.02
    assert cfg["run"]["simulate"] == 4 and cfg["data"]["batch"] == 32   # the default
    with open(out / "base-sgd-1" / "config.toml", "rb") as f:
        assert tomllib.load(f)["data"]["batch"] == 10                      # --batch
    md = (out / "report" / "recipes.md").read_text()
    assert md.startswith("N = 1 (sgd): held-out accuracy 0.")
    rows = {l.split("|")[1].strip(): l for l in md.splitlines() if l.startswith("| ")}
    assert set(rows) == {"recipe", "plain", "gain"}
    assert rows["gain"].count(" pt") == 2 and "| ibt |" in rows["gain"]
    bad = subprocess.run(cmd[:-4] + ["--recipe", "noalgo"], capture_output=True, text=True,
                         timeout=60, cwd=ROOT)
    assert bad.returncode == 2 and "NAME=ALGO" in bad.stderr
    # --seed-list: seed 1 alone (as a later session adds a grid's third
    # seed): its own N = 1 run and the recipe at seed 1, nothing of seed 0
    # rerun, and the table over that seed only
    one = cmd[:-4] + ["--ns", "2", "--seed-list", "1", "--recipe", "plain=ma"]
    r = subprocess.run(one, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert sorted(os.listdir(out)) == sorted(names + ["report", "base-sgd-1-s1",
                                                      "plain-ma-2-s1"])
    with open(out / "plain-ma-2-s1" / "config.toml", "rb") as f:
        cfg = tomllib.load(f)
    assert (cfg["model"]["seed"], cfg["data"]["seed"], cfg["run"]["simulate"]) == (1, 1, 2)
    assert ": start" not in "".join(l for l in r.stdout.splitlines() if "-s1" not in l)
    bad = subprocess.run(one[:-2] + ["--seed-list", "x"], capture_output=True, text=True,
                         timeout=60, cwd=ROOT)
    assert bad.returncode == 2 and "--seed-list" in bad.stderr
