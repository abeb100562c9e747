"""The time-per-pass model of a block pipeline (benchmarks/bench_scaling.py
prints it; `ibtmpi bench report` projects with it): a block is the workers'
compute and update beside the master's own work and update, then ONE
Allreduce of P floats among N+1 ranks (Rabenseifner: 2 ceil(log2 p) alpha +
2 (p-1)/p n beta). Inputs come from runs' metrics (run_inputs) or are
stated (CLUSTERS). Tests: tests/unit/test_bench_scripts.py.
"""
import math
import statistics

CLUSTERS = {
    # stated, not measured: latency per message step, seconds per byte
    "ib100": {"alpha": 2.0e-6, "beta": 1 / 12.5e9,
              "what": "100 Gb/s InfiniBand, 2 us latency"},
    "nvlink": {"alpha": 5.0e-6, "beta": 1 / 150e9,
               "what": "NVLink inside one node, 150 GB/s, 5 us per step"},
}


def t_ar(p, nbytes, alpha, beta):
    if p <= 1:
        return 0.0
    return 2 * math.ceil(math.log2(p)) * alpha + 2 * (p - 1) / p * nbytes * beta


def block_stages(n_workers, per_block, t_s, P, alpha, beta, u_worker=0.0, t_master=0.0,
                 u_master=None):
    """{stage: seconds} of one block: a worker's compute and update, and the
    master's own work and update, side by side (the larger is on the
    critical path), then the Allreduce. u_master: u_worker unless given."""
    u_master = u_worker if u_master is None else u_master
    return {"compute": per_block * t_s + u_worker, "master": t_master + u_master,
            "allreduce": t_ar(n_workers + 1, 4 * P, alpha, beta)}


def block_time(st):
    return max(st["compute"], st["master"]) + st["allreduce"]


def bottleneck(st):
    """The stage that decides the block: compute or the master (whichever
    is longer), else the Allreduce when it is longer than both."""
    lead = "master" if st["master"] > st["compute"] else "compute"
    return "allreduce" if st["allreduce"] > max(st["compute"], st["master"]) else lead


def pass_time(n_train, n_workers, split, t_s, P, alpha, beta, u_worker=0.0, t_master=0.0,
              u_master=None):
    """Model of one pass: blocks x T_block (see the module's docstring)."""
    per_worker = n_train // n_workers
    blocks = max(1, per_worker // split)
    st = block_stages(n_workers, per_worker / blocks, t_s, P, alpha, beta, u_worker,
                      t_master, u_master)
    return blocks * block_time(st)


def run_inputs(lines, n):
    """(seconds per sample, master's own work per block, serial: True where
    the master is a worker too, one process, so its work adds to the
    compute instead of overlapping it) from a run's metrics: medians over
    its blocks after the first two (start-up)."""
    use = lines[2:] or lines
    per = [l["compute_max_s"] / (l["samples"] / n) for l in use if l["samples"]]
    serial = bool(use) and all(l.get("master_is_worker") for l in use)
    busy = [l["master_busy_s"] - (l["compute_max_s"] if serial else 0.0) for l in use
            if "master_busy_s" in l]
    return (statistics.median(per) if per else None,
            max(statistics.median(busy), 0.0) if busy else 0.0, serial)


def update_seconds(P, algo="ibt", n_workers=4, reps=5):
    """Median seconds of one consensus update of P floats on this host."""
    import time
    import numpy as np
    from .consensus import make_consensus
    c = make_consensus(algo, np.zeros(P, np.float32), n_workers, {})
    S = np.ones(P, np.float32)
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        c.update(S, 0.0)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def paper_projection(run, n=32, n_train=20000, block=4960, net="ib100"):
    """The paper's fixed block at n workers, from a finished run's own
    figures (its time per sample, its master's work per block, its P) and a
    stated interconnect: (speedup, bottleneck, inputs)."""
    ts, busy, serial = run_inputs(run["metrics"], run["N"])
    P, c = run["parameters"], CLUSTERS[net]
    u = update_seconds(P)
    master = u if serial else max(busy, u)       # a master of its own: its measured work
    st = block_stages(n, block // n, ts, P, c["alpha"], c["beta"], u, master, 0.0)
    sp = n_train * ts / pass_time(n_train, n, block // n, ts, P, c["alpha"], c["beta"], u,
                                  master, 0.0)
    return sp, bottleneck(st), {"t_sample_ms": ts * 1e3, "master_ms": master * 1e3,
                                "update_ms": u * 1e3, "P": P, "net": c["what"],
                                "stages_ms": {k: v * 1e3 for k, v in st.items()}}
