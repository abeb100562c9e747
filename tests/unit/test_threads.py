import os

import numpy as np
import pytest

from ibtmpi import threads


@pytest.mark.parametrize("ranks,cores,node,expect", [
    (1, 2, 2, 2), (2, 2, 2, 1), (3, 2, 2, 1), (4, 16, 16, 4),
    (5, 16, 16, 3), (4, 1, 8, 1), (2, 4, 16, 4),
])
def test_default_threads(ranks, cores, node, expect):
    assert threads.default_threads(ranks, cores, node) == expect


@pytest.mark.parametrize("ranks,cores,node,load,expect", [
    (1, 2, 2, 0.4, 2), (1, 2, 2, 1.0, 2), (1, 2, 2, 1.2, 1), (1, 2, 2, 2.9, 1),
    (1, 16, 16, 4.5, 12), (4, 16, 16, 8.5, 2), (4, 16, 16, 40, 1),
    (1, 4, 16, 12.0, 4),            # pinned: the launcher's budget, whatever the load
])
def test_auto_threads_leave_the_cores_other_work_keeps_busy(ranks, cores, node, load, expect):
    """A lone run on a loaded 2-core machine took 22.5 s at 2 BLAS threads and
    5.0-7.1 s at 1 (hardening round 3): auto counts the load average, less
    half a core of noise, as cores in use."""
    assert threads.default_threads(ranks, cores, node, load=load) == expect


def test_configure_limits_blas(monkeypatch):
    assert threads.configure(1, ranks_on_node=1) == 1
    assert threads.current_blas_threads() == 1
    n = threads.configure("auto", ranks_on_node=1)
    assert n == threads.default_threads(1, load=threads.chosen["load"])
    monkeypatch.setattr(threads, "load_average", lambda: 50.0)
    monkeypatch.setattr(threads, "usable_cores", lambda: 2)
    monkeypatch.setattr(threads.os, "cpu_count", lambda: 2)
    assert threads.configure("auto", ranks_on_node=1) == 1
    assert threads.chosen["note"].startswith("run.threads auto: 1 BLAS thread(s) a rank, "
                                             "not 2: the node's load (50.0)")
    with pytest.raises(ValueError):
        threads.configure(-1)


SPIN = """
import time, numpy as np
from threadpoolctl import threadpool_limits
threadpool_limits(2)
a = np.ones((384, 384), np.float32)
a @ a
best = 1.0
for _ in range(3):
    a @ a                          # then a wait, as before an Allreduce
    c0 = time.process_time()
    time.sleep(0.3)
    best = min(best, time.process_time() - c0)
import os
print(os.environ.get("OPENBLAS_THREAD_TIMEOUT"), best)
"""


@pytest.mark.parametrize("first", ["import ibtmpi", "pass"])
def test_blas_threads_sleep_soon_after_a_call(first):
    """Importing ibtmpi before numpy makes OpenBLAS's threads sleep about
    0.4 ms after a call instead of busy-waiting about 0.1 s: the CPU time
    of a process sleeping 0.3 s right after a 2-thread GEMM. Without the
    import (the control) the spin shows, where OpenBLAS is numpy's BLAS."""
    import subprocess
    import sys
    from threadpoolctl import threadpool_info
    np.ones(2) @ np.ones(2)                  # numpy's BLAS is loaded
    if not any(p.get("internal_api") == "openblas" for p in threadpool_info()):
        pytest.skip("numpy's BLAS here is not OpenBLAS")
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    out = subprocess.run([sys.executable, "-c", first + "\n" + SPIN], env=env,
                         capture_output=True, text=True, check=True).stdout.split()
    if first == "pass":
        assert out[0] == "None"
        if os.cpu_count() >= 2:
            assert float(out[1]) > 0.02, out     # the other thread spun
    else:
        assert out[0] == "20"
        assert float(out[1]) < 0.01, out
