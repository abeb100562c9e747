"""The mpiexec that belongs to mpi4py's MPI, and what it needs to start a
given number of ranks on this machine.

``ibtmpi demo`` and ``ibtmpi bench run`` start their own jobs. MPICH's Hydra
starts any number of ranks as any user. Open MPI refuses two things a
laptop or a container meets at once: more ranks than cores ("not enough
slots") and running as root; both take an explicit option, which
``command`` adds, visibly, only where it is needed. A launcher we cannot
identify gets no extra options.
"""
import os
import shutil
import subprocess
import sys
from functools import lru_cache

from .errors import LauncherError


def find_mpiexec():
    """The venv's own mpiexec first (the one mpi4py's MPI came with), then
    mpiexec or mpirun on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.path.exists(here):
        return here
    found = shutil.which("mpiexec") or shutil.which("mpirun")
    if not found:
        raise LauncherError("no mpiexec found: install the 'mpich' extra "
                            "(pip install 'ibtmpi[mpich]') or load your MPI module")
    return found


@lru_cache(maxsize=None)
def flavor(mpiexec):
    """'openmpi', 'hydra' (MPICH, Intel MPI, MVAPICH) or 'unknown', from the
    launcher's --version output."""
    try:
        r = subprocess.run([mpiexec, "--version"], capture_output=True, text=True,
                           timeout=20, stdin=subprocess.DEVNULL)
        text = (r.stdout + r.stderr).lower()
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    if "open mpi" in text or "openrte" in text or "prte" in text:
        return "openmpi"
    if "hydra" in text or "intel(r) mpi" in text:
        return "hydra"
    return "unknown"


def options(mpiexec, nprocs, cores=None, euid=None):
    """Extra launcher options for `nprocs` ranks on this machine."""
    if flavor(mpiexec) != "openmpi":
        return []
    if cores is None:
        from .threads import usable_cores
        cores = usable_cores()
    euid = os.geteuid() if euid is None else euid
    opts = []
    if nprocs > cores:
        opts.append("--oversubscribe")          # Open MPI 4 and 5 both take it
    if euid == 0:
        opts.append("--allow-run-as-root")
    return opts


def command(nprocs, mpiexec=None):
    """[mpiexec, options...] to start `nprocs` ranks here; the caller adds
    -n and the program (an MPMD line's ranks count together)."""
    mpiexec = mpiexec or find_mpiexec()
    return [mpiexec] + options(mpiexec, nprocs)


def srun_mpi_plugin(kind):
    """srun's --mpi for a launcher flavor (flavor()): pmix for Open MPI (4
    and later are built with PMIx), pmi2 for Hydra's MPIs and otherwise
    (the PyPI MPICH wheel; stock Debian Slurm has pmi2 but may lack PMIx)."""
    return "pmix" if kind == "openmpi" else "pmi2"


def _as_typed(path, name):
    """`name` where it is on PATH and is `path`; else `path` itself."""
    on_path = shutil.which(name)
    if on_path and os.path.realpath(on_path) == os.path.realpath(path):
        return name
    return path


def rerun_prefix(world):
    """How to start this same command again, as a user can paste it: the
    launcher (where world > 1) and the ibtmpi program, each by name where
    PATH finds the one that runs now, else by its path (a venv that is not
    activated: `.venv/bin/mpiexec ... .venv/bin/ibtmpi`)."""
    prog = sys.argv[0] if sys.argv and sys.argv[0] else "ibtmpi"
    if os.path.basename(prog) == "__main__.py":         # python -m ibtmpi
        out = [_as_typed(sys.executable, "python3"), "-m", "ibtmpi"]
    else:
        out = [_as_typed(prog, "ibtmpi")]
    if world > 1:
        try:
            launcher = find_mpiexec()
        except LauncherError:
            launcher = "mpiexec"
        out = [_as_typed(launcher, "mpiexec"), "-n", str(world)] + out
    return out
