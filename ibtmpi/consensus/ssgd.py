"""Synchronous SGD (``ssgd``): the Horovod/DDP-style reference. No consensus
object: every minibatch's gradients are summed in one Allreduce and every
rank applies the same averaged gradient (train/steps.py, block_ssgd).
Tests: tests/unit/test_trainer.py, tests/mpi/test_trainer_mpi.py.
"""
from __future__ import annotations

from .base import Algorithm, register


@register
class SynchronousSGD(Algorithm):
    name = "ssgd"
    summary = "synchronous SGD: the gradients all-reduced every minibatch (Horovod-style)"
    per_step = True
