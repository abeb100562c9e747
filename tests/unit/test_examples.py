"""Every example config in examples/ is valid and plans a run (dry run) on a
small data set: the README's training commands cannot rot."""
import glob
import os

import pytest

from ibtmpi.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES = sorted(glob.glob(os.path.join(ROOT, "examples", "*.toml")))


def test_there_are_examples():
    assert {os.path.basename(p) for p in EXAMPLES} >= {"demo.toml", "paper25k.toml",
                                                      "fixed_block.toml", "diloco.toml"}


def test_diloco_example_has_the_published_outer_settings():
    """Douillard et al. 2023: inner AdamW whose state survives the syncs,
    outer Nesterov momentum 0.9 with learning rate 0.7."""
    from ibtmpi import optim
    from ibtmpi.config import load
    cfg = load(os.path.join(ROOT, "examples", "diloco.toml"))
    a, o = cfg["algorithm"], cfg["optim"]
    assert (a["name"], a["block_lr"], a["block_momentum"], a["nesterov"]) == (
        "bmuf", 0.7, 0.9, True)
    assert o["name"] == "adamw" and optim.reset_on_sync(o) is False


@pytest.mark.parametrize("path", EXAMPLES, ids=os.path.basename)
def test_example_config_plans_a_run(path, small_dataset, tmp_path, capsys):
    rc = main(["train", "--config", path, "--set", f"data.path={small_dataset}",
               "--set", f"run.dir={tmp_path / 'r'}", "--simulate", "2", "--dry-run"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    assert "dry run: nothing trained, nothing written" in cap.out
