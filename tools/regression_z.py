#!/usr/bin/env python
"""Bitwise regression check of the trainer: the working tree against a commit.

Runs the fixed set of short CPU training runs in RUNS below twice over,
once with the working tree's ibtmpi and once with the ibtmpi of COMMIT
(checked out with `git worktree add --detach` into a temporary directory,
removed at the end, also on failure or Ctrl-C), with exactly the same
command lines, and compares what each run leaves behind byte for byte:

  model.npz          every array (z, the final consensus model, float32;
                     input_shape, classes, layers, mean, std, algorithm)
  model-best.npz     every array, where a run writes one
  checkpoints/       the newest complete checkpoint: every array of every
                     rank file (z, z_g, block momentum, sum of duals, rho,
                     each worker's duals, momenta, easgd's own models), but
                     its `stamp` (the run's random id: whose file it is)

and, as a note that only fails the run with --strict, the deterministic
figures of metrics.jsonl (losses, accuracies, residuals, rho, lr per block)
and summary.json (test/val accuracy, best block, Allreduce count, ...).

Only the arrays both sides write are compared: an array that one side's
file has and the other's lacks (the current code no longer writes the
checkpoint arrays its algorithm does not use, e.g. zg, v and U for ma) is
counted in a note, "(3 checkpoint arrays only in the reference: U, v, zg)";
--every-array makes it a difference. A whole file only one side writes
(model-best.npz, another newest checkpoint, a rank file) is a difference
either way.

Cross-version resume: the *-resume-old runs train pass 1 on the
reference commit's code and resume to pass 2 on the current code in the
same run directory, so checkpoints written by the old code must resume
under the new code bit for bit. They run on the current side only (twice,
as every current run) and are checked through their same_as invariant
alone: their model.npz must equal the uninterrupted 2-pass run of the
same settings on the current side, and the resumed step must really have
resumed the old code's newest checkpoint (summary.json resumed_at_block,
no checkpoint set aside as damaged). Their own twin on the reference side
would just be a reference-only resume, already covered by the reference's
own runs, so there is none. --record/--compare check out no reference
code: there they are skipped, with a note.

Each run gets a fresh run directory; the current side runs every run twice
(`--repeat 1` for once) so that a run that is not deterministic on one code
shows as NONDET rather than as a regression. One line per run:

  NAME  OK
  NAME  DIFFER  (max abs diff of z 3.1e-06; 7 arrays in 3 files differ, ...)

then `N passed, M failed`; exit status 0 only when every run is OK.
Statuses: OK, DIFFER (the sides differ, or a run broke an invariant of
the table such as "a resumed run ends where the uninterrupted one does"),
NONDET (two runs of the same code differ), FAILED (a command ended with
an unexpected exit status, left no model, or did not resume where its
step says it must).

Every process (every MPI rank too) starts through a small shim that checks
`ibtmpi.__file__` lies in the tree it is meant to test and stops the run
otherwise, and each side prints its `ibtmpi.__file__` once (and every
rank's under mpiexec). PYTHONPATH puts the tree first, so a non-editable
`pip install .` in the venv does not shadow it.

Usage (from anywhere; the repository's .venv python is used for both sides
when it exists):
  python tools/regression_z.py [--against 7c6fd14]
  python tools/regression_z.py --selftest       # proves DIFFER is detected
  python tools/regression_z.py --perturb        # the current side with lr * (1 + 1e-6)
                                                     # (current-code steps; see below)
  python tools/regression_z.py --record DIR     # save this tree's results
  python tools/regression_z.py --compare DIR    # compare with saved results (no worktree)
  python tools/regression_z.py --only 'admm|ibt-mpi' --keep --list
  python tools/regression_z.py --tree /other/checkout   # test that tree instead
  python tools/regression_z.py --every-array    # a checkpoint array only one side
                                                     # writes is a DIFFER, not a note
                                                     # (--common-only, the default, is
                                                     # still accepted)

--perturb / --selftest perturb the lr of the current side's steps that run
on the current code, with one exception: a current-code step that resumes
the checkpoint of a reference-code step keeps the unperturbed lr, since
ibtmpi refuses a checkpoint written with another configuration (lr is part
of its digest). A *-resume-old run then has an unperturbed pass 1 (old
code) and pass 2 (new code) against its perturbed same_as partner, so it
must show DIFFER, as every other run must.

Adding a run: append a Run(...) to RUNS. `sets` are --set overrides on
top of BASE_SETS, `n` the worker count (--simulate n; 0: the N = 1
baseline with no launcher), `mpi` a real `mpiexec -n mpi` job instead,
`steps` a list of commands run one after the other in the run's directory
(each a dict: more `sets`, `env`, the expected exit status `rc`, its own
`dir`, its own `n`/`mpi`, `"code": "reference"` to run that step with the
reference tree's ibtmpi (PYTHONPATH and the shim's check; such a run is a
current-side-only run, see above), `"resumes": True` that the step must
resume the newest checkpoint the earlier steps left in its dir; "{run}" in
a value is the run's directory), and `same_as` the name of a run whose
model.npz this one must equal bit for bit on the same side (a resumed run
against the uninterrupted one; with the same sets but run.passes and the
checkpoint cadence, which ibtmpi does not hash).
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from worktree import Checkout  # noqa: E402  (tools/worktree.py: shared with bench_vs_commit)
DEFAULT_COMMIT = "7c6fd14"

# ---------------------------------------------------------------------------
# The run table
# ---------------------------------------------------------------------------

# the one data set both sides share: 480 train, 60 val, 60 test 16x16 images
DATA_ARGS = ["--n", "600", "--size", "16", "--shards", "3", "--seed", "4"]

# every command of every run: the reference CNN (226k parameters, so the
# host consensus update runs over 4 of its 64K-element chunks) on 16x16,
# split 40, batch 16, two passes, one BLAS thread per rank
BASE_SETS = ["data.split_size=40", "data.batch=16", "model.layers=reference",
             "run.passes=2", "run.threads=1", "run.quiet=true",
             "run.time_limit=none", "run.progress_s=0"]

# a custom layer list with dropout (dropout is reseeded per block and worker)
DROPOUT_LAYERS = ('[{type="conv",out=16,k=3,stride=1,pad=1},"relu",'
                  '{type="maxpool",k=2,stride=2},"flatten",{type="dropout",p=0.3},'
                  '{type="linear",out=64},"relu",{type="dropout",p=0.5},{type="linear"}]')

COSINE = ["algorithm.name=ibt", "optim.schedule=cosine", "optim.decay_passes=2.0",
          "optim.final_ratio=0.1", "optim.warmup_passes=0.5", "algorithm.warmup_steps=4"]


@dataclass
class Run:
    name: str
    sets: list = field(default_factory=list)
    n: int = 3                  # --simulate n; 0: no launcher, the N = 1 baseline
    mpi: int = 0                # > 0: mpiexec -n mpi (master + mpi-1 workers)
    steps: list = field(default_factory=lambda: [{}])
    same_as: str = ""           # must end with this run's model.npz, same side
    what: str = ""

    @property
    def cross(self):
        """A step runs on the reference code: a current-side-only run."""
        return any(st.get("code", "current") == "reference" for st in self.steps)


# cross-version resume: pass 1 on the reference code, resumed to pass 2 by
# the current code, in one run directory
RESUME_OLD = [{"sets": ["run.passes=1"], "code": "reference"},
              {"sets": ["run.passes=2"], "resumes": True}]


RUNS = [
    Run("sgd", ["algorithm.name=sgd"], n=0, what="N = 1 baseline, plain SGD"),
    Run("sgd-step-nesterov", ["algorithm.name=sgd", "optim.schedule=step",
                              "optim.milestones=[0.5, 1.5]", "optim.gamma=0.5",
                              "optim.nesterov=true", "optim.weight_decay=0.0"], n=0,
        what="step schedule, local Nesterov momentum, no weight decay"),
    Run("ssgd", ["algorithm.name=ssgd"], what="gradient Allreduce per minibatch"),
    Run("ma", ["algorithm.name=ma"]),
    Run("ma-fixed-block-disk", ["algorithm.name=ma", "data.split_size=0",
                                "data.block_size=120", "data.cache=disk",
                                "data.augment=true", "data.seed=3"],
        what="block_size instead of split_size, disk reader, augmentation"),
    Run("ma-early-stop", ["algorithm.name=ma", "run.passes=4", "run.eval_every=1",
                          "run.early_stop=1", "optim.lr=0.08"],
        what="early_stop after one evaluation without a better val accuracy"),
    Run("admm", ["algorithm.name=admm"]),
    Run("admm-adaptive-relax", ["algorithm.name=admm", "algorithm.adaptive_rho=true",
                                "algorithm.rho=0.1", "algorithm.rho_mu=2.0",
                                "algorithm.over_relaxation=1.6"],
        what="residual balancing (rho changes) and over-relaxation"),
    Run("admm-l2-dualreset", ["algorithm.name=admm", "algorithm.l2=0.002",
                              "algorithm.dual_reset=true", "optim.reset_momentum=false"],
        n=2, what="consensus L2, duals reset every block, momentum kept"),
    Run("admm-eval-ckpt-best", ["algorithm.name=admm", "run.eval_every=1",
                                "run.checkpoint_every=1", "run.keep_checkpoints=3"],
        same_as="admm", what="evaluation and checkpoint every block, model-best.npz"),
    Run("bmuf-nbm", ["algorithm.name=bmuf", "algorithm.nesterov=true"]),
    Run("bmuf-classic", ["algorithm.name=bmuf", "algorithm.nesterov=false",
                         "algorithm.block_momentum=-1.0", "algorithm.block_lr=0.5"],
        what="classical block momentum, eta = 1 - 1/N, zeta = 0.5"),
    Run("ibt", ["algorithm.name=ibt"]),
    Run("ibt-cosine-warmup", COSINE,
        what="cosine schedule, lr warm-up passes, ssgd warm-up steps"),
    Run("ibt-cosine-resume", COSINE,
        steps=[{"sets": ["run.passes=1"]}, {"sets": ["run.passes=2"]}],
        same_as="ibt-cosine-warmup", what="1 pass, then resumed to 2 passes"),
    Run("ibt-dropout-augment", ["algorithm.name=ibt", f"model.layers={DROPOUT_LAYERS}",
                                "data.augment=true", "data.seed=5", "model.seed=7"],
        what="custom layers with dropout, augmentation, other seeds"),
    Run("ibt-threads2", ["algorithm.name=ibt", "run.threads=2"],
        what="2 BLAS threads, consensus chunks over 2 threads"),
    Run("ibt-init-n2", ["algorithm.name=ibt", "run.passes=1"],
        steps=[{"dir": "a"}, {"dir": "b", "n": 2, "sets": ["model.init={run}/a"]}],
        what="a new 2-worker run from a 3-worker run's model (model.init)"),
    Run("easgd", ["algorithm.name=easgd", "algorithm.easgd_beta=0.5"]),
    # real MPI jobs: master + 2 workers
    Run("ibt-mpi", ["algorithm.name=ibt", "run.checkpoint_every=2"], mpi=3),
    Run("ibt-mpi-fault-resume", ["algorithm.name=ibt", "run.checkpoint_every=2"], mpi=3,
        steps=[{"env": {"IBTMPI_FAULT": "1:5:compute"}, "rc": 1}, {}],
        same_as="ibt-mpi", what="worker 1 crashes in block 5, the rerun resumes"),
    Run("admm-mpi-adaptive", ["algorithm.name=admm", "algorithm.adaptive_rho=true",
                              "algorithm.rho=0.1", "algorithm.rho_mu=2.0",
                              "algorithm.over_relaxation=1.5"], mpi=3),
    Run("ssgd-mpi", ["algorithm.name=ssgd"], mpi=3),
    Run("ma-mpi", ["algorithm.name=ma"], mpi=3),
    Run("bmuf-mpi", ["algorithm.name=bmuf"], mpi=3),
    Run("easgd-mpi", ["algorithm.name=easgd"], mpi=3),
    # cross-version resume (current side only, checked through same_as):
    # the reference code's checkpoint after pass 1, resumed by this code
    Run("ma-resume-old", ["algorithm.name=ma"], steps=RESUME_OLD, same_as="ma",
        what="pass 1 on the reference code, pass 2 resumed on the current code"),
    Run("admm-resume-old", ["algorithm.name=admm"], steps=RESUME_OLD, same_as="admm",
        what="pass 1 on the reference code, pass 2 resumed on the current code"),
    Run("ibt-resume-old", ["algorithm.name=ibt"], steps=RESUME_OLD, same_as="ibt",
        what="pass 1 on the reference code, pass 2 resumed on the current code"),
    Run("easgd-resume-old", ["algorithm.name=easgd", "algorithm.easgd_beta=0.5"],
        steps=RESUME_OLD, same_as="easgd",
        what="pass 1 on the reference code, pass 2 resumed on the current code"),
    Run("ssgd-resume-old", ["algorithm.name=ssgd"], steps=RESUME_OLD, same_as="ssgd",
        what="pass 1 on the reference code, pass 2 resumed on the current code"),
    Run("ibt-mpi-resume-old", ["algorithm.name=ibt", "run.checkpoint_every=2"], mpi=3,
        steps=RESUME_OLD, same_as="ibt-mpi",
        what="mpiexec: pass 1 on the reference code, pass 2 on the current code"),
]

# deterministic figures of metrics.jsonl lines and summary.json (timings,
# pids, hosts and memory figures are left out)
METRIC_KEYS = ("block", "blocks_total", "pass", "block_in_pass", "algorithm", "N",
               "train_loss", "train_acc", "samples", "primal_residual",
               "dual_residual", "rho", "lr", "val_loss", "val_acc")
SUMMARY_KEYS = ("algorithm", "N", "blocks", "passes", "allreduce_calls",
                "allreduce_bytes", "images", "test_loss", "test_acc", "val_acc",
                "best", "stopped_early", "resumed_at_block")

PERTURB = 1e-6      # --perturb / --selftest: the current side's lr * (1 + this)

# every process starts through this: it checks which ibtmpi it imported,
# then runs `python -m ibtmpi ARGS` (or, with --where, prints the path)
SHIM = r'''
import os, sys
import ibtmpi
got = os.path.realpath(os.path.dirname(ibtmpi.__file__))
want = os.path.realpath(os.environ["REGZ_EXPECT"])
rank = os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "-"))
if sys.argv[1:] == ["--where"]:
    print(f"rank {rank}: {ibtmpi.__file__}", flush=True)
    sys.exit(0 if got == want else 97)
if got != want:
    sys.stderr.write(f"regression_z shim: imported {got}, expected {want}\n")
    sys.exit(97)
import runpy
sys.argv = ["ibtmpi"] + sys.argv[1:]
runpy.run_module("ibtmpi", run_name="__main__", alter_sys=True)
'''

# ---------------------------------------------------------------------------


def log(msg=""):
    print(msg, flush=True)


class Setup(Exception):
    """Cannot start: exit status 2."""


def sh(cmd, cwd=None, check=True):
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if check and r.returncode:
        raise Setup(f"{' '.join(cmd)}: {(r.stderr or r.stdout).strip()}")
    return r.stdout.strip()


@dataclass
class Side:
    label: str          # "current", "current#2", "old", "recorded"
    root: str           # the tree whose ibtmpi/ is tested
    work: str           # cwd of its runs: WORK/<run name>/<dir>


class Runner:
    def __init__(self, args, tmp):
        self.a = args
        self.tmp = tmp
        self.python = args.python
        bindir = os.path.dirname(self.python)
        self.mpiexec = (os.path.join(bindir, "mpiexec")
                        if os.path.exists(os.path.join(bindir, "mpiexec"))
                        else shutil.which("mpiexec"))
        self.procs = set()
        self.stopping = False
        self.ref_root = None      # the reference tree, for "code": "reference" steps
        if tmp is None:           # --list: commands only
            return
        self.shim_dir = os.path.join(tmp, "shim")
        os.makedirs(self.shim_dir)
        self.shim = os.path.join(self.shim_dir, "regz_shim.py")
        with open(self.shim, "w") as f:
            f.write(SHIM)

    # -- processes -----------------------------------------------------------
    def env(self, root, extra=None):
        """The environment of a process that must import root/ibtmpi."""
        e = {k: v for k, v in os.environ.items()
             if not k.startswith(("IBTMPI_", "SLURM_", "PYTHON"))}
        e.update(PYTHONPATH=root, REGZ_EXPECT=os.path.join(root, "ibtmpi"),
                 PYTHONHASHSEED="0", PYTHONDONTWRITEBYTECODE="1",
                 PYTHONNOUSERSITE="1")
        e.update(extra or {})
        return e

    def launcher(self, nprocs):
        if not self.mpiexec:
            raise Setup("no mpiexec next to the python or on PATH (the mpich extra)")
        cmd = [self.mpiexec]
        ver = subprocess.run([self.mpiexec, "--version"], capture_output=True, text=True)
        if "open mpi" in (ver.stdout + ver.stderr).lower():     # as ibtmpi.launcher
            if nprocs > len(os.sched_getaffinity(0)):
                cmd.append("--oversubscribe")
            if os.geteuid() == 0:
                cmd.append("--allow-run-as-root")
        return cmd + ["-n", str(nprocs)]

    def call(self, cmd, cwd, env, logfile):
        if self.stopping:
            return 130
        with open(logfile, "a") as out:
            out.write(f"$ (cd {cwd}) PYTHONPATH={env.get('PYTHONPATH', '')} "
                      f"{' '.join(cmd)}\n")
            out.flush()
            p = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, start_new_session=True)
            self.procs.add(p)
            try:
                return p.wait(timeout=self.a.timeout)
            except subprocess.TimeoutExpired:
                out.write(f"regression_z: killed after {self.a.timeout} s\n")
                return 124
            finally:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
                self.procs.discard(p)

    def kill_all(self):
        self.stopping = True
        for p in list(self.procs):
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except OSError:
                pass

    # -- what a side imports ---------------------------------------------------
    def where(self, side):
        os.makedirs(side.work, exist_ok=True)
        env = self.env(side.root)
        r = subprocess.run([self.python, self.shim, "--where"], cwd=side.work, env=env,
                           capture_output=True, text=True)
        lines = [r.stdout.strip()]
        ok = r.returncode == 0
        if any(run.mpi or any(s.get("mpi") for s in run.steps) for run in self.a.runs):
            m = subprocess.run(self.launcher(2) + [self.python, self.shim, "--where"],
                               cwd=side.work, env=env, capture_output=True, text=True)
            lines += sorted(l for l in m.stdout.splitlines() if l.startswith("rank"))
            ok = ok and m.returncode == 0
        log(f"  {side.label:<9} ibtmpi.__file__: " + "\n            ".join(lines))
        if not ok:
            raise Setup(f"{side.label} side imports the wrong ibtmpi (want "
                        f"{side.root}/ibtmpi): {r.stderr.strip()}")

    # -- one run -----------------------------------------------------------------
    def commands(self, run, side_is_current):
        """[(argv after the launcher, launcher argv, env, expected rc, dir,
        code, resumes)]; code "reference": the step runs on the reference
        tree; resumes: the step must resume the newest checkpoint in dir.

        --perturb: the current side's steps on the current code get the
        perturbed lr, except a step that resumes the checkpoint of an earlier
        reference-code step (the same dir): ibtmpi refuses a checkpoint of
        another configuration, and lr is part of it, so such a step keeps
        the lr the checkpoint was written with."""
        out = []
        ref_dirs = set()
        for st in run.steps:
            d = st.get("dir", "run")
            code = st.get("code", "current")
            assert code in ("current", "reference"), f"{run.name}: code {code!r}"
            resumes_ref = d in ref_dirs
            if code == "reference":
                ref_dirs.add(d)
            sets = BASE_SETS + run.sets + st.get("sets", [])
            if (side_is_current and self.a.perturb and code == "current"
                    and not resumes_ref):
                lr = 0.02
                for s in sets:
                    if s.startswith("optim.lr="):
                        lr = float(s.split("=", 1)[1])
                sets = sets + [f"optim.lr={lr * (1 + PERTURB)!r}"]
            sets = [s.replace("{run}", run.name) for s in sets]
            argv = ["train", "--set", f"data.path={self.data}"]
            for s in sets + [f"run.dir={run.name}/{d}"]:
                argv += ["--set", s]
            mpi = st.get("mpi", run.mpi)
            n = st.get("n", run.n)
            if mpi:
                launch = self.launcher(mpi)
            else:
                launch = []
                if n:
                    argv += ["--simulate", str(n)]
            out.append((argv, launch, st.get("env", {}), st.get("rc", 0), d, code,
                        bool(st.get("resumes"))))
        return out

    def run_all(self, tasks):
        """run_one over (run, side) tasks, self.a.jobs at once; an interrupt
        cancels what has not started and kills what runs."""
        pool = ThreadPoolExecutor(self.a.jobs)
        try:
            futs = [pool.submit(self.run_one, r, s) for r, s in tasks]
            return {(r.name, s.label): f.result() for (r, s), f in zip(tasks, futs)}
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)
            self.kill_all()
            raise
        finally:
            pool.shutdown(wait=True)

    def run_one(self, run, side):
        """Run `run` on `side`; (result dir or None, seconds, why failed)."""
        t0 = time.time()
        base = os.path.join(side.work, run.name)
        shutil.rmtree(base, ignore_errors=True)
        os.makedirs(base)
        logfile = os.path.join(base, "log.txt")
        current = side.label.startswith("current")
        for argv, launch, env, rc_want, d, code, resumes in self.commands(run, current):
            if code == "reference":
                if not (current and self.ref_root):
                    return None, time.time() - t0, ("a reference-code step needs a "
                                                    "reference tree and the current side")
                root = self.ref_root
            else:
                root = side.root
            step_dir = os.path.join(base, d)
            ck = newest_checkpoint(step_dir) if resumes else None
            if resumes and not ck:
                return None, time.time() - t0, f"no checkpoint in {step_dir} to resume"
            cmd = launch + [self.python, self.shim] + argv
            rc = self.call(cmd, side.work, self.env(root, env), logfile)
            if rc != rc_want:
                tail = open(logfile).read().strip().splitlines()[-3:]
                return None, time.time() - t0, (f"exit {rc} (expected {rc_want}), "
                                                f"see {logfile}: " + " | ".join(tail))
            if resumes:
                why = not_resumed(step_dir, ck)
                if why:
                    return None, time.time() - t0, f"{why} (see {logfile})"
        res = os.path.join(base, d)
        if not os.path.exists(os.path.join(res, "model.npz")):
            return None, time.time() - t0, f"no {res}/model.npz"
        return res, time.time() - t0, ""


# ---------------------------------------------------------------------------
# What is compared
# ---------------------------------------------------------------------------

def newest_checkpoint(run_dir):
    done = [d for d in glob.glob(os.path.join(run_dir, "checkpoints", "ckpt-*"))
            if os.path.exists(os.path.join(d, "manifest.json"))]
    return max(done) if done else None


def not_resumed(run_dir, ck):
    """Why run_dir's last command did not resume the checkpoint ck ("": it
    did): a checkpoint the code could not read is set aside as damaged-*
    and an earlier one (or a fresh start) is used, which could end where
    the uninterrupted run does and hide that."""
    m = re.search(r"(\d+)$", os.path.basename(ck))
    damaged = glob.glob(os.path.join(run_dir, "checkpoints", "damaged-*"))
    if damaged:
        return f"a checkpoint was set aside as {os.path.basename(damaged[0])}"
    try:
        got = json.load(open(os.path.join(run_dir, "summary.json"))).get("resumed_at_block")
    except (OSError, ValueError) as e:
        return f"no summary.json to tell where it resumed ({e})"
    want = int(m.group(1)) + 1 if m else None
    if got != want or not got:
        return f"resumed at block {got}, not at {want} (after {os.path.basename(ck)})"
    return ""


def array_files(run_dir):
    """relative path -> file, of every .npz compared."""
    out = {}
    for name in ("model.npz", "model-best.npz"):
        p = os.path.join(run_dir, name)
        if os.path.exists(p):
            out[name] = p
    ck = newest_checkpoint(run_dir)
    if ck:
        for p in sorted(glob.glob(os.path.join(ck, "*.npz"))):
            out[os.path.relpath(p, run_dir)] = p
    return out


# arrays that name a file's owner, not a result: a checkpoint rank file's
# `stamp` (the run's random id and the block) differs between any two runs
IDENTITY_ARRAYS = ("stamp",)


def load_npz(path):
    import numpy as np
    with np.load(path, allow_pickle=False) as f:
        return {k: f[k] for k in f.files if k not in IDENTITY_ARRAYS}


def max_abs_diff(a, b):
    import numpy as np
    if a.shape != b.shape or a.dtype.kind not in "fiub" or b.dtype.kind not in "fiub":
        return None
    x, y = a.astype(np.float64), b.astype(np.float64)
    nan = np.isnan(x) | np.isnan(y)
    if (np.isnan(x) != np.isnan(y)).any():
        return float("inf")
    return float(np.max(np.abs(x[~nan] - y[~nan]), initial=0.0))


def compare_arrays(da, db, only_model=False, stats=None, common_only=False):
    """[(what, max abs diff or None)] of every array that is not bitwise
    equal, over the .npz files of two run directories (da the current side,
    db the reference); stats (a dict) gets the number of files and arrays
    compared. common_only: an array that only one side's file has (of a
    file both sides write) goes to stats["one_side"] as (file, array,
    "current" or "reference") instead; a whole file only one side writes
    is a difference either way."""
    stats = {} if stats is None else stats
    one_side = stats.setdefault("one_side", [])
    fa, fb = array_files(da), array_files(db)
    if only_model:
        fa = {k: v for k, v in fa.items() if k == "model.npz"}
        fb = {k: v for k, v in fb.items() if k == "model.npz"}
    diffs = []
    for rel in sorted(set(fa) | set(fb)):
        if rel not in fa or rel not in fb:
            diffs.append((f"{rel} ({'current' if rel in fa else 'reference'} only)", None))
            continue
        A, B = load_npz(fa[rel]), load_npz(fb[rel])
        stats["files"] = stats.get("files", 0) + 1
        stats["arrays"] = stats.get("arrays", 0) + len(set(A) & set(B))
        stats["bytes"] = stats.get("bytes", 0) + sum(A[k].nbytes for k in set(A) & set(B))
        for k in sorted(set(A) | set(B)):
            if k not in A or k not in B:
                who = "current" if k in A else "reference"
                if common_only:
                    one_side.append((rel, k, who))
                else:
                    diffs.append((f"{rel}:{k} ({who} only)", None))
                continue
            a, b = A[k], B[k]
            if a.dtype != b.dtype or a.shape != b.shape:
                diffs.append((f"{rel}:{k} {a.dtype}{list(a.shape)} vs "
                              f"{b.dtype}{list(b.shape)}", None))
            elif a.tobytes() != b.tobytes():
                diffs.append((f"{rel}:{k}", max_abs_diff(a, b)))
    return diffs


def describe_one_side(one_side):
    """'3 checkpoint arrays only in the reference: U, v, zg' (array names,
    each counted once over the rank files of the checkpoint)."""
    groups = {}
    for rel, key, who in one_side:
        place = "checkpoint" if rel.startswith("checkpoints" + os.sep) else rel
        groups.setdefault((who, place), set()).add(key)
    out = []
    for (who, place), names in sorted(groups.items(), key=lambda g: (g[0][0] != "reference",
                                                                     g[0][1])):
        names = sorted(names, key=lambda n: (n.lower(), n))
        out.append(f"{len(names)} {place} array{'s' if len(names) != 1 else ''} only in "
                   f"the {who}: {', '.join(names[:8])}{', ...' if len(names) > 8 else ''}")
    return "; ".join(out)


def figures(run_dir):
    lines = []
    p = os.path.join(run_dir, "metrics.jsonl")
    if os.path.exists(p):
        for l in open(p):
            if l.strip():
                m = json.loads(l)
                lines.append({k: m[k] for k in METRIC_KEYS if k in m})
    s = {}
    p = os.path.join(run_dir, "summary.json")
    if os.path.exists(p):
        full = json.load(open(p))
        s = {k: full[k] for k in SUMMARY_KEYS if k in full}
        if isinstance(s.get("best"), dict):
            s["best"] = {k: v for k, v in s["best"].items() if k != "file"}
    return lines, s


def compare_figures(da, db):
    """Short notes on the deterministic figures that differ."""
    (la, sa), (lb, sb) = figures(da), figures(db)
    notes = []
    if len(la) != len(lb):
        notes.append(f"metrics.jsonl {len(la)} vs {len(lb)} lines")
    for x, y in zip(la, lb):
        keys = [k for k in METRIC_KEYS if x.get(k) != y.get(k)]
        if keys:
            notes.append(f"metrics block {x.get('block')}: {','.join(keys)}")
            break
    keys = [k for k in SUMMARY_KEYS if sa.get(k) != sb.get(k)]
    if keys:
        notes.append(f"summary.json: {','.join(keys)}")
    return notes


def describe(diffs):
    """'max abs diff of z 3.1e-06; 7 arrays in 3 files differ, the most
    checkpoints/ckpt-00000007/rank-00000.npz:v by 0.02'"""
    z = [d for w, d in diffs if w == "model.npz:z"]
    nums = [(d, w) for w, d in diffs if d is not None]
    files = {w.split(":")[0].split(" ")[0] for w, _ in diffs}
    out = []
    if z:
        out.append(f"max abs diff of z {z[0]:.3g}")
    else:
        out.append(f"z equal, but {diffs[0][0]}")
    out.append(f"{len(diffs)} arrays in {len(files)} files differ")
    if nums:
        d, w = max(nums)
        if w != "model.npz:z" or not z:
            out[-1] += f", the most {w} by {d:.3g}"
    return "; ".join(out)


# ---------------------------------------------------------------------------
# The harvest of --record / --compare
# ---------------------------------------------------------------------------

def save_results(run_dir, dest):
    os.makedirs(dest, exist_ok=True)
    for name in ("model.npz", "model-best.npz", "metrics.jsonl", "summary.json"):
        p = os.path.join(run_dir, name)
        if os.path.exists(p):
            shutil.copy2(p, dest)
    ck = newest_checkpoint(run_dir)
    if ck:
        shutil.copytree(ck, os.path.join(dest, "checkpoints", os.path.basename(ck)))


# ---------------------------------------------------------------------------

def selftest_comparator(run_dir, tmp):
    """A copy of run_dir's model.npz with z[0] moved by one ulp must compare
    as different, with that ulp as its max abs diff."""
    import numpy as np
    d = os.path.join(tmp, "ulp")
    os.makedirs(d, exist_ok=True)
    arrays = load_npz(os.path.join(run_dir, "model.npz"))
    z = arrays["z"].copy()
    z[0] = np.nextafter(z[0], np.float32(np.inf))
    ulp = float(z[0]) - float(arrays["z"][0])
    arrays["z"] = z
    np.savez(os.path.join(d, "model.npz"), **arrays)
    diffs = compare_arrays(run_dir, d, only_model=True)
    ok = diffs == [("model.npz:z", ulp)]
    log(f"{'comparator: one-ulp change of z[0]':<28} {'DIFFER' if ok else 'MISSED'}  "
        f"({describe(diffs) if diffs else 'no difference seen'}; ulp {ulp:.3g})")
    return ok


def pick_python(args):
    if args.python:
        return os.path.abspath(args.python)
    venv = os.path.join(args.repo, ".venv", "bin", "python")
    return venv if os.path.exists(venv) else sys.executable


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--against", default=DEFAULT_COMMIT, metavar="COMMIT",
                    help=f"the commit to compare with (default {DEFAULT_COMMIT})")
    ap.add_argument("--record", metavar="DIR", help="run this tree only and save its "
                    "results in DIR (no worktree)")
    ap.add_argument("--compare", metavar="DIR", help="run this tree only and compare "
                    "with the results --record saved in DIR (no worktree)")
    ap.add_argument("--selftest", action="store_true",
                    help="perturb the current side (lr * (1 + 1e-6)) and check that "
                         "EVERY run is reported as DIFFER, plus a one-ulp change of z "
                         "through the comparator; exit 0 when all were detected")
    ap.add_argument("--perturb", action="store_true",
                    help="the current side's lr * (1 + 1e-6) (its current-code steps): "
                         "every run should DIFFER")
    ap.add_argument("--repeat", type=int, default=2, choices=(1, 2),
                    help="runs of the current side (2: also checks determinism; default)")
    ap.add_argument("--only", metavar="REGEX", help="only the runs whose name matches")
    ap.add_argument("--jobs", type=int, default=0,
                    help="runs at once (default: the usable cores, at most 2)")
    ap.add_argument("--python", help="interpreter for both sides (default: the "
                    "repository's .venv/bin/python, else this one)")
    ap.add_argument("--tree", metavar="DIR", help="test the ibtmpi/ of this source tree "
                    "as the current side instead of this checkout's working tree")
    ap.add_argument("--data", help="use this dataset instead of making one")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per command")
    ap.add_argument("--strict", action="store_true",
                    help="differing metrics.jsonl / summary.json figures fail a run too")
    ap.add_argument("--model-only", action="store_true",
                    help="compare model.npz only (not model-best.npz and checkpoints)")
    ap.add_argument("--every-array", action="store_true",
                    help="an array that only one side writes (a checkpoint format "
                         "change) is a difference; by default it is counted in a note "
                         "and only the arrays both sides write are compared")
    ap.add_argument("--common-only", action="store_true",
                    help="the default (compare the arrays both sides write); "
                         "accepted for older command lines")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    ap.add_argument("-v", "--verbose", action="store_true",
                    help="each line also gives the current side's seconds")
    ap.add_argument("--list", action="store_true", help="print the runs and exit")
    a = ap.parse_args(argv)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)      # `... --list | head`
    if a.selftest:
        a.perturb = True
    a.repo = sh(["git", "-C", HERE, "rev-parse", "--show-toplevel"])
    a.tree = os.path.realpath(a.tree) if a.tree else a.repo
    if not os.path.isfile(os.path.join(a.tree, "ibtmpi", "__init__.py")):
        raise SystemExit(f"regression_z: no ibtmpi/__init__.py in {a.tree}")
    a.python = pick_python(a)
    import importlib.util
    if importlib.util.find_spec("numpy") is None:
        if os.path.abspath(a.python) == os.path.abspath(sys.executable):
            raise SystemExit("regression_z: needs numpy (run it with the venv's python)")
        os.execv(a.python, [a.python, os.path.abspath(__file__)] + (argv or sys.argv[1:]))
    if a.every_array and a.common_only:
        raise SystemExit("regression_z: --every-array or --common-only, not both")
    a.common_only = not a.every_array
    a.runs = [r for r in RUNS if not a.only or re.search(a.only, r.name)]
    names = [r.name for r in RUNS]
    assert len(set(names)) == len(names), "duplicate run names"
    for r in a.runs:
        if r.same_as and r.same_as not in names:
            raise SystemExit(f"regression_z: {r.name}: same_as {r.same_as!r} is no run")
    if a.list:
        rn = Runner(a, None)
        rn.data = "DATA"
        for r in a.runs:
            log(f"{r.name}: {r.what}" + (f" (== {r.same_as})" if r.same_as else ""))
            for argv_, launch, env, rc, _, code, _ in rn.commands(r, r.cross):
                pre = " ".join(f"{k}={v}" for k, v in env.items())
                log(f"    {'[reference code] ' if code == 'reference' else ''}"
                    f"{pre + ' ' if pre else ''}"
                    f"{shlex.join(launch + ['python', '-m', 'ibtmpi'] + argv_)}"
                    + (f"   # exit {rc}" if rc else ""))
        return 0
    if a.record and a.compare:
        raise SystemExit("regression_z: --record or --compare, not both")
    skipped = []
    if a.record or a.compare:         # no reference tree to run their first step
        skipped = [r.name for r in a.runs if r.cross]
        a.runs = [r for r in a.runs if not r.cross]
    if not a.jobs:
        a.jobs = max(1, min(2, len(os.sched_getaffinity(0))))

    def stop(signum, frame):
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, stop)

    t_start = time.time()
    tmp = tempfile.mkdtemp(prefix="regression_z-")
    worktree = None
    rn = None
    try:
        rn = Runner(a, tmp)
        head = sh(["git", "-C", a.tree, "rev-parse", "--short", "HEAD"], check=False)
        dirty = sh(["git", "-C", a.tree, "status", "--porcelain"], check=False)
        dirty = [l for l in dirty.splitlines() if not l.endswith("tools/regression_z.py")]
        cur_desc = f"working tree {a.tree} (HEAD {head or '?'}" + (
            f", {len(dirty)} changed or untracked paths)" if dirty else ", clean)")
        sides = [Side("current", a.tree, os.path.join(tmp, "current"))]
        if a.repeat == 2:
            sides.append(Side("current#2", a.tree, os.path.join(tmp, "current2")))
        ref = None
        if a.compare:
            ref_desc = f"results recorded in {a.compare}"
            rec = os.path.join(a.compare, "record.json")
            if os.path.exists(rec):
                ref_desc += f" ({json.load(open(rec)).get('source', '?')})"
        elif not a.record:
            worktree = Checkout(a.repo, a.against, os.path.join(tmp, "old-tree")).add()
            ref = Side("old", worktree.path, os.path.join(tmp, "old"))
            sides.append(ref)
            rn.ref_root = worktree.path
            ref_desc = f"commit {worktree.commit[:12]} in a worktree at {worktree.path}"
        log(f"regression_z: {len(a.runs)} runs, python {a.python}")
        log(f"  current   = {cur_desc}" + (f", lr * (1 + {PERTURB:g}) (perturbed)"
                                            if a.perturb else ""))
        if a.record:
            log(f"  recording into {a.record}")
        else:
            log(f"  reference = {ref_desc}")
        if skipped:
            log(f"  skipped   = {len(skipped)} cross-version runs (their first step needs "
                f"the reference commit's code, which --record/--compare do not check "
                f"out): {', '.join(skipped)}")
        for s in sides:
            if not s.label.startswith("current#"):
                rn.where(s)

        # the data set, once, by the current tree's prep
        if a.data:
            rn.data = os.path.abspath(a.data)
        else:
            rn.data = os.path.join(tmp, "data", "synth16")
            env = rn.env(sides[0].root)
            r = subprocess.run([rn.python, rn.shim, "prep", "synth", rn.data, "--quiet"]
                               + DATA_ARGS, env=env, cwd=tmp, capture_output=True, text=True)
            if r.returncode:
                raise Setup(f"prep synth failed: {(r.stderr or r.stdout).strip()}")
        log(f"  data      = {rn.data}")

        # every (run, side); a cross-version run (a step on the reference
        # code) runs on the current side(s) only, and is checked through its
        # same_as partner there. A run's same_as partner runs on the same
        # sides anyway, so the order does not matter (also the same_as
        # partners that --only left out, on the sides their runs need)
        def sides_of(r):
            return [s for s in sides if not (r.cross and s is ref)]
        by_name = {r.name: r for r in RUNS}
        tasks = {}
        for r in a.runs:
            for s in sides_of(r):
                tasks.setdefault((r.name, s.label), (r, s))
                if r.same_as:
                    tasks.setdefault((r.same_as, s.label), (by_name[r.same_as], s))
        t_runs = time.time()
        results = rn.run_all(list(tasks.values()))
        t_runs = time.time() - t_runs

        passed = failed = 0
        log("")
        first_ok_dir = None
        for r in a.runs:
            cur = results[r.name, "current"]
            status, note, stats = "OK", [], {}
            if cur[0] is None:
                status, note = "FAILED", [f"current: {cur[2]}"]
            for s in sides_of(r)[1:]:
                other = results[r.name, s.label]
                if other[0] is None and status != "FAILED":
                    status, note = "FAILED", [f"{s.label}: {other[2]}"]
            if status == "OK" and a.repeat == 2:
                d2 = compare_arrays(cur[0], results[r.name, "current#2"][0], a.model_only)
                f2 = compare_figures(cur[0], results[r.name, "current#2"][0])
                if d2 or (f2 and a.strict):
                    status, note = "NONDET", [f"current vs its repeat: "
                                              f"{describe(d2) if d2 else '; '.join(f2)}"]
                elif f2:
                    note.append("repeat's figures differ: " + "; ".join(f2))
            # invariants inside a side
            if status == "OK" and r.same_as:
                for s in sides_of(r):
                    mine, theirs = results[r.name, s.label][0], results[r.same_as, s.label][0]
                    if theirs is None:
                        status, note = "FAILED", [f"{s.label}: {r.same_as} failed"]
                        break
                    d = compare_arrays(mine, theirs, only_model=True)
                    if d:
                        status = "DIFFER"
                        note.append(f"{s.label}: model.npz != {r.same_as}'s: {describe(d)}")
            if status == "OK" and not a.record and not r.cross:
                if a.compare:
                    other_dir = os.path.join(a.compare, r.name)
                    if not os.path.exists(os.path.join(other_dir, "model.npz")):
                        status, note = "FAILED", [f"not recorded in {a.compare}"]
                        other_dir = None
                else:
                    other_dir = results[r.name, "old"][0]
                if other_dir:
                    d = compare_arrays(cur[0], other_dir, a.model_only, stats,
                                       a.common_only)
                    if stats["one_side"]:
                        note.append(describe_one_side(stats["one_side"]))
                    f = compare_figures(cur[0], other_dir)
                    if d:
                        status, note = "DIFFER", [describe(d)] + note
                        if f:
                            note.append("; ".join(f))
                    elif f:
                        if a.strict:
                            status = "DIFFER"
                        note.append("figures differ: " + "; ".join(f))
            if status == "OK" and first_ok_dir is None:
                first_ok_dir = cur[0]
            if a.record and cur[0] is not None and status == "OK":
                save_results(cur[0], os.path.join(a.record, r.name))
            ok = status == "OK"
            if a.selftest:        # every run must have been caught
                ok = status == "DIFFER"
                first_ok_dir = first_ok_dir or cur[0]
            passed += ok
            failed += not ok
            secs = f"[{cur[1]:.1f} s" + (f"; {stats['arrays']} arrays in {stats['files']} "
                                         f"files, {stats['bytes'] / 2**20:.1f} MiB compared"
                                         if stats.get("files") else "") + "]"
            log(f"{r.name:<28} {status:<7}{'  ' + ' | '.join(note) if note else ''}  {secs}"
                if a.verbose else
                f"{r.name:<28} {status}{'  (' + ' | '.join(note) + ')' if note else ''}")
        if a.record:
            with open(os.path.join(a.record, "record.json"), "w") as f:
                json.dump({"source": cur_desc, "when": time.strftime("%Y-%m-%d %H:%M:%S"),
                           "runs": [r.name for r in a.runs]}, f, indent=1)
        if a.selftest:
            if first_ok_dir and selftest_comparator(first_ok_dir, tmp):
                passed += 1
            else:
                failed += 1
        log("")
        log(f"runs took {t_runs:.0f} s ({len(tasks)} runs of {len(a.runs)} table entries "
            f"on {len(sides)} sides, {a.jobs} at once); {time.time() - t_start:.0f} s in all")
        if a.selftest:
            log(f"selftest: {passed} of {passed + failed} perturbations detected")
        log(f"{passed} passed, {failed} failed"
            + (f", {len(skipped)} skipped (cross-version runs)" if skipped else ""))
        return 0 if failed == 0 else 1
    except Setup as e:
        log(f"regression_z: {e}")
        return 2
    except KeyboardInterrupt:
        log("regression_z: interrupted")
        return 130
    finally:
        if rn:
            rn.kill_all()
        if worktree:
            worktree.remove()
        if a.keep:
            log(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
