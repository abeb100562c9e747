"""run.tensorboard: the master's metrics as TensorBoard event files.

Offline clusters watch runs in TensorBoard; the event files are written
with tensorboardX (the `tensorboard` extra: no TensorFlow, no torch) into
RUN/tb/, one scalar per metrics.jsonl figure a block, with the block as
the step, so a resumed run continues its curves (TensorBoard shows the
newest value of a step a run wrote twice). metrics.jsonl stays the record;
these files are a view of it. Test: tests/unit/test_tensorboard.py.
"""
from __future__ import annotations

import os

DIR = "tb"

# metrics.jsonl key -> TensorBoard tag
SCALARS = {
    "train_loss": "loss/train", "val_loss": "loss/val",
    "train_acc": "accuracy/train", "val_acc": "accuracy/val",
    "lr": "optim/lr", "rho": "consensus/rho",
    "primal_residual": "consensus/primal_residual",
    "dual_residual": "consensus/dual_residual",
    "wall_s": "time/block_wall_s", "compute_mean_s": "time/compute_mean_s",
    "allreduce_s": "time/allreduce_s",
}


def check_available():
    """ConfigError-worthy text where tensorboardX is missing, else None."""
    try:
        import tensorboardX  # noqa: F401
    except ImportError:
        return ("run.tensorboard needs the tensorboardX package: pip install "
                "'ibtmpi[tensorboard]' (or tensorboardX)")
    return None


class Writer:
    """The master's event file writer for one job of a run."""

    def __init__(self, run_dir):
        from tensorboardX import SummaryWriter
        d = os.path.join(run_dir, DIR)
        os.makedirs(d, exist_ok=True)
        import time
        # one file a job: tensorboardX names it by the second and the host,
        # which two jobs of a run (a quick requeue) can share
        self.w = SummaryWriter(logdir=d, flush_secs=30,
                               filename_suffix=f".{os.getpid()}.{time.time_ns()}")

    def block(self, rec):
        step = int(rec["block"])
        for key, tag in SCALARS.items():
            v = rec.get(key)
            if isinstance(v, (int, float)) and v == v:     # numbers, not NaN
                self.w.add_scalar(tag, float(v), step)

    def close(self):
        self.w.flush()
        self.w.close()
