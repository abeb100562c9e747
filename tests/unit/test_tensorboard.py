"""run.tensorboard: the master's metrics as TensorBoard event files, read
back here without TensorBoard (the TFRecord framing and tensorboardX's own
Event proto): every block's figures, with the block as the step, equal to
metrics.jsonl's; a resumed run continues the curves."""
import glob
import json
import struct

import pytest

from ibtmpi.cli import main
from conftest import train_args

pytest.importorskip("tensorboardX")


def read_scalars(run):
    """{tag: {step: value}} from every event file under RUN/tb."""
    from tensorboardX.proto import event_pb2
    out = {}
    for path in sorted(glob.glob(str(run / "tb" / "events.out.tfevents.*"))):
        data = open(path, "rb").read()
        i = 0
        while i < len(data):
            (n,) = struct.unpack("<Q", data[i:i + 8])
            ev = event_pb2.Event.FromString(data[i + 12:i + 12 + n])
            i += 12 + n + 4                      # length, its crc, data, its crc
            for v in ev.summary.value:
                out.setdefault(v.tag, {})[ev.step] = v.simple_value
    return out


def test_event_files_hold_the_metrics_of_every_block(small_dataset, tmp_path):
    run = tmp_path / "r"
    args = ["train", "--simulate", "2"] + train_args(small_dataset, run) + [
        "--set", "run.tensorboard=true", "--set", "run.eval_every=2",
        "--set", "run.checkpoint_every=2"]
    assert main(args) == 0
    assert main(args + ["--set", "run.passes=2"]) == 0          # resumed
    recs = [json.loads(x) for x in open(run / "metrics.jsonl")]
    got = read_scalars(run)
    assert sorted(got["loss/train"]) == [r["block"] for r in recs]
    for r in recs:
        assert got["loss/train"][r["block"]] == pytest.approx(r["train_loss"], rel=1e-6)
        assert got["optim/lr"][r["block"]] == pytest.approx(r["lr"], rel=1e-6)
        if "val_acc" in r:
            assert got["accuracy/val"][r["block"]] == pytest.approx(r["val_acc"], rel=1e-6)
    assert len(got["accuracy/val"]) == sum("val_acc" in r for r in recs) > 0
    assert {"consensus/rho", "consensus/primal_residual", "time/block_wall_s"} <= set(got)


def test_without_tensorboardx_it_is_one_line(small_dataset, tmp_path, capsys, monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "tensorboardX", None)
    assert main(["train", "--simulate", "2"] + train_args(small_dataset, tmp_path / "r")
                + ["--set", "run.tensorboard=true"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["ibtmpi train: error: run.tensorboard needs the tensorboardX package: "
                   "pip install 'ibtmpi[tensorboard]' (or tensorboardX)"], err
