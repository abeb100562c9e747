"""Atomic writer of a dataset directory (layout: docs/data.md).

Everything is written into a hidden sibling ``.NAME.partial-PID`` and
renamed onto NAME only when complete, ``dataset.json`` (fsynced) last, so a
crash never leaves a directory that looks like a finished dataset. An
existing NAME is refused unless ``overwrite``; then the old one is moved
aside and removed only after the new one is in place.

Rows are written by split and position; the train split is cut into
``n_shards`` contiguous shards. Per-channel mean/std of the train split
(C values, one per band) are accumulated while writing.
"""
from __future__ import annotations

import contextlib
import datetime
import errno
import gc
import json
import os
import re
import shutil
import sys

import h5py
import numpy as np

from ibtmpi import __version__
from ibtmpi.dataset import FORMAT, VERSION
from ibtmpi.fsutil import fsync_dir, fsync_path, is_storage_error


class WriteError(Exception):
    pass


def ensure_parent(out):
    """Create the parent directory of `out` (like mkdir -p); return it."""
    parent = os.path.dirname(os.path.abspath(out))
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as e:
        raise WriteError(f"cannot create directory {parent}: {e.strerror}") from None
    return parent


# HDF5's own bytes per file (superblock, object headers, the chunk index)
# and per chunk (one row a chunk: its index entry), measured generously
FILE_OVERHEAD, CHUNK_OVERHEAD = 64 * 1024, 96


def needed_bytes(counts, image_shape, n_files, itemsize=1):
    """About what a data set of these split sizes takes on disk (no compression)."""
    row = int(np.prod(image_shape)) * itemsize + 4 + CHUNK_OVERHEAD
    return sum(counts.values()) * row + n_files * FILE_OVERHEAD + 4096


def free_bytes(path):
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def hdf5_files_open():
    """HDF5 files this process still holds open: after a write the file system
    refused, HDF5 can neither flush nor close them, and its teardown at exit
    then crashes (SIGSEGV): the caller exits with os._exit after its message."""
    return len(h5py.h5f.get_obj_ids(types=h5py.h5f.OBJ_FILE)) > 0


def _storage_errno(e):
    """The errno of a failed HDF5 write (h5py raises OSError, or RuntimeError
    with HDF5's 'errno = 28' in the text) where the file system is at
    fault (fsutil's storage errors), or None for another error."""
    if is_storage_error(e):
        return e.errno
    m = re.search(r"errno = (\d+)", str(e))
    code = int(m.group(1)) if m else None
    return code if is_storage_error(OSError(code, "")) else None


def shard_names(n_shards):
    return [f"train-{k:05d}-of-{n_shards:05d}.h5" for k in range(n_shards)]


class DatasetWriter:
    def __init__(self, out_dir, classes, image_shape, counts, n_shards=1,
                 source="", generator="", seed=None, overwrite=False,
                 extra=None, dtype=np.uint8):
        """dtype: of the stored pixels, uint8 or uint16 (16-bit bands kept;
        dataset.json then says "dtype": "uint16", a uint8 set writes no
        dtype and stays as it was)."""
        self.out = os.path.abspath(out_dir)
        self.dtype = np.dtype(dtype)
        if self.dtype not in (np.uint8, np.uint16):
            raise WriteError(f"images are stored as uint8 or uint16, not {self.dtype}")
        if os.path.exists(self.out) and not overwrite:
            raise WriteError(f"{out_dir} already exists; choose another "
                             f"directory or pass --overwrite")
        parent = ensure_parent(self.out)
        if not os.access(parent, os.W_OK):
            raise WriteError(f"cannot write in {parent}")
        if counts.get("train", 0) < 1:
            raise WriteError("the train split would be empty")
        if n_shards < 1 or n_shards > counts["train"]:
            raise WriteError(f"shards must be between 1 and the {counts['train']} "
                             f"training images, got {n_shards}")
        self.classes = list(classes)
        self.image_shape = tuple(int(s) for s in image_shape)
        self.counts = {k: int(v) for k, v in counts.items() if v > 0}
        self.meta = {"source": source, "generator": generator, "seed": seed,
                     **(extra or {})}
        need = needed_bytes(self.counts, self.image_shape, n_shards + 2, self.dtype.itemsize)
        free = free_bytes(parent)
        if need > free:              # before the first byte: HDF5 copes badly with ENOSPC
            raise OSError(errno.ENOSPC, f"No space left on device (the data set needs "
                          f"about {need / 2**20:.1f} MiB, {free / 2**20:.1f} MiB are free)",
                          parent)
        self.tmp = os.path.join(parent, f".{os.path.basename(self.out)}.partial-{os.getpid()}")
        if os.path.exists(self.tmp):
            shutil.rmtree(self.tmp)
        self.files = {}              # split -> [(name, h5 file, start, count)]
        os.makedirs(self.tmp)
        try:                         # a full disk here leaves no partial directory
            n = self.counts["train"]
            bounds = [(k * n) // n_shards for k in range(n_shards + 1)]
            self.files["train"] = []
            for k, name in enumerate(shard_names(n_shards)):
                cnt = bounds[k + 1] - bounds[k]
                self.files["train"].append((name, self._create(name, cnt), bounds[k], cnt))
            for split in ("val", "test"):
                if self.counts.get(split):
                    self.files[split] = [(f"{split}.h5",
                                          self._create(f"{split}.h5", self.counts[split]),
                                          0, self.counts[split])]
        except BaseException:
            self.abort()
            raise
        c = self.image_shape[2]
        self._sum = np.zeros(c)
        self._sum2 = np.zeros(c)
        self._npix = 0
        self.written = {k: 0 for k in self.files}

    def _create(self, name, n):
        # no chunk cache: a row goes to disk in its write() call, so a refused
        # write fails there, not later in a cache eviction or a dealloc
        f = h5py.File(os.path.join(self.tmp, name), "w", rdcc_nbytes=0)
        # Fletcher-32 checksums on every chunk: a damaged row is an error
        # naming its file and row on reading, not silently wrong pixels
        f.create_dataset("images", (n,) + self.image_shape, self.dtype,
                         chunks=(1,) + self.image_shape, fletcher32=True)
        f.create_dataset("labels", (n,), np.int16 if len(self.classes) < 32000
                         else np.int32, chunks=(min(n, 65536),), fletcher32=True)
        f.attrs["classes"] = json.dumps(self.classes)
        f.attrs["image_shape"] = self.image_shape
        return f

    def write(self, split, start, images, labels):
        """Rows [start, start+len) of `split` (contiguous positions)."""
        images = np.asarray(images)
        labels = np.asarray(labels)
        if images.dtype != self.dtype or images.shape[1:] != self.image_shape:
            raise WriteError(f"images must be {self.dtype} {self.image_shape}, got "
                             f"{images.dtype} {images.shape[1:]}")
        end = start + len(images)
        for name, f, s0, cnt in self.files[split]:
            lo, hi = max(start, s0), min(end, s0 + cnt)
            if lo < hi:
                with self._storage(name):
                    f["images"][lo - s0:hi - s0] = images[lo - start:hi - start]
                    f["labels"][lo - s0:hi - s0] = labels[lo - start:hi - start]
        if split == "train":
            px = images.reshape(-1, images.shape[-1]).astype(np.float64)
            self._sum += px.sum(0)
            self._sum2 += (px * px).sum(0)
            self._npix += len(px)
        self.written[split] += len(images)

    @contextlib.contextmanager
    def _storage(self, name):
        """A context in which a write the file system refuses (disk full,
        quota, read-only, I/O error) removes the partial data set and
        becomes one OSError naming the file, instead of h5py's errors."""
        try:
            yield
        except (OSError, RuntimeError) as e:
            code = _storage_errno(e)
            if code is None:
                raise
            self.abort()
            raise OSError(code, os.strerror(code), os.path.join(self.out, name)) from None

    def abort(self):
        """Close what can be closed and remove the partial directory. After a
        refused write HDF5 can close nothing and each of its objects
        complains as it is freed: those complaints are dropped here."""
        hook, sys.unraisablehook = sys.unraisablehook, lambda *a: None
        try:
            for fl in self.files.values():
                for _, f, _, _ in fl:
                    try:
                        f.close()
                    except Exception:
                        pass
            self.files = {}
            gc.collect()
        finally:
            sys.unraisablehook = hook
        shutil.rmtree(self.tmp, ignore_errors=True)

    def close(self):
        for split, n in self.counts.items():
            if self.written.get(split) != n:
                raise WriteError(f"split {split}: wrote {self.written.get(split)} "
                                 f"of {n} images")
        splits = {}
        for split, fl in self.files.items():
            per_class = np.zeros(len(self.classes), np.int64)
            for name, f, _, _ in fl:
                with self._storage(name):
                    per_class += np.bincount(f["labels"][:], minlength=len(self.classes))
                    f.flush()
                    f.close()
                    fsync_path(os.path.join(self.tmp, name))
            splits[split] = {"files": [x[0] for x in fl],
                             "counts": [x[3] for x in fl],
                             "n": self.counts[split],
                             "class_counts": per_class.tolist()}
        mean = self._sum / self._npix
        std = np.sqrt(np.maximum(self._sum2 / self._npix - mean ** 2, 1e-12))
        meta = {"format": FORMAT, "version": VERSION, "classes": self.classes,
                "image_shape": list(self.image_shape),
                "channels": self.image_shape[2], "splits": splits,
                "mean": mean.round(6).tolist(), "std": std.round(6).tolist(),
                "created": datetime.datetime.now(datetime.timezone.utc)
                .isoformat(timespec="seconds"),
                "ibtmpi_version": __version__, **self.meta,
                **({"dtype": self.dtype.name} if self.dtype != np.uint8 else {})}
        path = os.path.join(self.tmp, "dataset.json")
        with open(path, "w") as f:
            json.dump(meta, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        old = None
        if os.path.exists(self.out):
            old = f"{self.tmp}.old"
            os.rename(self.out, old)
        os.rename(self.tmp, self.out)
        fsync_dir(os.path.dirname(self.out))
        if old:
            shutil.rmtree(old, ignore_errors=True)
        return meta

    def __enter__(self):
        return self

    def __exit__(self, et, ev, tb):
        if et is not None:
            self.abort()
        return False


def stratified_assign(labels, ratios, seed):
    """Split id per sample (0 train, 1 val, 2 test), stratified by class:
    per class, val and test get round(n_c * ratio) of a seeded permutation."""
    labels = np.asarray(labels)
    r_val, r_test = ratios[1], ratios[2]
    out = np.zeros(len(labels), np.int8)
    rng = np.random.default_rng([seed, 7919])
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        idx = idx[rng.permutation(len(idx))]
        nv = int(round(len(idx) * r_val))
        nt = int(round(len(idx) * r_test))
        out[idx[:nv]] = 1
        out[idx[nv:nv + nt]] = 2
    return out


def parse_ratios(text):
    try:
        parts = [float(p) for p in str(text).split(",")]
    except ValueError:
        raise WriteError(f"--split expects three numbers like 0.8,0.1,0.1, got {text!r}") from None
    if len(parts) != 3 or min(parts) < 0 or parts[0] <= 0 or abs(sum(parts) - 1) > 1e-6:
        raise WriteError(f"--split expects train,val,test fractions summing to "
                         f"1 with train > 0, got {text!r}")
    return parts
