"""Checkpoints: one file per rank plus a manifest written last by the master.

Layout: ``RUN/checkpoints/ckpt-BBBBBBBB/rank-RRRRR.npz`` (B: the last
block done) and ``manifest.json``. Why per-rank files: each worker's duals,
momentum and (easgd) own model are P floats each; gathering N of them to
the master would be an extra collective of N*P floats per checkpoint,
while every rank writing its own file costs nothing extra on a shared
file system (which a multi-node run directory is). The replicated state
(z, z_g, block momentum, sum of duals, rho) is in rank 0's file only.

Every file is written to a temporary name, fsynced and renamed. The master
writes the manifest only after all ranks confirmed their file (through the
next block's Allreduce flags, or one small final sync), so a directory
without manifest.json is incomplete and never used. The last ``keep``
complete checkpoints are kept.

Reading is defensive (files may come from other people): no pickle
(np.load(allow_pickle=False)), every array's shape and dtype are read from
its .npy header and checked against what this run expects BEFORE it is
loaded, and paths in the manifest must be plain names inside the
checkpoint directory. Test: tests/unit/test_checkpoint.py.
"""
from __future__ import annotations

import json
import os
import shutil
import zipfile
import zlib

import numpy as np

from .errors import CheckpointError, DamagedCheckpoint
from .fsutil import fsync_dir

FORMAT = "ibtmpi-checkpoint"
VERSION = 1


def stamp(run_id, block):
    """What each rank file of checkpoint `block` of run `run_id` carries (its
    array ``stamp``), so a file copied in from another run or block is
    refused: the manifest records the run id, not the files' contents."""
    return f"{run_id}/{block}"


def check_stamp(path, want):
    """CheckpointError where the rank file at `path` does not carry `want`
    (stamp(run_id, block) of the manifest that lists it)."""
    got = str(read_rank(path, {"stamp": ((), "text")})["stamp"])
    if got != want:
        raise CheckpointError(f"{path} belongs to another checkpoint (it says {got!r}, the "
                              f"manifest {want!r}: copied in from another run or block?)")


def new_run_id():
    import uuid
    return uuid.uuid4().hex[:16]


def ckpt_dir(run_dir, block):
    return os.path.join(run_dir, "checkpoints", f"ckpt-{block:08d}")


def rank_file(rank):
    return f"rank-{rank:05d}.npz"


def write_rank(run_dir, block, rank, arrays):
    """Atomically write this rank's arrays (name -> ndarray)."""
    d = ckpt_dir(run_dir, block)
    os.makedirs(d, exist_ok=True)
    final = os.path.join(d, rank_file(rank))
    tmp = final + f".tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException as e:
        _discard(tmp)            # a full disk gets its space back
        if isinstance(e, OSError) and not e.filename:
            e.filename = final   # np.savez into a file object names no file
        raise
    return final


class BackgroundWrite:
    """write_rank in a thread, from arrays the caller no longer changes (its
    copies): the write and its fsync overlap the next block's compute.
    join() waits and raises what the write raised; `seconds` is how long
    it took."""

    def __init__(self, run_dir, block, rank, arrays):
        import threading
        self.block, self.error, self.seconds = block, None, 0.0
        self.thread = threading.Thread(target=self._write, args=(run_dir, block, rank, arrays),
                                       name=f"checkpoint-{block}", daemon=True)
        self.thread.start()

    def _write(self, run_dir, block, rank, arrays):
        import time
        t0 = time.perf_counter()
        try:
            write_rank(run_dir, block, rank, arrays)
        except BaseException as e:       # re-raised in the training thread
            self.error = e
        self.seconds = time.perf_counter() - t0

    def join(self):
        self.thread.join()
        if self.error is not None:
            raise self.error


def _discard(path):
    try:
        os.unlink(path)
    except OSError:
        pass


def write_manifest(run_dir, block, meta, keep=2):
    d = ckpt_dir(run_dir, block)
    m = {"format": FORMAT, "version": VERSION, "block": block, **meta}
    tmp = os.path.join(d, f"manifest.json.tmp-{os.getpid()}")
    try:
        with open(tmp, "w") as f:
            json.dump(m, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, os.path.join(d, "manifest.json"))
    except BaseException:
        _discard(tmp)
        raise
    fsync_dir(d)
    prune(run_dir, keep)


def complete(run_dir):
    """Blocks of complete checkpoints (with a manifest), ascending."""
    root = os.path.join(run_dir, "checkpoints")
    if not os.path.isdir(root):
        return []
    out = []
    for name in os.listdir(root):
        if name.startswith("ckpt-") and name[5:].isdigit() and os.path.isfile(
                os.path.join(root, name, "manifest.json")):
            out.append(int(name[5:]))
    return sorted(out)


def any_checkpoint(run_dir):
    root = os.path.join(run_dir, "checkpoints")
    return os.path.isdir(root) and any(n.startswith("ckpt-") for n in os.listdir(root))


def prune(run_dir, keep):
    """Keep the newest `keep` complete checkpoints; drop older ones and any
    incomplete directory older than the newest complete one."""
    done = complete(run_dir)
    if not done:
        return
    keep_set = set(done[-keep:])
    root = os.path.join(run_dir, "checkpoints")
    for name in os.listdir(root):
        if not (name.startswith("ckpt-") and name[5:].isdigit()):
            continue
        b = int(name[5:])
        if b not in keep_set and b < done[-1]:
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)


def read_manifest(run_dir, block):
    p = os.path.join(ckpt_dir(run_dir, block), "manifest.json")
    try:
        with open(p) as f:
            m = json.load(f)
    except (OSError, ValueError) as e:
        raise DamagedCheckpoint(f"{p}: cannot be read ({' '.join(str(e).split())})") from None
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise DamagedCheckpoint(f"{p}: not an ibtmpi checkpoint manifest (format "
                                f"{m.get('format') if isinstance(m, dict) else None!r})")
    if m.get("version") != VERSION:
        raise CheckpointError(f"{p}: manifest version {m.get('version')!r}; this ibtmpi "
                              f"reads version {VERSION} (written by another ibtmpi "
                              f"release: resume with that one, or use another run.dir)")
    for f in m.get("files", []):
        if not isinstance(f, str) or os.path.basename(f) != f or f in (".", ".."):
            raise CheckpointError(f"{p}: file name {f!r} must be a plain name inside "
                                  f"the checkpoint directory")
    return m


def _npy_header(zf, member):
    with zf.open(member) as f:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
        else:
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
    return tuple(shape), np.dtype(dtype)


# dtype kinds read_rank accepts in place of one dtype: the model file's
# metadata (strings, the input shape, the normalisation); a string may hold
# up to TEXT_MAX characters (a layer list in JSON is a few KiB)
KINDS = {"text": "U", "int": "iu", "float": "f"}
TEXT_MAX = 1 << 20


def _matches(got_shape, got_dtype, shape, dtype):
    if got_shape != tuple(shape):
        return False
    if dtype in KINDS:
        return (got_dtype.kind in KINDS[dtype]
                and (dtype != "text" or got_dtype.itemsize <= 4 * TEXT_MAX))
    return got_dtype == np.dtype(dtype)


def read_rank(path, expect):
    """Load the arrays named in `expect` {name: (shape, dtype)} from one rank
    file (or model file), checking each header first, so a file that
    declares a huge array is refused before anything is allocated; extra
    members are ignored. dtype may be a kind of KINDS ('text', 'int',
    'float') instead of one dtype; an entry (shape, dtype, "optional") may
    be missing (state added after older checkpoints were written)."""
    if not os.path.isfile(path):
        raise CheckpointError(f"{path} is missing")
    try:
        zf = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as e:
        raise CheckpointError(f"{path}: not a readable checkpoint file ({e})") from None
    with zf:
        names = set(zf.namelist())
        present = {}
        for name, (shape, dtype, *optional) in expect.items():
            member = f"{name}.npy"
            if member not in names:
                if optional:
                    continue
                raise CheckpointError(f"{path}: array {name!r} missing")
            present[name] = True
            try:
                got_shape, got_dtype = _npy_header(zf, member)
            except ValueError as e:
                raise CheckpointError(f"{path}: array {name!r} has a bad header ({e})") from None
            if not _matches(got_shape, got_dtype, shape, dtype):
                want = dtype if dtype in KINDS else np.dtype(dtype)
                raise CheckpointError(
                    f"{path}: array {name!r} is {got_dtype}{list(got_shape)}, this run "
                    f"expects {want}{list(shape)} (a checkpoint of another "
                    f"model or configuration?)")
            info = zf.getinfo(member)
            stored = info.file_size           # what the zip's directory says, bounded by
            if info.compress_type == zipfile.ZIP_STORED:      # what the file can hold
                stored = min(stored, info.compress_size, os.path.getsize(path))
            if int(np.prod(got_shape, dtype=object)) * got_dtype.itemsize > stored:
                raise CheckpointError(                 # a header that declares more
                    f"{path}: array {name!r} declares {got_dtype}{list(got_shape)} but "
                    f"the file holds {stored} bytes of it (damaged or forged)")
    try:
        with np.load(path, allow_pickle=False) as z:
            return {name: z[name] for name in present}
    except (zipfile.BadZipFile, ValueError, EOFError, zlib.error, OSError) as e:
        raise CheckpointError(f"{path}: its data cannot be read ({e}): damaged "
                              f"(a flipped bit fails the zip's CRC)") from None
