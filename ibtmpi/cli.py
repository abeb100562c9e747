"""Command line: ``ibtmpi <command>`` (also ``python -m ibtmpi``).

Commands: ``info`` (versions, MPI library, BLAS threads, model summary),
``demo`` (single-process training on built-in synthetic data) and ``prep``
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
    p.add_argument("--quiet", action="store_true")

    p = sub.add_parser("info", help="versions, MPI library, threads, model summary")
    p.add_argument("--model", default="reference")
    p.add_argument("--image-size", type=_positive_int, default=64)
    p.add_argument("--classes", type=_positive_int, default=5)

    p = sub.add_parser(
        "demo", help="train single-process on built-in synthetic data",
        description="Generate the synthetic 5-class overhead-image set in "
                    "memory and train the model with SGD in one process "
                    "(the N = 1 baseline), then print the test accuracy.")
    p.add_argument("--n", type=_positive_int, default=3000,
                   help="images in total, split 80/20 train/test (default 3000)")
    p.add_argument("--image-size", type=_positive_int, default=32)
    p.add_argument("--model", default="reference",
                   help="preset: reference, softmax, tiny (default reference)")
    p.add_argument("--epochs", type=_positive_int, default=4)
    p.add_argument("--batch", type=_positive_int, default=32)
    p.add_argument("--lr", type=_positive_float, default=0.02)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--weight-decay", type=float, default=5e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=_threads, default="auto",
                   help="BLAS threads (default: cores / ranks on the node)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
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


def cmd_demo(args):
    import numpy as np
    from . import serial, threads
    from .data import channel_stats
    from .optim import SGD
    from .data_prep import synth

    n_thr = threads.configure(args.threads, ranks_on_node=1)
    t0 = time.perf_counter()
    images, labels = synth.generate(args.n, args.image_size, seed=args.seed)
    n_test = max(len(synth.CLASSES), args.n // 5)
    xtr, ytr = images[n_test:], labels[n_test:]
    xte, yte = images[:n_test], labels[:n_test]
    if len(ytr) < args.batch:
        raise UsageError(f"--n {args.n} leaves {len(ytr)} training images, "
                         f"fewer than one batch of {args.batch}")
    mean, std = channel_stats(xtr)
    print(f"synthetic data: {len(ytr)} train / {len(yte)} test images "
          f"{args.image_size}x{args.image_size}, classes "
          f"{', '.join(synth.CLASSES)} ({time.perf_counter() - t0:.1f} s)")
    model = _model(args.model, args.image_size, len(synth.CLASSES), args.seed)
    opt = SGD(model.params, lr=args.lr, momentum=args.momentum,
              weight_decay=args.weight_decay)
    print(f"model {args.model}: {model.size:,d} parameters; SGD lr {args.lr} "
          f"momentum {args.momentum}, batch {args.batch}, {n_thr} BLAS thread(s)")

    bar = None
    if not args.quiet and sys.stderr.isatty():
        from tqdm import tqdm
        bar = tqdm(total=args.epochs * (len(ytr) // args.batch), unit="step",
                   leave=False)

    def on_step(loss):
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.3f}")

    def log(rec):
        msg = (f"epoch {rec['epoch']}/{args.epochs}: train loss "
               f"{rec['train_loss']:.4f} acc {rec['train_acc']:.3f} "
               f"({rec['steps'] * args.batch / rec['seconds']:.0f} img/s)")
        (bar.write if bar is not None else print)(msg)

    serial.train_epochs(model, opt, xtr, ytr, mean, std, args.batch,
                        args.epochs, seed=args.seed, log=log, on_step=on_step)
    if bar is not None:
        bar.close()
    loss, acc = serial.evaluate(model, xte, yte, mean, std)
    print(f"test accuracy {acc:.4f} (loss {loss:.4f}) on {len(yte)} images, "
          f"chance {1 / len(synth.CLASSES):.2f}; "
          f"total {time.perf_counter() - t0:.1f} s")
    return 0


def cmd_train(args):
    from . import comm, threads
    from .config import ConfigError, load
    from .dataset import DatasetError
    from .trainer import Trainer
    size, rank = comm.world_size(), comm.world_rank()
    overrides = list(args.set)
    if args.simulate:
        overrides.append(f"run.simulate={args.simulate}")
    if args.quiet:
        overrides.append("run.quiet=true")

    def log(msg):
        if rank == 0:
            print(msg, flush=True)
    try:
        if args.simulate and size > 1:
            raise ConfigError("--simulate runs N logical workers in ONE process; "
                              "launch it without mpiexec")
        cfg = load(args.config, overrides)
        threads.configure(cfg["run"]["threads"])
        trainer = Trainer(cfg, log=log)
    except (ConfigError, DatasetError, ValueError, OSError) as e:
        return _fail(f"ibtmpi train: error: {e}", 2, size, rank)
    try:
        trainer.run()
    except Exception:
        import traceback
        msg = f"[rank {rank}] ibtmpi train failed:\n" + traceback.format_exc()
        return _fail(msg, 1, size, rank, every_rank=True)
    return 0


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
