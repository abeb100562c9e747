"""run.keep_best: RUN/model-best.npz holds the consensus model of the
evaluation with the best val accuracy, checked by evaluating the file again;
summary.json says which block it was and its test accuracy; a resumed run
keeps the same best as an uninterrupted one."""
import json
import os
import re

import pytest

from ibtmpi.config import load
from ibtmpi.dataset import Dataset
from ibtmpi.outputs import load_trained
from ibtmpi.serial import evaluate
from ibtmpi.train import BEST, InjectedFault, Trainer
from ibtmpi.config import run_hash


def cfg(path, run_dir, **extra):
    # lr 0.3 on a tiny model: val accuracy goes up and down, so the best
    # evaluation is not the last one
    sets = [f"data.path={path}", "algorithm.name=ma", "data.split_size=40",
            "data.batch=16", "model.layers=tiny", "run.passes=3", "run.quiet=true",
            f"run.dir={run_dir}", "run.simulate=3", "run.threads=1",
            "run.eval_every=1", "run.checkpoint_every=2", "optim.lr=0.3"]
    return load(None, sets + [f"{k}={v}" for k, v in extra.items()])


def reevaluate(path, data, split):
    t = load_trained(str(path))
    sp = Dataset(data).split(split)
    return evaluate(t.model, sp.read_all(), sp.labels, t.mean, t.std)


def test_the_best_evaluation_is_kept_and_reported(small_dataset, tmp_path):
    logs = []
    t = Trainer(cfg(small_dataset, tmp_path / "r"), log=logs.append)
    s = t.run()
    recs = [json.loads(line) for line in open(tmp_path / "r" / "metrics.jsonl")]
    vals = [(r["val_acc"], -r["val_loss"], r["block"]) for r in recs]
    assert len(vals) == t.total_blocks
    acc, negloss, block = max(vals, key=lambda v: (v[0], v[1]))
    assert block != t.total_blocks - 1, "setting meant to peak before the end"
    b = s["best"]
    assert (b["block"], b["val_acc"], b["val_loss"]) == (block, acc, -negloss)
    # the file is that block's z: evaluated again it gives the same figures
    loss, a = reevaluate(tmp_path / "r" / BEST, small_dataset, "val")
    assert (a, loss) == pytest.approx((acc, -negloss), rel=1e-6, abs=0)
    loss, a = reevaluate(tmp_path / "r" / BEST, small_dataset, "test")
    assert (b["test_acc"], b["test_loss"]) == pytest.approx((a, loss), rel=1e-6, abs=0)
    assert b["file"] == str(tmp_path / "r" / BEST)
    assert json.load(open(tmp_path / "r" / "summary.json"))["best"] == b
    assert any(m.startswith(f"best val accuracy {acc:.4f} at block {block}") for m in logs)


def test_a_resumed_run_keeps_the_same_best(small_dataset, tmp_path, monkeypatch):
    ref = Trainer(cfg(small_dataset, tmp_path / "a"), log=lambda m: None)
    ref.run()
    best_block = ref.summary["best"]["block"]
    # stop after the best block, and once before it
    for k in sorted({best_block + 1, max(best_block - 1, 0)}):
        monkeypatch.setenv("IBTMPI_FAULT", f"0:{k}:compute")
        with pytest.raises(InjectedFault):
            Trainer(cfg(small_dataset, tmp_path / "b"), log=lambda m: None).run()
    monkeypatch.delenv("IBTMPI_FAULT")
    t = Trainer(cfg(small_dataset, tmp_path / "b"), log=lambda m: None)
    t.run()
    assert t.z.tobytes() == ref.z.tobytes()
    assert open(tmp_path / "b" / BEST, "rb").read() == open(tmp_path / "a" / BEST, "rb").read()
    sb, sa = t.summary["best"], ref.summary["best"]
    assert {k: v for k, v in sb.items() if k != "file"} == \
        {k: v for k, v in sa.items() if k != "file"}


def test_keep_best_off_writes_no_file_and_a_fresh_start_drops_a_stale_one(
        small_dataset, tmp_path):
    d = tmp_path / "r"
    os.makedirs(d)
    (d / BEST).write_bytes(b"from another run")
    t = Trainer(cfg(small_dataset, d, **{"run.keep_best": "false"}), log=lambda m: None)
    s = t.run()
    assert not (d / BEST).exists()
    assert "file" not in s["best"] and "test_acc" not in s["best"]
    assert run_hash(t.cfg) == run_hash(cfg(small_dataset, d))


def expected_stop(recs, patience, delta=0.0, ref=False):
    """The block an early-stopping run ends after, replayed from the metrics
    of the same run without it: the evaluation at block k that makes
    `patience` evaluations without a better one stops the run after k + 2.
    Better: higher (val_acc, -val_loss); with delta > 0, a val accuracy
    above the last better evaluation's by more than delta. ref=True: also
    that evaluation."""
    last, since = None, 0
    for r in recs:
        if last is None or (r["val_acc"] > last["val_acc"] + delta if delta else
                            (r["val_acc"], -r["val_loss"]) > (last["val_acc"], -last["val_loss"])):
            last, since = r, 0
            continue
        since += 1
        if since >= patience:
            return (r["block"] + 2, last) if ref else r["block"] + 2
    return (None, None) if ref else None


def test_early_stop_ends_after_the_block_the_rule_names(small_dataset, tmp_path, monkeypatch):
    full = Trainer(cfg(small_dataset, tmp_path / "full"), log=lambda m: None)
    full.run()
    recs = [json.loads(line) for line in open(tmp_path / "full" / "metrics.jsonl")]
    stop = expected_stop(recs, 2)
    assert stop is not None and stop + 1 < full.total_blocks, "setting meant to stop early"
    logs = []
    t = Trainer(cfg(small_dataset, tmp_path / "e", **{"run.early_stop": 2}), log=logs.append)
    s = t.run()
    assert s["blocks"] == stop + 1 and s["stopped_early"]["after_block"] == stop
    got = [json.loads(line) for line in open(tmp_path / "e" / "metrics.jsonl")]
    assert [r["block"] for r in got] == list(range(stop + 1))
    assert [r["val_acc"] for r in got] == [r["val_acc"] for r in recs[:stop + 1]]
    assert any(m.startswith("early stop (run.early_stop): no val accuracy better than")
               for m in logs)
    # its z is that of a run told to train exactly stop + 1 blocks
    bpp = t.sched.blocks_per_pass
    short = Trainer(cfg(small_dataset, tmp_path / "s", **{"run.passes": (stop + 0.5) / bpp}),
                    log=lambda m: None)
    short.run()
    assert short.total_blocks == stop + 1 and short.z.tobytes() == t.z.tobytes()
    assert s["best"] == {**short.summary["best"], "file": s["best"]["file"]}

    # interrupted before the stop and resumed: the same stop, the same z
    monkeypatch.setenv("IBTMPI_FAULT", f"0:{stop - 1}:compute")
    with pytest.raises(InjectedFault):
        Trainer(cfg(small_dataset, tmp_path / "r", **{"run.early_stop": 2}),
                log=lambda m: None).run()
    monkeypatch.delenv("IBTMPI_FAULT")
    r = Trainer(cfg(small_dataset, tmp_path / "r", **{"run.early_stop": 2}),
                log=lambda m: None)
    assert r.run()["stopped_early"] == s["stopped_early"]
    assert r.z.tobytes() == t.z.tobytes()

    # run again when finished: nothing to train, the summary is kept
    before = open(tmp_path / "e" / "summary.json").read()
    logs = []
    again = Trainer(cfg(small_dataset, tmp_path / "e", **{"run.early_stop": 2}),
                    log=logs.append)
    again.run()
    assert any("stopped early after block" in m and "nothing to train" in m for m in logs)
    assert open(tmp_path / "e" / "summary.json").read() == before
    # ... and when the summary was lost (a crash after the last checkpoint),
    # the run is finished from its checkpoint without training
    os.remove(tmp_path / "e" / "summary.json")
    again = Trainer(cfg(small_dataset, tmp_path / "e", **{"run.early_stop": 2}),
                    log=lambda m: None)
    s2 = again.run()
    assert s2["stopped_early"] == s["stopped_early"] and s2["test_acc"] == s["test_acc"]
    assert again.z.tobytes() == t.z.tobytes()


def test_early_stop_delta_needs_a_real_gain_and_leaves_the_best_model_alone(
        small_dataset, tmp_path):
    # lr 0.05, 4 passes: val accuracy climbs slowly with small ups and downs
    slow = {"optim.lr": 0.05, "run.passes": 4}
    full = Trainer(cfg(small_dataset, tmp_path / "full", **slow), log=lambda m: None)
    full.run()
    recs = [json.loads(line) for line in open(tmp_path / "full" / "metrics.jsonl")]
    patience = 3

    def case(delta):
        """(stop, the best evaluation up to it) where the stop comes before
        the end, differs from delta = 0's, and the best is not the
        reference the delta rule kept: a gain below delta updated
        model-best.npz but did not reset the count"""
        stop, ref = expected_stop(recs, patience, delta, ref=True)
        if stop is None or stop + 1 >= full.total_blocks or stop == expected_stop(recs, patience):
            return None
        best = max(recs[:stop - 1], key=lambda r: (r["val_acc"], -r["val_loss"]))
        return (stop, best) if best["block"] != ref["block"] else None

    # accuracies are multiples of 1 / n: deltas between them, no ties
    n = len(Dataset(small_dataset).split("val").labels)
    found = [((k + 0.5) / n, case((k + 0.5) / n)) for k in range(8) if case((k + 0.5) / n)]
    assert found, f"no delta separates the rules on these accuracies: {[r['val_acc'] for r in recs]}"
    delta, (stop, best) = found[0]
    logs = []
    t = Trainer(cfg(small_dataset, tmp_path / "e", **slow, **{
        "run.early_stop": patience, "run.early_stop_delta": delta}), log=logs.append)
    s = t.run()
    assert s["stopped_early"]["after_block"] == stop and s["blocks"] == stop + 1
    assert any(f"+ {delta:g} (block" in m for m in logs)
    # model-best.npz follows every better evaluation, gains below delta too
    assert s["best"]["block"] == best["block"]
    loss, acc = reevaluate(tmp_path / "e" / BEST, small_dataset, "val")
    assert acc == best["val_acc"] and loss == pytest.approx(best["val_loss"], rel=1e-6)

    # nothing clears 0.99: the first evaluation stays the reference
    t = Trainer(cfg(small_dataset, tmp_path / "h", **slow, **{
        "run.early_stop": patience, "run.early_stop_delta": 0.99}), log=lambda m: None)
    assert t.run()["stopped_early"]["after_block"] == recs[patience]["block"] + 2


@pytest.mark.parametrize("sets, msg", [
    ({"run.early_stop": 2, "run.early_stop_delta": 1.0}, "must be in [0, 1)"),
    ({"run.early_stop": 2, "run.early_stop_delta": -0.1}, "must be in [0, 1)"),
    ({"run.early_stop_delta": 0.01}, "run.early_stop is 0"),
])
def test_early_stop_delta_errors(small_dataset, tmp_path, sets, msg):
    from ibtmpi.config import ConfigError
    with pytest.raises(ConfigError, match=re.escape(msg)):
        cfg(small_dataset, tmp_path, **sets)


def test_the_history_alone_decides_best_and_early_stop():
    """EvalHistory with no trainer: the best by val accuracy (ties: the
    lower loss); patience 2 counts the evaluations since the last better
    one, and the stop rides two blocks later."""
    from ibtmpi.train.evaluation import EvalHistory
    h = EvalHistory(patience=2)

    def ev(block, acc, loss):
        return h.observe({"block": block, "pass": 0, "val_acc": acc, "val_loss": loss})
    assert ev(0, 0.50, 1.0) and h.best["block"] == 0
    assert ev(1, 0.50, 0.9) and h.best["block"] == 1          # a tie, lower loss
    assert not ev(2, 0.40, 0.8) and h.early is None           # 1 without a better one
    assert not ev(3, 0.45, 0.7)
    assert h.early == (5, "no val accuracy better than 0.5000 (block 1) in 2 evaluations")
    assert h.best == {"block": 1, "pass": 0, "val_acc": 0.50, "val_loss": 0.9}
    d = EvalHistory(patience=1, delta=0.05)                   # small gains do not count
    d.observe({"block": 0, "pass": 0, "val_acc": 0.50, "val_loss": 1.0})
    assert d.observe({"block": 1, "pass": 0, "val_acc": 0.52, "val_loss": 1.0})  # a best
    assert d.early == (3, "no val accuracy above 0.5000 + 0.05 (block 0) in 1 evaluations")


def test_a_carried_evaluation_keeps_lines_and_manifests_in_block_order():
    """CarriedEvaluation with no trainer: lines and checkpoint manifests
    that come while an evaluation is in flight wait for its line."""
    from ibtmpi.train.evaluation import CarriedEvaluation
    said = []
    c = CarriedEvaluation(emit=lambda rec, out: said.append(("line", rec["block"], out)),
                          manifest=lambda k: said.append(("manifest", k)),
                          span=lambda t0, t1, k: said.append(("span", k)))
    c.line({"block": 0})                        # nothing in flight: at once
    out = {"acc": 0.9}
    c.start({"block": 1}, iter(range(2)), out)  # an evaluation of two batches
    c.line({"block": 2})
    c.confirm(2)
    assert said == [("line", 0, None)]
    assert c.work() and c.work()                # its batches, in the waits
    assert not c.work()                         # done: its line, then the rest
    assert said == [("line", 0, None), ("span", 1), ("span", 1), ("line", 1, out),
                    ("line", 2, None), ("manifest", 2)]
    c.confirm(3)                                # nothing in flight: at once
    assert said[-1] == ("manifest", 3) and c.cpu_s >= 0 and not c.work()
