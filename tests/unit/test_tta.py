"""Time to accuracy (ibtmpi/tta.py) on hand-made metrics: the first
evaluation at the target, its passes, honest, critical-path and CPU
seconds, a modelled run's seconds, and the scaling model's block time."""
import json

import pytest

from ibtmpi import tta


def _line(block, wall, comp, wait, cpu, val=None, **kw):
    d = {"block": block, "blocks_total": 4, "wall_s": wall, "compute_max_s": comp,
         "data_wait_max_s": wait, "compute_cpu_s": cpu, "samples": 20,
         "master_busy_s": 0.2, **kw}
    if val is not None:
        d["val_acc"] = val
    return d


def _run(tmp_path, simulated=False, n=2):
    return {"dir": str(tmp_path), "name": f"t1-ibt-{n}", "algorithm": "ibt", "N": n,
            "simulated": simulated, "passes": 2.0, "split_size": 10, "block_size": 0,
            "metrics": [_line(0, 1.0, 0.6, 0.1, [0.5, 0.3], 0.5),
                        _line(1, 2.0, 0.8, 0.0, [0.6, 0.4]),
                        _line(2, 1.5, 1.0, 0.2, [1.0, 0.8], 0.9),
                        _line(3, 1.0, 0.5, 0.0, [0.4, 0.4], 0.95)]}


def test_reach_measured_modelled_and_simulated(tmp_path):
    base = {"metrics": [{"val_acc": 0.7}, {"val_acc": 0.9}, {}]}
    goal = tta.target(base)
    assert goal == pytest.approx(0.891)
    run = _run(tmp_path)
    hit = tta.reach(run, goal)           # block 2: 3 of 4 blocks of 2 passes
    assert hit["passes"] == pytest.approx(1.5) and hit["seconds"] == pytest.approx(4.5)
    assert hit["critical_s"] == pytest.approx(0.7 + 0.8 + 1.2)
    assert hit["cpu_s"] == pytest.approx(0.4 + 0.5 + 0.9) and not hit["modelled"]
    assert tta.reach(run, 0.96) is None
    assert tta.how_timed(run) == "measured: MPI"
    # modelled: every block 0.25 s, passes still the run's own
    (tmp_path / tta.TIMING).write_text(json.dumps({"how": "modelled: x", "block_s": 0.25}))
    hit = tta.reach(run, goal)
    assert hit["seconds"] == pytest.approx(0.75) and hit["modelled"]
    assert hit["passes"] == pytest.approx(1.5) and tta.how_timed(run) == "modelled: x"
    sim = _run(tmp_path / "none", simulated=True)
    hit = tta.reach(sim, goal)
    assert hit["seconds"] == pytest.approx(4.5) and hit["critical_s"] is None
    assert tta.how_timed(sim) == "simulated: workers in turn"
    md = "\n".join(tta.table([run, sim], base))
    assert "(0.8910)" in md
    assert "| t1-ibt-2 | ibt | 2 | 10 | 1.50 | 0.8 | 2.7 | 1.8 | modelled: x |" in md
    assert "| 1.50 | 4.5 | - | - | simulated: workers in turn |" in md
    assert "not reached in 2 (best 0.9500) | > 1.0 |" in "\n".join(tta.table([run], base, frac=1.1))
    assert tta.table([run], {"metrics": []}) == []


def test_model_block_and_its_error(tmp_path):
    run = _run(tmp_path)
    for line in run["metrics"]:
        line["compute_max_s"], line["wall_s"] = 0.5, 0.6
    (tmp_path / "summary.json").write_text(json.dumps(
        {"allreduce_calls": 8, "blocks": 4, "allreduce_bytes": 8 * 4000}))
    a, b = 1e-5, 1e-9
    block, inputs = tta.model_block(run, 4, a, b)
    # max(10 samples x 0.05 s, master 0.2 s) + 2 Allreduces of 4000 B among 5 ranks
    assert block == pytest.approx(0.5 + 2 * (2 * 3 * a + 2 * 4 / 5 * 4000 * b))
    assert inputs["t_sample_ms"] == pytest.approx(50.0)
    assert inputs["allreduce_calls_per_block"] == 2
    own = 0.5 + 2 * (2 * 2 * a + 2 * 2 / 3 * 4000 * b)
    assert tta.model_error(run, a, b) == pytest.approx(own * 2 / 1.2 - 1)


def test_a_repeat_on_the_cluster_counts_once_in_the_accuracy_tables(tmp_path):
    from ibtmpi.bench import _one_per_seed
    here, net, other = (_run(tmp_path / d) for d in ("here", "net", "other"))
    (tmp_path / "net").mkdir()
    (tmp_path / "net" / tta.TIMING).write_text(json.dumps({"how": "measured: 3 nodes"}))
    net["name"], other["seed"] = "net-ibt-2", (1, 1)
    assert _one_per_seed([net, here, other]) == [here, other]
