"""No output is written through a symbolic link: a link planted where a
run writes (its files, checkpoints/, .ranks/, timeline/) refuses the start
with one line and exit 2, and leaves the link's target as it was; files
written while a run goes (and evaluate's and predict's --out) replace a
link by a rename or refuse to open one, never write its target."""
import errno
import os

import numpy as np
import pytest

from ibtmpi.cli import main
from ibtmpi.fsutil import open_append, planted_links, replace_file
from conftest import train_args


@pytest.fixture(scope="module")
def trained(small_dataset, tmp_path_factory):
    run = tmp_path_factory.mktemp("trained") / "r"
    assert main(["train", "--simulate", "2"] + train_args(small_dataset, run)) == 0
    return str(run)


@pytest.mark.parametrize("name", ["config.toml", "metrics.jsonl", "summary.json",
                                  "checkpoints", ".ranks", "checkpoints/ckpt-00000001",
                                  "timeline"])
def test_a_planted_link_refuses_the_start_and_spares_its_target(small_dataset, tmp_path,
                                                                  name, capsys):
    run = tmp_path / "r"
    victim = tmp_path / "victim"
    if "/" in name or name in ("checkpoints", ".ranks", "timeline"):
        victim.mkdir()
        (victim / "keep.txt").write_text("precious")
    else:
        victim.write_text("precious")
    (run / os.path.dirname(name)).mkdir(parents=True, exist_ok=True)
    os.symlink(victim, run / name)
    assert main(["train", "--simulate", "2"] + train_args(small_dataset, run)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert (f"holds symbolic link(s) where ibtmpi writes: {name} -> {victim}" in err[0]
            and "remove them, or use another run.dir" in err[0])
    if victim.is_dir():
        assert [p.name for p in victim.iterdir()] == ["keep.txt"]
    else:
        assert victim.read_text() == "precious"
    assert not (run / "metrics.jsonl").exists() or name == "metrics.jsonl"


def test_the_run_directory_itself_may_be_a_link(small_dataset, tmp_path):
    real = tmp_path / "scratch" / "r"
    real.mkdir(parents=True)
    os.symlink(real, tmp_path / "r")
    assert planted_links(str(tmp_path / "r")) == []
    assert main(["train", "--simulate", "2"] + train_args(small_dataset, tmp_path / "r")) == 0
    assert (real / "summary.json").is_file()


def test_writes_replace_a_link_or_refuse_it(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    os.symlink(victim, tmp_path / "a")
    replace_file(str(tmp_path / "a"), "new")
    assert not os.path.islink(tmp_path / "a") and (tmp_path / "a").read_text() == "new"
    os.symlink(victim, tmp_path / "b")
    with pytest.raises(OSError) as e:
        open_append(str(tmp_path / "b"))
    assert e.value.errno == errno.ELOOP and "does not write through" in str(e.value)
    assert victim.read_text() == "precious"
    assert not [n for n in os.listdir(tmp_path) if ".tmp-" in n]


def test_evaluate_and_predict_out_never_write_through_a_link(trained, small_dataset,
                                                            tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    victims = {}
    for name in ("report.json", "report.txt", "confusion.png"):
        victims[name] = tmp_path / f"victim-{name}"
        victims[name].write_text("precious")
        os.symlink(victims[name], out / name)
    assert main(["evaluate", trained, "--out", str(out)]) == 0
    for name, v in victims.items():
        assert v.read_text() == "precious"
        assert not os.path.islink(out / name) and (out / name).stat().st_size > 0
    from PIL import Image
    img = tmp_path / "x.png"
    Image.fromarray(np.zeros((16, 16, 3), np.uint8)).save(img)
    pv = tmp_path / "victim-pred"
    pv.write_text("precious")
    os.symlink(pv, tmp_path / "pred.csv")
    assert main(["predict", trained, str(img), "--out", str(tmp_path / "pred.csv")]) == 0
    assert pv.read_text() == "precious"
    assert (tmp_path / "pred.csv").read_text().startswith("file,class")
