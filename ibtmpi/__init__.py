"""ibtmpi: MPI training of CNN image classifiers by Incremental Block Training
(IBT) with global-consensus ADMM. See README.md and docs/."""
__version__ = "0.1.0"
