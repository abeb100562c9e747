"""`ibtmpi info` and `ibtmpi demo`: what this environment has (versions, MPI,
threads, GPUs, srun's PMI plugin, a model's table) and a first run on it
(the synthetic data set and an `mpiexec -n 3` training). Tests:
tests/unit/test_cli.py, test_config_input.py (the demo's directories)."""
import sys

from . import __version__
from .errors import UsageError


def _model(spec, size, classes, seed=0):
    from .model import Model
    try:
        return Model(spec, (3, size, size), classes, seed=seed)
    except ValueError as e:          # bad preset, layer spec or geometry
        raise UsageError(str(e)) from None


def cmd_info(args):
    if args.srun_mpi:               # from the MPI's own launcher: no MPI started here
        from . import launcher
        try:
            kind = launcher.flavor(launcher.find_mpiexec())
        except launcher.LauncherError:
            kind = "unknown"
        print(launcher.srun_mpi_plugin(kind))
        return 0
    import numpy as np
    from . import comm, threads
    n = threads.configure("auto")
    print(f"ibtmpi {__version__}, numpy {np.__version__}")
    print(f"MPI: {comm.library_version()}")
    from . import launcher
    try:
        mpiexec = launcher.find_mpiexec()
        print(f"launcher: {mpiexec} ({launcher.flavor(mpiexec)})")
    except launcher.LauncherError as e:
        print(f"launcher: none ({e})")
    print(f"BLAS threads per rank: {n} (usable cores {threads.usable_cores()})")
    from .backend import device_lines, gpu_status
    ok, why = gpu_status()
    print(f"GPU: {why}" + ("" if ok else "; --device gpu is refused here"))
    for line in device_lines() if ok else []:
        print(f"  GPU {line}")
    aware, how = comm.cuda_support()
    print(f"CUDA-aware MPI: {({True: 'yes', False: 'no'}).get(aware, 'not said')} "
          f"({how}; run.cuda_aware = auto follows it)")
    m = _model(args.model, args.image_size, args.classes)
    print(f"model {args.model!r} for {3}x{args.image_size}x{args.image_size}, "
          f"{args.classes} classes:")
    print(m.summary())
    return 0


def _demo_names(args):
    """(data dir, run dir): the defaults, or named after what differs from
    them, so that another demo neither reuses data of another size nor
    meets the checkpoints of a run with other settings."""
    import hashlib
    data = args.data or ("data/demo" if (args.n, args.image_size) == (10000, 32)
                         else f"data/demo-{args.image_size}px-{args.n}")
    if args.run_dir:
        return data, args.run_dir
    parts = [args.algorithm if args.algorithm != "ibt" else "",
             f"{args.workers}w" if args.workers != 2 else "",
             args.model if args.model != "reference" else "",
             f"{args.passes:g}p" if args.passes != 3.0 else "",
             f"{args.image_size}px-{args.n}" if not args.data and data != "data/demo" else "",
             hashlib.sha1("\0".join(args.set).encode()).hexdigest()[:6] if args.set else ""]
    name = "-".join(p for p in parts if p)
    return data, "runs/demo" + (f"-{name}" if name else "")


def cmd_demo(args):
    import os
    import subprocess
    from . import launcher
    args.data, args.run_dir = _demo_names(args)
    try:                    # before writing anything
        mpiexec = launcher.command(args.workers + 1)
    except launcher.LauncherError as e:
        raise UsageError(str(e)) from None
    if not os.path.exists(os.path.join(args.data, "dataset.json")):
        from .data_prep.prep import prep_synth
        from .data_prep.writer import WriteError
        try:
            meta, dt = prep_synth(args.data, n=args.n, size=args.image_size,
                                  seed=0, shards=2, quiet=args.quiet,
                                  overwrite=os.path.exists(args.data))
        except WriteError as e:
            raise UsageError(str(e)) from None
        except OSError as e:         # disk full, quota: one line, its exit status
            from .fsutil import os_error_exit
            from .data_prep.writer import hdf5_files_open
            msg, code = os_error_exit("ibtmpi demo", e)
            print(msg, file=sys.stderr, flush=True)
            if hdf5_files_open():    # HDF5's own teardown would crash after it
                sys.stdout.flush()
                os._exit(code)
            return code
        print(f"wrote {args.data}: {meta['splits']['train']['n']} train / "
              f"{meta['splits']['val']['n']} val / {meta['splits']['test']['n']} "
              f"test synthetic images {args.image_size}x{args.image_size} in {dt:.1f} s",
              flush=True)
    cmd = mpiexec + [
        "-n", str(args.workers + 1), sys.executable, "-m", "ibtmpi", "train",
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
