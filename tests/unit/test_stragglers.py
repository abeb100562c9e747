"""A worker that holds every block back is named, once, with its node."""
import json

import numpy as np

from ibtmpi.config import load
from ibtmpi.monitor import Stragglers
from ibtmpi.testing import slow_worker
from ibtmpi.train import Trainer


def test_a_persistent_straggler_is_named_once():
    s = Stragglers(4)
    out = [s.block([1.0, 1.0, 1.6, 1.1]) for _ in range(12)]
    assert out[:7] == [None] * 7
    assert out[7] == (2, 8, 1.6 / 1.05)
    assert out[8:] == [None] * 4                 # once
    assert s.counts == {2: 12}


def test_noise_and_rotating_slowness_are_not_reported():
    s = Stragglers(4)
    rng = np.random.default_rng(0)
    for k in range(200):
        comp = 1.0 + 0.1 * rng.random(4)         # +-10 %: never 1.25x the median
        assert s.block(comp) is None
    for k in range(40):                          # a different worker slow each block
        comp = np.ones(4)
        comp[k % 4] = 2.0
        assert s.block(comp) is None
    assert set(s.counts) == {0, 1, 2, 3}


def test_one_worker_and_idle_blocks():
    assert Stragglers(1).block([5.0]) is None
    s = Stragglers(3)
    assert all(s.block([0.0, 0.0, 0.0]) is None for _ in range(20))


def test_a_slowed_worker_is_named_in_the_log_and_the_summary(small_dataset, tmp_path,
                                                             monkeypatch):
    cfg = load(None, [f"data.path={small_dataset}", "model.layers=tiny", "run.passes=1",
                      "run.quiet=true", f"run.dir={tmp_path}", "run.simulate=3",
                      "run.threads=1", "data.split_size=12", "data.batch=12",
                      "algorithm.name=ma"])
    logs = []
    slow_worker(monkeypatch, 0.03, worker=1)
    t = Trainer(cfg, log=logs.append)
    assert t.sched.blocks_per_pass >= 10
    t.run()
    named = [m for m in logs if "computed longest" in m]
    assert len(named) == 1 and named[0].startswith("worker 1 computed longest in ")
    recs = [json.loads(l) for l in open(tmp_path / "metrics.jsonl")]
    assert sum(r["slowest_worker"] == 1 for r in recs) >= 0.8 * len(recs)
    summary = json.load(open(tmp_path / "summary.json"))
    assert summary["straggler_blocks"]["1"] >= 8
