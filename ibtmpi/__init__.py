"""ibtmpi: MPI training of CNN image classifiers by Incremental Block Training
(IBT) with global-consensus ADMM. See README.md and docs/."""
import os as _os
import time as _time

__version__ = "0.1.0"
IMPORTED_AT = _time.time()     # start-up time where /proc cannot say

# OpenBLAS's worker threads busy-wait 2^28 cycles (about 0.1 s) after each
# BLAS call before they sleep: a rank that goes from a GEMM into a wait (the
# master between evaluation batches, a worker at the block's Allreduce)
# burns all its BLAS threads meanwhile. Seen on a 16-core GPU node: the
# one-process GPU run's rank 0 used 14.6 cores' CPU time over its wall time,
# 1.9 with 2^20 cycles (about 0.4 ms), as fast. Read when OpenBLAS loads
# (with numpy): a value the user set stays. docs/config.md, run.threads.
_os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "20")

# Installed, kernels/ and data_prep/ are the subpackages ibtmpi.kernels and
# ibtmpi.data_prep (setup.py maps them). In a source checkout they sit beside
# this package; `python -m ibtmpi` run from the checkout (as mpiexec does for
# the demo) must find them the same way.
_here = _os.path.dirname(_os.path.abspath(__file__))
_root = _os.path.dirname(_here)
if (not _os.path.isdir(_os.path.join(_here, "kernels"))
        and _os.path.isfile(_os.path.join(_root, "kernels", "__init__.py"))
        and _os.path.isfile(_os.path.join(_root, "data_prep", "__init__.py"))):
    __path__.append(_root)
