"""What a user does with a trained model: load it, evaluate it on a dataset
split, predict image files, plot a run's metrics.

``load_trained(path)`` takes a run directory (its model.npz), a model.npz
file, or a checkpoint directory (z from its rank-00000.npz; layers from the
run's config.toml; classes and normalisation from the dataset). Files are
read without pickle and every array's shape is checked before it is
trusted. A model keeps its data set's band preprocessing (``bands``,
``band_scale`` of ``prep folder --bands``) so predict reads files the same
way; models and data sets from before it are RGB. Errors are TrainedModelError with the file and what to do.
Tests: tests/unit/test_outputs.py.
"""
from __future__ import annotations

import json
import os

import numpy as np

from .errors import NoPlotting, TrainedModelError
from .fsutil import read_jsonl, save_figure
from .model import Model


def pyplot():
    """matplotlib.pyplot on the Agg backend, or NoPlotting with what to install."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise NoPlotting(f"matplotlib is not installed ({e}): pip install "
                         f"'ibtmpi[plot]'") from None
    return plt


def preprocess_of(meta):
    """{bands, band_scale[, dtype]} of a data set's dataset.json (RGB when
    absent; dtype only for a uint16 set, so a uint8 set's model file is as
    it was)."""
    return {"bands": meta.get("bands", "rgb"), "band_scale": meta.get("band_scale"),
            **({"dtype": meta["dtype"]} if meta.get("dtype", "uint8") != "uint8" else {})}


class Trained:
    def __init__(self, z, layers, input_shape, classes, mean, std, source, ops=None,
                 buffers=None, preprocess=None):
        self.classes = list(classes)
        self.preprocess = preprocess or {"bands": "rgb", "band_scale": None}
        self.dtype = np.dtype(self.preprocess.get("dtype", "uint8"))   # its stored pixels
        self.mean = np.asarray(mean, np.float64)
        self.std = np.asarray(std, np.float64)
        self.source = source
        self.layers = layers
        try:
            self.model = Model(layers, tuple(int(s) for s in input_shape), len(self.classes),
                               ops=ops)
        except ValueError as e:
            raise TrainedModelError(f"{source}: layer spec does not build: {e}") from None
        if z.shape != (self.model.size,) or z.dtype != np.float32:
            raise TrainedModelError(
                f"{source}: parameters are {z.dtype}{list(z.shape)}, the model needs "
                f"float32[{self.model.size}] (incompatible checkpoint)")
        bad = int(np.count_nonzero(~np.isfinite(z)))
        if bad:
            raise TrainedModelError(
                f"{source}: {bad:,d} of {z.size:,d} parameters are not finite (NaN or "
                f"inf: the model of a run that diverged?); it cannot predict anything")
        c = int(input_shape[0])
        if (self.mean.shape != (c,) or self.std.shape != (c,)
                or not (np.isfinite(self.mean).all() and np.isfinite(self.std).all())
                or (self.std <= 0).any()):
            raise TrainedModelError(
                f"{source}: its input normalisation is mean {self.mean.tolist()}, std "
                f"{self.std.tolist()}; it needs {c} finite values each, std > 0")
        self.model.params[...] = z if ops is None else ops.asarray(z)
        nb = self.model.n_buffers
        if nb:
            if buffers is None or buffers.shape != (nb,) or buffers.dtype != np.float32:
                got = "none" if buffers is None else f"{buffers.dtype}{list(buffers.shape)}"
                raise TrainedModelError(
                    f"{source}: the model's layers need float32[{nb}] buffers (BatchNorm's "
                    f"running statistics), the file has {got}")
            if not np.isfinite(buffers).all():
                raise TrainedModelError(
                    f"{source}: its BatchNorm running statistics are not finite (NaN or "
                    f"inf: the model of a run that diverged?)")
            self.model.load_buffers(buffers)

    def to_device(self, ops):
        """The same model computing with the device ops (backend.GpuOps)."""
        host = (lambda a: a) if self.model.xp is np else self.model.device_ops.asnumpy
        return Trained(np.asarray(host(self.model.params)), self.layers,
                       self.model.input_shape, self.classes, self.mean, self.std,
                       self.source, ops=ops,
                       buffers=np.asarray(host(self.model.buffers), np.float32),
                       preprocess=self.preprocess)

    @property
    def image_shape(self):                      # (H, W, C)
        c, h, w = self.model.input_shape
        return (h, w, c)

    @property
    def stored_max(self):
        """The stored pixels' full range (255, or 65,535 for uint16): what
        the 0..1 scale of a normalisation (safetensors metadata,
        data.normalize) is a fraction of."""
        return float(np.iinfo(self.dtype).max)

    def check_data(self, dtype, where):
        """A one-line ValueError where a data set's stored type `dtype` is
        not the one this model was trained on (its normalisation would be
        off by 257x)."""
        if np.dtype(dtype) != self.dtype:
            raise ValueError(f"{where} stores {np.dtype(dtype)} pixels, the model was trained on "
                             f"{self.dtype} ones (prep folder --depth decides): use a data "
                             f"set stored as the training set was")

    def probs(self, images_u8, batch=256):
        from .data import normalize
        out = np.empty((len(images_u8), len(self.classes)), np.float32)
        for s in range(0, len(images_u8), batch):
            x = normalize(images_u8[s:s + batch], self.mean, self.std)
            out[s:s + batch] = self.model.predict_proba(x, batch)
        return out


def _npz(path, expect):
    """Arrays of an untrusted npz: no pickle, shapes checked from headers."""
    from .checkpoint import CheckpointError, read_rank
    try:
        return read_rank(path, expect)
    except CheckpointError as e:
        raise TrainedModelError(str(e)) from None


def _model_npz(path):
    """A model.npz, every array's header checked before it is read: a file
    that declares a huge array is refused (exit 2), not allocated."""
    import zipfile
    try:
        with zipfile.ZipFile(path) as zf:
            names = set(zf.namelist())
    except (OSError, zipfile.BadZipFile) as e:
        raise TrainedModelError(f"{path}: not a model file ({e})") from None
    if "format.npy" not in names:
        raise TrainedModelError(f"{path}: not an ibtmpi model file (no 'format')")
    meta = _npz(path, {"format": ((), "text"), "input_shape": ((3,), "int"),
                       "classes": ((), "text"), "layers": ((), "text")})
    fmt = str(meta["format"])
    if fmt != "ibtmpi-model-1":
        raise TrainedModelError(f"{path}: unsupported model format {fmt!r}")
    shape = meta["input_shape"]
    if not all(0 < int(s) <= 1 << 16 for s in shape):
        raise TrainedModelError(f"{path}: malformed model file (input_shape "
                                f"{shape.tolist()})")
    try:
        classes = json.loads(str(meta["classes"]))
        layers = json.loads(str(meta["layers"]))
    except ValueError as e:
        raise TrainedModelError(f"{path}: malformed model file ({e})") from None
    c = int(shape[0])
    norm = _npz(path, {"mean": ((c,), "float"), "std": ((c,), "float")})
    from .model import build_layers
    try:                              # the parameter count, nothing allocated yet
        built, _ = build_layers(layers, tuple(int(s) for s in shape), len(classes))
    except (ValueError, TypeError, KeyError) as e:
        raise TrainedModelError(f"{path}: malformed model file ({e})") from None
    size = sum(int(np.prod(s)) for layer in built for s in layer.param_shapes())
    nb = sum(int(np.prod(s)) for layer in built for s in layer.buffer_shapes())
    z = _npz(path, {"z": ((size,), np.float32)})["z"]
    buffers = _npz(path, {"buffers": ((nb,), np.float32)})["buffers"] if nb else None
    pre = None
    if "preprocess.npy" in names:            # absent in models from before bands
        try:
            pre = json.loads(str(_npz(path, {"preprocess": ((), "text")})["preprocess"]))
        except ValueError as e:
            raise TrainedModelError(f"{path}: malformed model file ({e})") from None
        if not isinstance(pre, dict):
            raise TrainedModelError(f"{path}: malformed model file (preprocess {pre!r})")
    return Trained(z, layers, shape, classes, norm["mean"], norm["std"], path,
                   buffers=buffers, preprocess=pre)


def save_model(path, z, model, ds, cfg, buffers=None):
    """The trained model, self-contained and pickle-free: parameters, the
    buffers (BatchNorm's running statistics; only where the layers have
    any), layer spec, input shape, classes, the normalisation it was
    trained with and how files become its input (bands, band_scale)."""
    from .data import input_norm
    mean, std = input_norm(cfg, ds)        # what the run normalised with
    tmp = path + f".tmp-{os.getpid()}"
    more = {}
    if model.n_buffers:                    # the caller's host copy
        more["buffers"] = np.asarray(buffers, np.float32)
    with open(tmp, "wb") as f:
        np.savez(f, format=np.array("ibtmpi-model-1"), z=z, **more,
                 input_shape=np.array(model.input_shape, np.int64),
                 classes=np.array(json.dumps(ds.classes)),
                 layers=np.array(json.dumps(cfg["model"]["layers"])),
                 mean=mean, std=std,
                 algorithm=np.array(cfg["algorithm"]["name"]),
                 preprocess=np.array(json.dumps(preprocess_of(ds.meta))))
    os.replace(tmp, path)


def load_trained(path):
    if not os.path.exists(path):
        raise TrainedModelError(f"{path} does not exist (give a run directory, its "
                                f"model.npz, or a checkpoint directory)")
    if os.path.isdir(path):
        if os.path.isfile(os.path.join(path, "model.npz")):
            return _model_npz(os.path.join(path, "model.npz"))
        if os.path.isfile(os.path.join(path, "rank-00000.npz")):
            return _from_checkpoint(path)
        raise TrainedModelError(f"{path}: no model.npz (a run that finished) and no "
                                f"rank-00000.npz (a checkpoint directory)")
    return _model_npz(path)


def _run_config(path):
    """config.toml of the run that made `path` (a run directory, a model
    file in one, or one of its checkpoint directories RUN/checkpoints/X)."""
    path = os.path.abspath(path)
    if os.path.isfile(os.path.join(path, "rank-00000.npz")):
        return os.path.join(os.path.dirname(os.path.dirname(path)), "config.toml")
    return os.path.join(path if os.path.isdir(path) else os.path.dirname(path),
                        "config.toml")


def run_data_path(path):
    """The dataset directory the run that made `path` trained on (its
    config's data.path), for commands given a model but no --data."""
    from .config import load
    cfg_path = _run_config(path)
    if not os.path.isfile(cfg_path):
        raise TrainedModelError(f"no --data given, and {path} is not in a run directory "
                                f"(no {cfg_path}) to take it from: give --data DIR")
    data = load(cfg_path)["data"]["path"]
    if not os.path.isdir(data):
        raise TrainedModelError(f"no --data given, and the run's data.path {data} (from "
                                f"{cfg_path}) is not a directory here: give --data DIR")
    return data


def _from_checkpoint(d):
    from .config import load
    from .dataset import Dataset
    if not os.path.isfile(os.path.join(d, "manifest.json")):
        raise TrainedModelError(f"{d} is an incomplete checkpoint (no manifest.json)")
    cfg_path = _run_config(d)
    if not os.path.isfile(cfg_path):
        raise TrainedModelError(f"{cfg_path} missing: cannot tell the checkpoint's model")
    cfg = load(cfg_path)
    ds = Dataset(cfg["data"]["path"])
    h, w, c = ds.image_shape
    probe = Model(cfg["model"]["layers"], (c, h, w), ds.n_classes)
    from .consensus import get
    # a per-step algorithm (ssgd) has no consensus z: the replicated params are the model
    name = "params" if get(cfg["algorithm"]["name"]).per_step else "z"
    spec = {name: ((probe.size,), np.float32)}
    if probe.n_buffers:
        spec["zbuf"] = ((probe.n_buffers,), np.float32)
    arrs = _npz(os.path.join(d, "rank-00000.npz"), spec)
    from .data import input_norm
    mean, std = input_norm(cfg, ds)
    return Trained(arrs[name], cfg["model"]["layers"], (c, h, w), ds.classes, mean,
                   std, d, buffers=arrs.get("zbuf"), preprocess=preprocess_of(ds.meta))


# -- evaluation ---------------------------------------------------------------

def confusion(labels, preds, k):
    m = np.zeros((k, k), np.int64)
    np.add.at(m, (labels, preds), 1)
    return m


def report(cm, classes):
    """Accuracy and per-class precision / recall / F1 from a confusion matrix
    (rows: true class, columns: predicted), with what remote-sensing papers
    report beside them: overall accuracy (`accuracy`), average accuracy
    (the mean of the per-class recalls over the classes present: scikit-
    learn's balanced accuracy) and Cohen's kappa (agreement beyond what the
    row and column totals give by chance)."""
    tp = np.diag(cm).astype(np.float64)
    pred = cm.sum(0).astype(np.float64)
    true = cm.sum(1).astype(np.float64)
    prec = np.divide(tp, pred, out=np.zeros_like(tp), where=pred > 0)
    rec = np.divide(tp, true, out=np.zeros_like(tp), where=true > 0)
    f1 = np.divide(2 * prec * rec, prec + rec, out=np.zeros_like(tp), where=prec + rec > 0)
    n = float(cm.sum())
    po = tp.sum() / max(n, 1.0)
    pe = float((true * pred).sum()) / max(n * n, 1.0)
    kappa = (po - pe) / (1.0 - pe) if pe < 1.0 else 1.0      # one class everywhere
    present = true > 0
    return {"n": int(cm.sum()), "accuracy": float(tp.sum() / max(cm.sum(), 1)),
            "average_accuracy": float(rec[present].mean()) if present.any() else 0.0,
            "kappa": float(kappa),
            "classes": classes, "confusion": cm.tolist(),
            "per_class": {c: {"precision": float(p), "recall": float(r), "f1": float(f),
                              "support": int(t)}
                          for c, p, r, f, t in zip(classes, prec, rec, f1, true)},
            "macro_f1": float(f1.mean())}


def format_report(rep):
    cls = rep["classes"]
    w = max(8, max(len(c) for c in cls))
    lines = [f"accuracy {rep['accuracy']:.4f} on {rep['n']} images; average accuracy "
             f"{rep['average_accuracy']:.4f}; kappa {rep['kappa']:.4f}; macro F1 "
             f"{rep['macro_f1']:.4f}", "",
             f"{'class':<{w}} {'precision':>9} {'recall':>7} {'F1':>7} {'support':>8}"]
    for c in cls:
        m = rep["per_class"][c]
        lines.append(f"{c:<{w}} {m['precision']:>9.4f} {m['recall']:>7.4f} "
                     f"{m['f1']:>7.4f} {m['support']:>8d}")
    lines += ["", "confusion matrix (rows: true, columns: predicted)",
              " " * (w + 1) + " ".join(f"{c[:7]:>7}" for c in cls)]
    for c, row in zip(cls, rep["confusion"]):
        lines.append(f"{c:<{w}} " + " ".join(f"{v:>7d}" for v in row))
    return "\n".join(lines)


def confusion_png(rep, path):
    plt = pyplot()
    cm = np.array(rep["confusion"])
    k = len(rep["classes"])
    fig, ax = plt.subplots(figsize=(1.2 * k + 2, 1.2 * k + 1.5))
    norm = cm / np.maximum(cm.sum(1, keepdims=True), 1)
    ax.imshow(norm, cmap="Blues", vmin=0, vmax=1)
    for i in range(k):
        for j in range(k):
            ax.text(j, i, str(cm[i, j]), ha="center", va="center",
                    color="white" if norm[i, j] > 0.5 else "black")
    ax.set_xticks(range(k), rep["classes"], rotation=45, ha="right")
    ax.set_yticks(range(k), rep["classes"])
    ax.set_xlabel("predicted class")
    ax.set_ylabel("true class")
    ax.set_title(f"accuracy {rep['accuracy']:.4f} (n = {rep['n']})")
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


# -- plots of a run ------------------------------------------------------------

def _twin_legend(ax, ax2, loc):
    """One legend for a plot with a second y axis."""
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, loc=loc)


TIMELINE_COLORS = {"data": "C7", "compute": "C0", "allreduce": "C3", "consensus": "C2",
                   "evaluation": "C1", "checkpoint": "C4"}


def timeline_png(run_dir, path, plt, blocks=3):
    """run.timeline: a Gantt chart of every rank's lanes over the last
    `blocks` traced blocks (the steady state), from the ranks' own files
    (also of a job that failed before merging them), else from
    RUN/timeline.json. None when the run was not traced."""
    from . import timeline
    # the ranks' files are the record (a job that failed never merged its
    # own); the merged file serves where they were removed
    ev = [e for files in timeline.segments(run_dir).values() for p in files
          for e in timeline.read_events(p)]
    merged = os.path.join(run_dir, timeline.MERGED)
    if not ev and os.path.exists(merged):
        with open(merged) as f:
            ev = json.load(f)["traceEvents"]
    spans = [e for e in ev if e.get("ph") == "X" and "block" in e.get("args", {})]
    if not spans:
        return None
    last = max(e["args"]["block"] for e in spans)
    show = [e for e in spans if e["args"]["block"] > last - blocks]
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in ev
             if e.get("ph") == "M" and e["name"] == "thread_name"}
    lanes = sorted({(e["pid"], e["tid"]) for e in show})
    t0 = min(e["ts"] for e in show)
    fig, ax = plt.subplots(figsize=(10, max(2.5, min(0.3 * len(lanes) + 1.5, 12))))
    seen = set()
    for y, lane in enumerate(lanes):
        for name, color in TIMELINE_COLORS.items():
            bars = [((e["ts"] - t0) / 1e3, e["dur"] / 1e3) for e in show
                    if (e["pid"], e["tid"]) == lane and e["name"] == name]
            if bars:
                ax.broken_barh(bars, (y - 0.4, 0.8), color=color,
                               label=None if name in seen else name)
                seen.add(name)
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels([f"rank {p}: {names.get((p, t), t)}" for p, t in lanes])
    ax.set_xlabel("ms")
    ax.legend(loc="upper right", fontsize="small")
    first = max(last - blocks + 1, min(e["args"]["block"] for e in spans))
    ax.set_title(f"timeline, blocks {first}-{last} (all of it: {timeline.MERGED} "
                 f"in ui.perfetto.dev)")
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
    return path


def plot_run(run_dir, out_dir=None):
    """One PNG per view of a run's metrics.jsonl; returns the files written."""
    plt = pyplot()
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.isfile(path):
        raise TrainedModelError(f"{path} missing: not a run directory")
    recs = read_jsonl(path)
    if not recs:
        raise TrainedModelError(f"{path} is empty: the run did not finish a block")
    out_dir = out_dir or os.path.join(run_dir, "plots")
    os.makedirs(out_dir, exist_ok=True)
    bpp = max(r["block_in_pass"] for r in recs) + 1
    x = np.array([(r["block"] + 1) / bpp for r in recs])
    algo, n = recs[0]["algorithm"], recs[0]["N"]
    files = []
    for name, figure in _RUN_FIGURES:
        fig = figure(plt, recs, x, f"{algo}, N = {n}")
        if fig is not None:
            fig.tight_layout()
            files.append(os.path.join(out_dir, name))
            save_figure(fig, files[-1])
            plt.close(fig)
        if name == "memory.png":
            tl = timeline_png(run_dir, os.path.join(out_dir, "timeline.png"), plt)
            if tl:
                files.append(tl)
    return files


def _fig_loss_accuracy(plt, recs, x, what):
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(x, [r["train_loss"] for r in recs], label="train loss (block mean)")
    ev = [(xx, r) for xx, r in zip(x, recs) if "val_acc" in r]
    ax.set_xlabel("pass")
    ax.set_ylabel("cross-entropy")
    ax2 = ax.twinx()
    if ev:
        ax2.plot([e[0] for e in ev], [e[1]["val_acc"] for e in ev], "o-", color="C1",
                 label="validation accuracy")
        from .monitor import eval_rank
        best = max(ev, key=lambda e: eval_rank(e[1]))
        ax2.plot([best[0]], [best[1]["val_acc"]], "*", color="C3", markersize=12,
                 label=f"best {best[1]['val_acc']:.4f}")
        ax2.set_ylabel("validation accuracy")
        ax2.set_ylim(0, 1)
    _twin_legend(ax, ax2, "center right")
    ax.set_title(what)
    return fig


def _fig_residuals(plt, recs, x, what):
    fig, ax = plt.subplots(figsize=(7, 4))
    blocks = [r["block"] for r in recs]
    ax.semilogy(blocks, [max(r["primal_residual"], 1e-12) for r in recs], label="primal residual")
    ax.semilogy(blocks, [max(r["dual_residual"], 1e-12) for r in recs], label="dual residual")
    ax.set_xlabel("block")
    ax.set_ylabel("residual")
    ax2 = ax.twinx()
    ax2.plot(blocks, [r["rho"] for r in recs], "--", color="C2", label="rho")
    ax2.set_ylabel("rho")
    _twin_legend(ax, ax2, "upper right")
    ax.set_title(f"ADMM residuals and rho ({what})")
    return fig


def _fig_time_breakdown(plt, recs, x, what):
    fig, ax = plt.subplots(figsize=(7, 4))
    blocks = [r["block"] for r in recs]
    comp = np.array([r["compute_max_s"] for r in recs])
    wait = np.array([r["data_wait_max_s"] for r in recs])
    comm = np.array([r["comm_s"] for r in recs])
    ax.stackplot(blocks, comp, wait, comm,
                 labels=["compute (slowest worker)", "data wait (slowest)",
                         "communication + imbalance"])
    if all("compute_cpu_s" in r for r in recs):
        # below the compute band: the slowest worker waited for a core or a GPU
        ax.plot(blocks, [r["compute_cpu_s"][r["slowest_worker"]] for r in recs], "k--",
                linewidth=1, label="its CPU seconds in compute")
    ax.set_xlabel("block")
    ax.set_ylabel("seconds")
    ax.legend(loc="upper right")
    ax.set_title(f"time per block ({what})")
    return fig


def _fig_worker_compute(plt, recs, x, what):
    n = recs[0]["N"]
    per = [r["compute_s"] for r in recs if len(r.get("compute_s", ())) == n]
    if n <= 1 or not per:
        return None
    # every worker's compute time over its block's median worker: a row
    # that stays dark-red is a worker (node, GPU) the others wait for
    c = np.array(per, np.float64).T                     # (N, blocks)
    med = np.median(c, axis=0)
    ratio = c / np.where(med > 0, med, 1.0)
    fig, ax = plt.subplots(figsize=(8, max(2.5, min(0.25 * n + 1.5, 10))))
    im = ax.imshow(ratio, aspect="auto", interpolation="nearest", cmap="coolwarm",
                   vmin=0.5, vmax=1.5, origin="lower")
    ax.set_xlabel("block")
    ax.set_ylabel("worker (rank - 1)")
    from matplotlib.ticker import MaxNLocator
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))   # whole workers, no 0.5
    fig.colorbar(im, ax=ax, label="compute time / median worker")
    ax.set_title(f"compute time per worker and block ({what})")
    return fig


def _fig_memory(plt, recs, x, what):
    n = recs[0]["N"]
    mem = [r for r in recs if len(r.get("peak_rss_mib", ())) == n]
    if not mem:
        return None
    # each worker's high-water marks: flat after the first pass, or a leak
    pools = all(len(r.get("gpu_pool_mib", ())) == n for r in mem)
    fig, axes = plt.subplots(2 if pools else 1, 1, sharex=True,
                             figsize=(7, 5.5 if pools else 3.5), squeeze=False)
    mb = [r["block"] for r in mem]
    for ax, key, label in [(axes[0][0], "peak_rss_mib", "peak RSS (MiB)")] + (
            [(axes[1][0], "gpu_pool_mib", "CuPy pool (MiB)")] if pools else []):
        vals = np.array([r[key] for r in mem]).T         # (N, blocks)
        for i in range(min(n, 16)):
            ax.plot(mb, vals[i], drawstyle="steps-post", label=f"worker {i}")
        ax.set_ylabel(label)
    axes[0][0].set_title(f"memory per worker ({what})"
                         + ("; the first 16 workers" if n > 16 else ""))
    axes[-1][0].set_xlabel("block")
    if n <= 8:
        axes[0][0].legend(loc="lower right")
    return fig


def _fig_learning_rate(plt, recs, x, what):
    lrs = [r.get("lr") for r in recs]
    if None in lrs or len(set(lrs)) <= 1:          # no optim.schedule at work
        return None
    fig, ax = plt.subplots(figsize=(7, 3))
    ax.plot(x, lrs, drawstyle="steps-post")
    ax.set_xlabel("pass")
    ax.set_ylabel("local learning rate")
    ax.set_title(f"learning rate per block ({what})")
    return fig


# (file, figure) in the order plot_run writes them; timeline.png follows memory.png
_RUN_FIGURES = (("loss_accuracy.png", _fig_loss_accuracy),
                ("residuals.png", _fig_residuals),
                ("time_breakdown.png", _fig_time_breakdown),
                ("worker_compute.png", _fig_worker_compute),
                ("memory.png", _fig_memory),
                ("learning_rate.png", _fig_learning_rate))
