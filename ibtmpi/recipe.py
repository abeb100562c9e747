"""algorithm.recipe: the settings a block method gets for its worker count.

At a fixed block (the paper's setting: split = block / N) a worker's local
steps per block shrink with N, and with the single-worker settings the
block methods fall behind N = 1 (docs/benchmarks.md, "The accuracy study").
``auto`` derives, from N and the split, the settings the study measured to
close that gap; ``none`` leaves every default as it is. A value the user
gave (a config file or --set: ``Config.explicit``) always wins. The
trainer applies the recipe once N is known (every rank alike, so MPI and
the simulation derive the same values), logs the derived values in its
start-up lines and writes them into RUN/config.toml, so a resume derives
the same run.

The rule and its evidence: docs/config.md (algorithm.recipe).
Tests: tests/unit/test_recipe.py.
"""
from __future__ import annotations

import copy
import math

from .settings import Key, declare

RECIPES = ("auto", "none")

declare("algorithm", Key("recipe", "auto", "auto: the settings measured for this N where "
                         "you set none | none: the plain defaults", choices=RECIPES,
                         hashed=False))      # what it derived is in the other keys


def derive(cfg, n, split):
    """[(section.key, value)] recipe ``cfg.algorithm.recipe`` sets for N = n
    workers with `split` samples each a block (before the user's values)."""
    from .consensus import ALGORITHMS
    a, o = cfg["algorithm"], cfg["optim"]
    cls = ALGORITHMS[a["name"]]
    if a["recipe"] == "none" or n < MIN_WORKERS or cls.per_step or cls.single_worker:
        return []
    if o["name"] != "sgd":
        return []              # the study measured the sgd local optimizer only
    batch = LOCAL_BATCH if split <= SMALL_SPLIT else cfg["data"]["batch"]
    out = [("data.batch", batch),
           ("optim.warmup_passes", WARMUP_PASSES),
           ("optim.clip_norm", CLIP_NORM),
           ("optim.reset_momentum", RESET_MOMENTUM),
           ("optim.lr", scaled_lr(o["lr"], n))]
    # ibt: duals and an outer step (admm's z is the mean: nothing to centre)
    if getattr(cls, "dual", False) and cls.outer_name(a) not in (None, "average"):
        out.append(("algorithm.centred_duals", CENTRED_DUALS))
    return out


def scaled_lr(lr, n):
    """The local lr at N = n: lr x sqrt(n / MIN_WORKERS), to 6 significant
    digits (as the start line and config.toml show it): 1x at N = 10, 1.41x
    at 20, 2x at 40. A worker's steps a block shrink as 1/N at a fixed
    block; the square root keeps the averaged step's noise scale."""
    return float(f"{lr * math.sqrt(n / MIN_WORKERS):.6g}")


# the rule's constants (docs/config.md, algorithm.recipe, gives the evidence)
MIN_WORKERS = 10         # measured at N = 10, 20, 40; fewer workers keep the defaults
SMALL_SPLIT = 1024       # splits up to this take the small local batch
LOCAL_BATCH = 8          # ... of this many samples: 4x the local steps of batch 31
WARMUP_PASSES = 1.0      # linear lr warm-up over the first pass
CLIP_NORM = 5.0          # the loss gradient's L2 norm, clipped
RESET_MOMENTUM = False   # a worker keeps its local momentum across the syncs: 15.5
                         # steps a block at N = 40 are too few to build it up anew
CENTRED_DUALS = True     # ibt: the duals sum to zero, the outer step alone moves z
# optim.lr: scaled_lr (the configured lr x sqrt(N / MIN_WORKERS))


def apply(cfg, n, split):
    """(cfg', [(section.key, value)]): a copy of cfg with the recipe's values
    set where the user set none, and the values it set."""
    given = getattr(cfg, "explicit", frozenset())
    out, done = copy.deepcopy(cfg), []
    for key, value in derive(cfg, n, split):
        if key in given:
            continue
        sec, k = key.split(".", 1)
        if out[sec][k] != value:
            out[sec][k] = value
            done.append((key, value))
    return out, done


def _toml(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    return f"{v:g}" if isinstance(v, float) else str(v)


def describe(n, done):
    """The start-up line on what the recipe set, or None."""
    if not done:
        return None
    return (f"algorithm.recipe auto for N = {n}: "
            + ", ".join(f"{k} = {_toml(v)}" for k, v in done)
            + " (a value you set wins; algorithm.recipe = none: the plain defaults)")
