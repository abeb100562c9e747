"""The trainer's parts alone, with no Trainer: WorkerGroup (workers.py),
BlockFlags (packet.py), BlockClock (exchange.py) and the sync parts'
checkpoint state (steps.py). (The parts wired together: test_trainer.py.)"""
import copy

import numpy as np
import pytest

from ibtmpi import comm as mpi
from ibtmpi import config, optim
from ibtmpi.errors import Diverged
from ibtmpi.model import Model
from ibtmpi.train.exchange import BlockClock
from ibtmpi.train.lifecycle import RunControl
from ibtmpi.train.packet import (FLAG_CKPT, FLAG_EARLY, FLAG_NONFINITE, FLAG_STOP,
                                 BlockFlags, BlockPacket)
from ibtmpi.train.workers import WorkerGroup


def group(local=(0, 1), lr=0.1):
    model = Model("tiny", (3, 8, 8), 3, seed=0)
    o = dict(copy.deepcopy(config.DEFAULTS["optim"]), lr=lr)
    opt = optim.make(o, model.params)
    return WorkerGroup(local, model, opt, loaders={}, feeds={}, dev=None, w_host=None,
                       batch=4)


def batches(seed, n=3):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((4, 3, 8, 8)).astype(np.float32),
             rng.integers(0, 3, 4).astype(np.int64)) for _ in range(n)]


def test_simulated_workers_keep_their_own_optimizer_state():
    """Two workers share one model and one optimizer: each one's momentum
    survives the other's steps (swap_in/swap_out), and run_steps counts
    the samples and sums the loss over its minibatches."""
    wg = group()
    p0 = wg.model.params.copy()
    wg.swap_in(0)
    loss, n, correct = wg.run_steps(batches(0))
    assert n == 12 and np.isfinite(loss) and 0 <= correct <= 12
    assert not np.array_equal(wg.model.params, p0)
    wg.swap_out(0)
    v0 = {k: v.copy() for k, v in wg.opt_states[0].items()}
    assert any(v.any() for v in v0.values())
    wg.swap_in(1)                                  # worker 1 starts from rest
    assert not any(np.asarray(v).any() for v in wg.opt.state().values())
    wg.run_steps(batches(1))
    wg.swap_out(1)
    assert all(np.array_equal(wg.opt_states[0][k], v0[k]) for k in v0)
    assert any(v.any() for v in wg.opt_states[1].values())
    assert wg.opt_state(0) is wg.opt_states[0]


def test_one_worker_reads_and_loads_the_optimizer_itself():
    wg = group(local=(3,))
    wg.run_steps(batches(2, n=1))
    state = wg.opt_state(3)
    assert set(state) == set(wg.opt.state_spec())
    saved = {k: v.copy() for k, v in state.items()}
    wg.opt.reset()
    wg.load_opt_state(3, saved)
    assert all(np.array_equal(wg.opt.state()[k], saved[k]) for k in saved)


class Writes:
    """A stand-in for CheckpointWrites: a file pending confirmation."""
    def __init__(self, pending=None):
        self.pending, self.joined, self.settled = pending, 0, None

    def join(self):
        self.joined += 1

    def settle(self, every_rank_wrote):
        k, self.pending = self.pending, None
        self.settled = every_rank_wrote
        return k if every_rank_wrote else None


def flags(slots, pending=None, early=None, dist=False):
    pk = BlockPacket(4, 2)
    ctl = RunControl(0)
    confirmed = []
    fl = BlockFlags(pk, ctl, Writes(pending), slots, early=lambda: early,
                    confirm=confirmed.append,
                    diverged=lambda k, what, ranks: Diverged(f"{k} {what} {ranks}"), dist=dist)
    return pk, ctl, fl, confirmed


def test_flags_say_stop_checkpoint_and_early_stop_in_this_ranks_slots():
    pk, ctl, fl, _ = flags([0, 1], pending=4, early=(2, "no gain"))
    ctl.request_stop("a test")
    ctl.begin_block(2)
    fl.mark()
    out = pk.out("flags")
    assert list(out) == [FLAG_STOP | FLAG_CKPT | FLAG_EARLY] * 2 + [0]
    fl.mark(ckpt=False)                          # the checkpoint's bit comes later
    assert list(out[:2]) == [FLAG_STOP | FLAG_EARLY] * 2
    fl.checkpoint_written()
    assert list(out[:2]) == [FLAG_STOP | FLAG_CKPT | FLAG_EARLY] * 2


def summed(pk, values):
    pk.recv[pk.flags0:] = np.asarray(values, np.float32)


def test_a_checkpoint_is_confirmed_only_when_every_rank_wrote_it():
    pk, ctl, fl, confirmed = flags([0], pending=7)
    summed(pk, [FLAG_CKPT, FLAG_CKPT, 0])        # worker 1's file is not there
    fl.check(8)
    assert confirmed == [] and fl.writes.pending is None
    fl.writes.pending = 8
    summed(pk, [FLAG_CKPT, FLAG_CKPT, FLAG_CKPT | FLAG_STOP])
    fl.check(9)
    assert confirmed == [8] and ctl.stop_agreed and not ctl.early_agreed


@pytest.mark.parametrize("dist, ranks", [(False, [0]), (True, [2])])
def test_a_non_finite_worker_raises_with_its_rank(dist, ranks):
    pk, _, fl, _ = flags([0], dist=dist)
    summed(pk, [0, 0, FLAG_NONFINITE])
    with pytest.raises(Diverged, match=rf"3 non-finite loss or model on worker\(s\) \[1\] "
                                       rf"\{ranks}"):
        fl.check(3)


def test_the_block_clock_splits_the_masters_time(monkeypatch):
    """wall from block end to block end; slack the master's sleep in the
    wait (wait less the work it did in it); busy the rest but the Allreduce."""
    class Exchange:
        t_reduced = 0.0
    ex = Exchange()
    stats = {"wait_s": 0.0, "work_s": 0.0, "reduce_s": 0.0}
    monkeypatch.setattr(mpi, "STATS", stats)
    clock = BlockClock(ex, 10.0, dict(stats))
    ex.t_reduced = 12.0
    stats.update(wait_s=1.5, work_s=0.5, reduce_s=0.25)
    wall, busy, slack = clock.block()
    assert (wall, slack) == (2.0, 1.0) and busy == pytest.approx(0.75)
    ex.t_reduced = 15.0
    stats.update(wait_s=1.5, work_s=0.5, reduce_s=0.5)
    wall, busy, slack = clock.block()
    assert (wall, slack) == (3.0, 0.0) and busy == pytest.approx(2.75)
    assert clock.lap() >= 0.0
