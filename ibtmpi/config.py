"""Run configuration: TOML with sections data, model, algorithm, optim, run.

Every key is declared by the code that reads it (settings.py's ``Key``: an
algorithm's in consensus/, an optimizer's in optim/, the lr schedule's in
optim/lr.py, data.py's, model.py's, recipe.py's; the driver's [run] keys
below); importing those modules collects them. ``load(path, overrides)``
merges the defaults, the file, and ``--set section.key=value`` overrides
(values parsed as TOML, bare words as strings), then validates: unknown
sections/keys are errors with a did-you-mean, each key's declared check
and its owner's rules across keys. The checkpoint digest (``hashed_config``)
and the keys a resume may change come from the same declarations, and so
do docs/config.md's tables (``doc_tables``; tools/config_doc.py).
Tests: tests/unit/test_settings.py, test_docs_config.py, test_cli.py.
"""
from __future__ import annotations

import copy
import datetime
import difflib
import hashlib
import json
import math
import re

from .errors import ConfigError

try:
    import tomllib
except ImportError:                       # Python < 3.11
    import tomli as tomllib


from . import consensus, data, model, optim, recipe  # noqa: F401  (they declare their keys)
from . import settings
from .settings import ENUM_WHY, RULES, SCHEMA, SECTIONS, Key, bad, declare, non_negative, rule


# -- [run]: the driver's settings; none changes a result, so none is part of
# the digest a checkpoint must match ------------------------------------------
def _threads_setting(value, where):
    if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return value
    raise bad(where, f"must be 'auto' or an integer >= 1, got {value!r}")


def _watchdog_setting(value, where):
    if value == "auto" or (isinstance(value, (int, float)) and not isinstance(value, bool)
                           and math.isfinite(value) and value >= 0):
        return value if value == "auto" else float(value)
    raise bad(where, f"must be 'auto', 0 (off) or a number of seconds > 0, got {value!r}")


def _time_limit_setting(value, where):
    if isinstance(value, datetime.time):          # TOML read 01:30:00 as a time
        value = value.isoformat()
    if not isinstance(value, str):
        raise bad(where, f"needs a unit: 90m, 4h, 1:30:00 or 2-00:00:00 (or auto, none), "
                         f"got {value!r}")
    parse_duration(value, where)                  # an error now, not at the end
    return value


RUN = {"hashed": False}
declare(
    "run",
    Key("dir", "runs/run", "run directory (config, metrics, model)", **RUN),
    Key("passes", 1.0, "passes over the training data (fractions ok)",
        check=lambda v: v > 0, why="{where} must be > 0", **RUN),
    Key("eval_every", 0, "evaluate z on val every k blocks; 0: each pass",
        check=non_negative, why="{where} must be >= 0", shown="0 (= once per pass)", **RUN),
    Key("threads", "auto", "BLAS threads per rank", parse=_threads_setting, **RUN),
    Key("quiet", False, "", **RUN),
    Key("progress_s", 60.0, "seconds between progress lines in batch logs; 0: off",
        check=non_negative, why="{where} must be >= 0", shown="60", **RUN),
    Key("simulate", 0, "> 0: N logical workers in one process", check=non_negative,
        why="{where} must be >= 0", **RUN),
    Key("checkpoint_every", 0, "blocks between checkpoints; 0: once per pass",
        check=non_negative, why="{where} must be >= 0", shown="0 (= once per pass)", **RUN),
    Key("keep_checkpoints", 2, "complete checkpoints kept", check=lambda v: v >= 1,
        why="{where} must be >= 1", **RUN),
    Key("resume", "auto", "auto | always | never | reshape (another worker count)",
        choices=("auto", "always", "never", "reshape"), why=ENUM_WHY,
        **RUN),
    Key("watchdog_s", "auto", "abort a block running longer (MPI runs): auto = max(60 s, "
        "10x the slowest block so far); 0: off", parse=_watchdog_setting, **RUN),
    Key("cuda_aware", "auto", "GPU workers: auto | on | off (device buffers to MPI)",
        choices=("auto", "on", "off"), why=ENUM_WHY,
        **RUN),
    Key("eval_device", "auto", "the master's evaluation: auto | cpu | gpu",
        choices=("auto", "cpu", "gpu"), why=ENUM_WHY,
        **RUN),
    Key("gpu_math", "fp32", "GPU GEMMs: fp32 | tf32 (tensor cores)",
        choices=("fp32", "tf32"), why=ENUM_WHY,
        **RUN),
    Key("cuda_graphs", "auto", "GPU workers' steps from CUDA graphs: auto | on | off",
        choices=("auto", "on", "off"), why=ENUM_WHY,
        **RUN),
    Key("master_device", "auto", "a master of its own's consensus state: auto | cpu | gpu",
        choices=("auto", "cpu", "gpu"), why=ENUM_WHY,
        **RUN),
    Key("time_limit", "auto", "stop with a checkpoint before it: auto (the Slurm job's "
        "end) | none | 90m, 4h, 1:30:00, 2-00:00:00", parse=_time_limit_setting, **RUN),
    Key("profile", False, "cProfile every rank: RUN/profile-rank-R.txt/.pstats", **RUN),
    Key("keep_best", True, "RUN/model-best.npz: the z with the best val accuracy", **RUN),
    Key("early_stop", 0, "stop after this many evaluations without a better val "
        "accuracy; 0: off", check=non_negative, why="{where} must be >= 0 (0: off)",
        shown="0 (off)", **RUN),
    Key("early_stop_delta", 0.0, "early_stop: better means val accuracy up by more than "
        "this", check=lambda v: 0 <= v < 1,
        why="{where} must be in [0, 1) (a val accuracy difference)", **RUN),
    Key("timeline", False, "RUN/timeline.json: every rank's phases (Chrome trace)", **RUN),
    Key("tensorboard", False, "RUN/tb/: the master's metrics as TensorBoard events", **RUN),
)


@rule("run")
def _early_stop_rule(cfg):
    r = cfg["run"]
    if r["early_stop_delta"] and not r["early_stop"]:
        return "run.early_stop_delta is set but run.early_stop is 0 (off)"
    if r["tensorboard"]:
        from .tensorboard import check_available
        return check_available()          # tensorboardX missing: how to get it
    return None


# every section's defaults, collected from the declarations (the only place a
# default lives), in config.toml's order. load() and the checks read the
# declarations themselves, so a key declared later (a plug-in) takes part too.
DEFAULTS = {s: {k: copy.deepcopy(key.default) for k, key in SCHEMA[s].items()}
            for s in SECTIONS}

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
    """value as the key's type: its own parse, or its default's type (an
    integer where a number is wanted is one)."""
    k = SCHEMA[section][key]
    where = k.where
    if k.parse is not None:
        return k.parse(value, where)
    t = type(k.default)
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
    if section not in SECTIONS:
        raise ConfigError(f"{origin}: unknown section [{section}]"
                          f"{_suggest(section, list(SECTIONS))}")
    if key not in SCHEMA[section]:
        raise ConfigError(f"{origin}: unknown key {section}.{key}"
                          f"{_suggest(key, list(SCHEMA[section]))}")
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
    cfg = Config({s: settings.defaults(s) for s in SECTIONS})
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
                                  f"[section]{_suggest(section, list(SECTIONS))}")
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
    """Each key's own check (its owner's declaration), then the checks across
    keys (the owners' rules); data.path last."""
    for key in settings.keys():
        value = cfg[key.section][key.name]
        msg = key.problem(value)
        if msg:
            opts = key.options()
            raise ConfigError(msg + (_suggest(value, list(opts))
                                     if opts and isinstance(value, str) else ""))
    for section in SECTIONS:
        for fn in RULES.get(section, ()):
            msg = fn(cfg)
            if msg:
                raise ConfigError(msg)
    if not cfg["data"]["path"]:
        raise ConfigError("data.path is not set: give it in the config or with "
                          "--set data.path=DIR (make one with `ibtmpi prep synth DIR`)")


def _shown(key):
    """A default as docs/config.md's table shows it."""
    v = key.default
    if key.shown is not None:
        return key.shown
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f"`{v}`" if v else '`""`'
    if isinstance(v, list):
        return f"`{v!r}`"
    return repr(v)


def doc_tables(text):
    """docs/config.md with each section's key table written from the schema:
    its rows, their order and the default column; each row keeps its prose
    (a new key's row starts from its declaration's doc)."""
    lines = text.split("\n")
    out, section, i = [], None, 0
    while i < len(lines):
        line = lines[i]
        m = re.match(r"## \[(\w+)\]", line)
        if m:
            section = m.group(1)
        if section in SCHEMA and line.startswith("| key | default |"):
            out += [line, lines[i + 1]]
            i += 2
            prose = {}
            while i < len(lines) and lines[i].startswith("| `"):
                cells = [c.strip() for c in lines[i].strip().strip("|").split("|", 2)]
                prose[re.findall(r"`(\w+)`", cells[0])[0]] = cells[2].rstrip(" |")
                i += 1
            rows = []
            for key in SCHEMA[section].values():
                if key.joins and rows:
                    rows[-1][0].append(f"`{key.name}`")
                    rows[-1][1].append(_shown(key))
                else:
                    rows.append(([f"`{key.name}`"], [_shown(key)], prose.get(key.name, key.doc)))
            out += [f"| {', '.join(n)} | {', '.join(d)} | {why} |" for n, d, why in rows]
            section = None
            continue
        out.append(line)
        i += 1
    return "\n".join(out)


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
def _declared(flag):
    """{section: (key, ...)} of the keys declared with `flag`."""
    out = {}
    for k in settings.keys():
        if getattr(k, flag):
            out.setdefault(k.section, ())
            out[k.section] += (k.name,)
    return out


# Keys added after the first checkpoints: left out of the digest at their
# defaults, so older checkpoints keep theirs (Key.added).
ADDED_KEYS = _declared("added")

# Keys a resume may change (after a divergence, or to tune a long run): they
# change neither the model's shape, nor the data order, nor the shape of any
# saved state, so the checkpoint still fits. Each change is logged, written to
# the resumed block's metrics line and kept in the manifests that follow
# (Key.tunable).
RESUME_TUNABLE = _declared("tunable")


def config_changes(old, new):
    """[(section.key, old value, new value)] of two hashed_config() dicts,
    a key left out at its default counted at its default."""
    def flat(c):
        return {f"{s}.{k}": v for s, t in c.items() for k, v in t.items()}
    a, b = flat(old), flat(new)
    for key in set(a) ^ set(b):
        sec, k = key.split(".", 1)
        if k in SCHEMA.get(sec, {}):
            a.setdefault(key, SCHEMA[sec][k].default)
            b.setdefault(key, SCHEMA[sec][k].default)
    return [(key, a.get(key), b.get(key)) for key in sorted(set(a) | set(b))
            if a.get(key) != b.get(key)]


def tunable(key):
    sec, k = key.split(".", 1)
    return sec in SCHEMA and k in SCHEMA[sec] and SCHEMA[sec][k].tunable


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
        if k in SCHEMA.get(sec, {}):
            a.setdefault(key, SCHEMA[sec][k].default)
            b.setdefault(key, SCHEMA[sec][k].default)
    diffs = [f"{key}: {json.dumps(a.get(key, absent))} in the checkpoint, "
             f"{json.dumps(b.get(key, absent))} now"
             for key in sorted(set(a) | set(b)) if a.get(key, absent) != b.get(key, absent)]
    more = f"; and {len(diffs) - show} more" if len(diffs) > show else ""
    return "; ".join(diffs[:show]) + more


def hashed_config(cfg, legacy=False):
    """What determines the computation (as a dict; run_hash digests it): the
    keys declared hashed (not the operational ones, [run] among them; not
    algorithm.recipe, whose values are hashed where they land; not model.init,
    which only a fresh start reads; not data.path: the data may move, a copy
    staged to node-local scratch after a requeue, and the manifest's dataset
    fingerprint says whether it is the same data), each at the value it
    resolves to (Key.resolve). Keys added later (Key.added) are left out at
    their defaults, so older checkpoints keep their digest. legacy: the digest
    of checkpoints written before that (data.path in it, Key.legacy), still
    accepted on resume."""
    c = copy.deepcopy(cfg)
    for k in settings.keys():
        sec = c[k.section]
        if k.name not in sec:
            continue
        if not k.hashed and not (legacy and k.legacy):
            sec.pop(k.name)
            continue
        if k.resolve is not None:
            sec[k.name] = k.resolve(sec[k.name], cfg)
        if k.added and sec[k.name] == k.default:
            sec.pop(k.name)
    return c
