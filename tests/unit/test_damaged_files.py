"""Damaged inputs are named, not trained on: a shard with a damaged heap or
damaged pixels (its file and row), shard checksums, model files and
checkpoints whose headers declare more than they hold, and a checkpoint
whose data is damaged (set aside; the previous one resumes).
(First found by trying the project from a fresh clone.)"""
import glob
import os

import pytest

from ibtmpi.cli import main
from conftest import train_args

# a damaged shard is an error naming its file (and row)
def _damaged(src, dst, where):
    """A copy of the dataset with one train shard damaged: 'heap' = 2 KiB of
    random bytes at offset 2048 (HDF5's metadata), 'pixels' = 64 random
    bytes in the middle of the image rows."""
    import shutil
    shutil.copytree(src, dst)
    shard = sorted(glob.glob(os.path.join(dst, "train-*.h5")))[-1]
    rng = __import__("numpy").random.default_rng(1)
    with open(shard, "r+b") as f:
        if where == "heap":
            f.seek(2048)
            f.write(rng.bytes(2048))
        else:
            f.seek(os.path.getsize(shard) // 2)
            f.write(rng.bytes(64))
    return str(dst), shard


@pytest.mark.parametrize("cache", ["disk", "memory"])
@pytest.mark.parametrize("where", ["heap", "pixels"])
def test_a_damaged_shard_is_named(small_dataset, tmp_path, capsys, where, cache):
    data, shard = _damaged(small_dataset, tmp_path / "d", where)
    rc = main(["train"] + train_args(data, tmp_path / "run", **{"data.cache": cache}))
    err = capsys.readouterr().err
    assert rc == 2, err
    assert shard in err and "damaged" in err and "Traceback" not in err, err
    if where == "pixels":
        assert "row " in err and "cannot be read" in err


def test_prep_inspect_names_a_file_with_a_damaged_heap(small_dataset, tmp_path, capsys):
    from ibtmpi.data_prep.cli import main as prep
    data, shard = _damaged(small_dataset, tmp_path / "d", "heap")
    assert prep(["inspect", data]) == 2
    err = capsys.readouterr().err
    assert shard in err and "Traceback" not in err, err


def test_shards_carry_checksums_and_old_ones_still_load(small_dataset, tmp_path):
    import h5py
    import numpy as np
    import shutil
    from ibtmpi.dataset import Dataset
    shard = sorted(glob.glob(os.path.join(small_dataset, "train-*.h5")))[0]
    with h5py.File(shard, "r") as f:
        assert f["images"].fletcher32 and f["labels"].fletcher32
    # an older data set: the same rows without checksums (contiguous labels)
    old = tmp_path / "old"
    shutil.copytree(small_dataset, old)
    for p in glob.glob(str(old / "*.h5")):
        with h5py.File(p, "r") as f:
            im, lb = f["images"][:], f["labels"][:]
            attrs = dict(f.attrs)
        with h5py.File(p, "w") as f:
            f.create_dataset("images", data=im, chunks=(1,) + im.shape[1:])
            f.create_dataset("labels", data=lb)
            f.attrs.update(attrs)
        with h5py.File(p, "r") as f:
            assert not f["images"].fletcher32
    a, b = Dataset(small_dataset).split("train"), Dataset(str(old)).split("train")
    idx = np.arange(a.n)[::-7]
    assert np.array_equal(a.read(idx), b.read(idx))
    assert np.array_equal(a.labels, b.labels)


# every array of a file we read is checked from its header first
def _forge(src, dst, name, shape=(2 ** 40,), dtype="<f8"):
    """A copy of the npz `src` whose member `name` declares `shape` (and
    holds 16 bytes): loading it would try to allocate 8 TiB."""
    import io
    import zipfile
    import numpy as np
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for item in zin.infolist():
            data = zin.read(item.filename)
            if item.filename == f"{name}.npy":
                buf = io.BytesIO()
                np.lib.format.write_array_header_1_0(
                    buf, {"descr": dtype, "fortran_order": False, "shape": shape})
                data = buf.getvalue() + b"\0" * 16
            zout.writestr(item, data)
    return str(dst)


@pytest.mark.parametrize("member", ["input_shape", "mean", "std", "format", "classes",
                                    "layers", "z"])
@pytest.mark.parametrize("command", ["evaluate", "predict", "export", "init"])
def test_a_model_file_declaring_a_huge_array_exits_2(trained, small_dataset, tmp_path,
                                                     capsys, member, command):
    import numpy as np
    from PIL import Image
    bad = _forge(trained, tmp_path / "bad.npz", member)
    img = tmp_path / "x.png"
    Image.fromarray(np.zeros((16, 16, 3), np.uint8)).save(img)
    argv = {"evaluate": ["evaluate", bad, "--data", small_dataset],
            "predict": ["predict", bad, str(img)],
            "export": ["export", bad, "--onnx", str(tmp_path / "m.onnx")],
            "init": ["train"] + train_args(small_dataset, tmp_path / "run",
                                           **{"model.init": bad})}[command]
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "bad.npz" in lines[0] and repr(member) in lines[0], err


def test_a_checkpoint_declaring_more_than_it_holds_is_refused(trained, tmp_path):
    from ibtmpi.checkpoint import CheckpointError, read_rank
    bad = _forge(trained, tmp_path / "ck.npz", "z", shape=(8359,), dtype="<f4")
    with pytest.raises(CheckpointError, match=r"declares float32\[8359\] but the file holds 144 bytes"):
        read_rank(bad, {"z": ((8359,), "float32")})


def test_a_checkpoint_with_damaged_data_is_set_aside(small_dataset, tmp_path, capsys):
    """A flipped bit in a checkpoint's array data (its header intact) fails
    the zip's CRC: the checkpoint is set aside as damaged and the one before
    it resumes, instead of a crash."""
    import zipfile
    from ibtmpi import checkpoint as ckpt
    run = tmp_path / "r"
    sets = train_args(small_dataset, run, passes=1, **{"run.checkpoint_every": 2})
    assert main(["train"] + sets) == 0
    done = ckpt.complete(str(run))
    f = os.path.join(ckpt.ckpt_dir(str(run), done[-1]), ckpt.rank_file(0))
    with zipfile.ZipFile(f) as zf:
        info = zf.getinfo("z.npy")
    with open(f, "r+b") as fh:
        fh.seek(info.header_offset + 30 + len(info.filename) + 128 + 8)
        b = fh.read(1)
        fh.seek(-1, 1)
        fh.write(bytes([b[0] ^ 0x10]))
    capsys.readouterr()
    assert main(["train"] + train_args(small_dataset, run, passes=2,
                                       **{"run.checkpoint_every": 2})) == 0
    out = capsys.readouterr().out
    assert "cannot be read" in out and "set aside as" in out, out
    assert f"resuming from {ckpt.ckpt_dir(str(run), done[-2])}" in out
