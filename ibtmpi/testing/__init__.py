"""What tests and rehearsals use in place of a GPU: fakecupy.py, a CuPy
stand-in (NumPy arrays under CuPy's rules, the CUDA kernels run through
their host twins, kernels/host_emu.h) with fakecupy_async.py's streams,
events and graphs, strict enough that a missing wait shows. Used by
tests/, tests/standin/cupy (a rehearsal of the GPU scripts on a CPU) and
benchmarks/bench_gpu_host.py; nothing in the training path imports it.
"""
