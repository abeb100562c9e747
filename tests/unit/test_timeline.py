"""run.timeline: every rank's phases as Chrome trace events. The spans are
the same clock readings the metrics are made of, so each worker's compute
spans add up to its compute_s in metrics.jsonl; a rank that fails leaves
a file that still reads; a requeued run's jobs are merged into one trace."""
import collections
import json

import pytest

from ibtmpi import timeline
from ibtmpi.config import load
from ibtmpi.train import InjectedFault, Trainer
from ibtmpi.config import run_hash


def cfg(path, run_dir, algo="ibt", **extra):
    sets = [f"data.path={path}", f"algorithm.name={algo}", "data.split_size=40",
            "data.batch=16", "model.layers=tiny", "run.passes=2", "run.quiet=true",
            f"run.dir={run_dir}", "run.simulate=3", "run.threads=1",
            "run.eval_every=2", "run.checkpoint_every=3", "run.timeline=true"]
    return load(None, sets + [f"{k}={v}" for k, v in extra.items()])


def spans(run_dir):
    doc = json.load(open(run_dir / timeline.MERGED))
    return [e for e in doc["traceEvents"] if e["ph"] == "X"], doc


def fail_in_block(k, data, run_dir, monkeypatch):
    """A job that fails in block k's compute (the injected fault)."""
    monkeypatch.setenv("IBTMPI_FAULT", f"0:{k}:compute")
    with pytest.raises(InjectedFault):
        Trainer(cfg(data, run_dir), log=lambda m: None).run()
    monkeypatch.delenv("IBTMPI_FAULT")


# ts and dur are wall-clock microseconds rounded to 0.1 each, and near 1.8e15
# a float64 holds a quarter microsecond: ends and starts compare to 1 us
EPS = 1.0


def metrics(run_dir):
    return [json.loads(line) for line in open(run_dir / "metrics.jsonl")]


@pytest.mark.parametrize("algo", ["ibt", "ssgd"])
def test_spans_add_up_to_the_metrics(small_dataset, tmp_path, algo):
    logs = []
    t = Trainer(cfg(small_dataset, tmp_path, algo), log=logs.append)
    t.run()
    ev, doc = spans(tmp_path)
    assert any("timeline.json" in m and "perfetto" in m for m in logs)
    names = {(e["tid"], e["args"]["name"]) for e in doc["traceEvents"]
             if e["name"] == "thread_name"}
    assert names == {(0, "master"), (1, "worker 0"), (2, "worker 1"), (3, "worker 2")}
    recs = metrics(tmp_path)
    blocks = t.total_blocks
    for k, rec in enumerate(recs):
        for i in range(3):
            comp = [e for e in ev if e["name"] == "compute" and e["tid"] == 1 + i
                    and e["args"]["block"] == k]
            # ibt: one span per block; ssgd: one per step
            steps = t.sched.steps_in_block(t.sched.locate(k)[1])
            assert len(comp) == (steps if algo == "ssgd" else 1)
            got = sum(e["dur"] for e in comp) * 1e-6
            assert got == pytest.approx(rec["compute_s"][i], abs=2e-6 * len(comp) + 1e-6)
            data = [e for e in ev if e["name"] == "data" and e["tid"] == 1 + i
                    and e["args"]["block"] == k]
            assert len(data) == 1
            assert data[0]["ts"] + data[0]["dur"] <= comp[0]["ts"] + EPS
        red = [e for e in ev if e["name"] == "allreduce" and e["args"]["block"] == k]
        assert len(red) == (steps if algo == "ssgd" else 1) and all(e["tid"] == 0 for e in red)
        # in one process the block's reduction follows its workers' compute
        last = max(e["ts"] + e["dur"] for e in ev if e["name"] == "compute"
                   and e["args"]["block"] == k)
        assert red[-1]["ts"] >= last - EPS
    ck = sorted(e["args"]["block"] for e in ev if e["name"] == "checkpoint")
    assert ck == [k for k in range(blocks) if (k + 1) % 3 == 0 or k == blocks - 1]
    evals = {e["args"]["block"] for e in ev if e["name"] == "evaluation"}
    assert evals == {r["block"] for r in recs if "val_acc" in r}
    assert all(e["dur"] >= 0 for e in ev)


def test_off_by_default_and_outside_the_digest(small_dataset, tmp_path):
    c = cfg(small_dataset, tmp_path / "off", **{"run.timeline": "false"})
    Trainer(c, log=lambda m: None).run()
    assert not (tmp_path / "off" / timeline.DIR).exists()
    assert not (tmp_path / "off" / timeline.MERGED).exists()
    assert run_hash(c) == run_hash(cfg(small_dataset, tmp_path / "off"))


def test_a_failed_rank_leaves_a_readable_file_and_the_resumed_run_traces_every_job(
        small_dataset, tmp_path, monkeypatch):
    fail_in_block(4, small_dataset, tmp_path, monkeypatch)
    assert not (tmp_path / timeline.MERGED).exists()
    # cut off mid-run, with no closing bracket: its blocks up to the failure
    first = timeline.rank_file(str(tmp_path), "from-block-000000", 0)
    part = timeline.read_events(first)
    done = collections.Counter(e["args"]["block"] for e in part
                               if e["ph"] == "X" and e["name"] == "compute")
    assert sorted(done) == [0, 1, 2, 3] and all(v == 3 for v in done.values())
    # a line half written when the rank died is dropped, not fatal
    with open(first, "a") as f:
        f.write('{"name":"compute","ph":"X","pi')
    assert timeline.read_events(first) == part

    # resumed from the checkpoint after block 2, failing again in block 4,
    # and once more: the merged timeline holds all three jobs (block 3 ran
    # in each), apart on the wall clock
    fail_in_block(4, small_dataset, tmp_path, monkeypatch)
    t = Trainer(cfg(small_dataset, tmp_path), log=lambda m: None)
    t.run()
    assert t.start == 3 and list(timeline.segments(str(tmp_path))) == [
        "from-block-000000", "from-block-000003", "from-block-000003-try02"]
    ev, _ = spans(tmp_path)
    comp = collections.Counter(e["args"]["block"] for e in ev if e["name"] == "compute")
    assert comp == {k: (9 if k == 3 else 3) for k in range(t.total_blocks)}
    job2 = timeline.read_events(timeline.rank_file(str(tmp_path), "from-block-000003", 0))
    assert min(e["ts"] for e in job2 if e["ph"] == "X") > max(
        e["ts"] + e["dur"] for e in part if e["ph"] == "X")


def test_a_fresh_start_drops_the_timeline_of_the_run_it_replaces(
        small_dataset, tmp_path, monkeypatch):
    # failed in block 1, before its first checkpoint: the rerun starts at 0
    fail_in_block(1, small_dataset, tmp_path, monkeypatch)
    stale = timeline.read_events(timeline.rank_file(str(tmp_path), "from-block-000000", 0))
    t = Trainer(cfg(small_dataset, tmp_path), log=lambda m: None)
    t.run()
    assert t.start == 0
    ev, _ = spans(tmp_path)
    comp = collections.Counter(e["args"]["block"] for e in ev if e["name"] == "compute")
    assert comp == {k: 3 for k in range(t.total_blocks)}
    assert not {e["ts"] for e in stale if e["ph"] == "X"} & {e["ts"] for e in ev}


SLOW_STEP = """
import functools, sys, time
from ibtmpi.train import trainer
from ibtmpi.cli import main
from ibtmpi.model import Model
NAP = float(sys.argv.pop(1))
# no prefetch thread: nothing else in the process spends CPU while a step sleeps
trainer.WorkerData = functools.partial(trainer.WorkerData, prefetch=False)
orig = Model.loss_and_grad
def slow(self, *a, **k):
    time.sleep(NAP)
    return orig(self, *a, **k)
Model.loss_and_grad = slow
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("algo", ["ibt", "ssgd"])
def test_compute_cpu_time_leaves_out_time_off_the_cpu(small_dataset, tmp_path, algo):
    """compute_cpu_s is the worker's process's CPU time in the span
    compute_s times: each local step sleeping 20 ms (wall time, no CPU,
    like a rank waiting for a core or a GPU) shows in compute_s and not in
    compute_cpu_s. Run as `ibtmpi train` with run.threads = 1 in its own
    process, with the loader's prefetch thread (whose CPU time counts: it
    is the rank's work) off, so nothing else in it spends CPU meanwhile."""
    import subprocess
    import sys
    from conftest import train_args
    nap = 0.02
    script = tmp_path / "slow_step.py"
    script.write_text(SLOW_STEP)
    run = tmp_path / "r"
    args = train_args(small_dataset, run, 1, **{
        "algorithm.name": algo, "run.simulate": 3, "run.timeline": "true"})
    p = subprocess.run([sys.executable, str(script), str(nap), "train", *args],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    recs = metrics(run)
    s = json.load(open(run / "summary.json"))
    for rec in recs:
        for i, (wall, cpu) in enumerate(zip(rec["compute_s"], rec["compute_cpu_s"])):
            steps = -(-rec["samples"] // 3 // 16)       # minibatches of 16, the last short
            assert 0 < cpu and wall - cpu >= steps * nap * 0.95, (rec["block"], i)
    assert s["worker_compute_s"] == [round(sum(r["compute_s"][i] for r in recs), 3)
                                     for i in range(3)]
    assert s["worker_cpu_s"] == [round(sum(r["compute_cpu_s"][i] for r in recs), 3)
                                 for i in range(3)]
    # the trace's compute spans carry the same CPU seconds
    ev, _ = spans(run)
    got = sum(e["args"]["cpu_s"] for e in ev if e["name"] == "compute")
    assert got == pytest.approx(sum(sum(r["compute_cpu_s"]) for r in recs), abs=1e-4)


def test_a_preempted_job_merges_the_timeline_of_its_blocks(small_dataset, tmp_path):
    """A stop request (signal or time limit) ends the job after the next
    block with a checkpoint: the merged timeline covers the job's blocks."""
    from ibtmpi.train import Preempted
    t = Trainer(cfg(small_dataset, tmp_path), log=lambda m: None)
    mark = t.flags.mark

    def stop_at_block_2(**kw):                  # flags.mark(ckpt=False) in a block
        t.control.stop_requested = t.control.stop_requested or t.control.block == 2
        mark(**kw)
    t.flags.mark = stop_at_block_2
    with pytest.raises(Preempted):
        t.run()
    ev, _ = spans(tmp_path)
    assert {e["args"]["block"] for e in ev} == {0, 1, 2}
    assert [e["args"]["block"] for e in ev if e["name"] == "checkpoint"] == [2]


STARVE_ONE = """
import functools, sys, time
from ibtmpi.train import trainer, workers
from ibtmpi.cli import main
trainer.WorkerData = functools.partial(trainer.WorkerData, prefetch=False)
orig = workers.WorkerGroup.swap_in
def swap_in(self, i):
    if i == 1:
        time.sleep(0.08)      # worker 1 waits for a core every block
    return orig(self, i)
workers.WorkerGroup.swap_in = swap_in
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("passes, when", [(3, "in 8+ of the last 10 blocks"),
                                          (1, "in 4 of the 4 blocks of this run")])
def test_a_worker_that_waits_for_cores_is_named_once(small_dataset, tmp_path, passes, when):
    """A CPU worker whose process had a core for less than 60% of its
    compute time in 8 of 10 blocks is named in the log, once; a run too
    short for that, at its end when it was so in half its blocks;
    summary.json counts its blocks. Here worker 1's compute sleeps (no
    CPU) every block."""
    import subprocess
    import sys
    from conftest import train_args
    script = tmp_path / "starve.py"
    script.write_text(STARVE_ONE)
    run = tmp_path / "r"
    p = subprocess.run([sys.executable, str(script), "train", *train_args(
        small_dataset, run, passes, **{"algorithm.name": "ibt", "run.simulate": 3,
                                  "run.quiet": "false", "run.progress_s": 0})],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    out = p.stdout + p.stderr
    lines = [x for x in out.splitlines() if "had a core for only" in x]
    assert len(lines) == 1 and lines[0].startswith("worker 1 had a core for only"), out
    assert when in lines[0]
    s = json.load(open(run / "summary.json"))
    recs = metrics(run)
    assert s["starved_blocks"] == {"1": len(recs)} and len(recs) == 4 * passes
    assert all(r["compute_s"][1] - r["compute_cpu_s"][1] >= 0.075 for r in recs)
    assert all(r.get("starved") == [1] for r in recs)     # what status reads live


def test_plot_draws_the_timeline_also_of_a_run_that_failed(small_dataset, tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from ibtmpi.cli import main
    Trainer(cfg(small_dataset, tmp_path / "ok"), log=lambda m: None).run()
    assert main(["plot", str(tmp_path / "ok"), "--out", str(tmp_path / "p1")]) == 0
    assert (tmp_path / "p1" / "timeline.png").stat().st_size > 5000
    fail_in_block(4, small_dataset, tmp_path / "bad", monkeypatch)
    assert not (tmp_path / "bad" / timeline.MERGED).exists()
    assert main(["plot", str(tmp_path / "bad"), "--out", str(tmp_path / "p2")]) == 0
    assert (tmp_path / "p2" / "timeline.png").stat().st_size > 5000
    # not traced: no timeline plot
    Trainer(cfg(small_dataset, tmp_path / "off", **{"run.timeline": "false"}),
            log=lambda m: None).run()
    assert main(["plot", str(tmp_path / "off"), "--out", str(tmp_path / "p3")]) == 0
    assert not (tmp_path / "p3" / "timeline.png").exists()
