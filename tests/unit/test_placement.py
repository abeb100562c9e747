"""Where the ranks ran: the start line and summary.json's environment."""
import json
import os

from ibtmpi.config import load
from ibtmpi.threads import current_blas_threads
from ibtmpi.monitor import placement_text
from ibtmpi.status import ranges
from ibtmpi.trainer import Trainer


def testranges():
    assert ranges([0]) == "0"
    assert ranges([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"


def test_one_node_of_cpu_workers():
    rows = [("n1", 10, 1, "-"), ("n1", 11, 1, "cpu"), ("n1", 12, 1, "cpu")]
    assert placement_text(rows) == ("placement: 3 rank(s) on 1 node(s): n1 [0-2]; "
                                    "BLAS threads per rank 1; workers on cpu")


def test_many_gpu_nodes_are_shortened():
    rows = [("login", 1, 8, "-")]
    for node in range(6):
        rows += [(f"g{node}", 100 + i, 1, f"gpu {i}") for i in range(4)]
    text = placement_text(rows)
    assert text.startswith("placement: 25 rank(s) on 7 node(s): login [0], g0 [1-4], "
                           "g1 [5-8], g2 [9-12], ... 3 more;")
    assert "BLAS threads per rank 1/8" in text
    assert text.endswith("workers on gpu (24 GPU(s) for 24 worker(s))")


def test_gpus_shared_by_workers_are_counted_once():
    rows = [("n", 1, 1, "-"), ("n", 2, 1, "gpu 0"), ("n", 3, 1, "gpu 0")]
    assert placement_text(rows).endswith("(1 GPU(s) for 2 worker(s))")


def test_summary_records_the_environment(small_dataset, tmp_path):
    run = tmp_path / "r"
    logs = []
    cfg = load(None, [f"data.path={small_dataset}", "model.layers=tiny", "run.passes=0.5",
                      "run.quiet=true", f"run.dir={run}", "run.simulate=2", "run.threads=1",
                      "data.split_size=40", "data.batch=16"])
    Trainer(cfg, log=logs.append).run()
    env = json.load(open(run / "summary.json"))["environment"]
    assert env["ibtmpi"] and env["python"] and env["numpy"] and env["mpi"]
    assert env["ranks"] == [{"rank": 0, "host": os.uname().nodename, "pid": os.getpid(),
                             "blas_threads": current_blas_threads(), "device": "cpu"}]
    assert any(m.startswith("placement: 1 rank(s) on 1 node(s)") for m in logs)
