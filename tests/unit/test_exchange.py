"""BlockExchange (train/exchange.py) alone, with no trainer: in one process
the block's packet is summed with no watchdog; under a watchdog the
master's limit scales with the slowest block the RunControl holds and
allows the last checkpoint's write. (Under MPI: test_job_endings.py,
test_hangs.py and tests/mpi/test_trainer_mpi.py.)"""
import numpy as np

from ibtmpi import comm as mpi
from ibtmpi.train import exchange as ex
from ibtmpi.train.exchange import BlockExchange
from ibtmpi.train.lifecycle import RunControl
from ibtmpi.train.packet import BlockPacket


def build(one_process=True, watchdog="auto", control=None):
    pk = BlockPacket(5, 2)
    control = control or RunControl(0)
    return pk, control, BlockExchange(
        pk, mpi.self_comm(), control, rank=0, is_master=True, has_workers=True,
        one_process=one_process, per_step=False, watchdog=watchdog, state_device=None,
        gpu_buffers=False, placement=lambda: None, cfg=None)


def test_one_process_sums_the_packet_with_no_watchdog():
    pk, _, x = build()
    pk.send.fill(0)
    pk.model_out()[:] = np.arange(5, dtype=np.float32)
    S = x.reduce(lambda: False, k=3)
    assert np.array_equal(S, np.arange(5, dtype=np.float32))
    assert x.t_reduced > 0 and x.alarm is None     # no timer thread in one process


def test_the_watchdog_limit_follows_the_control_and_the_last_write(monkeypatch):
    seen = {}

    def fake_allreduce(send, recv, comm, work=None, watch=None, last=None, sleep_max=0):
        seen["watch"] = watch
        recv[...] = send
    monkeypatch.setattr(ex.mpi, "allreduce_sum", fake_allreduce)
    monkeypatch.setattr(ex.mpi, "post_arrivals", lambda: {})
    monkeypatch.setattr(ex.mpi, "wait_all", lambda reqs: None)
    ctl = RunControl(0)
    ctl.begin_job(0)
    ctl.block_ended(12.0)                          # 10 x 12 s = 120 s, above the floor
    pk, _, x = build(one_process=False, control=ctl)
    armed = []
    monkeypatch.setattr(ex.Alarm, "arm", lambda self, s, fn, *a: armed.append(s))
    x.reduce(None, k=5, write_s=7.0)
    assert armed == [120.0 + 2 * 7.0 + ex.WATCHDOG_GRACE_S]
    assert seen["watch"] is not None                # the master watches the arrivals
    x.reduce(None, k=0)                             # the job's first block: no limit
    assert len(armed) == 1
