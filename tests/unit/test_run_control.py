"""RunControl (train/lifecycle.py) alone, with no trainer: where the job is,
the stop a rank asks for and what the block's flags agree on, planted
faults, and the stop signals, which write only here."""
import os
import signal
import time

import pytest

from ibtmpi.errors import InjectedFault
from ibtmpi.train.lifecycle import (Faults, RunControl, install_stop_handlers,
                                    restore_handlers)


def test_entering_a_phase_raises_the_planted_fault_there_only():
    c = RunControl(2, faults=Faults("2:5:compute"))
    c.begin_block(4)
    c.enter("compute")                        # another block: nothing
    c.begin_block(5)
    c.enter("allreduce")                      # another phase: nothing
    c.at("compute")                           # naming a phase is no fault point
    assert (c.block, c.phase) == (5, "compute")
    with pytest.raises(InjectedFault, match="rank 2, block 5, phase compute"):
        c.enter("compute")
    c.at("checkpoint", 3)                     # a background write's own block
    assert (c.block, c.phase) == (3, "checkpoint")


def test_a_stop_is_asked_then_agreed():
    c = RunControl(0)
    assert not (c.stop_requested or c.stop_agreed or c.early_agreed)
    c.request_stop("the time limit (90m)")
    assert c.stop_requested and c.stop_reason == "the time limit (90m)"
    assert not c.stop_agreed and not c.interrupted     # the flags decide, not the wish
    c.agree(stop=True, early=False)
    assert c.stop_agreed and not c.early_agreed


def test_block_times_and_checkpoint_times_are_kept_for_the_watchdog_and_the_limit():
    c = RunControl(0, time_limit="2h")
    assert c.deadline is not None and c.deadline.ckpt_s == 0.0
    for s in (1.5, 4.0, 2.0):
        c.block_ended(s)
    c.checkpoint_took(3.0)
    c.checkpoint_took(1.0)
    assert c.slowest_block_s == 4.0 and c.deadline.ckpt_s == 3.0
    worker = RunControl(1, time_limit=None)  # only the master watches the clock
    worker.checkpoint_took(9.0)
    assert worker.deadline is None


def test_the_stop_signals_write_the_control_only():
    c = RunControl(0)
    old = install_stop_handlers(c)
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
        assert c.stop_requested and c.stop_reason == "a signal" and not c.interrupted
        os.kill(os.getpid(), signal.SIGINT)   # the first Ctrl-C: a checkpoint, exit 130
        time.sleep(0.05)
        assert c.interrupted and c.stop_reason == "Ctrl-C (SIGINT)"
    finally:
        restore_handlers(old)
