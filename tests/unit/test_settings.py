"""Settings are declared by the code that reads them (ibtmpi/settings.py):
one declaration gives a key its default, its check, its place in the
checkpoint digest and whether a resume may change it; config.py only
collects. Here a key is declared by a "plug-in" inside the test and taken
away afterwards, and the collected lists are held to the values the
checkpoints of earlier releases were written with."""
import copy

import pytest

from ibtmpi import config, settings
from ibtmpi.config import ConfigError, load
from ibtmpi.errors import ConfigError as TheConfigError

BASE = ["data.path=/data"]


@pytest.fixture
def plug():
    """Declare keys for one test; the schema is as it was afterwards."""
    before = {s: dict(t) for s, t in settings.SCHEMA.items()}
    rules = {s: list(r) for s, r in settings.RULES.items()}
    yield settings.declare
    settings.SCHEMA.clear()
    settings.SCHEMA.update(before)
    settings.RULES.clear()
    settings.RULES.update(rules)


def test_one_declaration_is_a_whole_key(plug):
    plug("algorithm", settings.Key("pull", 0.5, "a plug-in's own knob",
                                   check=lambda v: 0 < v < 1, why="{where} must be in (0, 1)",
                                   tunable=True, added=True))
    assert load(None, BASE)["algorithm"]["pull"] == 0.5                 # its default
    assert load(None, BASE + ["algorithm.pull=0.25"])["algorithm"]["pull"] == 0.25
    with pytest.raises(ConfigError, match=r"^algorithm.pull must be in \(0, 1\)$"):
        load(None, BASE + ["algorithm.pull=2.0"])
    with pytest.raises(ConfigError, match="algorithm.pull must be a number"):
        load(None, BASE + ["algorithm.pull=much"])
    with pytest.raises(ConfigError, match="did you mean 'pull'"):
        load(None, BASE + ["algorithm.pul=0.3"])
    assert config.tunable("algorithm.pull")
    # added later: left out of the digest at its default, so checkpoints of
    # the runs before it keep theirs; another value is another run
    cfg = load(None, BASE)
    assert "pull" not in config.hashed_config(cfg)["algorithm"]
    other = load(None, BASE + ["algorithm.pull=0.25"])
    assert config.run_hash(other) != config.run_hash(cfg)


def test_an_operational_key_changes_no_digest_and_a_rule_sees_the_whole_config(plug):
    plug("run", settings.Key("chatty", False, "say more", hashed=False))

    @settings.rule("run")
    def _(cfg):
        if cfg["run"]["chatty"] and cfg["run"]["quiet"]:
            return "run.chatty and run.quiet contradict each other"
    a, b = load(None, BASE), load(None, BASE + ["run.chatty=true"])
    assert config.run_hash(a) == config.run_hash(b)
    with pytest.raises(TheConfigError, match="contradict"):
        load(None, BASE + ["run.chatty=true", "run.quiet=true"])


def test_a_key_is_declared_once():
    with pytest.raises(ValueError, match="algorithm.rho is declared twice"):
        settings.declare("algorithm", settings.Key("rho", 1.0))
    with pytest.raises(ValueError, match="unknown section"):
        settings.declare("nosuch", settings.Key("x", 1))


def test_each_key_has_its_owner():
    """The owners the docs name: no key is declared in config.py but the
    driver's [run] keys."""
    owners = {"algorithm.rho": "ibtmpi.consensus.admm", "algorithm.block_lr":
              "ibtmpi.consensus.outer", "algorithm.easgd_beta": "ibtmpi.consensus.easgd",
              "optim.betas": "ibtmpi.optim.adam", "optim.momentum": "ibtmpi.optim.sgd",
              "optim.gamma": "ibtmpi.optim.lr", "data.normalize": "ibtmpi.data",
              "model.layers": "ibtmpi.model", "algorithm.recipe": "ibtmpi.recipe"}
    for where, module in owners.items():
        sec, name = where.split(".")
        key = settings.SCHEMA[sec][name]
        check = key.check or key.parse
        if check is not None:
            assert check.__module__ == module, where
    run_defined = {k.check.__module__ for k in settings.SCHEMA["run"].values() if k.check}
    assert run_defined <= {"ibtmpi.config", "ibtmpi.settings"}


# what the releases before the schema wrote into their checkpoints' digests
OLD_ADDED = {"optim": {"schedule", "milestones", "gamma", "decay_passes", "final_ratio",
                       "warmup_passes", "name", "betas", "eps", "reset_state", "clip_norm"},
             "algorithm": {"outer", "outer_schedule"}, "data": {"normalize"}}
# keys added since the schema (each at its default leaves the digest as it was)
NEW_KEYS = {"algorithm": {"overshoot_backoff", "centred_duals"},
            "optim": {"backbone_lr_scale"}}
for _s, _k in NEW_KEYS.items():
    OLD_ADDED[_s] = OLD_ADDED[_s] | _k
OLD_TUNABLE = {"optim": {"lr", "momentum", "weight_decay", "nesterov", "reset_momentum",
                         "betas", "eps", "reset_state", "clip_norm", "schedule", "milestones",
                         "gamma", "decay_passes", "final_ratio", "warmup_passes",
                         *NEW_KEYS["optim"]},
               "algorithm": {"rho", "l2", "adaptive_rho", "rho_mu", "rho_tau",
                             "over_relaxation", "dual_reset", "block_momentum", "block_lr",
                             "nesterov", "easgd_beta", "outer_schedule",
                             *NEW_KEYS["algorithm"]}}


def test_the_collected_lists_are_the_old_ones():
    assert {s: set(k) for s, k in config.ADDED_KEYS.items()} == OLD_ADDED
    assert {s: set(k) for s, k in config.RESUME_TUNABLE.items()} == OLD_TUNABLE
    hashed = config.hashed_config(load(None, BASE))
    assert hashed["run"] == {}                     # every [run] key is operational
    assert "init" not in hashed["model"] and "recipe" not in hashed["algorithm"]
    assert "path" not in hashed["data"]
    assert config.hashed_config(load(None, BASE), legacy=True)["data"]["path"] == "/data"


def test_digests_of_earlier_releases_are_kept():
    """run_hash of these configurations, as the release before the schema
    computed them (its checkpoints resume)."""
    cases = {(): "02e6c7be1d69d2d8",
             ("optim.schedule=cosine", "run.passes=3"): "fe0a9b6bb4fd9004",
             ("optim.name=adam", "algorithm.outer=sgd", "data.normalize=imagenet"):
             "279d7462ca148723"}
    got = {sets: config.run_hash(load(None, BASE + list(sets))) for sets in cases}
    assert got == cases


def test_defaults_reach_the_parts_that_read_them():
    """An algorithm built from a partial section takes the declared defaults."""
    import numpy as np
    from ibtmpi import consensus
    c = consensus.make_consensus("ibt", np.zeros(4, np.float32), 2, {})
    assert c.rho == settings.SCHEMA["algorithm"]["rho"].default == 0.01
    assert copy.deepcopy(config.DEFAULTS["optim"]) == settings.defaults("optim")
