"""Where the ranks ran: the start line and summary.json's environment."""
import json
import os

from ibtmpi.config import load
from ibtmpi.threads import current_blas_threads
from ibtmpi.monitor import oversubscription_text, placement_text
from ibtmpi.monitor import ranges
from ibtmpi.train import Trainer


def test_ranges():
    assert ranges([0]) == "0"
    assert ranges([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"


def test_one_node_of_cpu_workers():
    rows = [("n1", 10, 1, "-", (0, 1)), ("n1", 11, 1, "cpu", (0, 1)),
            ("n1", 12, 1, "cpu", (0, 1))]
    assert placement_text(rows) == ("placement: 3 rank(s) on 1 node(s): n1 [0-2]; "
                                    "BLAS threads per rank 1; workers on cpu")
    assert oversubscription_text(rows) is None            # 2 worker threads, 2 cores


def test_many_gpu_nodes_are_shortened():
    rows = [("login", 1, 8, "-", tuple(range(8)))]
    for node in range(6):
        rows += [(f"g{node}", 100 + i, 1, f"gpu {i}", (i,)) for i in range(4)]
    text = placement_text(rows)
    assert text.startswith("placement: 25 rank(s) on 7 node(s): login [0], g0 [1-4], "
                           "g1 [5-8], g2 [9-12], ... 3 more;")
    assert "BLAS threads per rank 1/8" in text
    assert text.endswith("workers on gpu (24 GPU(s) for 24 worker(s))")


def test_gpus_shared_by_workers_are_counted_once():
    rows = [("n", 1, 1, "-", (0,)), ("n", 2, 1, "gpu 0", (0,)), ("n", 3, 1, "gpu 0", (0,))]
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
                             "blas_threads": current_blas_threads(), "device": "cpu",
                             "cores": len(os.sched_getaffinity(0))}]
    assert any(m.startswith("placement: 1 rank(s) on 1 node(s)") for m in logs)


def test_oversubscription_counts_worker_threads_against_the_cores_they_may_use():
    def rows(node_cores, workers, threads=1, bind=False, host="n"):
        """master + `workers` CPU workers on one node; bind: each worker on its own core"""
        allc = tuple(range(node_cores))
        return [(host, 1, threads, "-", allc)] + [
            (host, 2 + i, threads, "cpu", (i % node_cores,) if bind else allc)
            for i in range(workers)]
    assert oversubscription_text(rows(2, 2)) is None
    assert oversubscription_text(rows(4, 2, threads=2)) is None
    # mpiexec -n 5 on 2 cores: 4 worker threads on 2 cores
    text = oversubscription_text(rows(2, 4))
    assert text.startswith("oversubscribed: n: 4 worker threads on 2 cores. Workers will "
                           "wait for cores")
    # BLAS threads count: 2 workers x 2 threads on 2 cores
    assert "n: 4 worker threads on 2 cores" in oversubscription_text(rows(2, 2, threads=2))
    # each worker bound to its own core: the cores are the union of the masks
    assert oversubscription_text(rows(8, 4, bind=True)) is None
    assert "n: 8 worker threads on 4 cores" in oversubscription_text(
        rows(8, 4, threads=2, bind=True))
    # GPU workers and the master are not counted; nodes are separate
    gpu = [("g", 1, 8, "-", (0,)), ("g", 2, 4, "gpu 0", (0,)), ("g", 3, 4, "gpu 1", (0,))]
    assert oversubscription_text(gpu) is None
    two = rows(2, 2, host="a") + rows(2, 3, host="b")[1:]
    assert oversubscription_text(two).startswith("oversubscribed: b: 3 worker threads on 2 cores.")
    assert placement_text(two).startswith("placement: 6 rank(s) on 2 node(s)")
