"""run.profile: every rank's cProfile in the run directory, also on failure."""
import os
import pstats

import pytest

from ibtmpi.config import load
from ibtmpi.train import InjectedFault, Trainer
from ibtmpi.config import run_hash


def cfg(data, run_dir, **extra):
    return load(None, [f"data.path={data}", "model.layers=tiny", "run.passes=1",
                       "run.quiet=true", f"run.dir={run_dir}", "run.simulate=2",
                       "run.threads=1", "data.split_size=40", "data.batch=16"]
                + [f"{k}={v}" for k, v in extra.items()])


def test_profile_names_where_the_time_went(small_dataset, tmp_path):
    Trainer(cfg(small_dataset, tmp_path, **{"run.profile": "true"}), log=lambda m: None).run()
    text = (tmp_path / "profile-rank-00000.txt").read_text()
    assert text.startswith("rank 0, block ")
    assert "loss_and_grad" in text and "cumulative" in text
    st = pstats.Stats(str(tmp_path / "profile-rank-00000.pstats"))
    assert any(fn[2] == "loss_and_grad" for fn in st.stats)


def test_profile_is_written_when_the_run_fails(small_dataset, tmp_path, monkeypatch):
    monkeypatch.setenv("IBTMPI_FAULT", "0:1:compute")
    with pytest.raises(InjectedFault):
        Trainer(cfg(small_dataset, tmp_path, **{"run.profile": "true"}),
                log=lambda m: None).run()
    assert "block 1, phase compute" in (tmp_path / "profile-rank-00000.txt").read_text()


def test_no_profile_by_default_and_not_part_of_the_digest(small_dataset, tmp_path):
    c = cfg(small_dataset, tmp_path)
    Trainer(c, log=lambda m: None).run()
    assert not [f for f in os.listdir(tmp_path) if f.startswith("profile-")]
    assert run_hash(c) == run_hash(cfg(small_dataset, tmp_path, **{"run.profile": "true"}))
