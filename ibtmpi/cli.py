"""Command line: ``ibtmpi <command>`` (also ``python -m ibtmpi``).

Commands: ``info`` (versions, MPI library, BLAS threads, model summary),
``demo`` (synthetic data + an MPI run with master and 2 workers), ``train`` and ``prep``
(dataset tools, also installed as ``ibtmpi-prep``). Bad input
exits with status 2 and a one-line message, never a traceback.
"""
from __future__ import annotations

import argparse
import sys
import time

from . import __version__


class UsageError(Exception):
    """Bad input: reported in one line, exit status 2."""


def _positive_int(text):
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}")
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {v}")
    return v


def _positive_float(text):
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}")
    if not v > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {v}")
    return v


def _threads(text):
    return text if text == "auto" else _positive_int(text)


def build_parser():
    ap = argparse.ArgumentParser(
        prog="ibtmpi",
        description="Incremental Block Training with consensus ADMM over MPI.")
    ap.add_argument("--version", action="version",
                    version=f"ibtmpi {__version__}")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("prep", help="make or check a dataset (synth, folder, inspect)",
                       add_help=False)
    p.add_argument("rest", nargs=argparse.REMAINDER)

    p = sub.add_parser(
        "train", help="train with IBT / consensus ADMM (under mpiexec: rank 0 master)",
        description="Train a CNN by Incremental Block Training. Under "
                    "`mpiexec -n N+1`, rank 0 is the master and ranks 1..N "
                    "the workers; a single process is the N = 1 baseline.")
    p.add_argument("--config", help="TOML run configuration (see examples/)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a config value (repeatable)")
    p.add_argument("--simulate", type=_positive_int,
                   help="run N logical workers in this one process")
    p.add_argument("--resume", action="store_true",
                   help="require a checkpoint to resume from (default: resume "
                        "automatically when the run directory has a matching one)")
    p.add_argument("--device", choices=("cpu", "gpu"), default="cpu",
                   help="compute device of the workers (default cpu)")
    p.add_argument("--quiet", action="store_true")

    p = sub.add_parser("info", help="versions, MPI library, threads, model summary")
    p.add_argument("--model", default="reference")
    p.add_argument("--image-size", type=_positive_int, default=64)
    p.add_argument("--classes", type=_positive_int, default=5)

    p = sub.add_parser(
        "demo", help="make the synthetic demo data and train over MPI (master + 2 workers)",
        description="Write the synthetic 5-class overhead-image set (if missing) "
                    "and run `mpiexec -n WORKERS+1 ibtmpi train` on it with the "
                    "MPI next to this Python (the mpich extra's) or on PATH.")
    p.add_argument("--data", default="data/demo", help="dataset directory (default data/demo)")
    p.add_argument("--n", type=_positive_int, default=10000,
                   help="images to generate if the dataset is missing (default 10000)")
    p.add_argument("--image-size", type=_positive_int, default=32)
    p.add_argument("--workers", type=_positive_int, default=2)
    p.add_argument("--algorithm", default="ibt")
    p.add_argument("--passes", type=_positive_float, default=3.0)
    p.add_argument("--model", default="reference")
    p.add_argument("--run-dir", default="runs/demo")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    p.add_argument("--quiet", action="store_true")
    return ap


def _model(spec, size, classes, seed=0):
    from .model import Model
    try:
        return Model(spec, (3, size, size), classes, seed=seed)
    except ValueError as e:          # bad preset, layer spec or geometry
        raise UsageError(str(e)) from None


def cmd_info(args):
    import numpy as np
    from . import comm, threads
    n = threads.configure("auto")
    print(f"ibtmpi {__version__}, numpy {np.__version__}")
    print(f"MPI: {comm.library_version()}")
    print(f"BLAS threads per rank: {n} (usable cores {threads.usable_cores()})")
    m = _model(args.model, args.image_size, args.classes)
    print(f"model {args.model!r} for {3}x{args.image_size}x{args.image_size}, "
          f"{args.classes} classes:")
    print(m.summary())
    return 0


def find_mpiexec():
    """The launcher of the MPI mpi4py runs on: the venv's own first."""
    import os
    import shutil
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.path.exists(here):
        return here
    found = shutil.which("mpiexec") or shutil.which("mpirun")
    if not found:
        raise UsageError("no mpiexec found: install the 'mpich' extra "
                         "(pip install 'ibtmpi[mpich]') or load your MPI module")
    return found


def cmd_demo(args):
    import os
    import subprocess
    if not os.path.exists(os.path.join(args.data, "dataset.json")):
        from .data_prep.prep import prep_synth
        from .data_prep.writer import WriteError
        try:
            meta, dt = prep_synth(args.data, n=args.n, size=args.image_size,
                                  seed=0, shards=2, quiet=args.quiet,
                                  overwrite=os.path.exists(args.data))
        except WriteError as e:
            raise UsageError(str(e)) from None
        print(f"wrote {args.data}: {meta['splits']['train']['n']} train / "
              f"{meta['splits']['val']['n']} val / {meta['splits']['test']['n']} "
              f"test synthetic images {args.image_size}x{args.image_size} in {dt:.1f} s",
              flush=True)
    cmd = [find_mpiexec(), "-n", str(args.workers + 1), sys.executable, "-m",
           "ibtmpi", "train",
           "--set", f"data.path={args.data}",
           "--set", f"algorithm.name={args.algorithm}",
           "--set", f"model.layers={args.model}",
           "--set", "data.split_size=256", "--set", "data.batch=32",
           "--set", f"run.passes={args.passes}",
           "--set", f"run.dir={args.run_dir}"]
    for s in args.set:
        cmd += ["--set", s]
    if args.quiet:
        cmd.append("--quiet")
    print("running: " + " ".join(cmd), flush=True)
    return subprocess.call(cmd)


def cmd_train(args):
    import os
    from . import comm, threads
    from .backend import DeviceError, select
    from .checkpoint import CheckpointError
    from .config import ConfigError, load
    from .dataset import DatasetError
    from .trainer import EXIT_DIVERGED, EXIT_PREEMPTED, Diverged, Preempted, Trainer
    size, rank = comm.world_size(), comm.world_rank()
    overrides = list(args.set)
    if args.simulate:
        overrides.append(f"run.simulate={args.simulate}")
    if args.quiet:
        overrides.append("run.quiet=true")
    if args.resume:
        overrides.append("run.resume=always")

    def log(msg):
        if rank == 0:
            print(msg, flush=True)
    if rank:
        import warnings
        fmt = warnings.formatwarning
        warnings.formatwarning = lambda *a, **k: f"[rank {rank}] " + fmt(*a, **k)
    comm.install_abort_hooks(rank)
    bad_input = (ConfigError, DatasetError, CheckpointError, DeviceError, ValueError, OSError)
    try:
        ntasks = os.environ.get("SLURM_NTASKS", "")
        if size == 1 and not args.simulate and ntasks.isdigit() and int(ntasks) > 1:
            raise ConfigError(
                f"SLURM_NTASKS={ntasks} but MPI sees 1 process: the job step was "
                f"started without a launcher; use `srun --mpi=pmi2 ...` or `mpirun ...`")
        if args.simulate and size > 1:
            raise ConfigError("--simulate runs N logical workers in ONE process; "
                              "launch it without mpiexec")
        if args.device == "gpu":
            select("gpu")                 # explicit error where there is no GPU
            raise DeviceError("the trainer's GPU path is not available yet (the CUDA "
                              "kernels are built and checked; see README); use --device cpu")
        cfg = load(args.config, overrides)
        if rank == 0:
            _check_writable(cfg["run"]["dir"])
        threads.configure(cfg["run"]["threads"])
        trainer = Trainer(cfg, log=log)
    except bad_input as e:
        return _fail(f"ibtmpi train: error: {e}", 2, size, rank)
    try:
        trainer.run()
    except Preempted as e:
        log(f"ibtmpi train: preempted: {e} (exit status {EXIT_PREEMPTED})")
        return EXIT_PREEMPTED                # every rank agreed: no abort needed
    except Diverged as e:
        log(f"ibtmpi train: diverged: {e}")
        return EXIT_DIVERGED
    except CheckpointError as e:
        return _fail(f"ibtmpi train: error: {e}", 2, size, rank)
    except Exception:
        import traceback
        msg = (f"[rank {rank}] ibtmpi train failed in block {trainer.block}, phase "
               f"{trainer.phase}:\n" + traceback.format_exc())
        return _fail(msg, 1, size, rank, every_rank=True)
    return 0


def _check_writable(run_dir):
    """The run directory must be creatable and writable before training."""
    import os
    from .config import ConfigError
    try:
        os.makedirs(run_dir, exist_ok=True)
        probe = os.path.join(run_dir, f".write-test-{os.getpid()}")
        with open(probe, "w") as f:
            f.write("ok")
        os.remove(probe)
    except OSError as e:
        raise ConfigError(f"run.dir {run_dir} is not writable ({e.strerror}); "
                          f"choose another with --set run.dir=DIR") from None


def _fail(msg, code, size, rank, every_rank=False):
    """Report and end the job. Under MPI a failing rank aborts the world so
    no other rank waits forever in a collective."""
    if rank == 0 or every_rank:
        print(msg, file=sys.stderr, flush=True)
    if size > 1:
        from . import comm
        if rank != 0 and not every_rank:
            time.sleep(2)          # let rank 0 print the (same) message first
        comm.abort(code)
    return code


def cmd_prep(args):
    from .data_prep.cli import main as prep_main
    return prep_main(args.rest, prog="ibtmpi prep")


COMMANDS = {"info": cmd_info, "demo": cmd_demo, "prep": cmd_prep,
            "train": cmd_train}


def main(argv=None):
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.command is None:
        ap.print_help()
        return 2
    try:
        return COMMANDS[args.command](args)
    except UsageError as e:
        print(f"ibtmpi {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
