"""Dataset validation: one test per error, each checking the message names
the offending file; plus reads against the written data."""
import json
import os
import shutil

import h5py
import numpy as np
import pytest

from ibtmpi.dataset import Dataset, DatasetError


@pytest.fixture
def ds(small_dataset, tmp_path):
    dst = tmp_path / "copy"
    shutil.copytree(small_dataset, dst)
    return str(dst)


def shard(ds, k=1):
    return os.path.join(ds, f"train-{k:05d}-of-00003.h5")


def rewrite(path, images=None, labels=None, drop=None, attrs=None):
    with h5py.File(path, "r") as f:
        im, lb = f["images"][:], f["labels"][:]
        at = dict(f.attrs)
    im = im if images is None else images(im)
    lb = lb if labels is None else labels(lb)
    with h5py.File(path, "w") as f:
        if drop != "images":
            f.create_dataset("images", data=im)
        if drop != "labels":
            f.create_dataset("labels", data=lb)
        for k, v in {**at, **(attrs or {})}.items():
            f.attrs[k] = v


def test_valid_dataset_reads_back(small_dataset):
    d = Dataset(small_dataset)
    tr = d.split("train")
    assert tr.n == sum(tr.counts) == d.meta["splits"]["train"]["n"]
    idx = np.array([5, 0, tr.n - 1, 1, 2, 300])
    rows = tr.read(idx)
    allrows = tr.read_all()
    np.testing.assert_array_equal(rows, allrows[idx])
    assert rows.shape == (6, 16, 16, 3)
    d.close()


def test_missing_directory(tmp_path):
    with pytest.raises(DatasetError, match="does not exist.*ibtmpi prep synth"):
        Dataset(tmp_path / "nope")


def test_missing_dataset_json(ds):
    os.remove(os.path.join(ds, "dataset.json"))
    with pytest.raises(DatasetError, match=r"dataset\.json is missing"):
        Dataset(ds)


def test_missing_shard_file(ds):
    os.remove(shard(ds, 2))
    with pytest.raises(DatasetError, match=r"train-00002-of-00003\.h5 is missing"):
        Dataset(ds)


def test_truncated_hdf5(ds):
    p = shard(ds, 1)
    size = os.path.getsize(p)
    with open(p, "r+b") as f:
        f.truncate(size // 2)
    with pytest.raises(DatasetError, match=r"train-00001-of-00003\.h5: .*(truncated|corrupt)"):
        Dataset(ds)


def test_garbage_file(ds):
    with open(shard(ds, 0), "wb") as f:
        f.write(b"this is not hdf5" * 100)
    with pytest.raises(DatasetError, match=r"train-00000-of-00003\.h5: cannot be read as HDF5"):
        Dataset(ds)


def test_images_missing(ds):
    rewrite(shard(ds), drop="images")
    with pytest.raises(DatasetError, match=r"train-00001-of-00003\.h5: dataset 'images' missing"):
        Dataset(ds)


def test_labels_missing(ds):
    rewrite(shard(ds), drop="labels")
    with pytest.raises(DatasetError, match=r"train-00001-of-00003\.h5: dataset 'labels' missing"):
        Dataset(ds)


def test_shape_mismatch_between_shards(ds):
    rewrite(shard(ds, 2), images=lambda im: np.zeros((len(im), 8, 8, 3), np.uint8))
    with pytest.raises(DatasetError, match=r"train-00002-of-00003\.h5: images are \(8, 8, 3\).*shape mismatch"):
        Dataset(ds)


def test_stored_dtype_is_dataset_jsons(ds):
    """A shard of another pixel type than dataset.json's dtype (uint8 when
    absent) is refused naming the file; a dtype this ibtmpi does not read
    too; a uint16 set (every shard uint16, "dtype": "uint16") reads back
    as uint16."""
    rewrite(shard(ds, 2), images=lambda im: im.astype(np.uint16))
    with pytest.raises(DatasetError, match=r"train-00002-of-00003\.h5: 'images' must be uint8"
                                           r".*found uint16"):
        Dataset(ds)
    p = os.path.join(ds, "dataset.json")
    meta = json.load(open(p))
    json.dump({**meta, "dtype": "float32"}, open(p, "w"))
    with pytest.raises(DatasetError, match="dtype 'float32' is not one this ibtmpi reads"):
        Dataset(ds)
    json.dump({**meta, "dtype": "uint16"}, open(p, "w"))
    with pytest.raises(DatasetError, match=r"'images' must be uint16.*found uint8"):
        Dataset(ds)
    want = {}
    for f in meta["splits"]["train"]["files"] + ["val.h5", "test.h5"]:
        with h5py.File(os.path.join(ds, f)) as h:
            want[f] = h["images"][:].astype(np.uint16) * 257          # 0..65535
        rewrite(os.path.join(ds, f), images=lambda im, f=f: want[f])
    d = Dataset(ds)
    assert d.dtype == np.uint16
    rows = d.split("train").read([3, 0])
    assert rows.dtype == np.uint16 and rows.max() > 255
    np.testing.assert_array_equal(rows, np.concatenate(
        [want[f] for f in meta["splits"]["train"]["files"]])[[3, 0]])


def test_label_out_of_range(ds):
    def bad(lb):
        lb = lb.copy()
        lb[7] = 9
        return lb
    rewrite(shard(ds), labels=bad)
    with pytest.raises(DatasetError, match=r"train-00001-of-00003\.h5: label 9 at row 7 is out of range"):
        Dataset(ds)


def test_class_mismatch(ds):
    rewrite(os.path.join(ds, "val.h5"), attrs={"classes": json.dumps(["a", "b", "c", "d", "e"])})
    with pytest.raises(DatasetError, match=r"val\.h5: classes .* differ"):
        Dataset(ds)


def test_count_disagrees_with_json(ds):
    rewrite(shard(ds), images=lambda im: im[:-3], labels=lambda lb: lb[:-3])
    with pytest.raises(DatasetError, match=r"train-00001-of-00003\.h5: holds \d+ images, dataset\.json says"):
        Dataset(ds)


def test_empty_shard(ds):
    rewrite(shard(ds), images=lambda im: im[:0], labels=lambda lb: lb[:0])
    with pytest.raises(DatasetError, match=r"train-00001-of-00003\.h5: empty file"):
        Dataset(ds)


def test_path_escape_in_json_refused(ds):
    p = os.path.join(ds, "dataset.json")
    meta = json.load(open(p))
    meta["splits"]["val"]["files"] = ["../val.h5"]
    json.dump(meta, open(p, "w"))
    with pytest.raises(DatasetError, match="plain name inside"):
        Dataset(ds)


def test_absurd_image_shape_refused_before_allocation(ds):
    p = os.path.join(ds, "dataset.json")
    meta = json.load(open(p))
    meta["image_shape"] = [100000, 100000, 3]
    json.dump(meta, open(p, "w"))
    with pytest.raises(DatasetError, match="bad image_shape"):
        Dataset(ds)


def test_shards_are_read_without_hdf5_file_locking(small_dataset):
    """Parallel file systems without flock support make a locking open fail
    ("unable to lock file"); readers never need the lock."""
    sp = Dataset(small_dataset).split("train")
    sp.read_all()
    for f in sp._open():
        assert f.id.get_access_plist().get_file_locking()[0] == 0
    sp.close()
