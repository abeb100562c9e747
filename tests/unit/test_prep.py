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
    rc = prep_main(["folder", str(root), str(tmp_path / "s"), "--strict", "--size", "16", "--quiet"])
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
    rc = prep_main(["folder", str(root), str(tmp_path / "ds"), "--size", "16", "--quiet"])
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


# -- prep folder --bands: multi-band TIFFs ------------------------------------

def write_tiff(path, hwc, planar):
    """A GeoTIFF-like file of the (H, W, C) array: bands as samples per pixel,
    stored (H, W, C) (contig) or as GDAL's band-interleaved (C, H, W)."""
    import tifffile
    if planar:
        tifffile.imwrite(path, np.ascontiguousarray(np.moveaxis(hwc, 2, 0)),
                         photometric="minisblack", planarconfig="separate")
    else:
        tifffile.imwrite(path, hwc, photometric="minisblack", planarconfig="contig")


def make_band_tree(root, n_bands, dtype, planar, n=6, side=20, seed=0):
    """2 classes x n images of n_bands; {class: [(H, W, C) source arrays]}."""
    rng = np.random.default_rng(seed)
    src = {}
    for k, cls in enumerate(("crop", "water")):
        (root / cls).mkdir(parents=True)
        src[cls] = []
        for i in range(n):
            if np.dtype(dtype).kind == "f":
                a = rng.normal(0.1 + 0.3 * k, 0.05, (side, side, n_bands))
            else:
                hi = 255 if dtype == np.uint8 else 9000
                a = rng.integers(0, hi // 2, (side, side, n_bands)) + k * (hi // 2)
                if dtype == np.int16:
                    a -= 3000                       # negative values too
            a = a.astype(dtype)
            write_tiff(root / cls / f"{i}.tif", a, planar)
            src[cls].append(a)
    return src


def stored_oracle(src, dtype, depth="auto"):
    """What --bands all must store for these sources (size = source size):
    8-bit as read, 16-bit unsigned as read (uint16; --depth 8: mapped);
    otherwise each band's min..max over all images onto 0..255."""
    allpix = np.concatenate([a for v in src.values() for a in v]).astype(np.float64)
    allpix = allpix.reshape(-1, allpix.shape[-1])
    if dtype == np.uint8 or (dtype == np.uint16 and depth == "auto"):
        return {c: [a.copy() for a in v] for c, v in src.items()}, None
    lo, hi = allpix.min(0), allpix.max(0)
    scale = (hi - lo) / 255
    return {c: [np.clip(np.rint((a.astype(np.float64) - lo) / scale), 0, 255).astype(np.uint8)
                for a in v] for c, v in src.items()}, (lo, scale)


def rows_by_class(ds):
    rows = np.concatenate([ds.split(s).read_all() for s in ds.splits])
    labels = np.concatenate([ds.split(s).labels for s in ds.splits])
    return {c: sorted(map(bytes, rows[labels == k])) for k, c in enumerate(ds.classes)}


@pytest.mark.parametrize("n_bands,dtype,planar,depth", [
    (4, np.uint16, False, "auto"), (4, np.uint16, True, "auto"), (4, np.uint16, True, "8"),
    (13, np.float32, True, "auto"), (13, np.int16, False, "auto"), (4, np.uint8, True, "auto")])
def test_bands_keep_the_source_pixels(tmp_path, n_bands, dtype, planar, depth):
    """Every image stored as its source: 8-bit and 16-bit unsigned bands as
    they are (uint16 shards for the latter, dataset.json's dtype), others
    (and 16-bit under --depth 8) mapped from each band's range onto 0..255."""
    root = tmp_path / "tree"
    src = make_band_tree(root, n_bands, dtype, planar)
    want, scale = stored_oracle(src, dtype, depth)
    out = str(tmp_path / "all")
    assert prep_main(["folder", str(root), out, "--bands", "all", "--size", "20",
                      "--split", "0.5,0.25,0.25", "--quiet", "--depth", depth]) == 0
    ds = Dataset(out)
    assert ds.image_shape == (20, 20, n_bands) and ds.meta["channels"] == n_bands
    kept16 = dtype == np.uint16 and depth == "auto"
    assert ds.dtype == (np.uint16 if kept16 else np.uint8)
    assert ds.meta.get("dtype") == ("uint16" if kept16 else None)
    assert ds.split("train").read([0, 1]).dtype == ds.dtype
    assert ds.meta["bands"] == "all"
    if scale is None:
        assert ds.meta["band_scale"] is None
    else:
        np.testing.assert_array_equal(ds.meta["band_scale"]["offset"], scale[0])
        np.testing.assert_allclose(ds.meta["band_scale"]["scale"], scale[1], rtol=1e-15)
    # every image is its source, band for band, in its class
    assert rows_by_class(ds) == {c: sorted(map(bytes, v)) for c, v in want.items()}
    # per-band mean/std over the train split, in stored units
    tr = ds.split("train").read_all().reshape(-1, n_bands).astype(np.float64)
    assert len(ds.meta["mean"]) == len(ds.meta["std"]) == n_bands
    np.testing.assert_allclose(ds.mean, tr.mean(0), atol=1e-5)
    np.testing.assert_allclose(ds.std, tr.std(0), atol=1e-5)
    # a selection: those bands in that order, each band scaled as under all
    sel = str(tmp_path / "sel")
    assert prep_main(["folder", str(root), sel, "--bands", "4,3,2", "--size", "20",
                      "--split", "0.5,0.25,0.25", "--quiet", "--depth", depth]) == 0
    ds = Dataset(sel)
    assert ds.image_shape == (20, 20, 3) and ds.meta["bands"] == [4, 3, 2]
    assert rows_by_class(ds) == {c: sorted(bytes(np.ascontiguousarray(a[..., [3, 2, 1]]))
                                           for a in v) for c, v in want.items()}


def test_bands_resize_each_band_bilinear(tmp_path):
    """A size other than the source's: each band as Pillow's float image
    resized bilinear (reducing_gap 3), then rounded for 8-bit sources."""
    from PIL import Image
    root = tmp_path / "tree"
    src = make_band_tree(root, 5, np.uint8, planar=True, n=4, side=30)
    out = str(tmp_path / "ds")
    assert prep_main(["folder", str(root), out, "--bands", "5,1", "--size", "12",
                      "--split", "0.5,0.25,0.25", "--quiet"]) == 0

    def resized(band):
        im = Image.fromarray(band.astype(np.float32), "F")
        return np.asarray(im.resize((12, 12), Image.BILINEAR, reducing_gap=3.0))
    want = {c: sorted(bytes(np.clip(np.rint(np.stack([resized(a[..., 4]), resized(a[..., 0])],
                                                     -1)), 0, 255).astype(np.uint8))
                      for a in v) for c, v in src.items()}
    assert rows_by_class(Dataset(out)) == want


def test_band_axis_rule():
    from ibtmpi.data_prep.images import band_axis
    assert band_axis((13, 64, 64), "SYX") == 0 and band_axis((64, 64, 13), "YXS") == 2
    assert band_axis((8, 8, 13), "YXS") == 2             # samples per pixel win
    # bands as pages (no S): the first axis when <= 64 and below both others
    assert band_axis((13, 64, 64), "QYX") == 0
    assert band_axis((64, 64, 13), "QYX") == 2
    assert band_axis((20, 24, 13), "") == 2 and band_axis((13, 20, 24), "") == 0
    assert band_axis((65, 300, 300), "") == 2


@pytest.mark.parametrize("planar", [True, False])
def test_bands_pages_layout(tmp_path, planar):
    """TIFFs of one band per pixel stacked as pages (no samples axis): the
    shape rule tells (C, H, W) from (H, W, C)."""
    import tifffile
    root = tmp_path / "tree"
    src = make_band_tree(root, 4, np.uint16, planar=False, n=3)
    for cls, arrs in src.items():
        for i, a in enumerate(arrs):
            arr = np.ascontiguousarray(np.moveaxis(a, 2, 0)) if planar else a
            tifffile.imwrite(root / cls / f"{i}.tif", arr, photometric="minisblack")
            with tifffile.TiffFile(root / cls / f"{i}.tif") as t:
                assert "S" not in t.series[0].axes
    want, _ = stored_oracle(src, np.uint16)
    out = str(tmp_path / "ds")
    assert prep_main(["folder", str(root), out, "--bands", "all", "--size", "20",
                      "--split", "0.34,0.33,0.33", "--quiet"]) == 0
    assert rows_by_class(Dataset(out)) == {c: sorted(map(bytes, v)) for c, v in want.items()}


def one_line_error(capsys, rc, *needles):
    err = capsys.readouterr().err
    assert rc == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    for n in needles:
        assert n in err, err
    return err


def test_bands_refused_with_one_line(tmp_path, capsys):
    root = tmp_path / "tree"
    make_band_tree(root, 4, np.uint16, planar=False)
    write_tiff(root / "water" / "x13.tif", np.zeros((20, 20, 13), np.uint16), planar=True)
    # mixed counts under all: names a file and both counts
    rc = prep_main(["folder", str(root), str(tmp_path / "a"), "--bands", "all", "--quiet"])
    one_line_error(capsys, rc, "x13.tif has 13 band(s)", "0.tif has 4", "--bands all")
    # a band beyond an image's count names that file
    (root / "water" / "x13.tif").unlink()
    rc = prep_main(["folder", str(root), str(tmp_path / "b"), "--bands", "2,5", "--quiet"])
    one_line_error(capsys, rc, "crop/0.tif has 4 band(s)", "band 5")
    for bad in ("0,1", "red", "1,,2", ""):
        rc = prep_main(["folder", str(root), str(tmp_path / "c"), "--bands", bad, "--quiet"])
        one_line_error(capsys, rc, "--bands expects rgb, all or")
    # RGB images (Pillow) have 3 bands
    rgb = tmp_path / "rgb"
    make_tree(rgb)
    rc = prep_main(["folder", str(rgb), str(tmp_path / "d"), "--bands", "1,4", "--quiet"])
    one_line_error(capsys, rc, "has 3 band(s)", "band 4")
    assert not [p for p in os.listdir(tmp_path) if p in "abcd" or "partial" in p]


def test_bands_without_tifffile_says_what_to_install(tmp_path, capsys, monkeypatch):
    import sys
    root = tmp_path / "tree"
    make_band_tree(root, 4, np.uint16, planar=False, n=2)
    monkeypatch.setitem(sys.modules, "tifffile", None)       # import fails
    rc = prep_main(["folder", str(root), str(tmp_path / "ds"), "--bands", "all", "--quiet"])
    one_line_error(capsys, rc, "pip install tifffile")


def test_bands_of_rgb_images(tmp_path, capsys):
    """--bands rgb is the default, byte for byte; a numeric list picks RGB
    channels of Pillow's images (grey, RGBA and JPEG converted as usual)."""
    root = tmp_path / "tree"
    make_tree(root)
    outs = {}
    for name, flag in (("plain", []), ("rgb", ["--bands", "rgb"]), ("bgr", ["--bands", "3,2,1"]),
                       ("g", ["--bands", "2"])):
        outs[name] = tmp_path / name
        assert prep_main(["folder", str(root), str(outs[name]), "--size", "12", "--shards", "2",
                          "--quiet"] + flag) == 0
    capsys.readouterr()
    names = sorted(os.listdir(outs["plain"]))
    assert names == sorted(os.listdir(outs["rgb"]))
    for f in names:
        if f.endswith(".h5"):
            assert (outs["plain"] / f).read_bytes() == (outs["rgb"] / f).read_bytes(), f
    meta = [json.load(open(outs[n] / "dataset.json")) for n in ("plain", "rgb")]
    for m in meta:
        del m["created"]
    assert meta[0] == meta[1] and meta[0]["bands"] == "rgb" and meta[0]["channels"] == 3
    plain = Dataset(str(outs["plain"]))
    for name, idx in (("bgr", [2, 1, 0]), ("g", [1])):
        d = Dataset(str(outs[name]))
        assert d.image_shape == (12, 12, len(idx))
        for s in plain.splits:
            assert np.array_equal(d.split(s).read_all(), plain.split(s).read_all()[..., idx])
        np.testing.assert_allclose(d.mean, plain.mean[idx], atol=1e-6)


def test_bands_train_evaluate_predict(tmp_path, capsys):
    """A 4-band uint16 set through the CLI (stored as uint16): the model's
    input has 4 channels, evaluate runs, and predict reads the source TIFFs
    into the stored values the model was trained on."""
    from ibtmpi.cli import main
    from ibtmpi.outputs import load_trained
    from conftest import train_args
    root = tmp_path / "tree"
    src = make_band_tree(root, 4, np.uint16, planar=True, n=24, side=16)
    data = str(tmp_path / "ms4")
    assert prep_main(["folder", str(root), data, "--bands", "all", "--size", "16",
                      "--quiet"]) == 0
    run = str(tmp_path / "run")
    assert main(["train"] + train_args(data, run, 1, **{"data.split_size": 8,
                                                       "data.batch": 4})) == 0
    tm = load_trained(run)
    assert tm.model.input_shape == (4, 16, 16) and tm.preprocess["bands"] == "all"
    np.testing.assert_allclose(tm.mean, Dataset(data).mean)
    capsys.readouterr()
    assert main(["evaluate", run]) == 0
    assert capsys.readouterr().out.startswith("accuracy")
    out = tmp_path / "p.json"
    files = [str(root / "water" / "0.tif"), str(root / "crop" / "1.tif")]
    assert main(["predict", run, *files, "--format", "json", "--out", str(out)]) == 0
    want, _ = stored_oracle(src, np.uint16)
    ref = tm.probs(np.stack([want["water"][0], want["crop"][1]]))
    got = json.load(open(out))["predictions"]
    for r, p in zip(got, ref):
        np.testing.assert_allclose([r["p_crop"], r["p_water"]], p, atol=1e-6)


def test_folder_keeps_the_images_own_size_and_says_what_it_resized(tmp_path, capsys):
    """--size defaults to the images' own side where they all have one square
    size (it was 64: 32-px PNGs became 64x64, 4x the compute, said nowhere);
    mixed or non-square images need --size, and what was resized or
    stretched is said and kept in dataset.json."""
    root = tmp_path / "same"
    for cls in ("a", "b"):
        (root / cls).mkdir(parents=True)
        for i in range(4):
            Image.fromarray(np.full((32, 32, 3), 40 * i, np.uint8)).save(root / cls / f"{i}.png")
    assert prep_main(["folder", str(root), str(tmp_path / "d1")]) == 0
    assert "images 32x32, stored as they are" in capsys.readouterr().out
    assert Dataset(str(tmp_path / "d1")).image_shape == (32, 32, 3)
    tree = tmp_path / "tree"
    make_tree(tree)                         # 20x24, 30x30 and 16x16 images
    assert prep_main(["folder", str(tree), str(tmp_path / "d2"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "the images have 3 sizes (24x20: 24, 30x30: 1, 16x16: 1)" in err, err
    assert "give --size S" in err and not (tmp_path / "d2").exists()
    assert prep_main(["folder", str(tree), str(tmp_path / "d3"), "--size", "16",
                      "--quiet"]) == 0
    out = capsys.readouterr().out             # said even when quiet
    assert ("resized 25 image(s) to 16x16 (from 24x20: 24, 30x30: 1); 24 of them not "
            "square, stretched") in out, out
    meta = json.load(open(tmp_path / "d3" / "dataset.json"))
    assert meta["sizes"].startswith("resized 25 image(s) to 16x16")
