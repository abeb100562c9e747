"""errors.py is the one home of the exit statuses and of the error classes
the command line turns into them: docs/reliability.md's table lists every
status it defines, and no other module of the library defines an
exception class or an EXIT_ constant."""
import ast
import os
import re

from ibtmpi import errors

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
LIB = os.path.join(ROOT, "ibtmpi")


def modules():
    """{dotted name: path} of the library."""
    out = {}
    for dp, _, files in os.walk(LIB):
        for f in files:
            if f.endswith(".py"):
                p = os.path.join(dp, f)
                name = os.path.relpath(p[:-3], ROOT).replace(os.sep, ".")
                out[name[:-len(".__init__")] if name.endswith(".__init__") else name] = p
    return out


def test_every_exit_status_is_in_the_reliability_table():
    text = open(os.path.join(ROOT, "docs", "reliability.md")).read()
    table = {int(m) for m in re.findall(r"^\| (\d+) \|", text, re.M)}
    consts = {v for k, v in vars(errors).items() if k.startswith("EXIT_") and k != "EXIT_STATUSES"}
    assert consts == set(errors.EXIT_STATUSES)
    assert consts <= table, sorted(consts - table)
    assert table <= consts, f"documented but not defined in errors.py: {sorted(table - consts)}"


def test_no_other_module_defines_an_error_class_or_an_exit_status():
    found = []
    for name, path in modules().items():
        if name == "ibtmpi.errors":
            continue
        tree = ast.parse(open(path).read())
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and any(
                    getattr(b, "id", getattr(b, "attr", "")).endswith(("Error", "Exception"))
                    for b in node.bases):
                found.append(f"{name}.{node.name}")
            if isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id.startswith("EXIT_") for t in node.targets):
                found.append(f"{name}: {ast.unparse(node)}")
    assert found == []


def test_old_homes_still_name_the_same_classes():
    """Code that imported an error from where it used to live gets the one class."""
    from ibtmpi import checkpoint, cli, config, dataset, runlock
    from ibtmpi.train import Diverged, Preempted
    assert config.ConfigError is errors.ConfigError
    assert checkpoint.CheckpointError is errors.CheckpointError
    assert dataset.DatasetError is errors.DatasetError
    assert cli.UsageError is errors.UsageError
    assert issubclass(runlock.RunDirBusy, checkpoint.CheckpointError)
    assert (Diverged, Preempted) == (errors.Diverged, errors.Preempted)
