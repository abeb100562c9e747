"""Checkpoints, resume and model.init: what a rank writes and reads back.

Every rank writes its own file per checkpoint (checkpoint.py) holding what
the parts own, asked from them: the algorithm's consensus state (the
master's file: every rank reads it back) and each local worker's state
(the algorithm's: its dual, easgd's own model; the optimizer's: its
momentum or moments), named ``<key>_<worker>``; ssgd's rank-level model
and optimizer state as ``params`` and ``opt_<key>``. Nothing here lists a
buffer by name. The master confirms a checkpoint in its manifest only
when every rank's flag says its file was written (the next block's
Allreduce, or the final sync).
What a checkpoint holds of the sync between workers comes from its part
(steps.py); the block's flags (packet.py) say when every rank wrote its file.
Tests: tests/unit/test_checkpoint.py, test_init.py, tests/mpi/test_trainer_mpi.py.
"""
from __future__ import annotations

import hashlib
import os
import time

import numpy as np

from .. import checkpoint as ckpt
from .. import comm as mpi
from ..config import (ConfigError, change_text, config_changes, config_diff, digest,
                      hashed_config, legacy_hashes, run_hash, tunable)
from ..errors import agreed
from .packet import FLAG_CKPT

# what a resume on another worker count may change beyond RESUME_TUNABLE:
# algorithm.recipe derives the local batch from N
RESHAPE_MAY_CHANGE = ("data.batch",)


class CheckpointWrites:
    """This rank's checkpoint files in flight: each written by a thread
    (checkpoint.BackgroundWrite) while the next block computes, joined
    before that block's flags say whether the file is complete, and
    settled when every rank's flag has said so (the master then writes the
    manifest). A write's error (a full disk) is raised at the join as the
    checkpoint's, with its block and phase on the RunControl."""

    def __init__(self, run_dir, rank, control):
        self.run_dir, self.rank, self.control = run_dir, rank, control
        self.write = None                # the write in flight
        self.pending = None              # the block whose file awaits confirmation
        self.max_s = 0.0                 # the longest write so far (the watchdog allows it)

    def start(self, k, arrays):
        """Write block k's file from `arrays` (copies the caller no longer
        changes); join() the previous write first."""
        self.write = ckpt.BackgroundWrite(self.run_dir, k, self.rank, arrays)
        self.pending = k

    def join(self):
        w, self.write = self.write, None
        if w is None:
            return
        try:
            w.join()
        except BaseException:
            self.control.at("checkpoint", w.block)
            raise
        self.max_s = max(self.max_s, w.seconds)
        self.control.checkpoint_took(w.seconds)   # the time limit keeps room for it

    def settle(self, every_rank_wrote):
        """The flags came back: the block to confirm (every rank wrote its
        file), or None; nothing is pending afterwards."""
        k, self.pending = self.pending, None
        return k if every_rank_wrote else None


class Checkpointer:
    """This rank's checkpoints and the run's resume: what it writes (asked
    from the sync part, steps.py), the manifests, the choice and the read
    of a checkpoint to resume from, model.init. It holds what a manifest
    names: the configuration's digest, the data's (dataset.json, wherever
    it lives; on the master also what the shards hold, sampled rows, which
    a resume checks) and whose checkpoints these are (the run id: the
    master's, a fresh one or the resumed run's, sent with the resume
    candidates; every rank file carries it). put(dst, src): a host array
    into this rank's state arrays; diverged(k, what, ranks): the exception
    for a non-finite z."""

    def __init__(self, cfg, ds, *, rank, is_master, n_workers, local, simulate, comm, sched,
                 packet, blocks, sync, model, norm, writes, control, put, log, diverged):
        self.cfg, self.ds, self.rank, self.is_master = cfg, ds, rank, is_master
        self.n_workers, self.local, self.simulate, self.comm = n_workers, local, simulate, comm
        self.sched, self.packet, self.blocks = sched, packet, blocks
        self.sync, self.model, self.norm_mean, self.norm_std = sync, model, *norm
        self.writes, self.control, self._put, self.log = writes, control, put, log
        self.diverged = diverged
        self.algo, self.run_dir = cfg["algorithm"]["name"], cfg["run"]["dir"]
        self.cfg_hash = run_hash(cfg)
        self.data_fp = digest(ds.meta)
        self.data_content = ds.content_digest() if is_master else None
        self.run_id = ckpt.new_run_id() if is_master else None
        self.resume_changes = []         # tunable keys this resume changed: (key, old, new)
        self.reshape = None              # run.resume = reshape: the checkpoint's count, pass
        self.changed_before = []         # every resume's changes so far (the manifests')
        self.pending_change = None       # their text, for the first block's metrics line
        self.init_note = ""              # model.init: where the start came from
        self.ckpt_ids = {}

    def take_change_note(self):
        """The text of the settings this resume changed, once: for the
        first block's metrics line (None after, or without a change)."""
        note, self.pending_change = self.pending_change, None
        return note

    def state_spec(self):
        """{name: (shape, dtype)} of this rank's checkpoint arrays: what the
        sync part (steps.py) keeps, the agreed buffers on the master."""
        spec = dict(self.blocks.master_spec()) if self.is_master else {}
        if self.is_master and self.packet.B:         # the agreed buffers (BatchNorm's)
            spec["zbuf"] = ((self.packet.B,), np.float32)
        spec.update(self.blocks.rank_spec())
        return spec

    def state_arrays(self):
        a = dict(self.blocks.master_arrays()) if self.is_master else {}
        if self.is_master and self.packet.B:
            a["zbuf"] = self.sync.zbuf
        a.update(self.blocks.rank_arrays())
        return a

    def write(self, k):
        """Start writing checkpoint k (this rank's file) while the next block
        computes."""
        self.control.enter("checkpoint")
        if not np.isfinite(self.sync.z).all():
            raise self.diverged(k, "the consensus model is not finite (not checkpointing "
                                    "it)", "all")
        self.control.faults.disk_full(self.rank, k, os.path.join(   # injected full disk (tests)
            ckpt.ckpt_dir(self.run_dir, k), ckpt.rank_file(self.rank)))
        self.writes.join()               # the previous one's write, if still going
        # copies now (the state moves on with the next block), written by a
        # thread while the next block computes; joined before that block's
        # flags say whether this rank's file is complete
        arrays = {name: np.array(a, copy=True) for name, a in self.state_arrays().items()}
        arrays["stamp"] = np.array(ckpt.stamp(self.run_id, k))   # whose file this is
        self.writes.start(k, arrays)

    def write_manifest(self, k):
        world = 1 if self.simulate else mpi.world_size()
        ckpt.write_manifest(self.run_dir, k, {
            "config_hash": self.cfg_hash, "config": hashed_config(self.cfg),
            "dataset": self.data_fp, "dataset_content": self.data_content,
            "run_id": self.run_id, "algorithm": self.algo,
            "n_workers": self.n_workers, "world_size": world,
            "simulate": self.simulate, "files": [ckpt.rank_file(r) for r in range(world)],
            "blocks_per_pass": self.sched.blocks_per_pass,
            "passes_done": (k + 1) / self.sched.blocks_per_pass,
            "changed": self.changed_before},
            keep=self.cfg["run"]["keep_checkpoints"])

    def final_sync(self, confirm):
        """One small collective after the run's last checkpoint, so the
        master confirms it (confirm(k): its manifest) only when every rank
        has its file."""
        self.writes.join()
        if self.writes.pending is None:
            return
        n = self.packet.size - self.packet.flags0
        send = np.zeros(n, np.float32)
        recv = np.zeros(n, np.float32)
        mine = ([0] if self.is_master else []) + [1 + i for i in self.local]
        for j in mine:
            send[j] = FLAG_CKPT
        mpi.allreduce_sum(send, recv, self.comm, count=False)
        k = self.writes.settle((recv.astype(np.int64) & FLAG_CKPT).all())
        if k is not None and self.is_master:
            confirm(k)

    def _resume_candidates(self):
        """Complete checkpoints to resume from, newest first ([]: start
        fresh); CheckpointError where run.resume or the newest checkpoint
        forbids it (another configuration, worker count or dataset)."""
        mode = self.cfg["run"]["resume"]
        done = ckpt.complete(self.run_dir)
        self.ckpt_ids = {}
        if not done:
            if mode == "always":
                raise ckpt.CheckpointError(
                    f"--resume: {self.run_dir} holds no complete checkpoint")
            return []
        k = done[-1]
        where = ckpt.ckpt_dir(self.run_dir, k)
        if mode == "never":
            raise ckpt.CheckpointError(
                f"{self.run_dir} holds checkpoints (newest {where}); use another "
                f"run.dir, or resume with run.resume=auto")
        # the newest manifest that reads decides; a damaged one before it is
        # a candidate that fails on every rank (set aside, like a damaged
        # rank file, and the previous checkpoint tried)
        self.ckpt_ids, m = {}, None
        for b in done[::-1]:
            try:
                mb = ckpt.read_manifest(self.run_dir, b)
            except ckpt.DamagedCheckpoint as e:
                self.ckpt_ids[b] = (False, str(e))
                continue
            self.ckpt_ids[b] = (True, mb.get("run_id"))
            if m is None:
                m, k, where = mb, b, ckpt.ckpt_dir(self.run_dir, b)
        if m is None:
            return done[::-1]
        self.run_id = m.get("run_id") or self.run_id
        world = 1 if self.simulate else mpi.world_size()
        self.reshape = None
        if mode == "reshape" and (m.get("n_workers") != self.n_workers
                                  or m.get("world_size") != world):
            # continue on another worker count: what is per model carries
            # (_load_state), the run goes on from the same pass
            self.reshape = {"from_n": m.get("n_workers"), "from_world": m.get("world_size"),
                            "passes_done": float(m.get("passes_done", 0.0)), "block": k}
        elif m.get("n_workers") == self.n_workers and m.get("world_size") != world:
            was = (f"simulated in one process (--simulate {self.n_workers})"
                   if m.get("simulate") or m.get("world_size") == 1 else
                   f"an MPI job of {m.get('world_size')} processes")
            now = (f"--simulate {self.n_workers}" if self.simulate or world == 1 else
                   f"an MPI job of {world} processes")
            again = (f"--simulate {self.n_workers}, without mpiexec"
                     if m.get("simulate") or m.get("world_size") == 1 else
                     f"mpiexec -n {m.get('world_size')}")
            raise ckpt.CheckpointError(
                f"{where} was written by the same {self.n_workers} workers, {was}; this "
                f"run is {now}. Each rank's file holds its own workers' state: resume "
                f"with {again}, or start a new run from this one's model: another "
                f"run.dir and --set model.init={self.run_dir}")
        elif m.get("n_workers") != self.n_workers or m.get("world_size") != world:
            raise ckpt.CheckpointError(
                f"{where} was written by {m.get('n_workers')} worker(s) in "
                f"{m.get('world_size')} process(es); this run has {self.n_workers} in "
                f"{world}. Resuming with another worker count is not supported "
                f"(duals and data ranges are per worker): relaunch with the same "
                f"count, continue with this count and fresh duals (--set "
                f"run.resume=reshape), or start a new run from this one's model: "
                f"another run.dir and --set model.init={self.run_dir}")
        self.resume_changes = []
        if m.get("config_hash") != self.cfg_hash and m.get("config_hash") not in legacy_hashes(
                self.cfg):
            changes = (config_changes(m["config"], hashed_config(self.cfg))
                       if isinstance(m.get("config"), dict) else None)
            may = (lambda key: tunable(key) or key in RESHAPE_MAY_CHANGE) if \
                self.reshape else tunable
            if changes and all(may(c[0]) for c in changes):
                self.resume_changes = changes      # lr, rho, ...: the state still fits
            else:
                what = (isinstance(m.get("config"), dict)
                        and config_diff(m["config"], hashed_config(self.cfg))
                        or "model, data, algorithm or optimizer differ")
                raise ckpt.CheckpointError(
                    f"{where} was written by another configuration ({what}); run with "
                    f"the checkpoint's settings to resume (a resume may change only "
                    f"the learning rate, its schedule, momentum, weight decay and the "
                    f"consensus settings such as algorithm.rho), or use another "
                    f"run.dir to start fresh")
        self.changed_before = m.get("changed", [])
        if m.get("dataset", self.data_fp) != self.data_fp:
            raise ckpt.CheckpointError(
                f"{where} was written for another dataset: "
                f"{self.ds.path}/dataset.json differs from the one the run started "
                f"with (regenerated or replaced?); use another run.dir to start fresh")
        if m.get("dataset_content", self.data_content) != self.data_content:
            raise ckpt.CheckpointError(
                f"{where} was written for other data: the shards in {self.ds.path} "
                f"hold other images or labels than when the run started (a shard "
                f"replaced or regenerated; dataset.json alone is unchanged); restore "
                f"them, or use another run.dir to start fresh")
        if self.reshape:
            return [k]              # the newest readable one; another count's files
        return done[::-1]

    def restore(self, dry=False):
        """Block to start from: 0, or one past the newest complete checkpoint
        that every rank can read. Under MPI rank 0 lists the candidates and
        broadcasts them (a rank with a stale view of the run directory, NFS
        attribute caches or a manifest written just after it looked, must not
        resume elsewhere), and all ranks agree on each attempt (allgather of
        the read errors): a checkpoint damaged on any rank is set aside as
        damaged-ckpt-* and the previous complete one is used."""
        dist = not (self.simulate or mpi.world_size() == 1)
        if not dist:
            cands = self._resume_candidates()
        else:
            res = None
            if self.is_master:
                try:
                    res = ("ok", self._resume_candidates(), self.resume_changes,
                           self.changed_before, self.ckpt_ids, self.run_id, self.reshape)
                except ckpt.CheckpointError as e:
                    res = ("error", str(e))
            res = mpi.bcast(res)
            if res[0] == "error":
                raise agreed(ckpt.CheckpointError(res[1]))
            (cands, self.resume_changes, self.changed_before, self.ckpt_ids,
             self.run_id, self.reshape) = res[1:]
        errs = []
        for k in cands:
            err = None
            readable, run_id = self.ckpt_ids.get(k, (True, None))
            try:
                if not readable:                       # its manifest (the master's view)
                    raise ckpt.CheckpointError(run_id)
                self._load_state(k, run_id, reshape=self.reshape is not None)
            except ckpt.CheckpointError as e:
                err = f"rank {self.rank}: {e}" if readable else str(e)
            errs = [e for e in (mpi.allgather(err) if dist else [err]) if e]
            errs = list(dict.fromkeys(errs))          # a bad manifest: once, not per rank
            if not errs:
                start = self._reshaped_start(dry) if self.reshape else k + 1
                self._apply_changes(start, dry)
                if self.reshape and not dry:
                    rs = self.reshape
                    note = (f"reshaped from {rs['from_n']} to {self.n_workers} worker(s) "
                            f"at pass {rs['passes_done']:g}")
                    self.changed_before = self.changed_before + [{"block": start,
                                                                  "changes": note}]
                    self.pending_change = (self.pending_change + "; " + note
                                           if self.pending_change else note)
                return start
            where = ckpt.ckpt_dir(self.run_dir, k)
            if dry:
                self.log(f"checkpoint {where} cannot be read ({'; '.join(errs)}); a run "
                         f"would set it aside and try the previous complete checkpoint")
            elif self.is_master:
                aside = os.path.join(os.path.dirname(where), "damaged-" + os.path.basename(where))
                if os.path.exists(aside):
                    aside += f".{time.time_ns()}"
                os.replace(where, aside)
                self.log(f"checkpoint {where} cannot be read ({'; '.join(errs)}); set "
                         f"aside as {aside}, trying the previous complete checkpoint")
        if cands:
            raise ckpt.CheckpointError(
                f"no complete checkpoint in {self.run_dir} could be read (last: "
                f"{'; '.join(errs)}); use another run.dir to start fresh")
        self._init_from_model(dist)
        return 0

    def _apply_changes(self, start, dry):
        """A resume that changed tunable keys (RESUME_TUNABLE): say so, keep
        it for the metrics line and the manifests, and move rho where it
        lives in the restored state (the scaled duals follow it)."""
        if not self.resume_changes:
            return
        text = change_text(self.resume_changes)
        self.log(f"{'would resume' if dry else 'resuming'} with changed settings at block "
                 f"{start}: {text}")
        if dry:
            return
        self.changed_before = self.changed_before + [{"block": start, "changes": text}]
        self.pending_change = text
        rho = dict((k, b) for k, _, b in self.resume_changes).get("algorithm.rho")
        if rho is not None:
            self.blocks.set_rho(float(rho))

    def _load_reshaped(self, where, want):
        path = os.path.join(where, ckpt.rank_file(0))
        if want is not None:
            ckpt.check_stamp(path, want)
        if self.packet.B:
            self.sync.set_buffers(ckpt.read_rank(path, {"zbuf": ((self.packet.B,), np.float32)}
                                                 )["zbuf"].copy(), self.model)
        self.blocks.load_reshaped(ckpt.read_rank(path, self.blocks.reshaped_spec()), self._put)

    def _init_from_model(self, dist):
        """model.init, for a run that starts at block 0: w of every worker
        and z from a trained model's z (duals and momenta stay zero). Every
        rank reads the file; all of them fail together (ConfigError, exit 2)
        when any one cannot, e.g. a path its node does not see."""
        path = self.cfg["model"]["init"]
        if not path:
            return
        from ..outputs import TrainedModelError, load_trained
        err, t, fp = None, None, None
        try:
            t = (self._from_safetensors(path) if path.endswith(".safetensors")
                 else load_trained(path))
            err = self._init_mismatch(t)
            fp = hashlib.sha256(t.model.params.tobytes()).hexdigest()
        except TrainedModelError as e:
            err = str(e)
        every = mpi.allgather((err, fp)) if dist else [(err, fp)]
        bad = [i for i, (e, _) in enumerate(every) if e]
        if bad:
            who = f" (rank(s) {bad})" if dist else ""
            raise agreed(ConfigError(f"model.init: {every[bad[0]][0]}{who}"))
        other = [i for i, (_, f) in enumerate(every) if f != every[0][1]]
        if other:
            raise agreed(ConfigError(
                f"model.init: rank(s) {other} read another model from {path} than rank "
                f"0 (another file at that path on their node?); every rank must start "
                f"from the same z"))
        self.sync.set_buffers(np.array(t.model.buffers, np.float32), self.model)
        self.blocks.start_from(t.model.params)     # float32 on the host (load_trained)
        notes = list(getattr(t, "notes", []))
        if t.mean is None:
            notes.append("the file names no input normalisation: this run normalises as "
                         "data.normalize says (\"imagenet\" for ImageNet weights)")
        if t.classes != list(self.ds.classes):
            notes.append(f"its classes {t.classes} are this data's {list(self.ds.classes)} "
                         f"by position")
        if t.mean is not None and not (np.allclose(t.mean, self.norm_mean, atol=1e-3) and
                                       np.allclose(t.std, self.norm_std, atol=1e-3)):
            notes.append("it was trained with another normalisation (mean/std); this "
                         "run normalises with this data's")
        self.init_note = (f"initialised from {t.source}"
                          + (": " + "; ".join(notes) if notes else ""))

    def _from_safetensors(self, path):
        """model.init = a .safetensors file (ibtmpi export's, or torchvision's
        state_dict saved with safetensors.torch.save_file): this run's own
        model, initialised as model.seed says, with the file's tensors copied
        in by name (interchange.load_into; a head of another class count keeps
        its fresh initialisation). Its classes are this data's; its
        normalisation the file's metadata's, where it says one."""
        import json
        from types import SimpleNamespace
        from ..interchange import load_into
        from ..model import Model
        layers = self.cfg["model"]["layers"]
        m = Model(layers, self.model.input_shape, self.model.n_classes,
                  seed=self.cfg["model"]["seed"])
        notes, meta = load_into(m, layers, path)
        info = {}
        try:
            info = json.loads(meta.get("ibtmpi", "{}"))
        except ValueError:
            pass
        mean = std = None
        if info.get("mean") and info.get("std"):        # 0..1: the stored type's range
            top = float(np.iinfo(self.ds.dtype).max)
            mean = np.asarray(info["mean"], np.float64) * top
            std = np.asarray(info["std"], np.float64) * top
        return SimpleNamespace(model=m, classes=list(self.ds.classes), mean=mean, std=std,
                               source=path, layers=layers, notes=notes)

    def _init_mismatch(self, t):
        """Why trained model t cannot start this run's model, or None."""
        m = self.model
        if t.model.input_shape != m.input_shape:
            return (f"{t.source} takes {t.model.input_shape} inputs (C, H, W), this "
                    f"data has {m.input_shape}")
        if t.model.n_classes != m.n_classes:
            return (f"{t.source} has {t.model.n_classes} classes, this data "
                    f"{m.n_classes}")
        mine = [l.describe() for l in m.layers]
        theirs = [l.describe() for l in t.model.layers]
        if mine != theirs or t.model.size != m.size:
            return (f"{t.source} has other layers ({t.layers!r}, {t.model.size:,d} "
                    f"parameters) than model.layers = {self.cfg['model']['layers']!r} "
                    f"({m.size:,d})")
        if sorted(t.classes) == sorted(self.ds.classes) and t.classes != list(self.ds.classes):
            return (f"{t.source} orders the same classes differently ({t.classes} "
                    f"against this data's {list(self.ds.classes)}): its outputs would "
                    f"name the wrong classes")
        return None

    def _reshaped_start(self, dry):
        """run.resume = reshape: the block of this worker count's schedule at
        the pass the checkpoint reached (the nearest block: with another
        count a pass has another number of blocks), said in one line."""
        rs = self.reshape
        start = int(round(rs["passes_done"] * self.sched.blocks_per_pass))
        total = self.control.total
        start = min(max(start, 1), total) if total else start
        what, fresh = self.blocks.carried, self.blocks.fresh
        self.log(f"{'would continue' if dry else 'continuing'} "
                 f"{ckpt.ckpt_dir(self.run_dir, rs['block'])} of {rs['from_n']} worker(s) "
                 f"in {rs['from_world']} process(es) with {self.n_workers} worker(s) "
                 f"(run.resume = reshape) at pass {rs['passes_done']:g}, block {start} of "
                 f"{total}: carried {what}; {fresh}; the data is split anew")
        return start

    def _load_state(self, k, run_id=None, reshape=False):
        """This rank's state from checkpoint k (CheckpointError if unreadable,
        or where run_id, the manifest's, is not the one the files carry).
        reshape: a checkpoint of another worker count: only what is per
        model, from the master's file (every rank's copy of it); the duals'
        sum and every worker's own state start at zero."""
        where = ckpt.ckpt_dir(self.run_dir, k)
        if reshape:
            return self._load_reshaped(where, ckpt.stamp(run_id, k) if run_id else None)
        if run_id is not None:
            for r in sorted({0, self.rank}):
                ckpt.check_stamp(os.path.join(where, ckpt.rank_file(r)), ckpt.stamp(run_id, k))
        spec0 = self.blocks.master_spec()     # the consensus state: the master's file
        master = ckpt.read_rank(os.path.join(where, ckpt.rank_file(0)), spec0) if spec0 else {}
        mine = ckpt.read_rank(os.path.join(where, ckpt.rank_file(self.rank)),
                              self.state_spec())
        if self.packet.B:                             # every rank: the master's copy
            self.sync.set_buffers(ckpt.read_rank(os.path.join(where, ckpt.rank_file(0)), {
                "zbuf": ((self.packet.B,), np.float32)})["zbuf"].copy(), self.model)
        self.blocks.load(master, mine, self._put)
