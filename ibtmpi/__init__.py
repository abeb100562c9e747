"""ibtmpi: MPI training of CNN image classifiers by Incremental Block Training
(IBT) with global-consensus ADMM. See README.md and docs/."""
import os as _os

__version__ = "0.1.0"

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
