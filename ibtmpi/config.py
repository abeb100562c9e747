"""Run configuration: TOML with sections data, model, algorithm, optim, run.

``load(path, overrides)`` merges the defaults below, the file, and
``--set section.key=value`` overrides (values parsed as TOML, bare words
as strings), then validates: unknown sections/keys are errors with a
did-you-mean, types and ranges are checked. Every default is documented
in docs/config.md. Test: tests/unit/test_config.py.
"""
from __future__ import annotations

import copy
import datetime
import difflib
import hashlib
import json
import math

from .errors import ConfigError

try:
    import tomllib
except ImportError:                       # Python < 3.11
    import tomli as tomllib


SCHEDULES = ("constant", "step", "cosine")

DEFAULTS = {
    "data": {
        "path": "",              # dataset directory (ibtmpi prep ...)
        "split_size": 0,         # samples per worker per block; 0: use block_size
        "block_size": 0,         # samples per block over all workers (split = block / N)
        "batch": 32,             # minibatch size of the local SGD steps
        "augment": False,        # random flips / 90-degree rotations
        "cache": "auto",         # auto | memory | disk
        "seed": 0,               # shuffling and augmentation
        "normalize": "dataset",  # dataset | imagenet | [[means], [stds]] (0..1 scale)
    },
    "model": {
        "layers": "reference",   # preset name or a list of layer tables
        "seed": 0,               # He initialisation
        "init": "",              # start from a trained model instead: a run
                                 # directory, its model.npz or a checkpoint dir
    },
    "algorithm": {
        "name": "ibt",
        "recipe": "auto",        # auto: the settings measured for this N (ibtmpi/recipe.py)
                                 # where you set none | none: the plain defaults
        "rho": 0.01,             # ADMM penalty (admm, ibt)
        "l2": 0.0,               # lambda of the consensus L2 term (admm z-update)
        "adaptive_rho": False,   # residual balancing (Boyd et al. 3.4.1)
        "rho_mu": 10.0,
        "rho_tau": 2.0,
        "over_relaxation": 1.0,  # alpha in [1, 1.8] (admm, ibt)
        "dual_reset": False,     # zero the duals at every block
        "outer": "auto",         # the outer optimizer on the consensus mean (consensus/
                                 # outer.py): auto (the algorithm's own) | average | sgd
        "block_momentum": 0.25,  # eta of the sgd outer optimizer (bmuf, ibt); < 0 means
                                 # CNTK's 1 - 1/N
        "block_lr": 1.0,         # zeta of the sgd outer optimizer (bmuf, ibt)
        "nesterov": True,        # NBM start point (bmuf); ibt is always Nesterov
        "outer_schedule": "none",  # zeta x the local lr's schedule: none | warmup (its
                                 # ramp only) | lr (lr_t / lr, the whole run)
        "easgd_beta": 0.9,       # EASGD: alpha = beta / N
        "warmup_steps": 0,       # ssgd steps (gradient Allreduce) before block 0
    },
    "optim": {
        "name": "sgd",           # the local optimizer (ibtmpi/optim/: sgd, adam, adamw)
        "lr": 0.02,
        "momentum": 0.9,         # sgd
        "weight_decay": 5e-4,    # sgd, adam: L2 in the gradient; adamw: decoupled
        "nesterov": False,       # sgd
        "reset_momentum": True,  # sgd: zero the local momentum after every sync
        "betas": [0.9, 0.999],   # adam, adamw: the moments' decay rates
        "eps": 1e-8,             # adam, adamw: added to the denominator
        "clip_norm": 0.0,        # clip each step's loss gradient to this L2 norm; 0: off
        "reset_state": "auto",   # zero the optimizer state after every sync:
                                 # auto (sgd: reset_momentum; adam/adamw: false) | true | false
        "schedule": "constant",  # constant | step | cosine: lr per block (ssgd: per step)
        "milestones": [],        # step: passes at which lr is multiplied by gamma
        "gamma": 0.1,            # step: the factor
        "decay_passes": 0.0,     # cosine: passes to decay over; 0: run.passes
        "final_ratio": 0.0,      # cosine: the last lr as a fraction of lr
        "warmup_passes": 0.0,    # linear lr warm-up (any schedule)
    },
    "run": {
        "dir": "runs/run",       # run directory (config, metrics, model)
        "passes": 1.0,           # passes over the training data (fractions ok)
        "eval_every": 0,         # evaluate z on val every k blocks; 0: each pass
        "threads": "auto",       # BLAS threads per rank
        "quiet": False,
        "progress_s": 60.0,      # seconds between progress lines in batch logs; 0: off
        "simulate": 0,           # > 0: N logical workers in one process
        "checkpoint_every": 0,   # blocks between checkpoints; 0: once per pass
        "keep_checkpoints": 2,   # complete checkpoints kept
        "resume": "auto",        # auto | always | never | reshape (another worker count)
        "watchdog_s": "auto",    # abort a block running longer (MPI runs): auto =
                                 # max(60 s, 10x the slowest block so far); 0: off
        "cuda_aware": "auto",    # GPU workers: auto | on | off (device buffers to MPI)
        "eval_device": "auto",   # the master's evaluation: auto | cpu | gpu
        "gpu_math": "fp32",      # GPU GEMMs: fp32 | tf32 (tensor cores)
        "cuda_graphs": "auto",   # GPU workers' steps from CUDA graphs: auto | on | off
        "master_device": "auto", # a master of its own's consensus state: auto | cpu | gpu
        "time_limit": "auto",    # stop with a checkpoint before it: auto (the Slurm
                                 # job's end) | none | 90m, 4h, 1:30:00, 2-00:00:00
        "profile": False,        # cProfile every rank: RUN/profile-rank-R.txt/.pstats
        "keep_best": True,       # RUN/model-best.npz: the z with the best val accuracy
        "early_stop": 0,         # stop after this many evaluations without a better
                                 # val accuracy; 0: off
        "early_stop_delta": 0.0, # early_stop: better means val accuracy up by more
                                 # than this (0: any better evaluation)
        "timeline": False,       # RUN/timeline.json: every rank's phases (Chrome trace)
        "tensorboard": False,    # RUN/tb/: the master's metrics as TensorBoard events
    },
}

_TYPES = {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
          list: "a list (e.g. [30, 45])"}


# names other tools use for our keys: a did-you-mean by meaning, not spelling
SYNONYMS = {
    "batch_size": "batch", "minibatch": "batch", "minibatch_size": "batch",
    "local_batch": "batch", "learning_rate": "lr", "lr_schedule": "schedule",
    "lr_scheduler": "schedule", "scheduler": "schedule", "epochs": "passes",
    "num_epochs": "passes", "max_epochs": "passes", "epoch": "passes",
    "algo": "name",
    "algorithm": "name", "method": "name", "optimizer": "name", "arch": "layers",
    "model": "layers", "architecture": "layers", "wd": "weight_decay",
    "l2_reg": "weight_decay", "dataset": "path", "data_dir": "path",
    "output_dir": "dir", "out_dir": "dir", "run_dir": "dir",
    "checkpoint_interval": "checkpoint_every", "save_every": "checkpoint_every",
    "patience": "early_stop", "warmup_epochs": "warmup_passes",
    "lr_milestones": "milestones", "lr_decay": "gamma", "penalty": "rho",
    "admm_rho": "rho", "nesterov_momentum": "nesterov", "eval_interval": "eval_every",
    "split": "split_size", "block": "block_size", "seed_data": "seed",
}


# words whose answer is not a key of the same section
HINTS = {
    "num_workers": "the workers are the MPI ranks after the master (mpiexec -n N+1), "
                   "or run.simulate = N in one process",
    "workers": "the workers are the MPI ranks after the master (mpiexec -n N+1), "
               "or run.simulate = N in one process",
    "world_size": "the world size is mpiexec -n; the workers are the ranks after the master",
}


def _suggest(word, options):
    norm = str(word).lower().replace("-", "_")
    if norm in HINTS:
        return f" ({HINTS[norm]})"
    alias = SYNONYMS.get(norm)
    if alias in options:
        return f" (did you mean {alias!r}?)"
    # near a key, or near another program's name for one (learning_rat:
    # learning_rate, which is lr here)
    names = list(options) + [w for w, k in SYNONYMS.items() if k in options]
    m = difflib.get_close_matches(norm, names, n=1, cutoff=0.6)
    return f" (did you mean {SYNONYMS.get(m[0], m[0])!r}?)" if m else ""


def _coerce(section, key, value):
    default = DEFAULTS[section][key]
    where = f"{section}.{key}"
    if section == "model" and key == "layers":
        if not isinstance(value, (str, list)):
            raise ConfigError(f"{where} must be a preset name or a list of layers")
        return value
    if key == "threads":
        if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
            return value
        raise ConfigError(f"{where} must be 'auto' or an integer >= 1, got {value!r}")
    if key == "watchdog_s":
        if value == "auto" or (isinstance(value, (int, float)) and not isinstance(value, bool)
                               and math.isfinite(value) and value >= 0):
            return value if value == "auto" else float(value)
        raise ConfigError(f"{where} must be 'auto', 0 (off) or a number of seconds > 0, "
                          f"got {value!r}")
    if key == "reset_state":
        if value == "auto" or isinstance(value, bool):
            return value
        raise ConfigError(f"{where} must be auto, true or false, got {value!r}")
    if section == "data" and key == "normalize":
        if value in ("dataset", "imagenet"):
            return value
        if (isinstance(value, list) and len(value) == 2
                and all(isinstance(v, list) and v for v in value)
                and len(value[0]) == len(value[1])
                and all(isinstance(x, (int, float)) and not isinstance(x, bool)
                        and math.isfinite(x) for v in value for x in v)
                and all(x > 0 for x in value[1])):
            return [[float(x) for x in v] for v in value]
        raise ConfigError(f"{where} must be \"dataset\", \"imagenet\" or [[means], [stds]] "
                          f"(one per band, on the 0..1 scale, stds > 0), got {value!r}")
    if key == "betas":
        if (isinstance(value, list) and len(value) == 2
                and all(isinstance(b, (int, float)) and not isinstance(b, bool)
                        and math.isfinite(b) for b in value)):
            return [float(b) for b in value]
        raise ConfigError(f"{where} must be two numbers [beta1, beta2], got {value!r}")
    if key == "time_limit":
        if isinstance(value, datetime.time):          # TOML read 01:30:00 as a time
            value = value.isoformat()
        if not isinstance(value, str):
            raise ConfigError(f"{where} needs a unit: 90m, 4h, 1:30:00 or 2-00:00:00 "
                              f"(or auto, none), got {value!r}")
        parse_duration(value, where)                  # an error now, not at the end
        return value
    t = type(default)
    if t is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if type(value) is not t:
        raise ConfigError(f"{where} must be {_TYPES[t]}, got {value!r}")
    if t is float and not math.isfinite(value):
        raise ConfigError(f"{where} must be a finite number, got {value!r}")
    if t is list and any(isinstance(v, float) and not math.isfinite(v) for v in value):
        raise ConfigError(f"{where} must hold finite numbers, got {value!r}")
    return value


def parse_duration(text, where="run.time_limit"):
    """Seconds of a duration: 45s, 90m, 4h, 2d, MM:SS, HH:MM:SS or
    D-HH[:MM[:SS]] (Slurm's --time forms with a colon or a day); None for
    auto and none. A bare number is refused: Slurm reads 30 as minutes."""
    t = str(text).strip().lower()
    if t in ("auto", "none"):
        return None
    bad = ConfigError(f"{where} must be auto, none or a duration like 90m, 4h, 1:30:00 "
                      f"or 2-00:00:00, got {text!r}")
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    try:
        if t and t[-1] in units:
            secs = float(t[:-1]) * units[t[-1]]
        elif ":" in t or "-" in t:
            days, _, rest = t.rpartition("-")
            parts = [float(x) for x in rest.split(":")]
            if days:                       # D-HH, D-HH:MM, D-HH:MM:SS
                parts += [0.0] * (3 - len(parts))
                h, m, sec = parts
                secs = float(days) * 86400 + h * 3600 + m * 60 + sec
            elif len(parts) == 2:          # MM:SS
                secs = parts[0] * 60 + parts[1]
            elif len(parts) == 3:          # HH:MM:SS
                secs = parts[0] * 3600 + parts[1] * 60 + parts[2]
            else:
                raise ValueError
        else:
            raise ValueError
    except ValueError:
        raise bad from None
    if not secs > 0 or secs != secs:
        raise bad
    return secs


def _merge(cfg, section, key, value, origin):
    if section not in DEFAULTS:
        raise ConfigError(f"{origin}: unknown section [{section}]"
                          f"{_suggest(section, list(DEFAULTS))}")
    if key not in DEFAULTS[section]:
        raise ConfigError(f"{origin}: unknown key {section}.{key}"
                          f"{_suggest(key, list(DEFAULTS[section]))}")
    cfg[section][key] = _coerce(section, key, value)


def parse_override(text):
    """'section.key=value' -> (section, key, value); value parsed as TOML."""
    if "=" not in text or "." not in text.split("=", 1)[0]:
        raise ConfigError(f"--set expects section.key=value, got {text!r}")
    lhs, rhs = text.split("=", 1)
    section, key = lhs.strip().split(".", 1)
    try:
        value = tomllib.loads(f"v = {rhs}")["v"]
    except tomllib.TOMLDecodeError:
        value = rhs.strip()                   # bare word: a string
    return section, key, value


class Config(dict):
    """The resolved configuration: {section: {key: value}}. ``explicit``:
    the "section.key" names a config file or --set gave, which a recipe
    (algorithm.recipe, ibtmpi/recipe.py) never overrides."""
    explicit = frozenset()


def load(path=None, overrides=()):
    cfg = Config(copy.deepcopy(DEFAULTS))
    given = set()
    if path:
        try:
            with open(path, "rb") as f:
                raw = tomllib.load(f)
        except OSError as e:
            raise ConfigError(f"cannot read config {path}: {e.strerror}") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{path}: invalid TOML: {e}") from None
        for section, table in raw.items():
            if not isinstance(table, dict):
                raise ConfigError(f"{path}: top-level key {section!r} must be a "
                                  f"[section]{_suggest(section, list(DEFAULTS))}")
            for key, value in table.items():
                _merge(cfg, section, key, value, path)
                given.add(f"{section}.{key}")
    for text in overrides:
        s, k, v = parse_override(text)
        _merge(cfg, s, k, v, "--set")
        given.add(f"{s}.{k}")
    validate(cfg)
    cfg.explicit = frozenset(given)
    return cfg


def validate(cfg):
    from .consensus import ALGORITHMS, OUTER, OUTER_SCHEDULES  # the registries
    from .recipe import RECIPES
    from .optim import OPTIMIZERS
    d, a, o, r = cfg["data"], cfg["algorithm"], cfg["optim"], cfg["run"]
    checks = [
        (d["batch"] >= 1, "data.batch must be >= 1"),
        (d["split_size"] >= 0 and d["block_size"] >= 0,
         "data.split_size and data.block_size must be >= 0"),
        (not (d["split_size"] and d["block_size"]),
         "give data.split_size or data.block_size, not both"),
        (d["cache"] in ("auto", "memory", "disk"), "data.cache must be auto, memory or disk"),
        (0 <= d["seed"] < 2**32, f"data.seed must be in 0 .. 2**32 - 1, got {d['seed']}"),
        (0 <= cfg["model"]["seed"] < 2**32,
         f"model.seed must be in 0 .. 2**32 - 1, got {cfg['model']['seed']}"),
        (a["name"] in ALGORITHMS,
         f"algorithm.name must be one of {', '.join(ALGORITHMS)}, got {a['name']!r}"
         + _suggest(a["name"], list(ALGORITHMS))),
        (o["name"] in OPTIMIZERS,
         f"optim.name must be one of {', '.join(OPTIMIZERS)}, got {o['name']!r}"
         + _suggest(o["name"], list(OPTIMIZERS))),
        (a["rho"] > 0, f"algorithm.rho must be > 0, got {a['rho']}"),
        (a["l2"] >= 0, "algorithm.l2 must be >= 0"),
        (1.0 <= a["over_relaxation"] <= 1.8, "algorithm.over_relaxation must be in [1, 1.8]"),
        (a["rho_mu"] > 1 and a["rho_tau"] > 1, "algorithm.rho_mu and rho_tau must be > 1"),
        (a["block_momentum"] < 1, "algorithm.block_momentum must be < 1 (or < 0 for 1 - 1/N)"),
        (a["block_lr"] > 0, "algorithm.block_lr must be > 0"),
        (a["outer"] == "auto" or a["outer"] in OUTER,
         f"algorithm.outer must be auto or one of {', '.join(OUTER)}, got {a['outer']!r}"
         + _suggest(a["outer"], list(OUTER))),
        (a["outer"] == "auto"
         or getattr(ALGORITHMS.get(a["name"]), "default_outer", None) is not None,
         f"algorithm.outer: {a['name']} has no outer step to swap (easgd moves z itself, "
         f"sgd and ssgd keep no consensus); leave it at auto"),
        (a["recipe"] in RECIPES,
         f"algorithm.recipe must be one of {', '.join(RECIPES)}, got {a['recipe']!r}"),
        (a["outer_schedule"] in OUTER_SCHEDULES,
         f"algorithm.outer_schedule must be one of {', '.join(OUTER_SCHEDULES)}, "
         f"got {a['outer_schedule']!r}"),
        (0 < a["easgd_beta"] <= 1, "algorithm.easgd_beta must be in (0, 1]"),
        (a["warmup_steps"] >= 0, "algorithm.warmup_steps must be >= 0"),
        (o["lr"] > 0, f"optim.lr must be > 0, got {o['lr']}"),
        (0 <= o["momentum"] < 1, "optim.momentum must be in [0, 1)"),
        (o["weight_decay"] >= 0, "optim.weight_decay must be >= 0"),
        (all(0 <= b < 1 for b in o["betas"]),
         f"optim.betas must both be in [0, 1), got {o['betas']!r}"),
        (o["eps"] > 0, f"optim.eps must be > 0, got {o['eps']!r}"),
        (o["clip_norm"] >= 0, f"optim.clip_norm must be >= 0 (0: off), got {o['clip_norm']!r}"),
        (o["schedule"] in SCHEDULES,
         f"optim.schedule must be one of {', '.join(SCHEDULES)}, got {o['schedule']!r}"
         + _suggest(o["schedule"], SCHEDULES)),
        (all(isinstance(m, (int, float)) and not isinstance(m, bool) and m > 0
             for m in o["milestones"]) and list(o["milestones"]) == sorted(o["milestones"]),
         f"optim.milestones must be increasing numbers of passes > 0, got {o['milestones']!r}"),
        (not o["milestones"] or o["schedule"] == "step",
         "optim.milestones is set but optim.schedule is not 'step'"),
        (0 < o["gamma"] <= 1, "optim.gamma must be in (0, 1]"),
        (o["decay_passes"] >= 0, "optim.decay_passes must be >= 0 (0: run.passes)"),
        (0 <= o["final_ratio"] <= 1, "optim.final_ratio must be in [0, 1]"),
        (o["warmup_passes"] >= 0, "optim.warmup_passes must be >= 0"),
        (r["passes"] > 0, "run.passes must be > 0"),
        (r["eval_every"] >= 0, "run.eval_every must be >= 0"),
        (r["early_stop"] >= 0, "run.early_stop must be >= 0 (0: off)"),
        (0 <= r["early_stop_delta"] < 1,
         "run.early_stop_delta must be in [0, 1) (a val accuracy difference)"),
        (not r["early_stop_delta"] or r["early_stop"],
         "run.early_stop_delta is set but run.early_stop is 0 (off)"),
        (r["simulate"] >= 0, "run.simulate must be >= 0"),
        (r["checkpoint_every"] >= 0, "run.checkpoint_every must be >= 0"),
        (r["keep_checkpoints"] >= 1, "run.keep_checkpoints must be >= 1"),
        (r["progress_s"] >= 0, "run.progress_s must be >= 0"),
        (r["resume"] in ("auto", "always", "never", "reshape"),
         "run.resume must be auto, always, never or reshape"),
        (r["eval_device"] in ("auto", "cpu", "gpu"),
         f"run.eval_device must be auto, cpu or gpu, got {r['eval_device']!r}"),
        (r["gpu_math"] in ("fp32", "tf32"),
         f"run.gpu_math must be fp32 or tf32, got {r['gpu_math']!r}"),
        (r["cuda_graphs"] in ("auto", "on", "off"),
         f"run.cuda_graphs must be auto, on or off, got {r['cuda_graphs']!r}"),
        (r["master_device"] in ("auto", "cpu", "gpu"),
         f"run.master_device must be auto, cpu or gpu, got {r['master_device']!r}"),
        (r["cuda_aware"] in ("auto", "on", "off"),
         f"run.cuda_aware must be auto, on or off, got {r['cuda_aware']!r}"),
    ]
    for ok, msg in checks:
        if not ok:
            raise ConfigError(msg)
    if r["tensorboard"]:
        from .tensorboard import check_available
        missing = check_available()
        if missing:
            raise ConfigError(missing)
    if not d["path"]:
        raise ConfigError("data.path is not set: give it in the config or with "
                          "--set data.path=DIR (make one with `ibtmpi prep synth DIR`)")


def to_toml(cfg):
    """The resolved config as TOML text (written into the run directory)."""
    def val(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, list):
            return "[" + ", ".join(val(x) for x in v) + "]"
        if isinstance(v, dict):
            return "{" + ", ".join(f"{k} = {val(x)}" for k, x in v.items()) + "}"
        return repr(v)
    out = []
    for s, table in cfg.items():
        out.append(f"[{s}]")
        out += [f"{k} = {val(v)}" for k, v in table.items()]
        out.append("")
    return "\n".join(out)


def digest(cfg):
    return hashlib.sha256(json.dumps(cfg, sort_keys=True).encode()).hexdigest()[:16]


# -- what a checkpoint must match -------------------------------------------------
LR_KEYS = ("schedule", "milestones", "gamma", "decay_passes", "final_ratio",
           "warmup_passes")
ADDED_KEYS = {"optim": LR_KEYS + ("name", "betas", "eps", "reset_state", "clip_norm"),
              "algorithm": ("outer", "outer_schedule"), "data": ("normalize",)}   # left out of the digest
                                                          # at their defaults


# Keys a resume may change (after a divergence, or to tune a long run): they
# change neither the model's shape, nor the data order, nor the shape of any
# saved state, so the checkpoint still fits. Each change is logged, written to
# the resumed block's metrics line and kept in the manifests that follow.
RESUME_TUNABLE = {
    "optim": ("lr", "momentum", "weight_decay", "nesterov", "reset_momentum", "betas",
              "eps", "reset_state", "clip_norm") + LR_KEYS,
    "algorithm": ("rho", "l2", "adaptive_rho", "rho_mu", "rho_tau", "over_relaxation",
                  "dual_reset", "block_momentum", "block_lr", "nesterov", "easgd_beta",
                  "outer_schedule"),
}


def config_changes(old, new):
    """[(section.key, old value, new value)] of two hashed_config() dicts,
    a key left out at its default counted at its default."""
    def flat(c):
        return {f"{s}.{k}": v for s, t in c.items() for k, v in t.items()}
    a, b = flat(old), flat(new)
    for key in set(a) ^ set(b):
        sec, k = key.split(".", 1)
        if k in DEFAULTS.get(sec, {}):
            a.setdefault(key, DEFAULTS[sec][k])
            b.setdefault(key, DEFAULTS[sec][k])
    return [(key, a.get(key), b.get(key)) for key in sorted(set(a) | set(b))
            if a.get(key) != b.get(key)]


def tunable(key):
    sec, k = key.split(".", 1)
    return k in RESUME_TUNABLE.get(sec, ())


def change_text(changes):
    """'optim.lr 0.3 -> 0.1, algorithm.rho 0.01 -> 0.1'"""
    return ", ".join(f"{k} {json.dumps(a)} -> {json.dumps(b)}" for k, a, b in changes)


def run_hash(cfg, legacy=False):
    return digest(hashed_config(cfg, legacy))


def legacy_hashes(cfg):
    """The digests older checkpoints of this configuration carry: before
    data.path left the digest, and the releases between run.cuda_aware's
    arrival and its move out of the digest, which hashed it at the value
    the run had (any of its three)."""
    out = {run_hash(cfg, legacy=True)}
    for v in ("auto", "on", "off"):
        c = hashed_config(cfg, legacy=True)
        c["run"]["cuda_aware"] = v
        out.add(digest(c))
    return out


def config_diff(old, new, show=6):
    """'section.key: A in the checkpoint, B now' for each key of two
    hashed_config() dicts that differs (at most `show`, then a count)."""
    def flat(c):
        return {f"{s}.{k}": v for s, t in c.items() for k, v in t.items()}
    a, b = flat(old), flat(new)
    absent = "(not set)"
    for key in set(a) ^ set(b):        # left out at its default (hashed_config)
        sec, k = key.split(".", 1)
        if k in DEFAULTS.get(sec, {}):
            a.setdefault(key, DEFAULTS[sec][k])
            b.setdefault(key, DEFAULTS[sec][k])
    diffs = [f"{key}: {json.dumps(a.get(key, absent))} in the checkpoint, "
             f"{json.dumps(b.get(key, absent))} now"
             for key in sorted(set(a) | set(b)) if a.get(key, absent) != b.get(key, absent)]
    more = f"; and {len(diffs) - show} more" if len(diffs) > show else ""
    return "; ".join(diffs[:show]) + more


def hashed_config(cfg, legacy=False):
    """What determines the computation (as a dict; run_hash digests it),
    not operational keys (passes, threads, quiet, eval/checkpoint cadence,
    run dir, watchdog, cuda_aware, progress_s, time_limit, profile,
    timeline, tensorboard, keep_best, early_stop, early_stop_delta,
    eval_device, master_device), nor algorithm.recipe (the values it derived are hashed
    where they land), nor where the data
    lives: data.path may move (a copy staged to node-local scratch after a
    requeue); the manifest's dataset fingerprint says whether it is the
    same data. Keys added later (ADDED_KEYS) are left out at their
    defaults, so older checkpoints keep their digest. legacy: the digest of
    checkpoints written before that (path included, no cuda_aware key),
    still accepted on resume."""
    c = copy.deepcopy(cfg)
    for key in ("passes", "quiet", "threads", "eval_every", "resume", "dir",
                "checkpoint_every", "keep_checkpoints", "simulate", "watchdog_s",
                "cuda_aware", "progress_s", "time_limit", "profile", "keep_best",
                "early_stop", "early_stop_delta", "timeline", "eval_device", "gpu_math",
                "cuda_graphs", "master_device", "tensorboard"):
        c["run"].pop(key, None)
    c["model"].pop("init", None)       # only a fresh start reads it
    c["algorithm"].pop("recipe", None)  # what it derived is in the other keys
    o = c["optim"]
    if o["schedule"] == "cosine" and not o["decay_passes"]:
        o["decay_passes"] = float(cfg["run"]["passes"])   # what 0 resolves to
    for sec, keys in ADDED_KEYS.items():    # older checkpoints lack them
        for key in keys:
            if c[sec].get(key) == DEFAULTS[sec][key]:
                c[sec].pop(key)
    if not legacy:
        c["data"].pop("path", None)
    return c
