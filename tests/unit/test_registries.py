"""The registries are the plug-in points: a new algorithm or optimizer is
one class with @register, and the trainer, config validation, checkpoints
and resume take it with no other change. Here each is defined inside the
test (its "new file") and removed again afterwards."""
import os

import conftest
import numpy as np
import pytest

from ibtmpi import checkpoint as ckpt
from ibtmpi import consensus, optim
from ibtmpi.config import ConfigError
from ibtmpi.train import Trainer


def cfg_for(path, run_dir, algo, n=2, **extra):
    return conftest.cfg_for(path, run_dir, algo, n, **extra)


@pytest.fixture
def registered():
    """Register classes for one test, leaving the registries as they were."""
    added = []

    def plug(registry, register):
        def deco(cls):
            register(cls)
            added.append((registry, cls.name))
            return cls
        return deco
    yield plug
    for registry, name in added:
        registry.pop(name)


def test_a_new_algorithm_is_one_class(small_dataset, tmp_path, registered):
    """A weighted average written from scratch: z = S/N through its own
    _step, the worker side inherited. It must train exactly as ma does."""
    @registered(consensus.ALGORITHMS, consensus.register)
    class Average2(consensus.BlockAlgorithm):
        name = "average2"
        summary = "model averaging, written again as a plug-in"

        def _step(self, S, sl):
            np.multiply(S, self.dtype.type(1.0 / self.n), out=self.z[sl])
            return S

    with pytest.raises(ConfigError, match="algorithm.name must be one of"):
        cfg_for(small_dataset, tmp_path / "x", "average3")
    t = Trainer(cfg_for(small_dataset, tmp_path / "new", "average2"), log=lambda m: None)
    t.run()
    ref = Trainer(cfg_for(small_dataset, tmp_path / "ma", "ma"), log=lambda m: None)
    ref.run()
    assert t.z.tobytes() == ref.z.tobytes()
    assert t.history[-1]["algorithm"] == "average2"


def test_a_new_optimizer_is_one_class_and_its_state_is_checkpointed(
        small_dataset, tmp_path, registered):
    """Heavy-ball momentum under another buffer name: the trainer swaps it
    between simulated workers, checkpoints it per worker as m_<worker> and
    resumes it bit for bit, with no code that knows its name."""
    @registered(optim.OPTIMIZERS, optim.register)
    class HeavyBall(optim.Optimizer):
        name = "heavyball"

        def __init__(self, params, lr, ops=None):
            super().__init__(params, lr, ops=ops)
            self.m = np.zeros_like(params)

        @classmethod
        def from_config(cls, o, params, ops=None):
            return cls(params, o["lr"], ops)

        def state(self):
            return {"m": self.m}

        def step(self, g):
            if self.extra_grad is not None:
                self.extra_grad(self.w, g)
            self.m *= self.w.dtype.type(0.5)
            self.m += g
            self.w -= self.w.dtype.type(self.lr) * self.m

    extra = {"optim.name": "heavyball", "optim.reset_momentum": "false",
             "run.checkpoint_every": 1}
    straight = Trainer(cfg_for(small_dataset, tmp_path / "a", "admm", **extra),
                       log=lambda m: None)
    straight.run()
    assert np.isfinite(straight.z).all()
    assert straight.history[-1]["train_loss"] < straight.history[0]["train_loss"]
    last = ckpt.complete(str(tmp_path / "a"))[-1]
    f = os.path.join(ckpt.ckpt_dir(str(tmp_path / "a"), last), ckpt.rank_file(0))
    with np.load(f) as z:
        assert {"m_0", "m_1", "u_0", "u_1", "z", "U"} <= set(z.files)
        assert z["m_1"].any()
    # one pass, then resumed to two: the same z as the straight run
    half = Trainer(cfg_for(small_dataset, tmp_path / "b", "admm", **extra,
                           **{"run.passes": 1}), log=lambda m: None)
    half.run()
    again = Trainer(cfg_for(small_dataset, tmp_path / "b", "admm", **extra),
                    log=lambda m: None)
    again.run()
    assert again.start > 0
    assert again.z.tobytes() == straight.z.tobytes()
    # and it is another computation than SGD's
    sgd = Trainer(cfg_for(small_dataset, tmp_path / "c", "admm",
                          **{"optim.reset_momentum": "false"}), log=lambda m: None)
    sgd.run()
    assert sgd.z.tobytes() != straight.z.tobytes()


def test_the_single_worker_rule_lives_in_the_algorithm(small_dataset, tmp_path):
    with pytest.raises(ValueError, match="single-worker baseline.*--simulate 2"):
        Trainer(cfg_for(small_dataset, tmp_path / "r", "sgd"), log=lambda m: None)
    assert [a for a, c in consensus.ALGORITHMS.items() if c.single_worker] == ["sgd"]
