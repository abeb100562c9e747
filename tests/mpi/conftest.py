"""MPI tests run as `mpiexec -n N pytest --with-mpi tests/mpi`: every rank
runs every test. A --junitxml path gets a per-rank suffix so ranks do not
overwrite each other's report."""
import os


def pytest_configure(config):
    xml = getattr(config.option, "xmlpath", None)
    if xml:
        from mpi4py import MPI
        root, ext = os.path.splitext(xml)
        config.option.xmlpath = f"{root}.rank{MPI.COMM_WORLD.Get_rank()}{ext}"
