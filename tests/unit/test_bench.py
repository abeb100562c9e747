"""`ibtmpi bench report` on real (tiny) runs and a diverged one."""
import json
import os

import pytest

from ibtmpi.cli import main
from ibtmpi.config import load
from ibtmpi.train import Trainer


def _runs(data, tmp_path, specs):
    """Tiny finished runs (name, algorithm, N) in tmp_path; their directories."""
    runs = []
    for name, algo, n in specs:
        d = str(tmp_path / name)
        cfg = load(None, [f"data.path={data}", f"algorithm.name={algo}",
                          "data.split_size=40", "data.batch=16", "model.layers=tiny",
                          "run.passes=2", "run.quiet=true", f"run.dir={d}",
                          f"run.simulate={n if n > 1 else 0}", "run.threads=1"])
        Trainer(cfg, log=lambda m: None).run()
        runs.append(d)
    return runs


def test_report_tables_plots_and_targets(small_dataset, tmp_path, capsys):
    runs = _runs(small_dataset, tmp_path, (("t1-sgd-1", "sgd", 1), ("t1-admm-2", "admm", 2),
                                           ("t1-ibt-2", "ibt", 2)))
    div = tmp_path / "t1-bmuf-2"
    div.mkdir()
    (div / "diverged.json").write_text(json.dumps({"algorithm": "bmuf", "N": 2,
                                                   "message": "x"}))
    runs.append(str(div))
    out = tmp_path / "rep"
    assert main(["bench", "report", *runs, "--out", str(out)]) == 0
    md = (out / "report.md").read_text()
    acc = json.load(open(tmp_path / "t1-admm-2" / "summary.json"))["test_acc"]
    assert "## T1: test accuracy vs N" in md
    assert f"| admm | - | {acc:.4f} |" in md
    assert "| bmuf | - | diverged |" in md
    assert "ibt at N = 2 within 0.5 pt of N = 1" in md
    assert "MPI:" in md and "commit" in md
    # T3: a worker's compute wall and CPU seconds per pass, from the metrics
    m = [json.loads(line) for line in open(tmp_path / "t1-ibt-2" / "metrics.jsonl")]
    wc = sum(r["compute_mean_s"] for r in m) / 2
    cc = sum(sum(r["compute_cpu_s"]) / 2 for r in m) / 2
    assert f"| {wc:.2f}, {cc:.2f} ({cc / wc:.0%}) |" in md
    assert "oversubscribed" not in md.lower()
    # a run whose workers waited for cores is marked as such in T3
    sp = tmp_path / "t1-ibt-2" / "summary.json"
    summ = json.load(open(sp))
    summ["starved_blocks"] = {"0": summ["blocks"], "1": summ["blocks"]}
    json.dump(summ, open(sp, "w"))
    assert main(["bench", "report", *runs, "--out", str(out)]) == 0
    md = (out / "report.md").read_text()
    assert "| t1-ibt-2 | sim (oversubscribed) |" in md          # simulated: N = 2 in one process
    assert "Oversubscribed: its CPU workers had a core" in md
    rep = json.load(open(out / "report.json"))
    assert {r["name"] for r in rep["runs"]} == {os.path.basename(r) for r in runs}
    for f in ("t4_val_accuracy.png", "t5_residuals_rho.png", "t7_time_to_accuracy.png"):
        assert (out / f).stat().st_size > 2000
    # T7: time to 99% of N = 1's final val accuracy, from the metrics lines
    from ibtmpi import bench
    base = [json.loads(line) for line in open(tmp_path / "t1-sgd-1" / "metrics.jsonl")]
    target = 0.99 * [l["val_acc"] for l in base if "val_acc" in l][-1]
    assert f"## T7: time to 99% of N = 1's final validation accuracy ({target:.4f})" in md
    t, k = 0.0, None
    for line in m:
        t += line["wall_s"]
        if line.get("val_acc") is not None and line["val_acc"] >= target:
            k = line
            break
    from ibtmpi import tta
    hit = tta.reach(bench.load_run(str(tmp_path / "t1-ibt-2")), target)
    if k is None:
        assert hit is None and "| t1-ibt-2 | ibt | 2 |" in md and "not reached" in md
    else:
        assert hit["seconds"] == pytest.approx(t)
        assert f"| {hit['seconds']:.1f} | - | - | simulated" in md
    assert main(["bench", "report", str(tmp_path / "nothing"), "--out", str(out)]) == 2


def test_holdout_decides_the_target_with_a_paired_standard_error(small_dataset, tmp_path):
    """bench report --holdout: both models predict the same unseen images;
    gap and SE equal a direct per-image computation."""
    import math
    import numpy as np
    from ibtmpi import bench
    from ibtmpi.data_prep.prep import prep_synth
    from ibtmpi.dataset import Dataset
    from ibtmpi.outputs import load_trained
    runs = _runs(small_dataset, tmp_path, (("t1-sgd-1", "sgd", 1), ("t1-ibt-2", "ibt", 2)))
    hold = str(tmp_path / "hold")
    prep_synth(hold, n=300, size=16, seed=11, shards=1, quiet=True)
    g = bench.paired_gap(runs[0], runs[1], hold)
    sp = Dataset(hold).split("test")
    a = load_trained(runs[0]).probs(sp.read_all()).argmax(1) == sp.labels
    b = load_trained(runs[1]).probs(sp.read_all()).argmax(1) == sp.labels
    n = len(a)
    diffs = [int(p) - int(q) for p, q in zip(a, b)]
    mean = sum(diffs) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in diffs) / (n - 1))
    assert g["n"] == n and g["base_acc"] == a.mean() and g["other_acc"] == b.mean()
    assert math.isclose(g["gap_pt"], 100 * mean, abs_tol=1e-9)
    assert math.isclose(g["se_pt"], 100 * sd / math.sqrt(n), rel_tol=1e-9)
    out = tmp_path / "rep"
    assert main(["bench", "report", *runs, "--out", str(out), "--holdout", hold]) == 0
    md = (out / "report.md").read_text()
    assert f"on the held-out set {hold} ({n:,} images)" in md
    assert f"gap {g['gap_pt']:+.2f} pt, paired SE {g['se_pt']:.2f} pt" in md
    assert main(["bench", "report", *runs, "--out", str(out), "--holdout",
                 str(tmp_path / "none")]) == 2
    assert np.isfinite(g["se_pt"])


def test_holdout_table_of_the_fixed_block_runs_pairs_each_seed(small_dataset, tmp_path):
    """T2 on the held-out set: each run against the N = 1 run of its own seed,
    the gap's SE from the seed-averaged per-image differences and the seeds'
    spread, as a direct computation gives them."""
    import math
    from ibtmpi.data_prep.prep import prep_synth
    from ibtmpi.dataset import Dataset
    from ibtmpi.outputs import load_trained
    runs = []
    for name, algo, n, sd in (("t2-sgd-1", "sgd", 1, 0), ("t2-ibt-2", "ibt", 2, 0),
                              ("t2-sgd-1-s1", "sgd", 1, 1), ("t2-ibt-2-s1", "ibt", 2, 1)):
        d = str(tmp_path / name)
        cfg = load(None, [f"data.path={small_dataset}", f"algorithm.name={algo}",
                          "data.block_size=80", "data.batch=16", "model.layers=tiny",
                          "run.passes=1", "run.quiet=true", f"run.dir={d}",
                          f"run.simulate={n if n > 1 else 0}", "run.threads=1",
                          f"model.seed={sd}", f"data.seed={sd}"])
        Trainer(cfg, log=lambda m: None).run()
        runs.append(d)
    hold = str(tmp_path / "hold")
    prep_synth(hold, n=300, size=16, seed=11, shards=1, quiet=True)
    sp = Dataset(hold).split("test")
    ok = [[int(v) for v in load_trained(d).probs(sp.read_all()).argmax(1) == sp.labels]
          for d in runs]
    n = len(ok[0])
    diffs = [[ok[0][i] - ok[1][i] for i in range(n)], [ok[2][i] - ok[3][i] for i in range(n)]]
    gaps = [100 * sum(d) / n for d in diffs]
    per_image = [(diffs[0][i] + diffs[1][i]) / 2 for i in range(n)]
    m = sum(per_image) / n
    se_img = 100 * math.sqrt(sum((v - m) ** 2 for v in per_image) / (n - 1) / n)
    g = sum(gaps) / 2
    se_seed = math.sqrt(((gaps[0] - g) ** 2 + (gaps[1] - g) ** 2) / 1 / 2)
    se = math.sqrt(se_img ** 2 + se_seed ** 2)
    acc = (sum(ok[1]) + sum(ok[3])) / (2 * n)
    out = tmp_path / "rep"
    assert main(["bench", "report", *runs, "--out", str(out), "--holdout", hold]) == 0
    md = (out / "report.md").read_text()
    assert f"## T2 on the held-out set {hold} ({n:,} images)" in md
    base = (sum(ok[0]) + sum(ok[2])) / (2 * n)
    assert f"| sgd | {base:.4f} (n=2) | - |" in md
    assert f"| ibt | - | {acc:.4f}, {g:+.2f} +- {se:.2f} pt (n=2) |" in md
    verdict = "MET" if g <= 0.5 else "NOT MET"
    assert (out / "t4_val_accuracy.png").stat().st_size > 2000     # from the T2 runs
    assert f"ibt within 0.5 pt of N = 1 on these images: N = 2 {verdict} " \
           f"(one-sided 95% bound {g + 1.645 * se:+.2f} pt)" in md


def test_bench_run_starts_real_mpi_jobs_and_reports(small_dataset, tmp_path, capsys):
    """`bench run` end to end, small: N = 2 as a real `mpiexec -n 3` job
    (started through ibtmpi.launcher), N = 1 as one process, then the report."""
    import sys
    if not os.path.exists(os.path.join(os.path.dirname(sys.executable), "mpiexec")):
        import pytest
        pytest.skip("no mpiexec in the venv")
    out = tmp_path / "b"
    assert main(["bench", "run", "--data", small_dataset, "--out", str(out), "--ns", "1,2",
                 "--algos", "sgd,ibt", "--passes", "1", "--split", "40", "--batch", "16",
                 "--fixed-block", "0", "--set", "model.layers=tiny"]) == 0
    text = capsys.readouterr().out
    assert "t1-ibt-2: test accuracy" in text and "(mpi," in text
    s = json.load(open(out / "t1-ibt-2" / "summary.json"))
    assert s["world_size"] == 3 and not s["simulated"]
    assert (out / "report" / "report.md").exists()


def test_bench_run_keeps_finished_runs_and_goes_on_past_a_failed_one(
        small_dataset, tmp_path, capsys, monkeypatch):
    """A bench is hours of runs: a rerun keeps those finished by the same
    command, a run that fails is recorded (failed.json, exit 1) and the
    others go on, and the next rerun retries only what failed."""
    out = tmp_path / "b"
    args = ["bench", "run", "--data", small_dataset, "--out", str(out), "--ns", "1,2",
            "--passes", "1", "--split", "40", "--batch", "16", "--fixed-block", "0",
            "--mpi-max", "0", "--set", "model.layers=tiny"]
    assert main(args + ["--algos", "sgd,ma"]) == 0
    capsys.readouterr()
    first = os.path.getmtime(out / "t1-ma-2" / "summary.json")
    monkeypatch.setenv("IBTMPI_FAULT", "0:0:compute")      # every new run fails
    assert main(args + ["--algos", "sgd,ma,admm"]) == 1
    o = capsys.readouterr()
    assert "t1-sgd-1: done earlier (test accuracy" in o.out
    assert "t1-ma-2: done earlier" in o.out
    assert "t1-admm-2: FAILED (exit 1)" in o.out
    assert "1 run(s) failed: t1-admm-2" in o.err
    assert json.load(open(out / "t1-admm-2" / "failed.json"))["exit"] == 1
    assert os.path.getmtime(out / "t1-ma-2" / "summary.json") == first
    md = (out / "report" / "report.md").read_text()
    assert "| ma |" in md                                             # report of the rest
    assert "## Failed runs (not in the tables)" in md and "- t1-admm-2: exit 1" in md
    monkeypatch.delenv("IBTMPI_FAULT")
    assert main(args + ["--algos", "sgd,ma,admm"]) == 0
    o = capsys.readouterr().out
    assert "t1-admm-2: test accuracy" in o and "t1-ma-2: done earlier" in o
    # another command for the same name is redone, and --fresh redoes all
    assert main(args + ["--algos", "ma", "--passes", "2"]) == 0
    assert "t1-ma-2: test accuracy" in capsys.readouterr().out
    assert main(args + ["--algos", "ma", "--passes", "2", "--fresh"]) == 0
    assert "done earlier" not in capsys.readouterr().out


def test_seeds_repeat_each_cell_and_the_report_gives_mean_and_sd(small_dataset, tmp_path,
                                                                 capsys):
    """--seeds 3: each run three times with model.seed = data.seed = 0, 1, 2;
    the tables give mean +- sd (n) of exactly those runs, and the target line
    the gap of the means with its standard error."""
    import statistics
    out = tmp_path / "b"
    assert main(["bench", "run", "--data", small_dataset, "--out", str(out), "--ns", "1,2",
                 "--algos", "sgd,ibt", "--passes", "1", "--split", "40", "--batch", "16",
                 "--fixed-block", "0", "--mpi-max", "0", "--seeds", "3",
                 "--set", "model.layers=tiny"]) == 0
    capsys.readouterr()
    names = sorted(d for d in os.listdir(out) if d.startswith("t1-"))
    assert names == ["t1-ibt-2", "t1-ibt-2-s1", "t1-ibt-2-s2",
                     "t1-sgd-1", "t1-sgd-1-s1", "t1-sgd-1-s2"]
    acc = {}
    for algo, n in (("sgd", 1), ("ibt", 2)):
        runs = [f"t1-{algo}-{n}", f"t1-{algo}-{n}-s1", f"t1-{algo}-{n}-s2"]
        cfgs = [load(str(out / d / "config.toml")) for d in runs]
        assert [(c["model"]["seed"], c["data"]["seed"]) for c in cfgs] == [(0, 0), (1, 1), (2, 2)]
        acc[algo] = [json.load(open(out / d / "summary.json"))["test_acc"] for d in runs]
    assert len(set(acc["ibt"])) > 1, "the seeds gave identical runs"
    md = (out / "report" / "report.md").read_text()
    m, sd = statistics.mean(acc["ibt"]), statistics.stdev(acc["ibt"])
    assert f"| ibt | - | {m:.4f} +- {sd:.4f} (n=3) |" in md
    bm, bsd = statistics.mean(acc["sgd"]), statistics.stdev(acc["sgd"])
    se = 100 * (bsd ** 2 / 3 + sd ** 2 / 3) ** 0.5
    assert f"({m:.4f} vs {bm:.4f}, {(bm - m) * 100:+.2f} pt, SE {se:.2f} pt over seeds" in md
    # the time table keeps one run (seed 0) per cell
    assert "| t1-ibt-2 | sim |" in md and "t1-ibt-2-s1 |" not in md


def test_a_run_directory_a_live_run_holds_is_never_cleared(small_dataset, tmp_path):
    """Two benches over one --out (a grid resumed while its first launch
    still ran): the second one cleared the unfinished run's directory under
    the live run, which then lost its checkpoints. It now leaves it alone."""
    import subprocess
    import sys
    from ibtmpi import bench, runlock
    d = tmp_path / "ma-2"
    d.mkdir()
    (d / "metrics.jsonl").write_text('{"block": 0}\n')
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with open(d / runlock.NAME, "w") as f:
            json.dump({"host": __import__("socket").gethostname(), "pid": holder.pid,
                       "job": None, "started": "now", "token": "t"}, f)
        said = []
        assert bench.run_one(str(tmp_path), "ma-2", small_dataset, "ma", 2, [], False,
                             log=said.append) is False
        assert (d / "metrics.jsonl").read_text() == '{"block": 0}\n'
        assert said and "not run:" in said[0] and "is in use by pid" in said[0]
    finally:
        holder.kill()
        holder.wait()
