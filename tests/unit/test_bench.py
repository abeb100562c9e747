"""`ibtmpi bench report` on real (tiny) runs and a diverged one."""
import json
import os

from ibtmpi.cli import main
from ibtmpi.config import load
from ibtmpi.trainer import Trainer


def test_report_tables_plots_and_targets(small_dataset, tmp_path, capsys):
    runs = []
    for name, algo, n in (("t1-sgd-1", "sgd", 1), ("t1-admm-2", "admm", 2),
                          ("t1-ibt-2", "ibt", 2)):
        d = str(tmp_path / name)
        cfg = load(None, [f"data.path={small_dataset}", f"algorithm.name={algo}",
                          "data.split_size=40", "data.batch=16", "model.layers=tiny",
                          "run.passes=2", "run.quiet=true", f"run.dir={d}",
                          f"run.simulate={n if n > 1 else 0}", "run.threads=1"])
        Trainer(cfg, log=lambda m: None).run()
        runs.append(d)
    div = tmp_path / "t1-bmuf-2"
    div.mkdir()
    (div / "diverged.json").write_text(json.dumps({"algorithm": "bmuf", "N": 2,
                                                   "message": "x"}))
    runs.append(str(div))
    out = tmp_path / "rep"
    assert main(["bench", "report", *runs, "--out", str(out)]) == 0
    md = (out / "report.md").read_text()
    acc = json.load(open(tmp_path / "t1-admm-2" / "summary.json"))["test_acc"]
    assert "## T1: test accuracy vs N" in md
    assert f"| admm | - | {acc:.4f} |" in md
    assert "| bmuf | - | diverged |" in md
    assert "ibt at N = 2 within 0.5 pt of N = 1" in md
    assert "MPI:" in md and "commit" in md
    rep = json.load(open(out / "report.json"))
    assert {r["name"] for r in rep["runs"]} == {os.path.basename(r) for r in runs}
    for f in ("t4_val_accuracy.png", "t5_residuals_rho.png"):
        assert (out / f).stat().st_size > 2000
    assert main(["bench", "report", str(tmp_path / "nothing"), "--out", str(out)]) == 2
