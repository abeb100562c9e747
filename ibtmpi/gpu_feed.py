"""A GPU worker's minibatches to its device, overlapped with compute.

The loader's prefetch thread reads block b+1 while block b trains and,
with a DeviceFeed, also writes it into page-locked (pinned) host memory
(``stage``): the block's stored images (uint8 or uint16), labels and augmentation ids, in one
of two slots. At the block's start ``upload`` issues one host -> device
copy per minibatch on a copy stream of its own, each followed by an event;
the compute stream waits for minibatch i's event just before step i, so
the copies of later minibatches run while the earlier ones compute, and no
step waits for the host. Normalisation and the flips/rotations happen on
the device (kernels/input.cu normalize_u8[_aug]).

Two slots each way, and two events keep them safe:
- a pinned slot is written again only after the copies out of it are done
  (``uploaded``: recorded on the copy stream after the block's last copy;
  the prefetch thread waits for it, never the training loop);
- a device slot is written again only after the steps that read it have
  run (``consumed``: recorded on the compute stream after the block's last
  step; the copy stream waits for it on the device).
Tests: tests/unit/test_gpu_pipeline.py (the CuPy stand-in's copy stream is
lazy: a missing wait or an early overwrite gives wrong numbers there).
"""
from __future__ import annotations

import numpy as np


class StagedBlock(list):
    """A block's minibatches, [(x uint8 (k, H, W, C), y (k,), ids (k,) or
    None)] as views of a pinned slot: usable as host minibatches too."""
    slot = None
    spans = ()


class _Slot:
    def __init__(self, ops, cap, shape, dtype):
        cp = ops.cp
        self.x = ops.pinned_empty(cap * int(np.prod(shape)), dtype).reshape((cap,) + shape)
        self.y = ops.pinned_empty(cap, np.int64)
        self.ids = ops.pinned_empty(cap, np.int32)
        self.dx = cp.empty((cap,) + shape, dtype)
        self.dy = cp.empty(cap, np.int64)
        self.dids = cp.empty(cap, np.int32)
        self.uploaded = self.consumed = None


class DeviceFeed:
    """One worker's feed: cap = the most images a block gives it, shape =
    (H, W, C) of its images, dtype their stored type (uint8, uint16)."""

    def __init__(self, ops, cap, shape, stream=None, dtype=np.uint8):
        self.ops, self.cp = ops, ops.cp
        self.cap, self.shape = int(cap), tuple(int(s) for s in shape)
        self.stream = stream if stream is not None else self.cp.cuda.Stream(non_blocking=True)
        # made here, in the training thread, on this worker's device
        self.slots = [_Slot(ops, self.cap, self.shape, np.dtype(dtype)) for _ in range(2)]
        self.device = ops.device_id()
        self._turn = 0
        self.uploads = 0

    def stage(self, mbs):
        """In the loader's thread: the block's minibatches into the next
        pinned slot, once the copies out of it are done."""
        slot = self.slots[self._turn]
        self._turn ^= 1
        if slot.uploaded is not None:
            with self.cp.cuda.Device(self.device):
                slot.uploaded.synchronize()
        out = StagedBlock()
        out.slot, spans, at = slot, [], 0
        for mb in mbs:
            x, y = mb[0], mb[1]
            ids = mb[2] if len(mb) > 2 else None
            k = len(y)
            if at + k > self.cap or tuple(x.shape[1:]) != self.shape:
                raise ValueError(f"a block of {at + k} images {tuple(x.shape[1:])} does not fit "
                                 f"the feed's {self.cap} x {self.shape}")
            slot.x[at:at + k] = x
            slot.y[at:at + k] = y
            if ids is not None:
                slot.ids[at:at + k] = ids
            out.append((slot.x[at:at + k], slot.y[at:at + k],
                        None if ids is None else slot.ids[at:at + k]))
            spans.append((at, k, ids is not None))
            at += k
        out.spans = spans
        return out

    def upload(self, staged):
        """At the block's start: every minibatch's copy issued on the copy
        stream. Returns [(x, y, ids, event)] on the device; wait for the
        event on the compute stream before using the minibatch."""
        slot = staged.slot
        items = []
        if slot.consumed is not None:
            self.stream.wait_event(slot.consumed)
        for at, k, has_ids in staged.spans:
            if k == 0:
                items.append((slot.dx[at:at], slot.dy[at:at], None, None))
                continue
            parts = [(slot.dx, slot.x), (slot.dy, slot.y)] + ([(slot.dids, slot.ids)]
                                                             if has_ids else [])
            for dst, src in parts:
                dst[at:at + k].set(src[at:at + k], stream=self.stream)
            ev = self.stream.record()
            items.append((slot.dx[at:at + k], slot.dy[at:at + k],
                          slot.dids[at:at + k] if has_ids else None, ev))
            self.uploads += 1
        slot.uploaded = self.stream.record()
        return items

    def consumed(self, staged):
        """After the block's last step is issued: its device slot may be
        written again once the compute stream gets there."""
        staged.slot.consumed = self.cp.cuda.get_current_stream().record()
