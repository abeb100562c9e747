"""Checkpoint/resume: a run interrupted after block k and resumed ends with
EXACTLY the same z as an uninterrupted run; foreign, incomplete and forged
checkpoints are refused with clear errors."""
import json
import os
import zipfile

import numpy as np
import pytest
from conftest import PARALLEL

from ibtmpi import checkpoint as ckpt
from ibtmpi.config import load
from ibtmpi.train import InjectedFault, Trainer
from ibtmpi.config import ADDED_KEYS

ALGOS = PARALLEL                  # every algorithm for N > 1 (the registry)


def cfg(path, run_dir, algo, **extra):
    sets = [f"data.path={path}", f"algorithm.name={algo}", "data.split_size=40",
            "data.batch=16", "model.layers=tiny", "run.passes=2", "run.quiet=true",
            f"run.dir={run_dir}", "run.simulate=3", "run.threads=1",
            "run.checkpoint_every=2", "data.augment=true"]
    return load(None, sets + [f"{k}={v}" for k, v in extra.items()])


def _interrupted(data, tmp_path, monkeypatch, algo):
    """The uninterrupted run in tmp_path/a (returned) and the same run in
    tmp_path/b stopped by a fault in block 5 (checkpoints 1 and 3 complete)."""
    ref = Trainer(cfg(data, tmp_path / "a", algo), log=lambda m: None)
    ref.run()
    monkeypatch.setenv("IBTMPI_FAULT", "0:5:compute")
    with pytest.raises(InjectedFault):
        Trainer(cfg(data, tmp_path / "b", algo), log=lambda m: None).run()
    monkeypatch.delenv("IBTMPI_FAULT")
    assert ckpt.complete(str(tmp_path / "b"))[-2:] == [1, 3]
    return ref


@pytest.mark.parametrize("algo", ALGOS)
def test_resume_is_bitwise_exact(small_dataset, tmp_path, monkeypatch, algo):
    ref = _interrupted(small_dataset, tmp_path, monkeypatch, algo)
    z_ref = ref.z.copy()
    logs = []
    t2 = Trainer(cfg(small_dataset, tmp_path / "b", algo), log=logs.append)
    t2.run()
    assert any("resuming from" in m for m in logs)
    assert t2.z.tobytes() == z_ref.tobytes()
    # metrics: one line per block, no duplicates from the first attempt
    lines = [json.loads(l) for l in open(tmp_path / "b" / "metrics.jsonl")]
    assert [l["block"] for l in lines] == list(range(ref.total_blocks))


def test_keep_last_m_and_incomplete_ignored(small_dataset, tmp_path):
    t = Trainer(cfg(small_dataset, tmp_path / "r", "admm",
                    **{"run.checkpoint_every": 1, "run.keep_checkpoints": 2}),
                log=lambda m: None)
    t.run()
    done = ckpt.complete(str(tmp_path / "r"))
    assert done == [t.total_blocks - 2, t.total_blocks - 1]
    # an incomplete newer directory (no manifest) is not used
    d = ckpt.ckpt_dir(str(tmp_path / "r"), 999)
    os.makedirs(d)
    assert ckpt.complete(str(tmp_path / "r"))[-1] == t.total_blocks - 1


def test_resume_with_other_config_or_worker_count_is_refused(small_dataset, tmp_path):
    Trainer(cfg(small_dataset, tmp_path / "r", "admm"), log=lambda m: None).run()
    # (algorithm.rho may change on a resume since hardening round 2; the
    # model may not)
    with pytest.raises(ckpt.CheckpointError, match="another configuration"):
        Trainer(cfg(small_dataset, tmp_path / "r", "admm", **{"model.layers": "softmax"}),
                log=lambda m: None).run()
    with pytest.raises(ckpt.CheckpointError, match="another worker count is not supported"):
        Trainer(cfg(small_dataset, tmp_path / "r", "admm", **{"run.simulate": 2}),
                log=lambda m: None).run()
    with pytest.raises(ckpt.CheckpointError, match="holds checkpoints"):
        Trainer(cfg(small_dataset, tmp_path / "r", "admm", **{"run.resume": "never"}),
                log=lambda m: None).run()
    with pytest.raises(ckpt.CheckpointError, match="no complete checkpoint"):
        Trainer(cfg(small_dataset, tmp_path / "empty", "admm", **{"run.resume": "always"}),
                log=lambda m: None).run()


def _forged_npz(path, name, shape):
    """An npz whose member header claims `shape` but holds 16 bytes."""
    import io
    buf = io.BytesIO()
    np.lib.format.write_array_header_2_0(
        buf, {"descr": "<f4", "fortran_order": False, "shape": shape})
    buf.write(b"\0" * 16)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{name}.npy", buf.getvalue())


def test_forged_huge_shape_is_refused_before_allocation(tmp_path):
    p = str(tmp_path / "rank-00000.npz")
    _forged_npz(p, "z", (10 ** 12,))
    with pytest.raises(ckpt.CheckpointError, match=r"'z' is float32\[1000000000000\]"):
        ckpt.read_rank(p, {"z": ((100,), np.float32)})


def test_manifest_path_escape_and_foreign_format_refused(tmp_path):
    d = ckpt.ckpt_dir(str(tmp_path), 3)
    os.makedirs(d)
    ckpt.write_manifest(str(tmp_path), 3, {"files": ["../../etc/passwd"]})
    with pytest.raises(ckpt.CheckpointError, match="plain name inside"):
        ckpt.read_manifest(str(tmp_path), 3)
    with open(os.path.join(d, "manifest.json"), "w") as f:
        json.dump({"format": "something-else"}, f)
    with pytest.raises(ckpt.CheckpointError, match="not an ibtmpi checkpoint"):
        ckpt.read_manifest(str(tmp_path), 3)


def test_no_pickle_in_checkpoints(tmp_path):
    p = str(tmp_path / "x.npz")
    np.savez(p, z=np.array([object()], dtype=object))
    with pytest.raises(ckpt.CheckpointError):
        ckpt.read_rank(p, {"z": ((1,), np.float32)})


def test_resume_follows_the_data_not_its_path(small_dataset, tmp_path, monkeypatch):
    """A copy of the dataset staged elsewhere (node-local scratch after a
    requeue) resumes; a regenerated dataset at the same path is refused."""
    import shutil
    ref = _interrupted(small_dataset, tmp_path, monkeypatch, "ibt")
    staged = tmp_path / "scratch" / "data"
    shutil.copytree(small_dataset, staged)
    c = cfg(small_dataset, tmp_path / "b", "ibt")
    c["data"]["path"] = str(staged)
    logs = []
    t = Trainer(c, log=logs.append)
    t.run()
    assert any("resuming from" in m for m in logs)
    assert t.z.tobytes() == ref.z.tobytes()
    meta = json.loads((staged / "dataset.json").read_text())
    meta["mean"][0] += 1.0                       # "regenerated": other statistics
    (staged / "dataset.json").write_text(json.dumps(meta))
    with pytest.raises(ckpt.CheckpointError, match="written for another dataset"):
        Trainer(c, log=lambda m: None).run()


@pytest.mark.parametrize("era", ["before-cuda-aware", "cuda-aware-hashed"])
def test_checkpoints_of_the_earlier_digest_still_resume(small_dataset, tmp_path, era):
    """Manifests written before data.path left the digest (and before the
    cuda_aware, progress_s, time_limit, profile, keep_best, early_stop, eval_device,
    master_device, model.init and learning-rate
    schedule keys existed) carry the legacy
    digest and no dataset entry; those between run.cuda_aware's arrival and
    its move out of the digest hashed it too (at "auto")."""
    import copy
    from ibtmpi.config import digest
    c = cfg(small_dataset, tmp_path / "r", "admm")
    Trainer(c, log=lambda m: None).run()
    old = copy.deepcopy(c)
    for key in ("passes", "quiet", "threads", "eval_every", "resume", "dir",
                "checkpoint_every", "keep_checkpoints", "simulate", "watchdog_s",
                "cuda_aware", "progress_s", "time_limit", "profile", "keep_best",
                "early_stop", "early_stop_delta", "timeline", "eval_device",
                "master_device", "gpu_math", "cuda_graphs", "tensorboard"):
        old["run"].pop(key)
    if era == "cuda-aware-hashed":
        old["run"]["cuda_aware"] = "auto"
    old["model"].pop("init")          # nor model.init
    old["algorithm"].pop("recipe")    # nor algorithm.recipe (never hashed)
    for sec, keys in ADDED_KEYS.items():   # nor the learning-rate schedule, optim.name,
        for key in keys:                     # algorithm.outer and outer_schedule
            old[sec].pop(key)
    for k in ckpt.complete(str(tmp_path / "r")):
        p = os.path.join(ckpt.ckpt_dir(str(tmp_path / "r"), k), "manifest.json")
        m = json.load(open(p))
        m["config_hash"] = digest(old)
        del m["dataset"]
        json.dump(m, open(p, "w"))
    c2 = cfg(small_dataset, tmp_path / "r", "admm", **{"run.passes": 3})
    logs = []
    Trainer(c2, log=logs.append).run()
    assert any("resuming from" in m for m in logs)


def test_a_damaged_newest_checkpoint_falls_back_to_the_previous(small_dataset, tmp_path,
                                                                 monkeypatch):
    ref = _interrupted(small_dataset, tmp_path, monkeypatch, "ibt")
    run = str(tmp_path / "b")
    with open(os.path.join(ckpt.ckpt_dir(run, 3), ckpt.rank_file(0)), "r+b") as f:
        f.truncate(100)                              # storage damage
    logs = []
    t = Trainer(cfg(small_dataset, tmp_path / "b", "ibt"), log=logs.append)
    t.run()
    assert any("cannot be read" in m and "set aside" in m for m in logs)
    assert any("resuming from" in m and "ckpt-00000001" in m for m in logs)
    assert os.path.isdir(os.path.join(run, "checkpoints", "damaged-ckpt-00000003"))
    assert t.z.tobytes() == ref.z.tobytes()
    lines = [json.loads(l) for l in open(tmp_path / "b" / "metrics.jsonl")]
    assert [l["block"] for l in lines] == list(range(ref.total_blocks))


def test_a_rank_file_from_another_run_or_block_is_set_aside(small_dataset, tmp_path,
                                                           monkeypatch):
    """The manifest names the run; every rank file carries it with its
    block: a file copied in (same shapes, a valid zip) is refused as
    foreign, set aside, and the previous checkpoint resumes exactly."""
    import shutil
    ref = _interrupted(small_dataset, tmp_path, monkeypatch, "ibt")
    run = str(tmp_path / "b")
    Trainer(cfg(small_dataset, tmp_path / "c", "ibt",
                **{"run.passes": 1.2}), log=lambda m: None).run()    # another run
    other = ckpt.ckpt_dir(str(tmp_path / "c"), 3)
    shutil.copy(os.path.join(other, ckpt.rank_file(0)),
                os.path.join(ckpt.ckpt_dir(run, 3), ckpt.rank_file(0)))
    logs = []
    t = Trainer(cfg(small_dataset, tmp_path / "b", "ibt"), log=logs.append)
    t.run()
    assert any("belongs to another checkpoint" in m and "copied in from another run" in m
               and "set aside" in m for m in logs), logs
    assert any("resuming from" in m and "ckpt-00000001" in m for m in logs)
    assert t.z.tobytes() == ref.z.tobytes()
    # the same run's file of an earlier block is foreign to a later one too
    run2 = str(tmp_path / "b2")
    _ = Trainer(cfg(small_dataset, run2, "ibt", **{"run.checkpoint_every": 1}),
                log=lambda m: None).run()
    k1, k2 = ckpt.complete(run2)[-2:]
    shutil.copy(os.path.join(ckpt.ckpt_dir(run2, k1), ckpt.rank_file(0)),
                os.path.join(ckpt.ckpt_dir(run2, k2), ckpt.rank_file(0)))
    logs = []
    Trainer(cfg(small_dataset, run2, "ibt", **{"run.passes": 3, "run.checkpoint_every": 1}),
            log=logs.append).run()
    assert any(f"/{k1}'" in m and f"/{k2}'" in m and "set aside" in m for m in logs), logs


def test_a_damaged_manifest_falls_back_to_the_previous(small_dataset, tmp_path, monkeypatch):
    ref = _interrupted(small_dataset, tmp_path, monkeypatch, "ibt")
    run = str(tmp_path / "b")
    with open(os.path.join(ckpt.ckpt_dir(run, 3), "manifest.json"), "r+b") as f:
        f.truncate(40)                               # storage damage
    logs = []
    t = Trainer(cfg(small_dataset, tmp_path / "b", "ibt"), log=logs.append)
    t.run()
    assert any("manifest.json: cannot be read" in m and "set aside" in m for m in logs), logs
    assert any("resuming from" in m and "ckpt-00000001" in m for m in logs)
    assert t.z.tobytes() == ref.z.tobytes()


def test_a_manifest_of_another_version_says_so(tmp_path):
    d = ckpt.ckpt_dir(str(tmp_path), 3)
    os.makedirs(d)
    with open(os.path.join(d, "manifest.json"), "w") as f:
        json.dump({"format": ckpt.FORMAT, "version": 0}, f)
    with pytest.raises(ckpt.CheckpointError, match="manifest version 0; this ibtmpi reads "
                                                   "version 1") as e:
        ckpt.read_manifest(str(tmp_path), 3)
    assert not isinstance(e.value, ckpt.DamagedCheckpoint)     # refused, not set aside


def test_a_failed_write_leaves_no_partial_file_and_names_the_file(tmp_path, monkeypatch):
    import errno
    import numpy as np

    def full(f, **arrays):
        f.write(b"x" * 1000)
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(np, "savez", full)
    with pytest.raises(OSError) as e:
        ckpt.write_rank(str(tmp_path), 3, 1, {"a": np.zeros(3)})
    assert e.value.errno == errno.ENOSPC
    assert e.value.filename.endswith("ckpt-00000003/rank-00001.npz")
    assert os.listdir(ckpt.ckpt_dir(str(tmp_path), 3)) == []


def test_checkpoint_writes_alone_join_settle_and_name_a_failed_block(tmp_path):
    """CheckpointWrites with no trainer: a file written in the background,
    joined (its time kept for the watchdog and the time limit), settled by
    the flags; a failed write is raised at the join as its own block's."""
    from ibtmpi.train.lifecycle import RunControl
    from ibtmpi.train.state import CheckpointWrites
    ctl = RunControl(0, time_limit="2h")
    w = CheckpointWrites(str(tmp_path), 0, ctl)
    w.start(3, {"z": np.arange(4, dtype=np.float32)})
    w.join()
    assert w.pending == 3 and w.max_s > 0 and ctl.deadline.ckpt_s == w.max_s
    assert os.path.exists(os.path.join(ckpt.ckpt_dir(str(tmp_path), 3), ckpt.rank_file(0)))
    assert w.settle(every_rank_wrote=False) is None and w.pending is None
    w.start(4, {"z": np.zeros(2, np.float32)})
    assert w.settle(every_rank_wrote=True) == 4
    w.join()
    blocked = tmp_path / "file"                   # a file where the directory must go
    blocked.write_text("")
    bad = CheckpointWrites(str(blocked), 0, ctl)
    ctl.at("compute", 9)
    bad.start(5, {"z": np.zeros(2, np.float32)})
    with pytest.raises(OSError):
        bad.join()
    assert (ctl.block, ctl.phase) == (5, "checkpoint")
