"""MPI tests run as `mpiexec -n N pytest --with-mpi tests/mpi`: every rank
runs every test. A --junitxml path gets a per-rank suffix so ranks do not
overwrite each other's report. `dataset`: a small synthetic set made by
rank 0 and shared by every test module."""
import os
import shutil
import tempfile

import pytest


def pytest_configure(config):
    xml = getattr(config.option, "xmlpath", None)
    if xml:
        from mpi4py import MPI
        root, ext = os.path.splitext(xml)
        config.option.xmlpath = f"{root}.rank{MPI.COMM_WORLD.Get_rank()}{ext}"


@pytest.fixture(scope="session")
def dataset():
    from mpi4py import MPI
    path = None
    if MPI.COMM_WORLD.Get_rank() == 0:
        from ibtmpi.data_prep.prep import prep_synth
        path = os.path.join(tempfile.mkdtemp(prefix="ibtmpi-mpi-"), "d")
        prep_synth(path, n=400, size=16, seed=2, shards=3, quiet=True)
    path = MPI.COMM_WORLD.bcast(path, root=0)
    yield path
    MPI.COMM_WORLD.Barrier()
    if MPI.COMM_WORLD.Get_rank() == 0:
        shutil.rmtree(os.path.dirname(path), ignore_errors=True)


