"""Durable file writes shared by the dataset writer and the checkpoints, and
how a failed write is reported."""
import errno
import os

from .errors import EXIT_STORAGE

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


def read_jsonl(path):
    """The records (JSON objects) of a JSON-lines file such as metrics.jsonl,
    up to its first line that is not one: a torn last line, bytes that are
    not UTF-8, anything but an object. [] where the file cannot be read.
    Every reader of a run's metrics goes through here (status, plot, bench,
    a resume), so a damaged file is read as far as it is whole, never a
    traceback."""
    import json
    recs = []
    try:
        with open(path, "rb") as f:
            for raw in f:
                try:
                    rec = json.loads(raw.decode("utf-8"))
                except (UnicodeDecodeError, ValueError):
                    break
                if not isinstance(rec, dict):
                    break
                recs.append(rec)
    except OSError:
        pass
    return recs


def replace_file(path, data):
    """Write `data` (str or bytes) to `path` through a temporary name and a
    rename: a symbolic link planted at `path` is replaced by the file, never
    written through, and a reader never sees half a file."""
    d = os.path.dirname(path) or "."
    tmp = os.path.join(d, f".{os.path.basename(path)}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb" if isinstance(data, bytes) else "w") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError) and e.filename in (tmp, None):
            e.filename, e.filename2 = path, None    # the file asked for, not the temporary
        raise


def open_append(path, truncate=False):
    """A text file opened for appending (or truncated), never through a
    symbolic link (O_NOFOLLOW: ELOOP names the link)."""
    flags = os.O_WRONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | (
        os.O_TRUNC if truncate else os.O_APPEND)
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise OSError(errno.ELOOP, "a symbolic link: ibtmpi does not write through "
                                       "links in a run directory; remove it", path) from None
        raise
    return os.fdopen(fd, "w")


# what a run directory holds that ibtmpi writes, looked at for links at start
LINK_CHECKED_DIRS = ("checkpoints", ".ranks", "timeline")


def planted_links(run_dir):
    """Symbolic links where ibtmpi writes in run_dir: its entries, and
    everything under checkpoints/, .ranks/ and timeline/ (the run directory
    itself may be a link: a run kept on scratch)."""
    out = []
    try:
        names = sorted(os.listdir(run_dir))
    except OSError:
        return out
    for name in names:
        p = os.path.join(run_dir, name)
        if os.path.islink(p):
            out.append(p)
        elif name in LINK_CHECKED_DIRS and os.path.isdir(p):
            for root, dirs, files in os.walk(p):
                out += [os.path.join(root, n) for n in sorted(dirs + files)
                        if os.path.islink(os.path.join(root, n))]
    return out


def save_figure(fig, path, dpi=100):
    """A matplotlib figure written like replace_file (never through a link)."""
    import io
    buf = io.BytesIO()
    fig.savefig(buf, format=os.path.splitext(path)[1][1:] or "png", dpi=dpi)
    replace_file(path, buf.getvalue())
