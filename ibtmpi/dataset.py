"""Dataset directories: open, validate everything up front, read rows.

Layout (written by ``ibtmpi prep``; docs/data.md has the full description):
``dataset.json`` (written last) + ``train-0000k-of-0000S.h5`` shards +
``val.h5`` + ``test.h5``. Each HDF5 file holds ``images`` uint8 (n, H, W, C)
(uint16 where dataset.json's ``dtype`` says so: 16-bit bands kept by prep
folder) chunked one image per chunk and ``labels`` integer (n,), with
attributes ``classes`` (JSON list) and ``image_shape``.

``Dataset(path)`` checks, before any training: the directory and every
listed file exist; each file opens as HDF5 and has ``images``/``labels`` of
the right dtype and shape; classes agree with dataset.json; labels are in
range; counts agree with dataset.json; no shard is empty; the last image
of each file can be read (catches truncation). Every error names the file
and says what to do. Sizes are checked before anything is allocated.
Test: tests/unit/test_dataset.py (one test per error).
"""
from __future__ import annotations

import json
import os

import numpy as np

from .errors import DatasetError

FORMAT = "ibtmpi-dataset"
VERSION = 1
MAX_IMAGE_BYTES = 64 * 2**20          # refuse absurd per-image shapes
DTYPES = ("uint8", "uint16")          # dataset.json's dtype (absent: uint8)


def _h5():
    import h5py
    return h5py


def open_read(path):
    """An HDF5 shard opened read-only WITHOUT file locking. HDF5 >= 1.10
    locks files by default and fails to open them on parallel file systems
    without flock support ("unable to lock file, errno = 524" on Lustre or
    NFS mounts); the shards are never written while anyone trains on them
    (prep writes to a temporary name and renames), so readers need no lock.
    One setting for the whole process: HDF5 refuses to open a file twice
    with different locking flags."""
    h5py = _h5()
    try:
        return h5py.File(path, "r", locking=False)
    except (TypeError, ValueError):          # h5py < 3.5 / HDF5 without the option
        return h5py.File(path, "r")


def _h5_reason(e):
    """HDF5's message without h5py's exception class noise, on one line."""
    return " ".join(str(e).split()) or type(e).__name__


def _nearby(path):
    """' (did you mean D?)' for a data set directory next to a path that is
    not there (a typo, or the name of one of its files), else ''."""
    import difflib
    parent, name = os.path.split(path.rstrip("/"))
    try:
        names = [n for n in os.listdir(parent or ".")
                 if os.path.isfile(os.path.join(parent, n, "dataset.json"))]
    except OSError:
        return ""
    m = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
    return f" (did you mean {os.path.join(parent, m[0])}?)" if m else ""


class SplitReader:
    """The files of one split viewed as one global row index space."""

    def __init__(self, name, files, counts, labels, sizes=None):
        self.name = name
        self.files = files                    # paths
        # each file's size when it was validated: a file that shrinks while
        # it is open reads as zeros past its end (HDF5 zero-fills, and the
        # Fletcher-32 sum of zeros is 0), so every read checks it (_check_size)
        self.sizes = list(sizes) if sizes is not None else [None] * len(files)
        self.counts = list(counts)
        self.offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.n = int(self.offsets[-1])
        self.labels = labels                  # (n,) int64, all in memory
        self._handles = None

    def _open(self):
        if self._handles is None:
            self._handles = [open_read(f) for f in self.files]
            for s in range(len(self.files)):
                self._check_size(s)
        return self._handles

    def _check_size(self, s):
        """DatasetError where file s is no longer the size it was validated
        at (truncated or rewritten in place while the run reads it). The
        open handle's own size (fstat): a file replaced by a rename leaves
        the handle on the old, intact one."""
        want = self.sizes[s]
        if want is None:
            return
        try:
            got = os.fstat(self._handles[s].id.get_vfd_handle()).st_size
        except (OSError, TypeError, ValueError, AttributeError):
            got = os.path.getsize(self.files[s])   # another HDF5 driver: the path
        if got != want:
            raise DatasetError(
                f"{self.files[s]}: the file changed while the run read it ({want} bytes "
                f"when checked, {got} now: truncated or rewritten in place); rows past "
                f"its end would read as zeros. Restore the file (or re-create the data "
                f"set with `ibtmpi prep`) and resume")

    def close(self):
        if self._handles:
            for h in self._handles:
                h.close()
        self._handles = None

    def __getstate__(self):                  # handles never cross processes
        d = dict(self.__dict__)
        d["_handles"] = None
        return d

    def read(self, idx, out=None):
        """(len(idx), H, W, C) of the stored dtype for global row indices (any order).

        Consecutive runs inside one file are read as one slice; other rows
        image by image (fancy indexing of random rows is ~15x slower)."""
        idx = np.asarray(idx, np.int64)
        handles = self._open()
        shape = handles[0]["images"].shape[1:]
        if out is None:
            out = np.empty((len(idx),) + shape, handles[0]["images"].dtype)
        if len(idx) == 0:
            return out
        if idx.min() < 0 or idx.max() >= self.n:
            raise IndexError(f"{self.name}: row index out of 0..{self.n - 1}")
        shard = np.searchsorted(self.offsets, idx, side="right") - 1
        order = np.argsort(idx, kind="stable")
        j = 0
        while j < len(order):
            k = j
            s = shard[order[j]]
            # extend a run of consecutive rows in the same shard
            while (k + 1 < len(order) and shard[order[k + 1]] == s
                   and idx[order[k + 1]] == idx[order[k]] + 1):
                k += 1
            lo = int(idx[order[j]] - self.offsets[s])
            out[order[j:k + 1]] = self._rows(s, lo, lo + (k - j + 1))
            j = k + 1
        for s in np.unique(shard):            # after the reads: zeros read past a
            self._check_size(int(s))          # new end are never handed on
        return out

    def _rows(self, s, lo, hi):
        """Rows lo..hi-1 of file s; a read HDF5 refuses (a damaged chunk, its
        checksum, a corrupt heap) is a DatasetError naming the file and the
        first row that cannot be read."""
        images = self._open()[s]["images"]
        try:
            return images[lo:hi]
        except (OSError, RuntimeError, ValueError) as e:
            self._check_size(s)              # a file cut short says so, not "damaged"
            bad = lo
            for r in range(lo, hi):          # one row a chunk: find the first bad one
                try:
                    images[r]
                except (OSError, RuntimeError, ValueError):
                    bad = r
                    break
            raise DatasetError(f"{self.files[s]}: row {bad} (split {self.name!r}) cannot be "
                               f"read: {_h5_reason(e)}; the file is damaged: re-create the "
                               f"data set with `ibtmpi prep` or restore it") from None

    def read_all(self):
        """All rows, file by file (contiguous reads)."""
        self._open()
        if not self.files:
            return None
        out = np.concatenate([self._rows(s, 0, c) for s, c in enumerate(self.counts)])
        for s in range(len(self.files)):
            self._check_size(s)
        return out


class Dataset:
    def __init__(self, path):
        self.path = os.path.abspath(path)
        if not os.path.exists(self.path):
            raise DatasetError(f"dataset directory {path} does not exist"
                               f"{_nearby(self.path)}; create one with `ibtmpi prep "
                               f"synth {path}`")
        if not os.path.isdir(self.path):
            raise DatasetError(f"{path} is not a directory (a dataset is a "
                               f"directory with dataset.json and .h5 files)")
        meta_path = os.path.join(self.path, "dataset.json")
        if not os.path.isfile(meta_path):
            raise DatasetError(
                f"{meta_path} is missing: not a dataset directory, or an "
                f"interrupted write (re-run `ibtmpi prep`)")
        try:
            with open(meta_path) as f:
                meta = json.load(f)
        except (OSError, ValueError) as e:
            raise DatasetError(f"{meta_path}: not valid JSON ({e})") from None
        self.meta = meta
        self._check_meta(meta_path)
        self.classes = list(meta["classes"])
        self.image_shape = tuple(int(s) for s in meta["image_shape"])
        self.dtype = np.dtype(meta.get("dtype", "uint8"))      # of the stored pixels
        self.mean = np.asarray(meta["mean"], np.float64)
        self.std = np.asarray(meta["std"], np.float64)
        self.splits = {}
        self.unchecked = []                   # files without Fletcher-32 checksums
        for name, info in meta["splits"].items():
            self.splits[name] = self._open_split(name, info)

    # -- validation ---------------------------------------------------------
    def _check_meta(self, where):
        m = self.meta
        if m.get("format") != FORMAT:
            raise DatasetError(f"{where}: format is {m.get('format')!r}, "
                               f"expected {FORMAT!r}")
        if m.get("version") != VERSION:
            raise DatasetError(f"{where}: format version {m.get('version')!r} "
                               f"is not supported (this ibtmpi reads {VERSION})")
        for key in ("classes", "image_shape", "splits", "mean", "std"):
            if key not in m:
                raise DatasetError(f"{where}: key {key!r} missing")
        shp = m["image_shape"]
        if m.get("dtype", "uint8") not in DTYPES:
            raise DatasetError(f"{where}: dtype {m['dtype']!r} is not one this ibtmpi reads "
                               f"({', '.join(DTYPES)})")
        if (not isinstance(shp, list) or len(shp) != 3
                or not all(isinstance(s, int) and s > 0 for s in shp)
                or int(np.prod(shp)) * np.dtype(m.get("dtype", "uint8")).itemsize
                > MAX_IMAGE_BYTES):
            raise DatasetError(f"{where}: bad image_shape {shp!r} "
                               f"(expected [H, W, C] of positive integers)")
        if not m["classes"] or len(set(m["classes"])) != len(m["classes"]):
            raise DatasetError(f"{where}: classes must be a non-empty list of "
                               f"distinct names")
        if "train" not in m["splits"]:
            raise DatasetError(f"{where}: no 'train' split")
        c = shp[2]
        if m.get("channels", c) != c:
            raise DatasetError(f"{where}: channels is {m['channels']!r}, image_shape "
                               f"says {c}")
        if len(m["mean"]) != c or len(m["std"]) != c or min(m["std"]) <= 0:
            raise DatasetError(f"{where}: mean/std must have {c} entries, std > 0")

    def _open_split(self, name, info):
        files = info.get("files")
        counts = info.get("counts")
        if (not isinstance(files, list) or not isinstance(counts, list)
                or len(files) != len(counts) or not files):
            raise DatasetError(f"{self.path}/dataset.json: split {name!r} needs "
                               f"matching non-empty 'files' and 'counts' lists")
        paths, labels, sizes = [], [], []
        for fname, count in zip(files, counts):
            # confine to the dataset directory: no absolute paths, no '..'
            if (os.path.isabs(fname) or os.path.basename(fname) != fname
                    or fname in (".", "..")):
                raise DatasetError(f"{self.path}/dataset.json: file name "
                                   f"{fname!r} must be a plain name inside "
                                   f"the dataset directory")
            p = os.path.join(self.path, fname)
            if not os.path.isfile(p):
                raise DatasetError(f"{p} is missing (listed in dataset.json, "
                                   f"split {name!r})")
            sizes.append(os.path.getsize(p))
            try:
                f = open_read(p)
            except OSError as e:
                raise DatasetError(f"{p}: cannot be read as HDF5 (truncated or "
                                   f"corrupt?): {e}") from None
            with f:
                try:
                    labels.append(self._check_file(p, f, count))
                except (OSError, RuntimeError, KeyError) as e:   # h5py names no file
                    raise DatasetError(f"{p}: cannot be read ({_h5_reason(e)}); the file "
                                       f"is damaged: re-create the data set with "
                                       f"`ibtmpi prep` or restore it") from None
            paths.append(p)
        return SplitReader(name, paths, counts, np.concatenate(labels), sizes)

    def _check_file(self, p, f, count):
        for key in ("images", "labels"):
            if key not in f:
                raise DatasetError(f"{p}: dataset {key!r} missing")
            self._check_storage(p, f, key)
        im, lb = f["images"], f["labels"]
        if not (im.fletcher32 and lb.fletcher32):
            self.unchecked.append(os.path.basename(p))
        if im.dtype != self.dtype or im.ndim != 4:
            raise DatasetError(f"{p}: 'images' must be {self.dtype} (n, H, W, C) (dataset.json's "
                               f"dtype), found {im.dtype} with shape {im.shape}")
        if tuple(im.shape[1:]) != self.image_shape:
            raise DatasetError(
                f"{p}: images are {tuple(im.shape[1:])}, dataset.json says "
                f"{self.image_shape} (shape mismatch between files)")
        if lb.ndim != 1 or lb.dtype.kind not in "iu":
            raise DatasetError(f"{p}: 'labels' must be integer (n,), found "
                               f"{lb.dtype} {lb.shape}")
        if lb.shape[0] != im.shape[0]:
            raise DatasetError(f"{p}: {im.shape[0]} images but {lb.shape[0]} labels")
        if im.shape[0] == 0:
            raise DatasetError(f"{p}: empty file (no images); remove it from "
                               f"dataset.json or re-run `ibtmpi prep`")
        if im.shape[0] != count:
            raise DatasetError(f"{p}: holds {im.shape[0]} images, dataset.json "
                               f"says {count}")
        cls = None
        if "classes" in f.attrs:          # its header first: a scalar string, not a huge array
            aid = f.attrs.get_id("classes")
            if aid.shape not in ((), (1,)) or aid.get_storage_size() > 1 << 20:
                raise DatasetError(f"{p}: attribute 'classes' is {aid.shape} of "
                                   f"{aid.get_storage_size()} bytes, not one JSON string")
            cls = f.attrs["classes"]
        if cls is not None:
            try:
                cls = json.loads(cls)
            except (TypeError, ValueError):
                raise DatasetError(f"{p}: attribute 'classes' is not a JSON list") from None
            if list(cls) != self.classes:
                raise DatasetError(f"{p}: classes {cls} differ from "
                                   f"dataset.json's {self.classes}")
        labels = lb[:].astype(np.int64)
        bad = np.flatnonzero((labels < 0) | (labels >= len(self.classes)))
        if len(bad):
            raise DatasetError(
                f"{p}: label {labels[bad[0]]} at row {bad[0]} is out of range "
                f"0..{len(self.classes) - 1} ({len(bad)} bad labels)")
        try:
            im[im.shape[0] - 1]               # truncated files fail here
        except (OSError, RuntimeError) as e:
            raise DatasetError(f"{p}: images cannot be read (truncated?): {e}") from None
        return labels

    @staticmethod
    def _check_storage(p, f, key):
        """The rows of `key` live in this file: not behind a soft or external
        link, not in external raw files, not a virtual dataset mapping other
        files. Each would read bytes from outside the dataset directory (the
        plain-name rule for dataset.json's files holds inside the shards too)."""
        h5py = _h5()
        link = f.get(key, getlink=True)
        if not isinstance(link, h5py.HardLink):
            raise DatasetError(f"{p}: {key!r} is a {type(link).__name__} (to "
                               f"{getattr(link, 'filename', '') or getattr(link, 'path', '')}); "
                               f"a shard must hold its own rows: re-create it with `ibtmpi prep`")
        d = f[key]
        if not isinstance(d, h5py.Dataset):
            raise DatasetError(f"{p}: {key!r} is not a dataset")
        if d.external:
            raise DatasetError(f"{p}: {key!r} is stored in external file(s) "
                               f"({', '.join(str(e[0]) for e in d.external[:3])}); "
                               f"a shard must hold its own rows: re-create it with `ibtmpi prep`")
        if d.is_virtual:
            raise DatasetError(f"{p}: {key!r} is a virtual dataset (rows mapped from "
                               f"other files); a shard must hold its own rows: re-create "
                               f"it with `ibtmpi prep`")

    def content_digest(self, budget=4096):
        """A digest of what the shards hold, for a resume to tell the data
        set it started on from a replaced one, wherever the directory was
        copied to (sizes and times change with a copy; content does not):
        per file its size in rows, all labels, and images spread evenly over
        it (`budget` images in all, at least 4 a file: a few MB read
        whatever the data set's size). A
        replaced shard that differs only in rows between the samples goes
        unseen; a regenerated or foreign one does not."""
        import hashlib
        h = hashlib.sha256()
        rows = max(4, budget // sum(len(sp.files) for sp in self.splits.values()))
        for name in sorted(self.splits):
            sp = self.splits[name]
            h.update(name.encode())
            sp._open()
            for s, c in enumerate(sp.counts):
                h.update(np.int64(c).tobytes())
                h.update(np.ascontiguousarray(
                    sp.labels[sp.offsets[s]:sp.offsets[s + 1]]).tobytes())
                for r in sorted({int(i) for i in np.linspace(0, c - 1, min(rows, c))}):
                    h.update(np.ascontiguousarray(sp._rows(s, r, r + 1)).tobytes())
                sp._check_size(s)
        return h.hexdigest()[:16]

    # -- access -----------------------------------------------------------
    @property
    def n_classes(self):
        return len(self.classes)

    def split(self, name):
        if name not in self.splits:
            raise DatasetError(f"{self.path}: no {name!r} split (has "
                               f"{', '.join(self.splits)})")
        return self.splits[name]

    def close(self):
        for s in self.splits.values():
            s.close()
