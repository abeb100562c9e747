"""Durable file writes shared by the dataset writer and the checkpoints."""
import os


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
