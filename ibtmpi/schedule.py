"""Which training samples each worker uses in each block: pure index math.

Global sample index space: the training samples of all shards in order,
[0, n). Worker i of N owns the contiguous range [i*n//N, (i+1)*n//N)
(sizes differ by at most one; any N works with any number of shards).

Per pass p, worker i visits its range in the order of a permutation drawn
from (seed, p, i). Block b of the pass gives worker i its next
``split_size`` samples of that order. Remainder policy: a pass has
``blocks_per_pass = max(1, min_range // split_size)`` blocks and the LAST
block of the pass takes everything left in the worker's range (between
split_size and 2*split_size - 1 samples more or less), so every sample is
used exactly once per pass and no block is tiny.

Each split is cut into K near-equal minibatches (np.array_split), with K =
ceil(largest split of that block over all workers / batch), the same on
every worker, so ranks never wait for one another's extra steps.
Indices inside a minibatch are sorted (contiguous HDF5 reads).
Test: tests/unit/test_schedule.py.
"""
from __future__ import annotations

import math

import numpy as np


def worker_range(n, n_workers, i):
    """[start, end) of worker i's samples."""
    return (i * n) // n_workers, ((i + 1) * n) // n_workers


def split_size_for(block_size=None, split_size=None, n_workers=1):
    """The paper's fixed-block setting: split = block / N (10x496 = 4960)."""
    if (block_size is None) == (split_size is None):
        raise ValueError("give exactly one of data.split_size and data.block_size")
    if split_size is not None:
        if split_size < 1:
            raise ValueError(f"data.split_size must be >= 1, got {split_size}")
        return int(split_size)
    if block_size < n_workers:
        raise ValueError(f"data.block_size {block_size} is smaller than the "
                         f"{n_workers} workers")
    return int(block_size) // n_workers


class Schedule:
    def __init__(self, n, n_workers, split_size, batch, seed=0):
        if n_workers < 1:
            raise ValueError(f"need at least one worker, got {n_workers}")
        if batch < 1:
            raise ValueError(f"batch size must be >= 1, got {batch}")
        if split_size < 1:
            raise ValueError(f"split size must be >= 1, got {split_size}")
        if n < n_workers * batch:
            raise ValueError(
                f"{n} training samples are fewer than {n_workers} workers x "
                f"batch {batch}; use fewer workers or a smaller batch")
        self.n, self.n_workers = int(n), int(n_workers)
        self.split_size, self.batch, self.seed = int(split_size), int(batch), seed
        self.ranges = [worker_range(n, n_workers, i) for i in range(n_workers)]
        sizes = [e - s for s, e in self.ranges]
        self.min_range, self.max_range = min(sizes), max(sizes)
        self.blocks_per_pass = max(1, self.min_range // self.split_size)

    # -- sizes (no permutation needed) ------------------------------------
    def split_len(self, worker, block):
        s, e = self.ranges[worker]
        if block < self.blocks_per_pass - 1:
            return self.split_size
        return (e - s) - (self.blocks_per_pass - 1) * self.split_size

    def steps_in_block(self, block):
        """K: minibatches every worker runs in this block of any pass."""
        longest = max(self.split_len(w, block) for w in range(self.n_workers))
        return math.ceil(longest / self.batch)

    def steps_per_pass(self):
        return sum(self.steps_in_block(b) for b in range(self.blocks_per_pass))

    def locate(self, global_block):
        """(pass, block within pass) of a running block counter."""
        return divmod(int(global_block), self.blocks_per_pass)

    # -- indices ----------------------------------------------------------
    def order(self, worker, pass_idx):
        """Worker's range permuted by (seed, pass, worker): global indices."""
        s, e = self.ranges[worker]
        rng = np.random.default_rng([self.seed, pass_idx, worker])
        return s + rng.permutation(e - s)

    def split(self, worker, pass_idx, block, order=None):
        if not 0 <= block < self.blocks_per_pass:
            raise IndexError(f"block {block} outside 0..{self.blocks_per_pass - 1}")
        order = self.order(worker, pass_idx) if order is None else order
        a = block * self.split_size
        b = a + self.split_len(worker, block)
        return order[a:b]

    def minibatches(self, worker, pass_idx, block, order=None):
        """K sorted index arrays (global indices) for this worker and block."""
        idx = self.split(worker, pass_idx, block, order)
        k = self.steps_in_block(block)
        return [np.sort(c) for c in np.array_split(idx, k)]
