"""Every way an ibtmpi command ends: its exit statuses and the error
classes the command line turns into them (docs/reliability.md's table;
docs/design.md section 7). Nothing here imports the rest of the library,
so any module may raise these without an import cycle.

Tests: tests/unit/test_errors.py (this table against the docs and the
library: no error class or exit status is defined anywhere else).
"""
from __future__ import annotations

EXIT_OK = 0
EXIT_CRASHED = 1            # a rank crashed or hung: one line, the job aborted
EXIT_USAGE = 2              # bad input found before training: config, data, launch
EXIT_DIVERGED = 4           # non-finite loss or model; the last good checkpoint kept
EXIT_NO_MEMORY = 71         # EX_OSERR: the system could not give what was asked
EXIT_STORAGE = 74           # a write failed: disk full, quota, read-only (EX_IOERR)
EXIT_PREEMPTED = 75         # checkpointed after SIGTERM/SIGUSR1: resubmit to resume
EXIT_INTERRUPTED = 130      # Ctrl-C: checkpointed at the end of the block (or at once)

EXIT_STATUSES = {EXIT_OK: "finished", EXIT_CRASHED: "a rank crashed or hung",
                 EXIT_USAGE: "bad input", EXIT_DIVERGED: "diverged",
                 EXIT_NO_MEMORY: "out of memory", EXIT_STORAGE: "a write failed",
                 EXIT_PREEMPTED: "preempted", EXIT_INTERRUPTED: "interrupted"}


# -- bad input: one line, exit 2 ---------------------------------------------
class UsageError(Exception):
    """Bad input on the command line: reported in one line, exit status 2."""


class ConfigError(Exception):
    """Bad configuration: reported in one line, exit status 2."""


class DatasetError(Exception):
    """A dataset directory or file is missing, corrupt or inconsistent
    (exit 2; in mid-run a rank's own, the job aborted)."""


class CheckpointError(Exception):
    """A checkpoint is missing, incomplete, foreign or malformed (exit 2)."""


class DamagedCheckpoint(CheckpointError):
    """A manifest that cannot be read as one (a resume sets the checkpoint
    aside and tries the previous one), not one of another version."""


class RunDirBusy(CheckpointError):
    """Another live run holds the run directory (exit 2)."""


class DeviceError(Exception):
    """A device was asked for that this machine cannot provide (exit 2)."""


class KernelError(Exception):
    """A CUDA kernel failed to compile or to match its host twin (exit 2)."""


class LauncherError(RuntimeError):
    """mpiexec, srun or the MPI library cannot launch what was asked (exit 2)."""


class MPIUnavailable(RuntimeError):
    """Several ranks were launched but this process has no usable MPI (exit 2)."""


class TrainedModelError(Exception):
    """A model file or run directory that evaluate, predict or export cannot
    use (exit 2)."""


class NoPlotting(Exception):
    """matplotlib is not installed (it is an extra: ibtmpi[plot]); exit 2."""


# -- how a training job ends ---------------------------------------------------
class Preempted(Exception):
    """All ranks agreed to stop after a signal; a checkpoint was written
    (exit 75, or 130 after Ctrl-C)."""


class Diverged(Exception):
    """Non-finite loss or model; the last good checkpoint is kept (exit 4)."""


class WatchdogTimeout(RuntimeError):
    """A block ran past run.watchdog_s; names the ranks that had not
    arrived (exit 1, the job aborted)."""


class InjectedFault(RuntimeError):
    """A fault planted by IBTMPI_FAULT (tests): the crash path, exit 1."""


def agreed(err):
    """Mark an error that every rank raised alike, after a collective that
    told them all: the job then ends in order (exit 2, one line from rank 0),
    without MPI_Abort."""
    err.agreed = True
    return err
