"""Block/split scheduling: disjoint, complete, deterministic, equal step
counts, for many (n, N, split, batch) combinations."""
import itertools

import numpy as np
import pytest

from ibtmpi.schedule import Schedule, split_size_for, worker_range

COMBOS = list(itertools.product(
    [97, 100, 1000, 1003],        # n
    [1, 2, 3, 4, 7, 10],          # workers
    [5, 16, 50, 124],             # split size
    [1, 4, 8],                    # batch
))


@pytest.mark.parametrize("n,N,split,batch", COMBOS)
def test_schedule_properties(n, N, split, batch):
    if n < N * batch:
        with pytest.raises(ValueError, match="fewer than"):
            Schedule(n, N, split, batch)
        return
    s = Schedule(n, N, split, batch, seed=3)
    for p in range(2):
        seen = []
        for b in range(s.blocks_per_pass):
            k = s.steps_in_block(b)
            per_worker = [s.minibatches(w, p, b) for w in range(N)]
            # every worker runs the same number of minibatches
            assert all(len(m) == k for m in per_worker)
            for w, mbs in enumerate(per_worker):
                lo, hi = s.ranges[w]
                for mb in mbs:
                    assert len(mb) <= batch
                    assert (np.diff(mb) > 0).all()          # sorted, unique
                    assert ((mb >= lo) & (mb < hi)).all()   # own range only
                    seen.append(mb)
        seen = np.concatenate(seen)
        # every sample exactly once per pass
        assert len(seen) == n
        assert np.array_equal(np.sort(seen), np.arange(n))


def test_ranges_are_balanced_and_disjoint():
    for n, N in [(10, 3), (1003, 7), (5, 5)]:
        r = [worker_range(n, N, i) for i in range(N)]
        assert r[0][0] == 0 and r[-1][1] == n
        assert all(a[1] == b[0] for a, b in zip(r, r[1:]))
        sizes = [e - s for s, e in r]
        assert max(sizes) - min(sizes) <= 1


def test_deterministic_and_reshuffled_per_pass():
    a = Schedule(1000, 4, 50, 8, seed=1)
    b = Schedule(1000, 4, 50, 8, seed=1)
    c = Schedule(1000, 4, 50, 8, seed=2)
    assert np.array_equal(a.split(2, 0, 3), b.split(2, 0, 3))
    assert not np.array_equal(a.split(2, 0, 3), c.split(2, 0, 3))
    assert not np.array_equal(a.split(2, 0, 3), a.split(2, 1, 3))


def test_paper_fixed_block_sizes():
    # 10x496, 20x248, 40x124 from one block of 4960
    assert [split_size_for(block_size=4960, n_workers=n) for n in (10, 20, 40)] \
        == [496, 248, 124]
    s = Schedule(20000, 40, 124, 32)
    assert s.blocks_per_pass == 4          # 500 samples per worker // 124
    assert s.split_len(0, 3) == 500 - 3 * 124
    with pytest.raises(ValueError):
        split_size_for(block_size=10, split_size=5)
    with pytest.raises(ValueError):
        split_size_for(block_size=3, n_workers=4)


def test_locate_and_bad_block():
    s = Schedule(100, 2, 10, 5)
    assert s.blocks_per_pass == 5
    assert s.locate(12) == (2, 2)
    with pytest.raises(IndexError):
        s.split(0, 0, 5)
