"""Command line: ``ibtmpi <command>`` (also ``python -m ibtmpi``).

Commands: ``info`` (versions, MPI library, BLAS threads, model summary),
``demo`` (synthetic data + an MPI run with master and 2 workers), ``train`` and ``prep``
(dataset tools, also installed as ``ibtmpi-prep``). Bad input
exits with status 2 and a one-line message, never a traceback.
"""
from __future__ import annotations

import argparse
import sys

from . import __version__
from .errors import UsageError


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
    _add_prep(sub)
    _add_train(sub)
    _add_evaluate(sub)
    _add_predict(sub)
    _add_export(sub)
    _add_import_weights(sub)
    _add_plot(sub)
    _add_bench(sub)
    _add_status(sub)
    _add_info(sub)
    _add_demo(sub)
    return ap


def _add_prep(sub):
    p = sub.add_parser("prep", help="make or check a dataset (synth, folder, inspect)",
                       add_help=False)
    p.add_argument("rest", nargs=argparse.REMAINDER)


def _add_train(sub):
    p = sub.add_parser(
        "train", help="train with IBT / consensus ADMM (under mpiexec: rank 0 master)",
        description="Train a CNN by Incremental Block Training. Under "
                    "`mpiexec -n N+1`, rank 0 is the master and ranks 1..N "
                    "the workers; a single process is the N = 1 baseline.")
    p.add_argument("--config", help="TOML run configuration (see examples/)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a config value (repeatable)")
    p.add_argument("--simulate", type=_positive_int, metavar="N",
                   help="run N logical workers in this one process")
    p.add_argument("--resume", action="store_true",
                   help="require a checkpoint to resume from (default: resume "
                        "automatically when the run directory has a matching one)")
    p.add_argument("--dry-run", action="store_true",
                   help="check everything a run checks (config, data on every rank, "
                        "device, run directory and its lock, the checkpoint it would "
                        "resume from), print the plan and exit: 0 where the job "
                        "would start, 2 where not; trains and writes nothing")
    p.add_argument("--device", choices=("cpu", "gpu", "auto"), default="cpu",
                   help="compute device of the workers: gpu (an error where CuPy "
                        "or a GPU is missing), auto (gpu where CuPy sees one, "
                        "else cpu) or cpu (default)")
    p.add_argument("--cuda-aware", choices=("auto", "on", "off"),
                   help="GPU workers under MPI: hand device buffers to the "
                        "Allreduce (on), stage through pinned host memory (off), "
                        "or on where the MPI library reports CUDA support "
                        "(auto, the default; = --set run.cuda_aware=...)")
    p.add_argument("--quiet", action="store_true",
                   help="no progress bar or progress lines (= --set run.quiet=true)")


def _add_evaluate(sub):
    p = sub.add_parser("evaluate", help="accuracy, per-class P/R/F1, confusion matrix",
                       description="Evaluate a trained model (run directory, model.npz "
                       "or checkpoint directory) on a dataset split. Under mpiexec "
                       "the split is shared out over the ranks; the result is "
                       "identical to one process.")
    p.add_argument("model")
    p.add_argument("--data", help="dataset directory (default: the data.path of the "
                   "run that made the model, from its config.toml)")
    p.add_argument("--split", default="test")
    p.add_argument("--out", help="directory for report.json, report.txt and "
                   "confusion.png (default: print only)")
    p.add_argument("--device", choices=("cpu", "gpu", "auto"), default="cpu",
                   help="as for train")
    p.add_argument("--batch", type=int, default=256,
                   help="images per forward pass (default 256; lower it when a GPU "
                   "runs out of memory)")


def _add_predict(sub):
    p = sub.add_parser("predict", help="class and probabilities for image files",
                       description="Predict image files or folders with exactly the "
                       "training preprocessing (RGB or the data set's --bands, "
                       "resize, normalisation).")
    p.add_argument("model")
    p.add_argument("images", nargs="+")
    p.add_argument("--format", choices=("csv", "json"), default="csv")
    p.add_argument("--out", help="write here instead of standard output")


def _add_export(sub):
    p = sub.add_parser("export", help="export to ONNX and/or safetensors")
    p.add_argument("model")
    p.add_argument("--onnx", metavar="FILE", help="the model with its normalisation, for "
                   "onnxruntime")
    p.add_argument("--safetensors", metavar="FILE", help="the weights (torchvision's names "
                   "for resnet18_imagenet and resnet34_imagenet), for PyTorch")


def _add_import_weights(sub):
    p = sub.add_parser("import-weights", help="an ibtmpi model file from safetensors "
                       "weights (torchvision's names for the ImageNet ResNet presets)")
    p.add_argument("weights", metavar="IN.safetensors")
    p.add_argument("--layers", required=True, metavar="PRESET",
                   help="e.g. resnet18_imagenet (the file's tensors go in by name)")
    p.add_argument("--data", required=True, metavar="DATASET",
                   help="the data set whose classes and image size the model takes")
    p.add_argument("--out", required=True, metavar="MODEL.npz")
    p.add_argument("--normalize", choices=("dataset", "imagenet"),
                   help="default: the file's own, else imagenet for torchvision's names "
                        "on 3 bands, else dataset")


def _add_plot(sub):
    p = sub.add_parser("plot", help="PNG plots of a run's metrics")
    p.add_argument("run_dir")
    p.add_argument("--out", help="output directory (default RUN_DIR/plots)")


def _add_bench(sub):
    p = sub.add_parser("bench", help="run the algorithm comparison / report on runs",
                       description="`bench run` trains every algorithm for each N "
                       "(MPI where the cores allow, simulation beyond) and the "
                       "fixed-block experiment; `bench report` turns run "
                       "directories into report.md, report.json and PNG plots.")
    bsub = p.add_subparsers(dest="bench_cmd", metavar="run|report")
    b = bsub.add_parser("run")
    b.add_argument("--data", default="data/bench32",
                   help="dataset (made with 10,000 synthetic 32x32 images if missing)")
    b.add_argument("--out", default="runs/bench")
    b.add_argument("--ns", default="1,2,4,8")
    b.add_argument("--algos")
    b.add_argument("--passes", type=_positive_float, default=3.0)
    b.add_argument("--split", type=_positive_int, default=256)
    b.add_argument("--batch", type=_positive_int, default=32)
    b.add_argument("--mpi-max", type=int, help="largest N run as real MPI (default: cores)")
    b.add_argument("--fixed-block", type=int, default=1240, help="0 skips T2")
    b.add_argument("--fixed-ns", default="10,20,40")
    b.add_argument("--seeds", type=_positive_int, default=1,
                   help="runs per cell, model.seed = data.seed = 0..S-1; the report "
                        "gives mean +- sd (default 1)")
    b.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    b.add_argument("--fresh", action="store_true",
                   help="redo every run; by default a run directory that already holds "
                        "the result of the same command is kept (a stopped bench resumes)")
    b = bsub.add_parser("report")
    b.add_argument("runs", nargs="+", help="run directories")
    b.add_argument("--out", required=True)
    b.add_argument("--holdout", metavar="DATA",
                   help="a dataset the runs never saw (e.g. `ibtmpi prep synth` with "
                        "another --seed): the accuracy target is also decided on its "
                        "test split, with the paired standard error of the gap")


def _add_status(sub):
    p = sub.add_parser(
        "status", help="what run directories' jobs are doing (running, finished, ...)",
        description="One line per run directory, from the files the run keeps: running "
                    "(who holds it, heartbeat, block, time left), finished (test "
                    "accuracy), failed or stopped (and the checkpoint a rerun resumes "
                    "from). Reads no data and needs no MPI: safe on a login node.")
    p.add_argument("runs", nargs="+", metavar="RUN")
    p.add_argument("--json", action="store_true", help="one JSON object per line")


def _add_info(sub):
    p = sub.add_parser("info", help="versions, MPI library, threads, model summary")
    p.add_argument("--srun-mpi", action="store_true",
                   help="print only the srun --mpi plugin this environment's MPI needs "
                        "(pmi2 for MPICH, pmix for Open MPI): what the Slurm templates use")
    p.add_argument("--model", default="reference")
    p.add_argument("--image-size", type=_positive_int, default=64)
    p.add_argument("--classes", type=_positive_int, default=5)


def _add_demo(sub):
    p = sub.add_parser(
        "demo", help="make the synthetic demo data and train over MPI (master + 2 workers)",
        description="Write the synthetic 5-class overhead-image set (if missing) "
                    "and run `mpiexec -n WORKERS+1 ibtmpi train` on it with the "
                    "MPI next to this Python (the mpich extra's) or on PATH.")
    p.add_argument("--data", help="dataset directory (default data/demo, or "
                   "data/demo-SIZEpx-N when --n or --image-size is not the default)")
    p.add_argument("--n", type=_positive_int, default=10000,
                   help="images to generate if the dataset is missing (default 10000)")
    p.add_argument("--image-size", type=_positive_int, default=32)
    p.add_argument("--workers", type=_positive_int, default=2)
    p.add_argument("--algorithm", default="ibt")
    p.add_argument("--passes", type=_positive_float, default=3.0)
    p.add_argument("--model", default="reference")
    p.add_argument("--run-dir", help="run directory (default runs/demo, or named after "
                   "the settings that differ from the defaults, e.g. runs/demo-admm-4w, so "
                   "that a demo with other settings does not meet the first one's checkpoints)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    p.add_argument("--quiet", action="store_true")


def cmd_info(args):
    from .envcmds import cmd_info as info
    return info(args)


def cmd_demo(args):
    from .envcmds import cmd_demo as demo
    return demo(args)


def cmd_train(args):
    from .train.entry import cmd_train as train
    return train(args)


def cmd_evaluate(args):
    import json
    import os
    import numpy as np
    from . import comm
    from .dataset import Dataset, DatasetError
    from .errors import EXIT_NO_MEMORY
    from .outputs import (NoPlotting, TrainedModelError, confusion, confusion_png,
                          format_report, load_trained, report, run_data_path)
    from .schedule import worker_range
    from .train.entry import choose_device, fail
    size, rank = comm.world_size(), comm.world_rank()
    try:
        if args.batch < 1:
            raise UsageError(f"--batch must be at least 1, got {args.batch}")
        tm = load_trained(args.model)
        if args.data is None:
            args.data = run_data_path(args.model)
        ds = Dataset(args.data)
        if ds.classes != tm.classes:
            raise UsageError(f"{args.data} has classes {ds.classes}, the model was "
                             f"trained on {tm.classes}")
        if ds.image_shape != tm.image_shape:
            raise UsageError(f"{args.data} has images {ds.image_shape}, the model takes "
                             f"{tm.image_shape} (H, W, C); re-import with "
                             f"`ibtmpi prep ... --size {tm.image_shape[0]}`")
        try:
            tm.check_data(ds.dtype, args.data)
        except ValueError as e:
            raise UsageError(str(e)) from None
        sp = ds.split(args.split)
        if args.out and rank == 0:     # before the work: a bad --out fails at once
            try:
                os.makedirs(args.out, exist_ok=True)
            except OSError as e:
                raise UsageError(f"--out {args.out}: {e.strerror}") from None
        if choose_device(args.device, lambda m: rank == 0 and print(m, file=sys.stderr),
                   master=False) == "gpu":
            from .backend import GpuOps, bind_worker_gpu
            bind_worker_gpu(comm.node_rank_size()[0])
            tm = tm.to_device(GpuOps())
    except (TrainedModelError, DatasetError, UsageError) as e:
        return fail(f"ibtmpi evaluate: error: {e}", 2, size, rank)
    except Exception as e:             # DeviceError and friends: clear, exit 2
        from .backend import DeviceError
        if not isinstance(e, DeviceError):
            raise
        return fail(f"ibtmpi evaluate: error: {e}", 2, size, rank)
    lo, hi = worker_range(sp.n, size, rank)       # this rank's share
    cm = np.zeros((len(tm.classes), len(tm.classes)), np.int64)
    step = max(1024, args.batch)
    try:
        for s in range(lo, hi, step):
            idx = np.arange(s, min(hi, s + step))
            preds = tm.probs(sp.read(idx), args.batch).argmax(1)
            cm += confusion(sp.labels[idx], preds, len(tm.classes))
    except MemoryError as e:           # CuPy's OutOfMemoryError, NumPy's
        where = ("host memory" if tm.model.xp is np
                 else f"GPU {tm.model.device_ops.device_id()}")
        return fail(f"[rank {rank}] ibtmpi evaluate: out of memory ({where}): "
                     f"{str(e).rstrip('.')}. Lower --batch (now {args.batch})",
                     EXIT_NO_MEMORY, size, rank, every_rank=True)
    total = np.zeros_like(cm)
    comm.allreduce_sum(cm, total, count=False)
    if rank == 0:
        rep = report(total, tm.classes)
        rep.update(model=os.path.abspath(args.model), data=os.path.abspath(args.data),
                   split=args.split, ranks=size)
        text = format_report(rep)
        print(text)
        if args.out:
            from .fsutil import replace_file       # never through a link at --out
            replace_file(os.path.join(args.out, "report.json"), json.dumps(rep, indent=1))
            replace_file(os.path.join(args.out, "report.txt"), text + "\n")
            try:
                confusion_png(rep, os.path.join(args.out, "confusion.png"))
                print(f"wrote {args.out}/report.json, report.txt, confusion.png")
            except NoPlotting as e:
                print(f"wrote {args.out}/report.json, report.txt (no confusion.png: {e})")
    return 0


def cmd_predict(args):
    import csv
    import io
    import json
    import os
    import numpy as np
    from .data_prep.images import IMAGE_EXT, check_preprocess, load_stored
    from .outputs import TrainedModelError, load_trained
    try:
        tm = load_trained(args.model)
        pre = check_preprocess(tm.preprocess, tm.image_shape[2])
    except (TrainedModelError, ValueError) as e:
        raise UsageError(f"{args.model}: {e}" if isinstance(e, ValueError) else str(e)) from None
    files = []
    for p in args.images:
        if os.path.isdir(p):
            for dp, _, fs in os.walk(p):
                files += [os.path.join(dp, f) for f in sorted(fs)
                          if os.path.splitext(f)[1].lower() in IMAGE_EXT]
        else:
            files.append(p)
    h, w, c = tm.image_shape
    if h != w:
        raise UsageError(f"model input {h}x{w} is not square; predict resizes to squares")
    imgs, ok, errors = [], [], []
    for f in files:
        if os.path.exists(f) and not os.path.isfile(f):    # a FIFO would block the read
            errors.append((f, "not a regular file (a FIFO, device or socket)"))
            continue
        try:
            imgs.append(load_stored(f, h, c, pre))
            ok.append(f)
        except Exception as e:                   # unreadable: report, go on
            errors.append((f, f"{type(e).__name__}: {e}"))
    rows = []
    if imgs:
        probs = tm.probs(np.stack(imgs))
        for f, pr in zip(ok, probs):
            rows.append({"file": f, "class": tm.classes[int(pr.argmax())],
                         **{f"p_{k}": float(v) for k, v in zip(tm.classes, pr)}})
    for f, why in errors:
        print(f"ibtmpi predict: cannot read {f}: {why}", file=sys.stderr)
    if args.format == "json":
        text = json.dumps({"predictions": rows,
                           "errors": [{"file": f, "error": e} for f, e in errors]}, indent=1)
    else:
        buf = io.StringIO()
        wr = csv.DictWriter(buf, ["file", "class"] + [f"p_{k}" for k in tm.classes])
        wr.writeheader()
        for r in rows:
            wr.writerow({k: (f"{v:.6f}" if isinstance(v, float) else v) for k, v in r.items()})
        text = buf.getvalue().rstrip("\n")
    if args.out:
        from .fsutil import replace_file           # never through a link at --out
        replace_file(args.out, text + "\n")
    else:
        print(text)
    if not rows:
        print("ibtmpi predict: error: no image could be read", file=sys.stderr)
        return 2
    if errors:                  # the others' predictions are written; the exit says so
        print(f"ibtmpi predict: error: {len(errors)} of {len(files)} file(s) could not be "
              f"read (above); the other {len(rows)} are predicted", file=sys.stderr)
        return 2
    return 0


def cmd_export(args):
    from .outputs import TrainedModelError, load_trained
    if not (args.onnx or args.safetensors):
        raise UsageError("give --onnx FILE, --safetensors FILE or both")
    try:
        tm = load_trained(args.model)
        if args.onnx:
            from .onnx_export import export
            model = export(tm, args.onnx)
        if args.safetensors:
            from .interchange import TWINS, export as export_weights
            n = export_weights(tm, args.safetensors)
    except (TrainedModelError, RuntimeError) as e:
        raise UsageError(str(e)) from None
    if args.onnx:
        print(f"wrote {args.onnx}: {len(model.graph.node)} nodes; input 'image' float32 "
              f"(N, {', '.join(map(str, tm.model.input_shape))}) "
              f"{'RGB' if tm.image_shape[2] == 3 else 'stored band values'} "
              f"0..{tm.stored_max:,.0f} "
              f"(normalisation folded in); outputs 'logits', 'probs' over "
              f"{', '.join(tm.classes)}")
    if args.safetensors:
        twin = isinstance(tm.layers, str) and tm.layers in TWINS
        print(f"wrote {args.safetensors}: {n} tensors, "
              + (f"torchvision's {tm.layers.replace('_imagenet', '')} names "
                 f"(load_state_dict takes them)" if twin else "ibtmpi's layer names "
                 "(layers.<i>.<name>)")
              + "; the input normalisation and class names in its metadata")
    return 0


def cmd_import_weights(args):
    from .dataset import DatasetError
    from .interchange import import_weights
    from .outputs import TrainedModelError
    try:
        n, notes, norm = import_weights(args.weights, args.layers, args.data, args.out,
                                        args.normalize)
    except (TrainedModelError, DatasetError) as e:
        raise UsageError(str(e)) from None
    said = norm if isinstance(norm, str) else "the file's own"
    print(f"wrote {args.out}: {n} tensors of {args.layers} from {args.weights}, for "
          f"{args.data}; normalisation: {said}" + "".join(f"; {x}" for x in notes))
    return 0


def cmd_plot(args):
    from .outputs import NoPlotting, TrainedModelError, plot_run
    try:
        files = plot_run(args.run_dir, args.out)
    except (TrainedModelError, NoPlotting) as e:
        raise UsageError(str(e)) from None
    for f in files:
        print(f"wrote {f}")
    return 0


def _int_list(flag, text):
    try:
        return tuple(int(x) for x in text.split(",") if x)
    except ValueError:
        raise UsageError(f"{flag}: a comma-separated list of integers, got {text!r}") from None


def cmd_bench(args):
    import os
    from . import bench
    from .dataset import DatasetError
    from .outputs import TrainedModelError
    if args.bench_cmd == "run":
        if not os.path.exists(os.path.join(args.data, "dataset.json")):
            from .data_prep.prep import prep_synth
            prep_synth(args.data, n=10000, size=32, shards=2, quiet=True)
        algos = tuple(a for a in args.algos.split(",") if a) if args.algos else bench.ALGOS
        unknown = [a for a in algos if a not in bench.ALGOS]
        if unknown:
            raise UsageError(f"--algos: unknown {', '.join(unknown)}; known: "
                             f"{', '.join(bench.ALGOS)}")
        failed = bench.run(args.out, args.data, _int_list("--ns", args.ns), algos,
                           args.passes, args.split, args.batch, args.mpi_max,
                           args.fixed_block, _int_list("--fixed-ns", args.fixed_ns), tuple(args.set),
                           fresh=args.fresh, seeds=args.seeds)
        runs = sorted(os.path.join(args.out, d) for d in os.listdir(args.out)
                      if d.startswith(("t1-", "t2-")))
        try:
            text, _ = bench.report(runs, os.path.join(args.out, "report"))
            print(text)
        except ValueError as e:                   # nothing finished
            print(f"ibtmpi bench run: no report: {e}", file=sys.stderr)
        if failed:
            print(f"ibtmpi bench run: {len(failed)} run(s) failed: {', '.join(failed)} "
                  f"(each has failed.json); rerun the same command to retry them, the "
                  f"finished ones are kept", file=sys.stderr)
            return 1
        return 0
    if args.bench_cmd == "report":
        try:
            text, files = bench.report(args.runs, args.out, holdout=args.holdout)
        except (ValueError, DatasetError, TrainedModelError) as e:
            raise UsageError(str(e)) from None
        print(text)
        print(f"wrote {args.out}/report.md, report.json and " + _plots_said(files))
        return 0
    raise UsageError("give `bench run` or `bench report`")


def _plots_said(files):
    """'3 plots', or why there are none (matplotlib is an extra)."""
    if files:
        return f"{len(files)} plots"
    from .outputs import NoPlotting, pyplot
    try:
        pyplot()
    except NoPlotting as e:
        return f"no plots ({e})"
    return "no plots (no finished run to plot)"


def cmd_status(args):
    import json
    from .status import describe, inspect
    code = 0
    for run in args.runs:
        try:
            info = inspect(run)
        except FileNotFoundError as e:
            print(f"ibtmpi status: error: {e}", file=sys.stderr)
            code = 2
            continue
        print(json.dumps(info) if args.json else describe(info), flush=True)
    return code


def cmd_prep(args):
    from .data_prep.cli import main as prep_main
    return prep_main(args.rest, prog="ibtmpi prep")


COMMANDS = {"info": cmd_info, "status": cmd_status, "demo": cmd_demo, "prep": cmd_prep,
            "train": cmd_train, "evaluate": cmd_evaluate, "predict": cmd_predict,
            "export": cmd_export, "import-weights": cmd_import_weights, "plot": cmd_plot,
            "bench": cmd_bench}


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
    except KeyboardInterrupt:        # under mpiexec every rank gets it: say it once
        comm = sys.modules.get(__package__ + ".comm")
        try:
            rank = comm.world_rank() if comm is not None else 0
        except Exception:
            rank = 0
        if rank == 0:
            print("interrupted", file=sys.stderr)
        return 130
    except RuntimeError as e:        # comm.MPIUnavailable: a launch without MPI
        comm = sys.modules.get(__package__ + ".comm")
        if comm is None or not isinstance(e, comm.MPIUnavailable):
            raise
        if comm.launcher_rank() == 0:    # every rank has it: one line for the job
            print(f"ibtmpi {args.command}: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:            # e.g. `ibtmpi evaluate ... | head`
        import os
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as e:               # an output path that cannot be written, a full disk
        from .fsutil import os_error_exit
        msg, code = os_error_exit(f"ibtmpi {args.command}", e)
        print(msg, file=sys.stderr)
        return code
