"""This rank's workers: the model they compute with, the local optimizer and
each worker's own optimizer state, their data loaders and GPU feeds.

Several simulated workers in one process share one model and one
optimizer: a worker's optimizer state is swapped in before its steps and
out after them through the optimizer's ``state()/load()``. On a GPU whose
worker's consensus state is on the host (simulation, one process), w is
staged through a pinned host image (``w_host``).
Nothing here knows the consensus algorithm: the sync parts (steps.py) ask
for the steps and hand the algorithm's extra gradient to the optimizer.
Tests: tests/unit/test_workers.py, tests/unit/test_trainer.py.
"""
from __future__ import annotations

import numpy as np

from .. import memory


def host_fn(ops):
    """a -> a on the host, for arrays of GpuOps `ops` (None: all on the host)."""
    if ops is None:
        return lambda a: a
    return lambda a: ops.asnumpy(a) if ops.on_device(a) else a


def put_fn(ops):
    """(dst, src) -> copy host array src into dst, a host or a device array."""
    def put(dst, src):
        if ops is None or not ops.on_device(dst):
            np.copyto(dst, src)
        else:
            ops.to_device(src, dst)
    return put


class WorkerGroup:
    """local: this rank's worker ids; dev: their GpuOps (None: the CPU);
    w_host: the pinned host image of w where the consensus state is on the
    host but w on a GPU (else None); batch: the local minibatch size."""

    def __init__(self, local, model, opt, loaders, feeds, dev, w_host, batch):
        self.local, self.model, self.opt = list(local), model, opt
        self.loaders, self.feeds, self.dev = loaders, feeds, dev
        self.w_host, self.batch = w_host, batch
        self.host = host_fn(dev)
        # each local worker's optimizer state between its blocks (host)
        self.opt_states = {i: {k: np.zeros(s, dt) for k, (s, dt) in
                               opt.state_spec().items()} for i in self.local}

    @property
    def stage(self):
        """w has a host image its consensus state works on."""
        return self.w_host is not None

    def to_dev(self, a):
        return a if self.dev is None else self.dev.asarray(a)

    def run_steps(self, mbs, feed=None):
        """The local steps over minibatches `mbs`: (loss sum, samples,
        correct). On a GPU the loss and correct count stay on the device
        (no host sync per step) and are read once at the end; with a feed
        (gpu_feed) the minibatches' copies run on their own stream and each
        step waits only for its own."""
        stats = self.model.new_stats(self.batch)
        n = 0
        if feed is not None:
            wait = self.dev.cp.cuda.get_current_stream().wait_event
            items = feed.upload(mbs)
        else:
            items = [(mb[0], mb[1], mb[2] if len(mb) > 2 else None, None) for mb in mbs]
        for x, y, ids, ev in items:
            if len(y) == 0:
                continue
            if ev is not None:
                wait(ev)
            self.model.step_grad(x, y, stats, ids)
            self.opt.step(self.model.grads)
            n += len(y)
        if feed is not None:
            feed.consumed(mbs)
        loss_sum, correct = self.model.read_stats(stats)
        return loss_sum, n, correct

    def swap_in(self, i):
        """Worker i's optimizer state into the shared optimizer."""
        if len(self.local) > 1:
            self.opt.load(self.opt_states[i])

    def swap_out(self, i):
        if len(self.local) > 1:
            for k, buf in self.opt.state().items():
                self.opt_states[i][k][...] = self.host(buf)

    def opt_state(self, i):
        """Worker i's optimizer state on the host (for its checkpoint)."""
        if len(self.local) > 1:
            return self.opt_states[i]
        return {k: self.host(v) for k, v in self.opt.state().items()}

    def load_opt_state(self, i, arrays):
        for k, a in arrays.items():
            np.copyto(self.opt_states[i][k], a)
        if len(self.local) == 1:
            self.opt.load(arrays)

    def memory_into(self, packet, i):
        """Worker i's memory high-water marks into its slots of the block's
        Allreduce (memory.py): this process's peak RSS, its CuPy pool."""
        packet.put("rss", i, memory.peak_rss_mib())
        if self.dev is not None:
            graphs = self.model.graphs
            held = self.dev.pool_bytes() + (graphs.pool_bytes() if graphs else 0)
            packet.put("pool", i, held / memory.MIB)

    def close(self):
        for ld in self.loaders.values():
            ld.close()
