"""Synchronous SGD (``ssgd``): the Horovod/DDP-style reference. No consensus
object: every minibatch's gradients are summed in one Allreduce and every
rank applies the same averaged gradient (train/steps.py, block_ssgd).
Tests: tests/unit/test_trainer.py, tests/mpi/test_trainer_mpi.py.
"""
from __future__ import annotations

from ..settings import Key, declare, non_negative
from .base import Algorithm, register

declare("algorithm", Key("warmup_steps", 0, "ssgd steps (gradient Allreduce) before block 0",
                         check=non_negative, why="{where} must be >= 0"))


@register
class SynchronousSGD(Algorithm):
    name = "ssgd"
    summary = "synchronous SGD: the gradients all-reduced every minibatch (Horovod-style)"
    per_step = True
