"""The trainer with real CuPy workers against the NumPy backend, and the
no-host-sync local steps, on a real GPU. Skipped where CuPy or a device is
missing. Run: pytest -m gpu tests/gpu"""
import os
import sys

import numpy as np
import pytest

from ibtmpi import backend

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "unit"))
import conftest as _unit  # noqa: E402

small_dataset = _unit.small_dataset     # the unit suite's data set fixture

OK, WHY = backend.gpu_status()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not OK, reason=f"no GPU: {WHY}")]


@pytest.mark.parametrize("algo", ["admm", "ibt", "easgd", "ssgd"])
def test_gpu_workers_match_the_host_backend(small_dataset, tmp_path, algo):
    from test_device_path import device_vs_host
    # cuBLAS sums in another order than NumPy's BLAS: close, not bitwise
    device_vs_host(small_dataset, tmp_path, algo, backend.GpuOps(), 1e-3)


def test_step_grad_keeps_the_loss_on_the_device():
    """The fused loss end (softmax_xent_train) on the GPU: the gradient of
    the eager path, the stats on the device until read."""
    from ibtmpi.model import Model
    g = backend.GpuOps()
    rng = np.random.default_rng(1)
    x = rng.standard_normal((8, 3, 16, 16)).astype(np.float32)
    y = rng.integers(0, 5, 8)
    m = Model("tiny", (3, 16, 16), 5, ops=g)
    loss, c = m.loss_and_grad(x, y)
    grads = g.asnumpy(m.grads)
    stats = m.new_stats(8)
    m.step_grad(x, y, stats)
    assert isinstance(stats, g.cp.ndarray)
    np.testing.assert_allclose(g.asnumpy(m.grads), grads, rtol=1e-6, atol=1e-7)
    got = m.read_stats(stats)
    assert got[0] == pytest.approx(loss * 8, rel=1e-6) and got[1] == c


def test_pool_figure_and_out_of_memory():
    """pool_bytes (the workers' gpu_pool_mib) grows with a step's arrays; a
    pool limit (CuPy's set_limit, what CUPY_GPU_MEMORY_LIMIT sets) below a
    step's need raises a MemoryError, which `ibtmpi train` turns into
    exit 71 with one line; after the limit is lifted the same step runs."""
    from ibtmpi.model import Model
    g = backend.GpuOps()
    pool = g.cp.get_default_memory_pool()
    pool.free_all_blocks()                       # this test's mark, not an earlier one's
    m = Model("tiny", (3, 16, 16), 5, ops=g)
    x = np.random.default_rng(2).standard_normal((64, 3, 16, 16)).astype(np.float32)
    y = np.arange(64) % 5
    m.step_grad(x, y, m.new_stats(64))
    held = g.pool_bytes()
    assert held >= m.size * 4 * 2                # at least params and grads
    # a step 16 times as large: its activations cannot fit in the blocks
    # the pool keeps (real CuPy keeps the free parts of split blocks, which
    # free_all_blocks cannot hand back, so the same step can fit in them)
    x16, y16 = np.tile(x, (16, 1, 1, 1)), np.tile(y, 16)
    pool.free_all_blocks()
    pool.set_limit(size=pool.total_bytes() + 64 * 1024)   # room for 64 KiB more
    try:
        with pytest.raises(MemoryError, match="[Oo]ut of memory"):
            m.step_grad(x16, y16, m.new_stats(1024))
    finally:
        pool.set_limit(size=0)
    m.step_grad(x16, y16, m.new_stats(1024))
    assert g.pool_bytes() > held
