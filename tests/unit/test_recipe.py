"""algorithm.recipe (ibtmpi/recipe.py): the values auto derives for N = 1,
10 and 40 at the paper's block, the user's values winning, and a run that
logs them, writes them to config.toml and resumes to the same model."""
import os

import pytest

from ibtmpi import recipe
from ibtmpi.config import ConfigError, load, tomllib
from ibtmpi.train import Trainer


def _cfg(*sets):
    return load(None, ["data.path=x", "algorithm.recipe=auto", *sets])


def test_auto_derives_the_documented_values_at_the_papers_block():
    c = _cfg("data.block_size=4960", "data.batch=31")
    # N = 1: the baseline (sgd) keeps every default
    assert recipe.derive(load(None, ["data.path=x", "algorithm.name=sgd",
                                     "algorithm.recipe=auto"]), 1, 4960) == []
    want = [("data.batch", recipe.LOCAL_BATCH),
            ("optim.warmup_passes", recipe.WARMUP_PASSES),
            ("optim.clip_norm", recipe.CLIP_NORM),
            ("optim.reset_momentum", recipe.RESET_MOMENTUM)]
    # the local lr: the configured 0.02 x sqrt(N / 10); ibt's duals centred
    cd = [("algorithm.centred_duals", True)]
    assert recipe.derive(c, 10, 496) == want + [("optim.lr", 0.02)] + cd
    assert recipe.derive(c, 20, 248) == want + [("optim.lr", 0.0282843)] + cd
    assert recipe.derive(c, 40, 124) == want + [("optim.lr", 0.04)] + cd
    assert (recipe.LOCAL_BATCH, recipe.WARMUP_PASSES, recipe.CLIP_NORM,
            recipe.RESET_MOMENTUM, recipe.CENTRED_DUALS) == (8, 1.0, 5.0, False, True)
    # centring is ibt's: admm (z is the mean: a no-op), bmuf (no duals) and
    # ibt with the outer step swapped for averaging get the rest alone
    for sets in (["algorithm.name=admm"], ["algorithm.name=bmuf"],
                 ["algorithm.outer=average"]):
        assert recipe.derive(_cfg("data.block_size=4960", "data.batch=31", *sets),
                             40, 124) == want + [("optim.lr", 0.04)], sets
    # a split too large for the small batch keeps its batch
    assert dict(recipe.derive(c, 10, 2480))["data.batch"] == 31
    # below the measured N: the defaults
    assert recipe.MIN_WORKERS == 10 and recipe.derive(c, 9, 551) == []
    # ssgd, easgd with another optimizer, or recipe none: nothing
    assert recipe.derive(_cfg("algorithm.name=ssgd"), 10, 496) == []
    assert recipe.derive(_cfg("optim.name=adamw"), 10, 496) == []
    assert recipe.derive(load(None, ["data.path=x", "algorithm.recipe=none"]), 10, 496) == []


def test_the_users_values_win():
    c = _cfg("data.batch=31", "optim.clip_norm=0")
    out, done = recipe.apply(c, 40, 124)
    assert done == [("optim.warmup_passes", 1.0), ("optim.reset_momentum", False),
                    ("optim.lr", 0.04), ("algorithm.centred_duals", True)]
    assert dict(recipe.apply(_cfg("algorithm.centred_duals=false"), 40, 124)[1]).keys() == {
        "data.batch", "optim.warmup_passes", "optim.clip_norm", "optim.reset_momentum",
        "optim.lr"}
    assert out["data"]["batch"] == 31 and out["optim"]["clip_norm"] == 0.0
    assert c["optim"]["warmup_passes"] == 0.0           # the caller's config is untouched
    line = recipe.describe(40, done)
    assert line.startswith("algorithm.recipe auto for N = 40: optim.warmup_passes = 1")
    assert line.endswith("optim.lr = 0.04, algorithm.centred_duals = true (a value you set "
                         "wins; algorithm.recipe = none: the plain defaults)")
    out, done = recipe.apply(_cfg("optim.lr=0.01"), 40, 124)
    assert out["optim"]["lr"] == 0.01 and "optim.lr" not in dict(done)
    assert recipe.describe(40, []) is None
    with pytest.raises(ConfigError, match="algorithm.recipe must be one of auto, none"):
        load(None, ["data.path=x", "algorithm.recipe=best"])


def test_a_run_logs_writes_and_resumes_its_recipe(small_dataset, tmp_path):
    sets = [f"data.path={small_dataset}", "algorithm.recipe=auto", "data.split_size=16",
            "model.layers=tiny", "run.passes=2", "run.quiet=true", "run.simulate=10",
            "run.threads=1", "run.checkpoint_every=1", f"run.dir={tmp_path / 'r'}"]
    logs = []
    t = Trainer(load(None, sets + ["run.passes=1"]), log=logs.append)
    t.run()
    line = [m for m in logs if m.startswith("algorithm.recipe auto for N = 10")]
    assert line and "data.batch = 8" in line[0] and "optim.clip_norm = 5" in line[0]
    assert "optim.reset_momentum = false" in line[0]
    assert "algorithm.centred_duals = true" in line[0]
    assert any(m.startswith("outer step: ") and "duals centred on the consensus mean" in m
               for m in logs)
    with open(os.path.join(tmp_path, "r", "config.toml"), "rb") as f:
        saved = tomllib.load(f)
    assert (saved["data"]["batch"], saved["optim"]["warmup_passes"],
            saved["optim"]["clip_norm"], saved["optim"]["reset_momentum"],
            saved["algorithm"]["centred_duals"]) == (8, 1.0, 5.0, False, True)
    # the same command for 2 passes resumes (the derived values hash alike)
    # and equals the uninterrupted 2-pass run
    logs = []
    t2 = Trainer(load(None, sets), log=logs.append)
    t2.run()
    assert any("resuming from" in m for m in logs)
    ref = Trainer(load(None, sets[:-1] + [f"run.dir={tmp_path / 'ref'}"]), log=lambda m: None)
    ref.run()
    assert t2.z.tobytes() == ref.z.tobytes()
    # and the run's own config.toml, every key given, derives nothing more
    again = load(os.path.join(tmp_path, "r", "config.toml"))
    assert recipe.apply(again, 10, 40)[1] == []


def test_the_recipe_key_is_not_hashed_its_values_are():
    from ibtmpi.config import run_hash
    a = load(None, ["data.path=x", "algorithm.recipe=none"])
    b = load(None, ["data.path=x", "algorithm.recipe=auto"])
    assert run_hash(a) == run_hash(b)                 # N < 10: the same computation
    assert run_hash(recipe.apply(b, 40, 124)[0]) != run_hash(b)


def test_the_dry_run_names_what_the_recipe_sets(small_dataset, tmp_path, capsys):
    from ibtmpi.cli import main
    args = ["train", "--dry-run", "--simulate", "10", "--set", f"data.path={small_dataset}",
            "--set", "model.layers=tiny", "--set", f"run.dir={tmp_path / 'r'}",
            "--set", "data.block_size=160", "--set", "optim.clip_norm=2"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert ("algorithm.recipe auto for N = 10: data.batch = 8, optim.warmup_passes = 1, "
            "optim.reset_momentum = false, algorithm.centred_duals = true (a value you set "
            "wins") in out
    assert "split 16 per worker (block 160), batch 8" in out
    assert ("outer step: sgd (eta 0.25, zeta 1, Nesterov: gain 1.67)" in out
            and "duals centred on the consensus mean" in out)
    assert main(args + ["--set", "algorithm.recipe=none"]) == 0
    out = capsys.readouterr().out
    assert "algorithm.recipe" not in out and "batch 32" in out
