"""run.resume = reshape: a run continues on another worker count. What is
per model carries exactly (z, the outer optimizer's start point and
momentum, BatchNorm's statistics; ssgd's model and optimizer state), what
is per worker starts at zero (duals and their sum, local momentum), the
learning-rate schedule goes on from the same pass, and one line says so;
under `auto` the refusal names the way. Under mpiexec 2 -> 3 workers and
across --simulate counts."""
import json
import os
import subprocess

import numpy as np
import pytest

from ibtmpi import checkpoint as ckpt
from ibtmpi.cli import main
from ibtmpi.config import load
from ibtmpi.train import Trainer
from conftest import IBTMPI, MPIEXEC, mpiexec, train_args


def _cfg(data, run, n, algo="ibt", passes=1, **extra):
    sets = [f"data.path={data}", f"algorithm.name={algo}", "data.split_size=40",
            "data.batch=16", "model.layers=tiny", f"run.passes={passes}", "run.quiet=true",
            f"run.dir={run}", f"run.simulate={n}", "run.threads=1",
            "optim.schedule=cosine", "optim.decay_passes=2", "run.checkpoint_every=2"]
    return load(None, sets + [f"{k}={v}" for k, v in extra.items()])


@pytest.mark.parametrize("algo", ["ibt", "admm", "bmuf", "ssgd"])
def test_what_is_per_model_carries_and_what_is_per_worker_starts_at_zero(
        small_dataset, tmp_path, algo):
    run = tmp_path / "r"
    Trainer(_cfg(small_dataset, run, 2, algo), log=lambda m: None).run()
    k = ckpt.complete(str(run))[-1]
    saved = dict(np.load(os.path.join(ckpt.ckpt_dir(str(run), k), ckpt.rank_file(0))))
    logs = []
    t = Trainer(_cfg(small_dataset, run, 3, algo, passes=2, **{"run.resume": "reshape"}),
                log=logs.append)
    t._placement = lambda: [("h", 0, 1, "cpu", ())]
    start = t.ckpt.restore()
    assert start == round(1.0 * t.sched.blocks_per_pass)           # the same pass
    line = [m for m in logs if m.startswith("continuing ")]
    assert line and f"of 2 worker(s) in 1 process(es) with 3 worker(s)" in line[0]
    if algo == "ssgd":
        assert t.z.tobytes() == saved["params"].tobytes()
        assert "nothing is per worker" in line[0]
        return
    assert t.cons.z.tobytes() == saved["z"].tobytes()
    for name, arr in t.cons.state_vectors():
        if name == "U":
            assert not arr.any()                      # the duals' sum starts afresh
        else:
            assert arr.tobytes() == saved[name].tobytes(), name
    for i in t.local:
        u = getattr(t.blocks.states[i], "u", None)
        assert u is None or not u.any()
        assert all(not np.asarray(v).any() for v in t.workers.opt_states[i].values())
    assert "each worker's dual and local optimizer state start at zero" in line[0]


def test_the_schedule_goes_on_from_the_same_pass(small_dataset, tmp_path):
    run, ref = tmp_path / "r", tmp_path / "ref"
    Trainer(_cfg(small_dataset, run, 2), log=lambda m: None).run()
    t = Trainer(_cfg(small_dataset, run, 3, passes=2, **{"run.resume": "reshape"}),
                log=lambda m: None)
    t.run()
    Trainer(_cfg(small_dataset, ref, 3, passes=2), log=lambda m: None).run()
    lines = [json.loads(x) for x in open(run / "metrics.jsonl")]
    refl = {r["block"]: r for r in (json.loads(x) for x in open(ref / "metrics.jsonl"))}
    new = [r for r in lines if r["N"] == 3]
    assert [r["block"] for r in new] == list(range(t.start, t.total_blocks))
    for r in new:                         # lr by the block of this count's schedule
        assert r["lr"] == refl[r["block"]]["lr"]
    assert new[0]["config_changed"] == "reshaped from 2 to 3 worker(s) at pass 1"
    assert [r["N"] for r in lines[:len(lines) - len(new)]] == [2] * (len(lines) - len(new))
    s = json.load(open(run / "summary.json"))
    assert s["N"] == 3 and s["passes"] == 2 and s["resumed_at_block"] == t.start
    m = ckpt.read_manifest(str(run), ckpt.complete(str(run))[-1])
    assert m["n_workers"] == 3 and any("reshaped" in c["changes"] for c in m["changed"])


def test_auto_refuses_another_count_and_names_reshape(small_dataset, tmp_path, capsys):
    run = tmp_path / "r"
    assert main(["train", "--simulate", "2"] + train_args(small_dataset, run)) == 0
    capsys.readouterr()
    assert main(["train", "--simulate", "3"] + train_args(small_dataset, run)
                + ["--set", "run.passes=2"]) == 2
    err = capsys.readouterr().err
    assert ("continue with this count and fresh duals (--set run.resume=reshape)" in err), err


@pytest.mark.skipif(not os.path.exists(MPIEXEC), reason="no mpiexec in the venv")
def test_under_mpiexec_2_workers_continue_as_3(small_dataset, tmp_path):
    run = tmp_path / "r"
    r = subprocess.run(mpiexec(3) + IBTMPI + ["train"] + train_args(small_dataset, run),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    r = subprocess.run(mpiexec(4) + IBTMPI + ["train"] + train_args(
        small_dataset, run, passes=2, **{"run.resume": "reshape", "run.quiet": "false"}),
        capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "of 2 worker(s) in 3 process(es) with 3 worker(s) (run.resume = reshape)" \
        in r.stdout, r.stdout
    s = json.load(open(run / "summary.json"))
    assert s["N"] == 3 and s["world_size"] == 4 and s["passes"] == 2
