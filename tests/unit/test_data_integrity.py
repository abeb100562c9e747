"""Data the run reads is the data it validated: a shard that shrinks while
it is open is refused instead of read as zeros; rows that live outside the
shard (links, external raw files, virtual datasets) are refused; shards
without checksums are named at the start; and a resume refuses shards
that hold other images than the run started on, with dataset.json alone
unchanged."""
import os

import h5py
import numpy as np
import pytest

from ibtmpi.cli import main
from ibtmpi.dataset import Dataset, DatasetError
from conftest import copy_dataset, train_args


@pytest.fixture
def ds(small_dataset, tmp_path):
    return copy_dataset(small_dataset, tmp_path / "copy")


def shard(ds, k=1):
    return os.path.join(ds, f"train-{k:05d}-of-00003.h5")


def test_a_shard_truncated_while_open_is_an_error_not_zeros(ds):
    d = Dataset(ds)
    tr = d.split("train")
    lo, hi = int(tr.offsets[1]), int(tr.offsets[2])
    good = tr.read(np.arange(lo, hi))        # the file's index is now cached
    assert good[-10:].any()
    os.truncate(shard(ds), os.path.getsize(shard(ds)) // 2)
    with pytest.raises(DatasetError, match=r"train-00001-of-00003\.h5: the file changed "
                                           r"while the run read it .*truncated"):
        tr.read(np.arange(hi - 10, hi))
    with pytest.raises(DatasetError, match="changed while the run read it"):
        tr.read_all()
    d.close()


def test_a_shard_replaced_by_a_rename_keeps_reading_the_open_file(ds):
    d = Dataset(ds)
    tr = d.split("train")
    before = tr.read(np.arange(0, 20))
    tmp = shard(ds, 0) + ".new"
    with h5py.File(shard(ds, 0), "r", locking=False) as f, h5py.File(tmp, "w") as g:
        g.create_dataset("images", data=f["images"][:1])
        g.create_dataset("labels", data=f["labels"][:1])
    os.replace(tmp, shard(ds, 0))
    np.testing.assert_array_equal(tr.read(np.arange(0, 20)), before)
    d.close()


def _plant(path, key, how, target):
    """Rewrite `path` with `key` stored `how` (soft, external link, external
    raw file or virtual), pointing at `target`."""
    with h5py.File(path, "r") as f:
        im, lb = f["images"][:], f["labels"][:]
        attrs = dict(f.attrs)
    data = {"images": im, "labels": lb}
    with h5py.File(path, "w") as f:
        for k, v in attrs.items():
            f.attrs[k] = v
        for k, v in data.items():
            if k != key:
                f.create_dataset(k, data=v, fletcher32=True, chunks=True)
                continue
            if how == "soft":
                f.create_dataset("elsewhere", data=v)
                f[k] = h5py.SoftLink("/elsewhere")
            elif how == "extlink":
                with h5py.File(target, "w") as g:
                    g.create_dataset("rows", data=v)
                f[k] = h5py.ExternalLink(target, "/rows")
            elif how == "external":
                v.tofile(target)
                f.create_dataset(k, shape=v.shape, dtype=v.dtype,
                                 external=[(target, 0, v.nbytes)])
            elif how == "virtual":
                with h5py.File(target, "w") as g:
                    g.create_dataset("rows", data=v)
                layout = h5py.VirtualLayout(shape=v.shape, dtype=v.dtype)
                layout[:] = h5py.VirtualSource(target, "rows", shape=v.shape)
                f.create_virtual_dataset(k, layout)


@pytest.mark.parametrize("how,what", [("soft", "SoftLink"), ("extlink", "ExternalLink"),
                                      ("external", "external file"),
                                      ("virtual", "virtual dataset")])
def test_rows_stored_outside_the_shard_are_refused(ds, tmp_path, how, what):
    target = str(tmp_path / ("secret.bin" if how == "external" else "secret.h5"))
    _plant(shard(ds), "images", how, target)
    with h5py.File(shard(ds), "r") as f:          # h5py reads it as an ordinary array
        assert f["images"].shape[0] > 0
    with pytest.raises(DatasetError, match=rf"train-00001-of-00003\.h5: 'images' .*{what}"
                                           rf".*must hold its own rows"):
        Dataset(ds)


def test_labels_behind_an_external_link_are_refused(ds, tmp_path):
    _plant(shard(ds, 2), "labels", "extlink", str(tmp_path / "l.h5"))
    with pytest.raises(DatasetError, match="'labels' is a ExternalLink"):
        Dataset(ds)


def test_shards_without_checksums_are_listed_and_named_at_the_start(ds, tmp_path, capsys):
    assert Dataset(ds).unchecked == []
    with h5py.File(shard(ds), "r") as f:
        im, lb, attrs = f["images"][:], f["labels"][:], dict(f.attrs)
    with h5py.File(shard(ds), "w") as f:
        f.create_dataset("images", data=im)
        f.create_dataset("labels", data=lb)
        for k, v in attrs.items():
            f.attrs[k] = v
    assert Dataset(ds).unchecked == ["train-00001-of-00003.h5"]
    assert main(["train", "--simulate", "2"] + train_args(ds, tmp_path / "r")
                + ["--set", "run.quiet=false", "--set", "run.passes=0.2"]) == 0
    out = capsys.readouterr().out
    assert ("warning: train-00001-of-00003.h5 in " in out
            and "have no checksums: a damaged row would be read without an error" in out)


def test_content_digest_sees_a_replaced_shard_not_a_copied_directory(ds, tmp_path):
    a = Dataset(ds).content_digest()
    moved = copy_dataset(ds, tmp_path / "moved")
    os.utime(shard(moved), (1, 1))
    assert Dataset(moved).content_digest() == a          # a copy elsewhere, other times
    small = Dataset(ds).content_digest(budget=20)        # 4 rows a file: 0, 66, 133, 199
    with h5py.File(shard(ds), "r+") as f:
        f["images"][7] = 255 - f["images"][7]
    assert Dataset(ds).content_digest() != a             # every row of a small set
    assert Dataset(ds).content_digest(budget=20) == small     # a row between samples
    with h5py.File(shard(ds), "r+") as f:
        f["labels"][7] = (f["labels"][7] + 1) % 3
    assert Dataset(ds).content_digest(budget=20) != small     # labels: all of them


def test_resume_refuses_a_replaced_shard_with_the_same_dataset_json(ds, tmp_path, capsys):
    run = tmp_path / "r"
    args = ["train", "--simulate", "2"] + train_args(ds, run) + [
        "--set", "run.checkpoint_every=1"]
    assert main(args) == 0
    assert main(args + ["--set", "run.passes=2"]) == 0   # an unchanged set resumes
    capsys.readouterr()
    with h5py.File(shard(ds), "r+") as f:                # another image, same sizes
        f["images"][0] = 255 - f["images"][0]
    with open(os.path.join(ds, "dataset.json")) as f:
        meta = f.read()
    assert main(args + ["--set", "run.passes=3"]) == 2
    err = capsys.readouterr().err
    assert "was written for other data: the shards in" in err
    assert "hold other images or labels than when the run started" in err
    with open(os.path.join(ds, "dataset.json")) as f:
        assert f.read() == meta
