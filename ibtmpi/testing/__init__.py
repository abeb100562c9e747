"""What tests and rehearsals use in place of a GPU: fakecupy.py, a CuPy
stand-in (NumPy arrays under CuPy's rules, the CUDA kernels run through
their host twins, kernels/host_emu.h) with fakecupy_async.py's streams,
events and graphs, strict enough that a missing wait shows. Used by
tests/, tests/standin/cupy (a rehearsal of the GPU scripts on a CPU) and
benchmarks/bench_gpu_host.py; nothing in the training path imports it.
And `slow_worker`, the straggler the tests plant.
"""


def slow_worker(monkeypatch, seconds, worker=None):
    """Every block, worker `worker` of this process (None: each of them)
    sleeps `seconds` before its steps (WorkerGroup.swap_in): a straggler."""
    import time

    from ..train.workers import WorkerGroup
    orig = WorkerGroup.swap_in

    def slow(self, i):
        if worker is None or i == worker:
            time.sleep(seconds)
        return orig(self, i)
    monkeypatch.setattr(WorkerGroup, "swap_in", slow)
