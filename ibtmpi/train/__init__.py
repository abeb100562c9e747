"""The training package: the driver (trainer.py) and its single-purpose
parts; docs/architecture.md has the map. ``Trainer`` is the entry for
code; ``ibtmpi train`` goes through entry.py.
"""
from ..errors import (EXIT_DIVERGED, EXIT_PREEMPTED, Diverged, InjectedFault, Preempted,
                        WatchdogTimeout)
from .master import BEST
from .trainer import Trainer

__all__ = ["Trainer", "BEST", "EXIT_DIVERGED", "EXIT_PREEMPTED", "Diverged",
           "InjectedFault", "Preempted", "WatchdogTimeout"]
