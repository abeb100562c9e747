"""The scaling model's time per pass for a finished run, against the run's
own honest time per pass: the run's blocks of its last pass, each its
measured compute (slowest worker) or the master's own work, whichever is
longer, plus its Allreduces at the alpha and beta measured on the links
(ibtmpi/scaling.py t_ar, benchmarks/allreduce_alpha_beta.py). It checks
the model's communication term on a real network; the compute side comes
from the run itself.

Usage: python tests/multinode/predict.py RUN_DIR AB_JSON
"""
import json
import sys

from ibtmpi.scaling import t_ar


def predict(run_dir, ab):
    s = json.load(open(f"{run_dir}/summary.json"))
    lines = [json.loads(x) for x in open(f"{run_dir}/metrics.jsonl")]
    last = max(l["pass"] for l in lines)
    blocks = [l for l in lines if l["pass"] == last]
    calls = s["allreduce_calls"] / s["blocks"]            # per block (ssgd: its steps)
    nbytes = s["allreduce_bytes"] / s["allreduce_calls"]
    ar = t_ar(s["world_size"], nbytes, ab["alpha_s"], ab["beta_s_per_byte"])
    model = sum(max(l["compute_max_s"], l.get("master_busy_s", 0.0)) + calls * ar
                for l in blocks)
    measured = s["pass_s"][last]
    return model, measured, calls * ar * len(blocks)


def main():
    run_dir, ab_path = sys.argv[1:3]
    model, measured, comm = predict(run_dir, json.load(open(ab_path)))
    print(f"last pass: model {model:.2f} s (of which Allreduce {comm:.2f} s) against "
          f"{measured:.2f} s measured: error {model / measured - 1:+.0%}")


if __name__ == "__main__":
    main()
