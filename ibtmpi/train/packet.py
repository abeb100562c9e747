"""The block packet: ONE float32 buffer per direction that carries
everything a block's single Allreduce sums, with named slot views.

  [ model part (P) | buffer moments (B) | stats: loss_sum, samples, correct,
    q, 2 reserved |
    compute s (N) | data-wait s (N) | compute CPU s (N) | peak RSS MiB (N) |
    GPU pool MiB (N) | flags (master + N workers) ]

q is sum_i ||w_i - z_s||^2 (the primal residual's raw sum). Flags: 1 stop
requested (signal), 2 non-finite, 4 checkpoint file written, 8 early stop;
each rank sets its own slot, so the sum is an OR. The buffer moments are
the workers' shares of the model's buffers (BatchNorm's running
statistics: Model.buffer_moments, docs/design.md section 9; B = 0 without
such layers). A slot is one entry in the list below, and nobody computes
an offset by hand. With a GPU worker's state
on its device the model part lives on the device too (`model_out`), and
`reduce` moves it as the MPI library needs (CUDA-aware or staged).
Tests: tests/unit/test_trainer.py, tests/mpi/test_trainer_mpi.py,
tests/mpi/test_gpu_buffers_mpi.py.
"""
from __future__ import annotations

import numpy as np

NS = 6                      # stats slots: loss_sum, samples, correct, q, (2 reserved)
STATS = {"loss_sum": 0, "samples": 1, "correct": 2, "q": 3}
FLAG_STOP, FLAG_NONFINITE, FLAG_CKPT, FLAG_EARLY = 1, 2, 4, 8
WORKER_SLOTS = ("compute", "wait", "cpu", "rss", "pool")   # one float per worker


class BlockPacket:
    """send/recv: the host buffers (pinned where a GPU stages through them);
    send_d/recv_d: device buffers where the model part lives on a GPU."""

    def __init__(self, P, n, empty=None, device_zeros=None, B=0):
        empty = empty or (lambda m: np.empty(m, np.float32))
        self.P, self.n, self.B = P, n, B
        slots = [("model", P), ("buffers", B), ("stats", NS)] + [(s, n) for s in WORKER_SLOTS] + \
            [("flags", 1 + n)]
        self.slots, off = {}, 0
        for name, m in slots:
            self.slots[name] = slice(off, off + m)
            off += m
        self.size = off
        self.send, self.recv = empty(off), empty(off)      # pinned: one DMA each way
        self.send.fill(0)
        self.recv.fill(0)
        self.send_d = self.recv_d = None
        if device_zeros is not None:        # the block's packed buffer on the GPU
            self.send_d = device_zeros(off, np.float32)
            self.recv_d = device_zeros(off, np.float32)

    # -- views -------------------------------------------------------------
    def out(self, name):
        """This rank's outgoing slot `name` (host)."""
        return self.send[self.slots[name]]

    def got(self, name):
        """The reduced slot `name` (host; the model part: see reduce)."""
        return self.recv[self.slots[name]]

    def model_out(self):
        """Where this rank writes its model part: the device buffer when the
        state is on a GPU, else the host one."""
        return (self.send_d if self.send_d is not None else self.send)[:self.P]

    @property
    def flags0(self):
        return self.slots["flags"].start

    def add_stats(self, loss_sum, samples, correct, q=0.0):
        self.out("stats")[:4] += np.array([loss_sum, samples, correct, q], np.float32)

    def stat(self, name):
        return float(self.got("stats")[STATS[name]])

    def put(self, name, i, value):
        self.out(name)[i] = value

    def add(self, name, i, value):
        self.out(name)[i] += value

    def reduced(self, name):
        """The reduced per-worker slot as float64."""
        return self.got(name).astype(np.float64)

    def flag(self, j, bit):
        """Raise flag `bit` in slot j (0 the master, 1 + i worker i)."""
        self.out("flags")[j] += bit

    def rflags(self):
        return self.got("flags").astype(np.int64)

    # -- the Allreduce -------------------------------------------------------
    def push_tail(self, dev):
        """The host tail (stats, timings, flags) up into the device send
        buffer, and the stream synchronized: MPI reads it next."""
        dev.to_device(self.send[self.P:], self.send_d[self.P:])
        dev.synchronize()

    def reduce(self, allreduce, dev=None, gpu_buffers=False):
        """allreduce(send, recv): the block's one collective. Returns the
        reduced model part (P,). On a device (`dev`, a GpuOps) with
        gpu_buffers (CUDA-aware MPI) the host tail goes up first, the stream
        is synchronized before MPI reads it, and only the reduced tail
        comes back; without, the P floats come down into the pinned host
        buffer, whose sum goes back up."""
        P = self.P
        if self.send_d is None:
            allreduce(self.send, self.recv)
            return self.recv[:P]
        if not gpu_buffers:
            dev.to_host(self.send_d[:P], self.send[:P])    # waits for the stream
            allreduce(self.send, self.recv)
            dev.to_device(self.recv[:P], self.recv_d[:P])
            return self.recv_d[:P]
        self.push_tail(dev)
        allreduce(self.send_d, self.recv_d)
        dev.to_host(self.recv_d[P:], self.recv[P:])
        return self.recv_d[:P]


class BlockFlags:
    """This rank's flag slots of the block's Allreduce (`slots`: 0 for the
    master, 1 + i for its worker i) and what the summed flags say. writes:
    the CheckpointWrites whose file the checkpoint bit confirms; early: ()
    -> the master's early-stop decision (block, ...) or None; confirm(k):
    checkpoint k is on every rank (the master writes its manifest; None
    on the workers); diverged(k, what, ranks): the exception a non-finite
    worker raises; dist: one process per rank (worker i is rank 1 + i)."""

    def __init__(self, packet, control, writes, slots, *, early, confirm, diverged, dist):
        self.packet, self.control, self.writes, self.slots = packet, control, writes, slots
        self.early, self.confirm, self.diverged, self.dist = early, confirm, diverged, dist

    def mark(self, ckpt=True):
        """This rank's slots for the coming Allreduce; ckpt=False leaves the
        checkpoint's bit to checkpoint_written, after the compute."""
        if ckpt:
            self.writes.join()           # is the last checkpoint's file complete?
        fl = self.packet.out("flags")
        early = self.early()             # the master's decision (None elsewhere)
        for j in self.slots:
            v = 0
            if self.control.stop_requested:
                v |= FLAG_STOP
            if ckpt and self.writes.pending is not None:
                v |= FLAG_CKPT
            if early is not None and self.control.block >= early[0]:
                v |= FLAG_EARLY
            fl[j] = v

    def checkpoint_written(self):
        """Right before the block's Allreduce: wait for the last checkpoint's
        write (it ran while this block computed) and say it is complete."""
        self.writes.join()
        if self.writes.pending is not None:
            fl = self.packet.out("flags")
            for j in self.slots:
                fl[j] += FLAG_CKPT

    def check(self, k):
        """After block k's Allreduce: confirm the previous checkpoint (it was
        good when written), raise for a non-finite worker, agree on a stop."""
        f = self.packet.rflags()
        if self.writes.pending is not None:
            done = self.writes.settle((f & FLAG_CKPT).all())
            if done is not None and self.confirm is not None:
                self.confirm(done)
        bad = [j - 1 for j in range(1, len(f)) if f[j] & FLAG_NONFINITE]
        if bad:
            ranks = [b + 1 for b in bad] if self.dist else [0]
            raise self.diverged(k, f"non-finite loss or model on worker(s) {bad}", ranks)
        self.control.agree(stop=(f & FLAG_STOP).any(), early=(f & FLAG_EARLY).any())
