"""What a command reports: no plots is said with its reason, a
one-process run plans no Allreduce and says a clamped split, --quiet is
quiet, and the docs list what model.npz holds.
(First found by trying the project from a fresh clone.)"""
import os

from ibtmpi.cli import main
from conftest import train_args

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


# no plots is said with its reason, not as "0 plots"
def test_no_plots_says_why(monkeypatch):
    from ibtmpi import cli, outputs

    def missing():
        raise outputs.NoPlotting("matplotlib is not installed: pip install 'ibtmpi[plot]'")
    monkeypatch.setattr(outputs, "pyplot", missing)
    said = cli._plots_said([])
    assert said.startswith("no plots (matplotlib is not installed") and "0 plots" not in said
    assert cli._plots_said(["a.png", "b.png"]) == "2 plots"


# one process reports no Allreduce traffic; a clamped split is said
def test_one_process_plans_no_allreduce_and_says_a_clamped_split(small_dataset, tmp_path,
                                                                 capsys):
    argv = ["train", "--dry-run"] + train_args(small_dataset, tmp_path / "r",
                                              **{"data.split_size": 5000})
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "communication: none (one process" in out and "Allreduce(s) per pass" not in out
    # 480 train images, one worker: the split is its whole range, and it says why
    assert ("split 480 per worker (data.split_size 5,000 is more than a worker's 480 "
            "samples: each worker takes its whole range, one block per pass)") in out
    assert main(["train", "--simulate", "2", "--dry-run"]
                + train_args(small_dataset, tmp_path / "r")) == 0
    out = capsys.readouterr().out
    assert "Allreduce(s) per pass (one per block)" in out and "simulated here: no MPI" in out
    assert main(["train"] + train_args(small_dataset, tmp_path / "r2",
                                       **{"data.split_size": 5000})) == 0
    out = capsys.readouterr().out
    assert "split 480 (data.split_size 5,000 is more than" in out


def test_bench_table_shows_no_allreduce_for_one_process():
    from ibtmpi import bench
    row = {"name": "t1-sgd-1", "simulated": False, "N": 1, "world_size": 1,
           "algorithm": "sgd", "wall_per_pass": 1.0, "critical_per_pass": 1.0,
           "ips_worker_mean": None, "ips_worker_ci": None, "rank0_cpu_share": None,
           "allreduce_calls_per_pass": 9.0, "allreduce_mib_per_pass": 21.3}
    md = "\n".join(bench._time_table([row], row))
    assert "| none | none |" in md and "21.3" not in md


# --quiet means quiet; the docs list what model.npz holds
def test_prep_quiet_prints_nothing(tmp_path, capsys):
    import numpy as np
    from PIL import Image
    from ibtmpi.data_prep.cli import main as prep
    for c in ("a", "b"):
        (tmp_path / "src" / c).mkdir(parents=True)
        for i in range(12):
            Image.fromarray(np.full((8, 8, 3), i, np.uint8)).save(tmp_path / "src" / c / f"{i}.png")
    (tmp_path / "src" / "a" / "broken.png").write_bytes(b"not an image")
    assert prep(["folder", str(tmp_path / "src"), str(tmp_path / "f"), "--size", "8",
                 "--quiet"]) == 0
    out, err = capsys.readouterr()          # the skipped file is a warning: still said
    assert out.startswith("skipped 1 unreadable file(s):") and "wrote" not in out, out
    assert len(out.strip().splitlines()) == 2 and err == ""
    assert prep(["synth", str(tmp_path / "s"), "--n", "60", "--size", "8", "--quiet"]) == 0
    assert capsys.readouterr() == ("", "")


def test_docs_list_what_model_npz_holds(trained):
    import numpy as np
    text = open(os.path.join(ROOT, "docs", "config.md")).read()
    section = text[text.index("- `model.npz`:"):]
    section = section[:section.index("model-best.npz")]
    with np.load(trained) as f:
        for key in f.files:
            assert f"`{key}`" in section, key
    assert "n_classes" not in section
