"""Assertions that only rank 0 can make, failing on every rank together.

Written as `if rank == 0: assert ...` followed by a collective, a failed
assertion leaves the other ranks waiting in that collective until the test
timeout, and the ranks then disagree on which test runs next. on_master(check)
runs check() on rank 0 and broadcasts its error, so every rank fails the same
test at once and the next test starts together."""
import traceback

import pytest
from mpi4py import MPI


def on_master(check):
    W = MPI.COMM_WORLD
    err = None
    if W.Get_rank() == 0:
        try:
            check()
        except Exception as e:          # AssertionError included
            err = "".join(traceback.format_exception_only(type(e), e)).strip()
            tb = traceback.format_exc()
    err = W.bcast(err, root=0)
    if err is not None:
        if W.Get_rank() == 0:
            pytest.fail(f"{err}\n{tb}", pytrace=False)
        pytest.fail(f"rank 0 failed: {err}", pytrace=False)
