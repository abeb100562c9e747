"""Durable file writes shared by the dataset writer and the checkpoints, and
how a failed write is reported."""
import errno
import os

EXIT_STORAGE = 74      # a write failed: disk full, quota, read-only (EX_IOERR)
_STORAGE = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO, errno.EFBIG)


def is_storage_error(e):
    """The file system, not the caller, is at fault: disk full, quota,
    read-only, I/O error, file too large."""
    return getattr(e, "errno", None) in _STORAGE


def os_error_exit(prog, e):
    """One line for an OSError that ends a command, and its exit status:
    EXIT_STORAGE where the file system failed, 2 (bad input) where the path
    given cannot be used (missing parent, not a directory, no permission)."""
    where = e.filename if e.filename is not None else "a file"
    if e.filename2 is not None:
        where = f"{where} -> {e.filename2}"
    reason = e.strerror or str(e)
    if is_storage_error(e):
        return (f"{prog}: error: cannot write {where}: {reason}; free space (or "
                f"fix the file system) and run it again", EXIT_STORAGE)
    return f"{prog}: error: {where}: {reason}", 2


def fsync_path(path):
    """fsync a file or directory by path."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path):
    """fsync a directory (its entries: renames); ignored where unsupported."""
    try:
        fsync_path(path)
    except OSError:
        pass
