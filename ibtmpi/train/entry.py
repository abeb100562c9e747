"""`ibtmpi train`: the launch. Device choice (the same on every rank), the
configuration, the run directory check, the Trainer, and how every way a
job ends becomes an exit status and one line (docs/reliability.md): 0
done, 2 bad input, 4 diverged, 71 out of memory, 74 storage, 75 preempted
(resubmit to resume), 1 a crash (every failing rank's traceback). Under
MPI a failing rank aborts the world, so no rank waits in a collective.
Tests: tests/unit/test_cli.py, test_faults.py, tests/mpi/test_trainer_mpi.py.
"""
import sys
import time

from .lifecycle import keep_error


def choose_device(asked, log, master=True):
    """cpu | gpu for --device asked, the same on every rank (collective):
    gpu raises DeviceError where CuPy or a GPU is missing on a worker rank
    (never a silent fallback); auto picks gpu where every worker sees one
    and says when it falls back to the CPU. With `master`, rank 0 needs no
    GPU (training); evaluation computes on every rank."""
    if asked == "cpu":
        return "cpu"
    import socket
    from .. import comm
    from ..backend import gpu_status, workers_device
    statuses = comm.allgather((*gpu_status(), socket.gethostname()))
    device, note = workers_device(asked, statuses, master)
    if note:
        log(note)
    return device


def cmd_train(args):
    """`ibtmpi train`: start up on every rank, agree, then train; every way
    out is an exit status and one line (docs/reliability.md)."""
    import types
    from .. import comm
    size, rank = comm.world_size(), comm.world_rank()

    def log(msg):
        if rank == 0:
            print(msg, flush=True)
    if rank:
        import warnings
        fmt = warnings.formatwarning
        warnings.formatwarning = lambda *a, **k: f"[rank {rank}] " + fmt(*a, **k)
    comm.install_abort_hooks(rank)
    st = types.SimpleNamespace(cfg=None, device_ops=None, made=[], trainer=None)
    try:
        err = _start_up(args, st, size, rank, log)
    except MemoryError as e:              # building the model, buffers, data caches
        _remove_empty(st.made)
        return _out_of_memory(e, None, st.cfg, st.device_ops, size, rank)
    # Every rank gets here, failed or not, with no collective since the
    # device choice: agree, so that a start refused on any rank (a bad
    # config everywhere, data missing on one node) ends every rank in order
    # with exit 2 and one line from rank 0, not with MPI_Abort's banner.
    bad = [(r, m) for r, m in enumerate(comm.allgather(err) if size > 1 else [err]) if m]
    if bad:
        _remove_empty(st.made)       # a refused start leaves no empty run directory
        if rank == 0:
            who, msg = bad[0]
            print(msg if who == 0 else f"[rank {who}] {msg}", file=sys.stderr, flush=True)
        return 2
    if args.dry_run:
        try:
            for line in st.trainer.plan():
                log(line)
            return 0
        except _bad_input() as e:
            return fail(f"ibtmpi train: error: {e}", 2, size, rank)
    return _train(st, size, rank, log)


def _bad_input():
    """The exceptions that are bad input (exit 2) at start-up."""
    from ..backend import DeviceError
    from ..checkpoint import CheckpointError
    from ..config import ConfigError
    from ..dataset import DatasetError
    return (ConfigError, DatasetError, CheckpointError, DeviceError, ValueError, OSError)


def _overrides(args):
    """The shorthand flags first, then --set: an explicit --set of the same
    key wins (a template's --quiet is undone by --set run.quiet=false)."""
    out = []
    if args.simulate:
        out.append(f"run.simulate={args.simulate}")
    if args.quiet:
        out.append("run.quiet=true")
    if args.resume:
        out.append("run.resume=always")
    if args.cuda_aware:
        out.append(f"run.cuda_aware={args.cuda_aware}")
    return out + list(args.set)


def _start_up(args, st, size, rank, log):
    """Device, configuration, run directory, the Trainer (into st); the
    one-line error of bad input, or None. MemoryError goes up."""
    import os
    from .. import comm, threads
    from ..config import ConfigError, load
    from .trainer import Trainer
    try:
        ntasks = os.environ.get("SLURM_NTASKS", "")
        if size == 1 and not args.simulate and ntasks.isdigit() and int(ntasks) > 1:
            raise ConfigError(
                f"SLURM_NTASKS={ntasks} but MPI sees 1 process: the job step was "
                f"started without a launcher; use `srun --mpi=pmi2 ...` or `mpirun ...`")
        if args.simulate and size > 1:
            raise ConfigError("--simulate runs N logical workers in ONE process; "
                              "launch it without mpiexec")
        on_gpu = choose_device(args.device, log) == "gpu"
        # the start-up's collectives, all here, before anything that may fail
        # on one rank alone (its GPU, its config file, its run directory):
        # such a rank goes straight to the agreement below, where the others
        # must meet it, not inside another collective
        local = comm.worker_local_rank() if on_gpu else -1
        ranks_on_node = comm.node_rank_size()[1] if size > 1 else 1
        if on_gpu:
            if local >= 0 or args.simulate:   # the master needs no GPU
                from ..backend import GpuOps, bind_worker_gpu
                gpu = bind_worker_gpu(max(local, 0))
                st.device_ops = GpuOps()
                if rank <= 1:
                    log(f"workers compute on GPU (rank {rank}: device {gpu})")
        st.cfg = cfg = load(args.config, _overrides(args))
        # every rank writes its checkpoint file there: find out now, not
        # after the first pass of compute
        st.made = _check_writable(cfg["run"]["dir"], create=not args.dry_run)
        threads.configure(cfg["run"]["threads"], ranks_on_node=ranks_on_node)
        if threads.chosen.get("note"):        # auto chose fewer for a loaded node
            log(threads.chosen["note"])
        from ..backend import resolve_cuda_aware
        distributed = size > 1 and not cfg["run"]["simulate"]
        gpu_buffers, why = resolve_cuda_aware(
            cfg["run"]["cuda_aware"], on_gpu, distributed,
            comm.cuda_support() if on_gpu and distributed else (None, ""))
        if on_gpu and rank == 0:
            log(f"block buffers: {why}")
        # a master of its own on a GPU node evaluates there (run.eval_device)
        # and keeps its consensus state there (run.master_device)
        master_ops = None
        wants = {cfg["run"]["eval_device"], cfg["run"]["master_device"]} != {"cpu"}
        if on_gpu and rank == 0 and distributed and st.device_ops is None and wants:
            from ..backend import GpuOps, gpu_status
            if gpu_status()[0]:
                master_ops = GpuOps()
        st.trainer = Trainer(cfg, log=log, device_ops=st.device_ops, gpu_buffers=gpu_buffers,
                             master_ops=master_ops)
    except _bad_input() as e:
        return f"ibtmpi train: error: {e}"
    return None


def _train(st, size, rank, log):
    """trainer.run(), and each way it can end as an exit status."""
    from ..errors import (EXIT_DIVERGED, EXIT_INTERRUPTED, EXIT_PREEMPTED, EXIT_STORAGE,
                          CheckpointError, ConfigError, DatasetError, Diverged,
                          Preempted, WatchdogTimeout)
    from ..fsutil import is_storage_error
    trainer, cfg = st.trainer, st.cfg
    try:
        trainer.run()
    except Preempted as e:
        if trainer.control.interrupted:
            log(f"ibtmpi train: interrupted: {e} (exit status {EXIT_INTERRUPTED})")
            return EXIT_INTERRUPTED
        log(f"ibtmpi train: preempted: {e} (exit status {EXIT_PREEMPTED})")
        return EXIT_PREEMPTED                # every rank agreed: no abort needed
    except Diverged as e:
        msg = f"ibtmpi train: {e}"
        log(msg)
        if rank == 0:                   # for `ibtmpi status`: diverged at block k
            keep_error(cfg, rank, f"[rank 0] {msg}")
        return EXIT_DIVERGED
    except (CheckpointError, ConfigError) as e:   # what run() finds before block 0
        if getattr(e, "agreed", False):  # every rank raised it: end in order
            if rank == 0:
                print(f"ibtmpi train: error: {e}", file=sys.stderr, flush=True)
            return 2
        return fail(f"ibtmpi train: error: {e}", 2, size, rank)
    except DatasetError as e:            # a damaged row met in mid-run: this rank's alone
        msg = (f"[rank {rank}] ibtmpi train: error in block {trainer.control.block}: {e}. "
               f"Complete checkpoints are kept: the same command resumes once the "
               f"data set is whole")
        keep_error(cfg, rank, msg)        # `ibtmpi status`: failed, and why
        return fail(msg, 2, size, rank, every_rank=True)
    except OSError as e:
        if is_storage_error(e):          # disk full, quota, read-only: say so in one line
            where = f" {e.filename}" if e.filename else f" a file in {trainer.run_dir}"
            msg = (f"[rank {rank}] ibtmpi train: error: cannot write{where}: "
                   f"{e.strerror} (block {trainer.control.block}, phase {trainer.control.phase}). "
                   f"Complete checkpoints are kept: free space (or fix the file "
                   f"system) and run the same command again to resume")
            keep_error(cfg, rank, msg)    # a few bytes: often still room for them
            return fail(msg, EXIT_STORAGE, size, rank, every_rank=True)
        return _crash(trainer, cfg, size, rank)
    except MemoryError as e:             # CuPy's OutOfMemoryError, NumPy's too
        return _out_of_memory(e, trainer, cfg, st.device_ops, size, rank)
    except WatchdogTimeout as e:         # a rank stopped answering: one line, abort
        msg = (f"[rank {rank}] ibtmpi train: hung rank: {e}. The job is aborted; "
               f"complete checkpoints are kept (rerun to resume); run.watchdog_s sets "
               f"the limit (0: off)")
        keep_error(cfg, rank, msg)
        return fail(msg, 1, size, rank, every_rank=True)
    except Exception:
        return _crash(trainer, cfg, size, rank)
    return 0


def _out_of_memory(err, trainer, cfg, ops, size, rank):
    """A rank ran out of memory: one line (kept in RUN/error-rank-R.txt)
    naming the GPU or host memory, where in the run and what to change; the
    job is aborted with EXIT_NO_MEMORY."""
    from ..errors import EXIT_NO_MEMORY
    from ..memory import MIB, oom_text
    gpu = pool = None
    if (ops is None and trainer is not None and getattr(trainer, "sdev", None) is not None
            and type(err).__name__ == "OutOfMemoryError"):    # CuPy's: the master's GPU
        ops = trainer.sdev                                     # (run.master_device)
    if ops is not None:
        try:
            gpu, pool = ops.device_id(), ops.pool_bytes() / MIB
        except Exception:              # a device too broken to answer
            pass
    batch = cfg["data"]["batch"] if cfg else "?"
    if trainer is None:
        msg = oom_text(err, rank, "start-up", 0, batch, gpu, pool)
    else:
        msg = oom_text(err, rank, trainer.control.phase, trainer.control.block, batch, gpu, pool,
                       trainer.sharing(), master=not trainer.local)
    keep_error(cfg, rank, msg)
    return fail(msg, EXIT_NO_MEMORY, size, rank, every_rank=True)


def _crash(trainer, cfg, size, rank):
    """An unexpected exception: every rank that has one prints its traceback
    (kept in RUN/error-rank-R.txt too) and the job is aborted."""
    import traceback
    msg = (f"[rank {rank}] ibtmpi train failed in block {trainer.control.block}, phase "
           f"{trainer.control.phase}:\n" + traceback.format_exc())
    keep_error(cfg, rank, msg.rstrip("\n"))
    return fail(msg, 1, size, rank, every_rank=True, one_line=False)


def _check_writable(run_dir, create=True):
    """The run directory must be creatable and writable before training.
    create=False (a dry run): a missing one is not made; the nearest
    existing directory above it must be writable instead. Returns the
    directories it created, the topmost first (to remove them again when
    the start is refused)."""
    import os
    from ..config import ConfigError
    if not create and not os.path.isdir(run_dir):
        up = os.path.dirname(os.path.abspath(run_dir))
        while not os.path.exists(up):
            up = os.path.dirname(up)
        if not (os.path.isdir(up) and os.access(up, os.W_OK | os.X_OK)):
            raise ConfigError(f"run.dir {run_dir} cannot be created ({up} is not a "
                              f"writable directory); choose another with --set run.dir=DIR")
        return []
    made, d = [], os.path.abspath(run_dir)
    while not os.path.exists(d):
        made.insert(0, d)
        d = os.path.dirname(d)
    try:
        os.makedirs(run_dir, exist_ok=True)
        import socket                 # ranks on other nodes may share a pid
        probe = os.path.join(run_dir, f".write-test-{socket.gethostname()}-{os.getpid()}")
        with open(probe, "w") as f:
            f.write("ok")
        os.remove(probe)
    except OSError as e:
        raise ConfigError(f"run.dir {run_dir} is not writable ({e.strerror}); "
                          f"choose another with --set run.dir=DIR") from None
    from ..fsutil import planted_links
    links = planted_links(run_dir)
    if links:
        raise ConfigError(
            f"run.dir {run_dir} holds symbolic link(s) where ibtmpi writes: "
            + ", ".join(f"{os.path.relpath(p, run_dir)} -> {os.readlink(p)}"
                        for p in links[:3]) + (f" and {len(links) - 3} more" if
                                               len(links) > 3 else "")
            + "; a run would write through them: remove them, or use another run.dir")
    return made


def _remove_empty(dirs):
    """Remove the directories a refused start made, deepest first, where
    they are still empty (another rank may have removed them already)."""
    import os
    for d in reversed(dirs):
        try:
            os.rmdir(d)
        except OSError:
            pass


STAGGER_S = 0.5       # fail(): a worker's one-line error waits this (x its place) first


def fail(msg, code, size, rank, every_rank=False, one_line=True):
    """Report and end the job. Under MPI a failing rank aborts the world so
    no other rank waits forever in a collective. every_rank: the failure
    may be this rank's alone, so it speaks for itself; with one_line, a
    worker waits a moment first (rank 0 at once, then rank 1, ...), so
    where several ranks fail alike (a full disk) the first abort ends the
    others before they repeat the line. A crash (one_line False) prints
    every failing rank's traceback at once."""
    if every_rank and one_line and rank and size > 1:
        time.sleep(STAGGER_S * min(rank, 8))
    if rank == 0 or every_rank:
        print(msg, file=sys.stderr, flush=True)
    if size > 1:
        from .. import comm
        if rank != 0 and not every_rank:
            # Where every rank fails alike (a bad config), rank 0 prints and
            # aborts first and this rank never gets here. Still alive: the
            # failure is this rank's alone (its node lacks the data, its GPU
            # binding failed), and only it can say why.
            time.sleep(2)
            print(f"[rank {rank}] {msg}", file=sys.stderr, flush=True)
        time.sleep(0.5)            # let the launcher forward it before the abort
        comm.abort(code)
    return code
