"""benchmarks/gpu_e2e.sh rehearsed on this CPU as test_gpu_check.py
rehearses gpu_check.sh (`import cupy` finds the CuPy stand-in, tiny sizes:
GPU_E2E_QUICK=1): every stage must end ok and leave its files; and
benchmarks/e2e_summary.py's figures and verdicts on hand-made runs."""
import json
import math
import os
import sys

import pytest

from test_gpu_check import BIN, ROOT, no_mpiexec_path, rehearse

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import e2e_summary  # noqa: E402

STAGES = ["imports", "info", "compile", "step", "prep", "train-sgd-b8", "train-sgd-b32",
          "train-ibt-sim4", "train-ibt-mpi2", "summary"]
RUN_FILES = ["config.toml", "metrics.jsonl", "process_wall_s", "summary.json"]


@pytest.mark.skipif(not os.path.exists(os.path.join(BIN, "mpiexec")),
                    reason="no mpiexec beside this Python")
def test_gpu_e2e_stages(tmp_path):
    out, stages, log = rehearse(tmp_path, f"{BIN}{os.pathsep}{os.environ['PATH']}",
                                script="gpu_e2e.sh", quick="GPU_E2E_QUICK")
    assert list(stages) == STAGES, log
    for name in STAGES:
        assert stages[name].startswith("ok,"), f"{name}: {stages[name]}\n{log}"
    assert sorted(p.name for p in out.iterdir()) == [
        "e2e.json", "e2e.txt", "env.txt", "gpu_step.json", "gpu_step.txt", "runs",
        "stages.txt", "summary.log", "train.txt"]
    for run in ("sgd-b8", "sgd-b32", "ibt-sim4", "ibt-mpi2"):
        assert sorted(p.name for p in (out / "runs" / run).iterdir()) == RUN_FILES, run
    step = json.loads((out / "gpu_step.json").read_text())
    assert [r["batch"] for r in step] == [8, 16, 32]
    for r in step:
        assert list(r["modes"]) == ["fp32", "graphs", "tf32", "graphs+tf32"]
        assert all(m["img_s"] > 0 for m in r["modes"].values())
        # the stand-in rounds TF32 GEMM inputs to 10 mantissa bits
        assert 1e-5 < r["tf32_grad_dev"]["max_rel"] < 0.05, r["tf32_grad_dev"]
    e2e = json.loads((out / "e2e.json").read_text())
    runs = e2e["runs"]
    assert (runs["ibt-mpi2"]["N"], runs["ibt-mpi2"]["world_size"]) == (2, 3)
    assert (runs["ibt-sim4"]["N"], runs["ibt-sim4"]["simulated"]) == (4, True)
    assert runs["sgd-b32"]["step_mode"] == "graphs" and runs["sgd-b32"]["wall_from"] == "process"
    for r in runs.values():
        assert r["img_s"] > 0 and r["wall_ratio"] > 1 and 0 <= r["data_wait_share"] < 1
    text = (out / "e2e.txt").read_text()
    for line in ("trainer img/s over a pass / step (graphs) at batch 8",
                 "sgd-b32: trainer img/s over a pass / step (graphs) at batch 32",
                 "sgd-b8: whole-run wall / sum of passes", "ibt-sim4: whole-run wall",
                 "step (graphs) / PyTorch defaults at batch 32",
                 "step / PyTorch defaults at batch 64: - = - (target >= 1.00x): not measured",
                 "| ibt-mpi2 | ibt | 2 | 3 | 8 | graphs |",
                 "batch 32: tf32 gradients vs fp32"):
        assert line in text, text
    assert "ibt-mpi2: whole-run wall" not in text      # 3 processes: no target
    assert "no summary.json" not in text


def test_gpu_e2e_keeps_to_its_budget(tmp_path):
    """No budget: every stage, the summary too, is skipped and says so; no
    mpiexec: the MPI run says why it is skipped."""
    out, stages, log = rehearse(tmp_path, no_mpiexec_path(tmp_path), script="gpu_e2e.sh",
                                quick="GPU_E2E_QUICK", GPU_E2E_BUDGET="0")
    assert list(stages) == STAGES, log
    assert stages.pop("train-ibt-mpi2") == "SKIPPED (no usable mpiexec + mpi4py)"
    assert set(stages.values()) == {"SKIPPED (the 0 s budget is spent)"}, stages


def write_run(d, pass_blocks, process_wall=None, graphs="auto", math_="fp32", batch=32):
    """A run directory: pass_blocks = per pass [(samples, wall_s,
    data_wait_max_s)] of its blocks."""
    d.mkdir()
    blocks = [{"pass": p, "samples": n, "wall_s": w, "data_wait_max_s": dw}
              for p, bl in enumerate(pass_blocks) for n, w, dw in bl]
    (d / "metrics.jsonl").write_text("".join(json.dumps(b) + "\n" for b in blocks))
    pass_s = [sum(w for _, w, _ in bl) for bl in pass_blocks]
    (d / "summary.json").write_text(json.dumps({
        "algorithm": "sgd", "N": 1, "world_size": 1, "simulated": False, "startup_s": 0.5,
        "pass_s": pass_s, "wall_s": sum(pass_s) + 0.1, "final_eval_s": 0.25,
        "master_busy_s": 0.3}))
    (d / "config.toml").write_text(f'[data]\nbatch = {batch}\n\n[run]\ncuda_graphs = "{graphs}"\n'
                                   f'gpu_math = "{math_}"\n')
    if process_wall is not None:
        (d / "process_wall_s").write_text(f"{process_wall}\n")
    return str(d)


STEP = [{"batch": 32, "ours_img_s": 2100.0, "torch_img_s": 1500.0, "torch_defaults_img_s": 1000.0,
         "modes": {"fp32": {"img_s": 2100.0}, "graphs": {"img_s": 2200.0},
                   "tf32": {"img_s": 2500.0}}},
        {"batch": 64, "ours_img_s": 3000.0, "torch_img_s": 2500.0,
         "torch_defaults_img_s": 3500.0, "modes": {"fp32": {"img_s": 3000.0},
                                                   "graphs": {"img_s": 3500.0}}}]
PASSES = [[(1000, 1.0, 0.1), (1000, 1.0, 0.1)], [(1000, 0.5, 0.05), (1000, 0.5, 0.05)],
          [(1000, 0.5, 0.05), (1000, 0.5, 0.05)]]


def test_e2e_summary_figures_and_targets(tmp_path):
    r = e2e_summary.run_figures(write_run(tmp_path / "a", PASSES, process_wall=5.0))
    assert r["pass_s"] == [2.0, 1.0, 1.0]
    assert r["pass_img_s"] == [1000.0, 2000.0, 2000.0]
    assert r["img_s"] == 1500.0 and r["steady_img_s"] == 2000.0
    assert math.isclose(r["data_wait_share"], 0.1)
    assert (r["wall_s"], r["wall_from"], r["wall_ratio"]) == (5.0, "process", 1.25)
    assert r["step_mode"] == "graphs" and r["batch"] == 32
    # no process_wall_s: launch to the end of the test evaluation from summary.json
    b = e2e_summary.run_figures(write_run(tmp_path / "b", PASSES, graphs="off", math_="tf32"))
    assert (b["wall_s"], b["wall_from"]) == (0.5 + 4.1 + 0.25, "summary.json")
    assert math.isclose(b["wall_ratio"], 4.85 / 4)
    assert b["step_mode"] == "tf32"
    got = {t[0]: (t[2], t[4]) for t in e2e_summary.targets({"a": r, "b": b}, STEP)}
    want = {"a: trainer img/s over a pass / step (graphs) at batch 32": (2000 / 2200, "met"),
            "a: whole-run wall / sum of passes": (1.25, "NOT met"),
            "b: trainer img/s over a pass / step (tf32) at batch 32": (0.8, "NOT met"),
            "b: whole-run wall / sum of passes": (4.85 / 4, "NOT met"),
            "step (fp32) / PyTorch defaults at batch 32": (2.1, "met"),
            "step (graphs) / PyTorch defaults at batch 32": (2.2, "met"),
            "step (tf32) / PyTorch defaults at batch 32": (2.5, "met"),
            "step (fp32) / PyTorch defaults at batch 64": (3000 / 3500, "NOT met"),
            "step (graphs) / PyTorch defaults at batch 64": (1.0, "met")}
    assert got.keys() == want.keys()
    for k, (v, how) in want.items():
        assert math.isclose(got[k][0], v) and got[k][1] == how, (k, got[k])
    text = e2e_summary.render({"a": r}, STEP, missing=["c"])
    assert ("a: trainer img/s over a pass / step (graphs) at batch 32: 2,000 / 2,200 = 0.91x "
            "(target >= 0.90x): met") in text
    assert "a: whole-run wall / sum of passes: 5.00 s / 4.00 s = 1.25x (target <= 1.20x): NOT met" \
        in text
    assert "| a | sgd | 1 | 1 | 32 | graphs | 0.50 | 3 | 2.00, 1.00 | 1,500 | 0.25 | 10.0% " \
           "| 5.00 (process) | 1.25x | 0.91x |" in text
    assert "c: no summary.json (the run did not finish)" in text
    assert "| 32 | 2,100 | 2,200 | 2,500 | 1,500 | 1,000 |" in text


def test_e2e_summary_cli(tmp_path):
    """Writes the report and its JSON; a run without summary.json is named
    and the exit status is 1; a broken step file is one line, exit 1."""
    (tmp_path / "step.json").write_text(json.dumps(STEP))
    a = write_run(tmp_path / "a", PASSES, process_wall=5.0)
    out = tmp_path / "e2e.txt"
    argv = ["--step", str(tmp_path / "step.json"), "--out", str(out), f"a={a}"]
    assert e2e_summary.main(argv) == 0
    assert "## Targets" in out.read_text()
    data = json.loads((tmp_path / "e2e.json").read_text())
    assert data["runs"]["a"]["img_s"] == 1500.0
    assert {"what": "a: whole-run wall / sum of passes", "figure": "5.00 s / 4.00 s",
            "value": 1.25, "target": "<= 1.20x", "verdict": "NOT met"} in data["targets"]
    assert e2e_summary.main(argv + [f"gone={tmp_path / 'gone'}"]) == 1
    assert "gone: no summary.json" in out.read_text()
    (tmp_path / "step.json").write_text("{broken")
    with pytest.raises(SystemExit) as e:
        e2e_summary.main(argv)
    assert str(e.value).startswith("e2e_summary: JSONDecodeError:") and "\n" not in str(e.value)
