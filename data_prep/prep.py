"""``ibtmpi prep synth|folder|inspect``: make and check dataset directories.

synth: the procedural 5-class set (synth.py), streamed chunk by chunk into
the atomic writer. folder: class-per-subfolder image trees (EuroSAT, UC
Merced, NWPU-RESISC45, AID), decoded with Pillow, converted to RGB, resized,
optionally re-labelled by a class map; unreadable files are listed and
skipped (or fatal with strict); with ``bands`` other than rgb, TIFF bands
are kept instead (images.py: layout, resizing, uint8 storage). inspect:
full validation plus a summary.
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np

from . import synth
from .images import (IMAGE_EXT, BandError, band_scale, check_band_counts, image_hw,
                     is_tiff, load_bands, load_image, size_plan, to_stored)
from .writer import (DatasetWriter, WriteError, ensure_parent, free_bytes, needed_bytes,
                     stratified_assign)

def _bar(total, desc, quiet):
    from tqdm import tqdm
    return tqdm(total=total, desc=desc, unit="img", disable=quiet or None,
                file=sys.stderr, leave=False)


def _positions(split_id):
    """Row of each sample inside its split, in generation order."""
    pos = np.empty(len(split_id), np.int64)
    for s in range(3):
        m = split_id == s
        pos[m] = np.arange(m.sum())
    return pos


def prep_synth(out, n=25000, size=64, seed=0, classes=synth.CLASSES,
               ratios=(0.8, 0.1, 0.1), shards=4, distractor_p=0.3,
               overwrite=False, quiet=False):
    t0 = time.perf_counter()
    classes = list(classes)
    gen_idx = np.asarray(synth.class_indices(classes))
    if n < len(classes):
        raise WriteError(f"--n {n} is fewer than the {len(classes)} classes")
    labels = synth.draw_labels(n, len(classes), seed)
    split_id = stratified_assign(labels, ratios, seed)
    pos = _positions(split_id)
    counts = {name: int((split_id == s).sum())
              for s, name in enumerate(("train", "val", "test"))}
    w = DatasetWriter(out, classes, (size, size, 3), counts, shards,
                      source="synthetic", generator=f"ibtmpi synth {synth.VERSION}",
                      seed=seed, overwrite=overwrite,
                      extra={"distractor_p": distractor_p})
    with w, _bar(n, "synth", quiet) as bar:
        for c0 in range(0, n, synth.CHUNK):
            sl = slice(c0, min(n, c0 + synth.CHUNK))
            imgs = synth.make_chunk(seed, c0 // synth.CHUNK, gen_idx[labels[sl]],
                                    size, distractor_p)
            for s, name in enumerate(("train", "val", "test")):
                m = split_id[sl] == s
                if m.any():   # members of a split are contiguous rows there
                    w.write(name, int(pos[sl][m][0]), imgs[m], labels[sl][m])
            bar.update(sl.stop - sl.start)
        meta = w.close()
    return meta, time.perf_counter() - t0


def load_class_map(path):
    """{source class: target class or None (drop)} from JSON or TOML."""
    try:
        if path.endswith(".toml"):
            try:
                import tomllib
            except ImportError:                      # Python < 3.11
                import tomli as tomllib
            with open(path, "rb") as f:
                m = tomllib.load(f)
        else:
            with open(path) as f:
                m = json.load(f)
    except (OSError, ValueError) as e:
        raise WriteError(f"class map {path}: {e}") from None
    if not isinstance(m, dict) or not all(
            isinstance(k, str) and (v is None or isinstance(v, str))
            for k, v in m.items()):
        raise WriteError(f"class map {path}: expected a table of "
                         f"\"source class\" = \"target class\" strings")
    return {k: (v or None) for k, v in m.items()}


def scan_folder(root, class_map=None):
    """[(path, class name)] and the ordered class list."""
    if not os.path.isdir(root):
        raise WriteError(f"{root} is not a directory")
    src_classes = sorted(d for d in os.listdir(root)
                         if os.path.isdir(os.path.join(root, d))
                         and not d.startswith("."))
    if not src_classes:
        raise WriteError(f"{root} has no class subfolders (expected ROOT/<class>/<images>)")
    if class_map is not None:
        unknown = sorted(set(class_map) - set(src_classes))
        if unknown:
            raise WriteError(f"class map names folders not in {root}: {unknown}")
        targets = []
        for v in class_map.values():
            if v and v not in targets:
                targets.append(v)
    else:
        targets = src_classes
    items = []
    for sc in src_classes:
        tc = class_map.get(sc) if class_map is not None else sc
        if not tc:
            continue
        for dirpath, dirs, files in os.walk(os.path.join(root, sc)):
            # the listing order is the file system's: sort it, so the same
            # tree gives the same data set (same split, same order) anywhere
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            for fn in sorted(files):
                if os.path.splitext(fn)[1].lower() in IMAGE_EXT:
                    items.append((os.path.join(dirpath, fn), tc))
    if not items:
        raise WriteError(f"no images found under {root}")
    return items, targets


def _check_space(parent, shape, dtype, shards):
    """Refuse before the first byte when decoding (shape of dtype) and
    writing the shards would not fit beside the output."""
    n = shape[0]
    need = (int(np.prod(shape)) * np.dtype(dtype).itemsize
            + needed_bytes({"all": n}, shape[1:], shards + 2))
    free = free_bytes(parent)
    if need > free:
        raise OSError(errno.ENOSPC, f"No space left on device (decoding and writing "
                      f"{n} images of {shape[1]}x{shape[2]}x{shape[3]} needs about "
                      f"{need / 2**20:.1f} MiB, {free / 2**20:.1f} MiB are free)", parent)


def _scratch(tmpdir, shape, dtype):
    """A disk-backed array for the decoded images, its blocks reserved."""
    path = os.path.join(tmpdir, "decoded.npy")
    buf = np.lib.format.open_memmap(path, "w+", dtype, shape)
    # reserve its blocks now: a memory map that meets a full disk later
    # is a SIGBUS, not an error
    fd = os.open(path, os.O_RDWR)
    try:
        os.posix_fallocate(fd, 0, os.fstat(fd).st_size)
    except OSError as e:         # a file system without fallocate: go on
        if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise
    finally:
        os.close(fd)
    return buf


def _decode(items, buf, load, strict, quiet, rgb):
    """buf[i] = load(path i); (readable mask, each source's depth (8, 16, 0:
    images.depth), [(path, why)])."""
    ok = np.zeros(len(items), bool)
    depths = np.zeros(len(items), np.int8)
    bad = []
    with _bar(len(items), "decode", quiet) as bar:
        for i, (p, _) in enumerate(items):
            try:
                buf[i], depths[i] = load(p)
                ok[i] = True
            except BandError:                    # the tree, not this file: fatal
                raise
            except Exception as e:               # PIL raises many types
                why = f"{type(e).__name__}: {e}"
                if rgb and is_tiff(p):
                    why += " (a TIFF of more than 3 bands? keep them with --bands all)"
                if strict:
                    raise WriteError(f"{p}: cannot be read as an image ({why}); "
                                     f"remove it or drop --strict") from None
                bad.append((p, why))
            bar.update(1)
    return ok, depths, bad


def _write_splits(w, buf, good, labels, split_id, seed, store=None):
    """Each split in a seeded random order (contiguous worker ranges are
    class-mixed); rows of buf[good], through store (to uint8) if given."""
    rng = np.random.default_rng([seed, 104729])
    for s, name in enumerate(("train", "val", "test")):
        members = np.flatnonzero(split_id == s)
        members = members[rng.permutation(len(members))]
        for c0 in range(0, len(members), 512):
            sel = members[c0:c0 + 512]
            order = np.argsort(good[sel])          # memmap-friendly
            rows = buf[good[sel][order]]
            if store is not None:
                rows = store(rows)
            unsorted = np.empty_like(rows)
            unsorted[order] = rows
            w.write(name, c0, unsorted, labels[sel])


def prep_folder(root, out, size=None, class_map=None, ratios=(0.8, 0.1, 0.1),
                seed=0, shards=1, strict=False, overwrite=False, quiet=False,
                bands="rgb", depth="auto"):
    """bands: "rgb", "all" or a tuple of 1-based band numbers (images.py);
    depth: "auto" (a tree of 16-bit bands is stored as uint16 as it is) or
    "8" (every non-8-bit tree mapped onto 0..255, as before uint16 sets);
    size None: the images' own side, where they all have one square size
    (images.size_plan; what was resized or stretched goes into
    dataset.json's `sizes` and the command's output)."""
    t0 = time.perf_counter()
    cmap = load_class_map(class_map) if class_map else None
    items, classes = scan_folder(root, cmap)
    if os.path.exists(out) and not overwrite:
        raise WriteError(f"{out} already exists; choose another directory or "
                         f"pass --overwrite")
    rgb = bands == "rgb"
    n_bands = 3 if rgb else check_band_counts([p for p, _ in items], bands)
    sizes = {}
    for p, _ in items:                   # headers only: an unreadable one is the decode's
        try:
            hw = image_hw(p, rgb)
        except Exception:
            continue
        sizes[hw] = sizes.get(hw, 0) + 1
    try:
        size, size_note = size_plan(sizes, size)
    except ValueError as e:
        raise WriteError(f"{root}: {e}") from None
    shape, dtype = (len(items), size, size, n_bands), (np.uint8 if rgb else np.float32)
    # Phase 1: decode everything into a disk-backed array (any data size),
    # beside the output: the two need about twice the data set's size
    parent = ensure_parent(out)
    _check_space(parent, shape, dtype, shards)
    tmpdir = tempfile.mkdtemp(prefix=".prep-", dir=parent)
    try:
        buf = _scratch(tmpdir, shape, dtype)
        ok, depths, bad = _decode(items, buf, (lambda p: (load_image(p, size), 8)) if rgb
                              else (lambda p: load_bands(p, size, bands)), strict, quiet, rgb)
        good = np.flatnonzero(ok)
        name_to_idx = {c: i for i, c in enumerate(classes)}
        labels = np.array([name_to_idx[items[i][1]] for i in good], np.int64)
        if len(good) == 0:
            raise WriteError(f"none of the {len(items)} images could be read")
        empty = [c for i, c in enumerate(classes) if not (labels == i).any()]
        if empty:
            raise WriteError(
                f"class(es) {empty} have no readable images under {root}: the model "
                f"would get an output no sample trains; remove those folders or map "
                f"them away with --class-map")
        keep16 = not rgb and str(depth) == "auto" and (depths[good] == 16).all()
        stored = np.uint16 if keep16 else np.uint8
        scale = None if rgb or keep16 or (depths[good] == 8).all() else band_scale(
            buf[good[i:i + 512]] for i in range(0, len(good), 512))
        # Phase 2: stratified split, then the shards
        split_id = stratified_assign(labels, ratios, seed)
        w = DatasetWriter(out, classes, shape[1:],
                          {n: int((split_id == s).sum())
                           for s, n in enumerate(("train", "val", "test"))},
                          shards, source=f"folder:{os.path.abspath(root)}",
                          generator="ibtmpi prep folder", seed=seed,
                          overwrite=overwrite, dtype=stored,
                          extra={"class_map": cmap, "skipped": len(bad), "sizes": size_note,
                                 "bands": bands if rgb or bands == "all" else list(bands),
                                 "band_scale": scale})
        with w:
            _write_splits(w, buf, good, labels, split_id, seed,
                          None if rgb else (lambda x: to_stored(x, scale, stored)))
            meta = w.close()
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    return meta, bad, time.perf_counter() - t0


def dir_size(path):
    return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))


def inspect(path):
    """Validate a dataset; return printable summary lines."""
    from ibtmpi.dataset import Dataset
    ds = Dataset(path)
    lines = [f"dataset {ds.path}: OK",
             f"  classes ({ds.n_classes}): {', '.join(ds.classes)}",
             f"  image shape (H, W, C): {ds.image_shape}, stored as {ds.dtype}",
             f"  train mean {np.round(ds.mean, 2).tolist()} std "
             f"{np.round(ds.std, 2).tolist()}",
             f"  source: {ds.meta.get('source')}  generator: "
             f"{ds.meta.get('generator')}  seed: {ds.meta.get('seed')}"]
    if "bands" in ds.meta:                 # prep folder's; synth sets are RGB
        lines.insert(4, f"  bands: {ds.meta['bands']}" + (
            "; each band's range over the data set stored as 0..255 (band_scale in "
            "dataset.json)" if ds.meta.get("band_scale") else ""))
    width = max(len(c) for c in ds.classes)
    for name, sp in ds.splits.items():
        size = sum(os.path.getsize(f) for f in sp.files)
        lines.append(f"  {name}: {sp.n} images in {len(sp.files)} file(s), "
                     f"{size / 2**20:.1f} MiB")
        counts = np.bincount(sp.labels, minlength=ds.n_classes)
        for c, k in zip(ds.classes, counts):
            lines.append(f"    {c:<{width}} {k:>8d}")
    lines.append(f"  total on disk: {dir_size(ds.path) / 2**20:.1f} MiB")
    ds.close()
    return lines
