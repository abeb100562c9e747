"""The configuration's schema, declared by the code each setting belongs to.

An owner (an algorithm, the outer optimizer, an optimizer, the learning-rate
schedule, the recipe, the data and model settings) declares its keys with
``declare(section, Key(...), ...)``: the default, what a value must be, and
what the key is to a checkpoint (part of the run's digest or not; added
after checkpoints existed, so left out of the digest at its default; a key
a resume may change). Checks across keys of one section are ``@rule``s.
config.py collects every declaration into DEFAULTS, validation, the
digest's key lists and the resume's tunable keys, and docs/config.md's
tables are written from them (``python -m ibtmpi.config --doc``). A new
key is one declaration beside the code that reads it, and a row of prose
in docs/config.md.

Nothing here imports the rest of the library, so an owner declares its
keys without importing config.py. Test: tests/unit/test_settings.py.
"""
from __future__ import annotations

import copy

from .errors import ConfigError

SCHEMA = {}     # section -> {key: Key}, in declaration order
RULES = {}      # section -> [fn(cfg) -> message or None]
SECTIONS = ("data", "model", "algorithm", "optim", "run")   # config.toml's order


class Key:
    """One setting. check(value) -> bool, with `why` the message when it is
    false ({v} the value, {where} section.key); choices: the allowed values,
    or a function giving them (a registry), `why` then with {opts} ('a, b
    or c') or {names} ('a, b, c'); parse(value, where) -> value for
    a key whose type is not its default's (it raises ConfigError itself).
    hashed=False: not part of the run's digest (operational: it changes no
    result); legacy=True: but part of the digest older checkpoints carry.
    added=True: left out of the digest at its default (older checkpoints
    lack it). tunable: a resume may change it. resolve(value, cfg): the
    value the digest holds (cosine's decay_passes 0 is run.passes). shown:
    the default as docs/config.md shows it; joins: shares the previous
    key's row there; lead: first in its section (the section's name key),
    whichever owner is imported first."""

    __slots__ = ("name", "default", "doc", "check", "why", "choices", "parse", "hashed",
                 "legacy", "added", "tunable", "resolve", "shown", "joins", "lead", "section")

    def __init__(self, name, default, doc="", *, check=None, why=None, choices=None,
                 parse=None, hashed=True, legacy=False, added=False, tunable=False,
                 resolve=None, shown=None, joins=False, lead=False):
        self.name, self.default, self.doc = name, default, doc
        self.check, self.why, self.choices, self.parse = check, why, choices, parse
        self.hashed, self.legacy, self.added, self.tunable = hashed, legacy, added, tunable
        self.resolve, self.shown, self.joins, self.lead = resolve, shown, joins, lead
        self.section = None

    @property
    def where(self):
        return f"{self.section}.{self.name}"

    def options(self):
        c = self.choices
        return tuple(c() if callable(c) else c) if c is not None else None

    def problem(self, value):
        """The message for a value this key refuses, or None."""
        opts = self.options()
        if opts is not None and value not in opts:
            return (self.why or "{where} must be one of {names}, got {v!r}").format(
                where=self.where, v=value, opts=one_of(opts), names=", ".join(opts))
        if self.check is not None and not self.check(value):
            return self.why.format(where=self.where, v=value)
        return None


def one_of(names):
    """'a, b or c'"""
    names = [str(n) for n in names]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def declare(section, *keys):
    """Add keys to a section of the schema (each once)."""
    if section not in SECTIONS:
        raise ValueError(f"unknown section {section!r}")
    table = SCHEMA.setdefault(section, {})
    for k in keys:
        if k.name in table:
            raise ValueError(f"{section}.{k.name} is declared twice")
        k.section = section
        table[k.name] = k
        if k.lead:
            SCHEMA[section] = table = {k.name: k, **table}
    return keys


def rule(section):
    """Decorator: fn(cfg) -> the message for a bad combination, or None."""
    def deco(fn):
        RULES.setdefault(section, []).append(fn)
        return fn
    return deco


def defaults(section):
    """{key: default} of one section (copies)."""
    return {k: copy.deepcopy(key.default) for k, key in SCHEMA.get(section, {}).items()}


def keys():
    """Every declared Key, section by section."""
    return [k for s in SECTIONS for k in SCHEMA.get(s, {}).values()]


def non_negative(v):
    return v >= 0


def seed_range(v):
    """A seed NumPy's generators take."""
    return 0 <= v < 2**32


SEED_WHY = "{where} must be in 0 .. 2**32 - 1, got {v}"
ENUM_WHY = "{where} must be {opts}, got {v!r}"       # a few fixed words


def bad(where, text):
    """A ConfigError for a parse function."""
    return ConfigError(f"{where} {text}")
