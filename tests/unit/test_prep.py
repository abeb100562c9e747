"""prep synth / folder / inspect: atomic writes, layout, folder import of
real PNG and JPEG files including grayscale, RGBA and a corrupt file."""
import json
import os

import numpy as np
import pytest
from PIL import Image

from ibtmpi.data_prep import synth
from ibtmpi.data_prep.cli import main as prep_main
from ibtmpi.data_prep.prep import prep_synth
from ibtmpi.dataset import Dataset


def test_synth_layout_and_determinism(tmp_path):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    prep_synth(a, n=300, size=16, seed=9, shards=2, quiet=True)
    prep_synth(b, n=300, size=16, seed=9, shards=2, quiet=True)
    assert sorted(os.listdir(a)) == ["dataset.json", "test.h5",
                                     "train-00000-of-00002.h5",
                                     "train-00001-of-00002.h5", "val.h5"]
    da, db = Dataset(a), Dataset(b)
    for s in ("train", "val", "test"):
        assert np.array_equal(da.split(s).read_all(), db.split(s).read_all())
        assert np.array_equal(da.split(s).labels, db.split(s).labels)
    meta = da.meta
    assert meta["splits"]["train"]["n"] == 240
    assert meta["splits"]["val"]["class_counts"] == [6] * 5
    assert meta["seed"] == 9 and meta["classes"] == list(synth.CLASSES)
    # the images are exactly the generator's, routed to their splits
    imgs, labels = synth.generate(300, 16, seed=9)
    allrows = np.concatenate([da.split(s).read_all() for s in ("train", "val", "test")])
    assert sorted(map(bytes, allrows)) == sorted(map(bytes, imgs))
    # mean/std are the train split's
    tr = da.split("train").read_all().reshape(-1, 3).astype(np.float64)
    np.testing.assert_allclose(da.mean, tr.mean(0), atol=1e-4)


def test_refuses_to_overwrite_and_leaves_no_partial(tmp_path, capsys):
    out = str(tmp_path / "d")
    assert prep_main(["synth", out, "--n", "100", "--size", "8", "--quiet"]) == 0
    before = open(os.path.join(out, "dataset.json")).read()
    rc = prep_main(["synth", out, "--n", "100", "--size", "8", "--quiet"])
    assert rc == 2 and "already exists" in capsys.readouterr().err
    assert open(os.path.join(out, "dataset.json")).read() == before
    assert prep_main(["synth", out, "--n", "120", "--size", "8", "--quiet",
                      "--overwrite"]) == 0
    assert Dataset(out).meta["splits"]["train"]["n"] == 100   # 24/class: 2 val, 2 test
    assert [d for d in os.listdir(tmp_path) if "partial" in d] == []


def test_failed_write_leaves_nothing(tmp_path, monkeypatch):
    out = tmp_path / "d"
    import ibtmpi.data_prep.prep as prep

    def boom(*a, **k):
        raise RuntimeError("disk on fire")
    monkeypatch.setattr(prep.synth, "make_chunk", boom)
    with pytest.raises(RuntimeError):
        prep.prep_synth(str(out), n=100, size=8, quiet=True)
    assert not out.exists()
    assert os.listdir(tmp_path) == []


def test_bad_options_exit_2(tmp_path, capsys):
    assert prep_main(["synth", str(tmp_path / "x"), "--split", "0.5,0.1"]) == 2
    assert "--split" in capsys.readouterr().err
    assert prep_main(["synth", str(tmp_path / "x"), "--classes", "forest"]) == 2
    assert "unknown class 'forest'" in capsys.readouterr().err
    assert prep_main(["synth", str(tmp_path / "x"), "--n", "50", "--shards", "100"]) == 2


def make_tree(root):
    rng = np.random.default_rng(0)
    for cls, colour in [("Forest", (20, 120, 30)), ("River", (20, 40, 160)),
                        ("Highway", (90, 90, 90)), ("Pasture", (100, 160, 60))]:
        d = root / cls
        d.mkdir(parents=True)
        for i in range(6):
            arr = np.clip(np.array(colour) + rng.integers(-20, 20, (20, 24, 3)), 0, 255).astype(np.uint8)
            if i % 2:
                Image.fromarray(arr).save(d / f"{i}.png")
            else:
                Image.fromarray(arr).save(d / f"{i}.jpg", quality=90)
    Image.fromarray(np.full((30, 30), 77, np.uint8), "L").save(root / "Forest" / "grey.png")
    rgba = np.zeros((16, 16, 4), np.uint8)
    rgba[..., 0] = 200
    rgba[..., 3] = 255
    Image.fromarray(rgba, "RGBA").save(root / "River" / "alpha.png")
    (root / "Highway" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    (root / "Highway" / "notes.txt").write_text("ignored")


def test_folder_import(tmp_path, capsys):
    root = tmp_path / "tree"
    make_tree(root)
    out = str(tmp_path / "ds")
    rc = prep_main(["folder", str(root), out, "--size", "12", "--split",
                    "0.5,0.25,0.25", "--quiet"])
    text = capsys.readouterr().out
    assert rc == 0
    assert "skipped 1 unreadable file(s)" in text and "broken.jpg" in text
    d = Dataset(out)
    assert d.classes == ["Forest", "Highway", "Pasture", "River"]
    assert d.image_shape == (12, 12, 3)
    total = sum(sp.n for sp in d.splits.values())
    assert total == 6 * 4 + 2            # + grey + rgba, - broken
    rows = np.concatenate([d.split(s).read_all() for s in d.splits])
    labels = np.concatenate([d.split(s).labels for s in d.splits])
    grey = rows[(rows[..., 0] == rows[..., 1]) & (rows[..., 1] == rows[..., 2])
                ].reshape(-1, 3)
    assert (grey == 77).all(axis=1).any()              # grayscale -> RGB
    forest = rows[labels == 0].reshape(-1, 3).mean(0)
    assert forest[1] > forest[0] and forest[1] > forest[2]


def test_folder_strict_and_class_map(tmp_path, capsys):
    root = tmp_path / "tree"
    make_tree(root)
    rc = prep_main(["folder", str(root), str(tmp_path / "s"), "--strict", "--quiet"])
    assert rc == 2 and "broken.jpg" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()
    cmap = tmp_path / "map.json"
    cmap.write_text(json.dumps({"Forest": "green_area", "Pasture": "green_area",
                                "River": "lake", "Highway": ""}))
    out = str(tmp_path / "m")
    assert prep_main(["folder", str(root), out, "--class-map", str(cmap),
                      "--size", "8", "--quiet"]) == 0
    d = Dataset(out)
    assert d.classes == ["green_area", "lake"]
    assert sum(sp.n for sp in d.splits.values()) == 6 + 6 + 1 + 7


def test_inspect(small_dataset, capsys):
    assert prep_main(["inspect", small_dataset]) == 0
    out = capsys.readouterr().out
    assert "OK" in out and "train: 480 images in 3 file(s)" in out
    assert prep_main(["inspect", small_dataset + "-missing"]) == 2


def test_missing_parent_directories_are_created(tmp_path):
    out = tmp_path / "a" / "b" / "ds"
    assert prep_main(["synth", str(out), "--n", "60", "--size", "8", "--quiet"]) == 0
    assert (out / "dataset.json").exists()


@pytest.mark.parametrize("where", ["_create", "write"])
def test_full_disk_is_one_line_exit_74_and_leaves_nothing(tmp_path, monkeypatch, capsys, where):
    """ENOSPC while the shards are created (in the writer's constructor) or
    filled: exit 74, one line, and no partial directory left behind."""
    import errno
    from ibtmpi.data_prep import writer

    def full(self, *a, **k):
        raise OSError(errno.ENOSPC, "No space left on device",
                      os.path.join(self.tmp, "val.h5"))
    monkeypatch.setattr(writer.DatasetWriter, where, full)
    out = tmp_path / "d"
    rc = prep_main(["synth", str(out), "--n", "100", "--size", "8", "--quiet"])
    err = capsys.readouterr().err
    assert rc == 74, err
    assert err.startswith("ibtmpi-prep synth: error: cannot write ") and \
        "No space left on device; free space" in err, err
    assert len(err.strip().splitlines()) == 1
    assert os.listdir(tmp_path) == []


def test_folder_with_a_class_without_images_is_refused(tmp_path, capsys):
    root = tmp_path / "tree"
    make_tree(root)
    (root / "Empty").mkdir()
    (root / "Empty" / "readme.txt").write_text("no images here")
    rc = prep_main(["folder", str(root), str(tmp_path / "ds"), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and "['Empty'] have no readable images" in err
    assert not (tmp_path / "ds").exists()


def test_folder_order_does_not_depend_on_the_listing(tmp_path, monkeypatch):
    """Nested folders are walked in sorted order, whatever os.walk's
    listing order is: the same tree gives the same bytes."""
    root = tmp_path / "tree"
    make_tree(root)
    for sub in ("b", "a", "c"):
        d = root / "River" / sub
        d.mkdir()
        for i in range(3):
            Image.fromarray(np.full((8, 8, 3), 10 * i + ord(sub), np.uint8)).save(d / f"{i}.png")
    assert prep_main(["folder", str(root), str(tmp_path / "one"), "--size", "8",
                      "--quiet"]) == 0
    real_walk = os.walk

    def reversed_walk(top, *a, **k):
        for dirpath, dirs, files in real_walk(top, *a, **k):
            dirs.reverse()
            yield dirpath, dirs, files[::-1]
    monkeypatch.setattr(os, "walk", reversed_walk)
    assert prep_main(["folder", str(root), str(tmp_path / "two"), "--size", "8",
                      "--quiet"]) == 0
    a, b = Dataset(str(tmp_path / "one")), Dataset(str(tmp_path / "two"))
    for s in a.splits:
        assert a.split(s).read_all().tobytes() == b.split(s).read_all().tobytes()
        assert np.array_equal(a.split(s).labels, b.split(s).labels)
