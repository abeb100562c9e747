"""docs/config.md documents every configuration key with its real default,
and no key that does not exist."""
import os
import re

from ibtmpi.config import DEFAULTS

DOC = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "config.md")
# keys whose documented default is the EFFECTIVE one, not the raw DEFAULTS value
EFFECTIVE = {("data", "path"): "(required)",
             ("data", "split_size"): "512"}      # 0 in DEFAULTS: 512 unless block_size


def documented():
    """{(section, key): first word of the default column}."""
    out, sec = {}, None
    for line in open(DOC):
        m = re.match(r"## \[(\w+)\]", line)
        if m:
            sec = m.group(1)
            continue
        if sec and line.startswith("| `"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            keys = re.findall(r"`(\w+)`", cells[0])
            # commas inside a list default ([0.9, 0.999]) do not separate keys
            defaults = [d.strip().strip("`").strip('"')
                        for d in re.split(r",(?![^\[]*\])", cells[1])]
            if len(defaults) != len(keys):
                defaults = [cells[1]] * len(keys)
            for k, d in zip(keys, defaults):
                out[(sec, k)] = (d if d.startswith(("(", "[")) or not d
                                 else d.split()[0])
    return out


def same(doc, value):
    if isinstance(value, list):
        return doc == repr(value)
    if isinstance(value, bool):
        return doc == str(value).lower()
    if isinstance(value, (int, float)):
        try:
            return float(doc) == float(value)
        except ValueError:
            return False
    return doc == value


def test_every_key_is_documented_and_every_documented_key_exists():
    doc = documented()
    real = {(s, k) for s, keys in DEFAULTS.items() for k in keys}
    assert sorted(real - doc.keys()) == [], "keys missing from docs/config.md"
    assert sorted(doc.keys() - real) == [], "docs/config.md documents unknown keys"


def test_documented_defaults_are_the_real_ones():
    wrong = []
    for (s, k), d in documented().items():
        want = EFFECTIVE.get((s, k))
        ok = d == want if want is not None else same(d, DEFAULTS[s][k])
        if not ok:
            wrong.append(f"{s}.{k}: docs say {d!r}, code has {DEFAULTS[s][k]!r}")
    assert wrong == []


def test_effective_split_size_default_is_the_documented_one(small_dataset, tmp_path):
    from ibtmpi.config import load
    from ibtmpi.train import Trainer
    cfg = load(None, [f"data.path={small_dataset}", f"run.dir={tmp_path}",
                      "model.layers=tiny", "run.quiet=true"])
    t = Trainer(cfg, log=lambda m: None)
    assert t.sched.split_size == int(EFFECTIVE[("data", "split_size")])


def test_documented_names_are_the_registries():
    """algorithm.name and optim.name list exactly the registered classes,
    in registration order."""
    from ibtmpi.consensus import ALGORITHMS
    from ibtmpi.optim import OPTIMIZERS
    rows = {}
    sec = None
    for line in open(DOC):
        m = re.match(r"## \[(\w+)\]", line)
        if m:
            sec = m.group(1)
        elif sec and line.startswith("| `name` |"):
            why = line.strip().strip("|").split("|")[2]
            rows[sec] = [w for w in re.findall(r"`(\w+)`", why) if w not in ("ibtmpi",)]
    assert rows["algorithm"] == list(ALGORITHMS)
    assert rows["optim"] == list(OPTIMIZERS)


def test_the_tables_are_the_declared_settings():
    """Rows, their order and the defaults come from the declarations
    (ibtmpi/settings.py); `python tools/config_doc.py` rewrites them."""
    from ibtmpi.config import doc_tables
    text = open(DOC).read()
    assert doc_tables(text) == text, "run: python tools/config_doc.py"
