"""Local optimizers (registered classes that own their state) and the
learning-rate schedule. base.py: the protocol, the registry and the ADMM
prox hook; one module per optimizer (sgd.py, adam.py); lr.py: LrSchedule.
Tests: tests/unit/test_optim.py, tests/unit/test_lr_schedule.py.
"""
from .base import OPTIMIZERS, Optimizer, Prox, make, register, reset_on_sync
from . import sgd                     # registration: one line per optimizer
from . import adam
from .adam import Adam, AdamW, adam_update
from .sgd import SGD, sgd_update
from .lr import SCHEDULES, LrSchedule  # (after the optimizers: their keys come first)

__all__ = ["OPTIMIZERS", "Optimizer", "Prox", "make", "register", "reset_on_sync",
           "SCHEDULES", "LrSchedule", "SGD", "sgd_update", "sgd", "Adam", "AdamW", "adam_update", "adam"]
