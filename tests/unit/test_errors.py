"""errors.py is the one home of the exit statuses and of the error classes
the command line turns into them: docs/reliability.md's table lists every
status it defines, and no other module of the library defines an
exception class or an EXIT_ constant. And the library has no import cycle
(each part can be imported, and tested, alone)."""
import ast
import collections
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
        if name == "ibtmpi.errors" or name.startswith("ibtmpi.testing"):
            continue                   # (the CuPy stand-in mimics CuPy's own)
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


def import_graph():
    mods = modules()
    graph = collections.defaultdict(set)
    for name, path in mods.items():
        pkg = name if path.endswith("__init__.py") else name.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(open(path).read())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = pkg.split(".")
                    base = ".".join(parts[:len(parts) - node.level + 1]
                                    + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                targets = [f"{base}.{a.name}" for a in node.names] + [base]
            for t in targets:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != name and t.startswith("ibtmpi") and t != "ibtmpi":
                    graph[name].add(t)
    return mods, graph


def test_the_library_has_no_import_cycle():
    """A package's own __init__ importing its parts is not a cycle; a part
    importing back a module that imports it is (Tarjan's components)."""
    mods, graph = import_graph()
    for name in mods:                  # a part -> its own package: the package's init
        graph[name] = {t for t in graph[name] if not name.startswith(t + ".")}
    index, low, stack, on, comps = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))
    for v in sorted(mods):
        if v not in index:
            visit(v)
    assert comps == []


def test_modules_classes_and_functions_stay_readable():
    """The library's size limits (docs/architecture.md): no module over 600 lines,
    no class over 500, no function over 100, and no class of train/ that
    inherits another part of train/: the parts are built from explicit
    arguments (the one exception: a private base that two implementations
    of one interface share, steps._Sync)."""
    big = []
    train_classes = set()
    for name, path in modules().items():
        src = open(path).read()
        if src.count("\n") > 600:
            big.append(f"{name}: {src.count(chr(10))} lines")
        tree = ast.parse(src)
        for node in ast.walk(tree):
            size = getattr(node, "end_lineno", 0) - getattr(node, "lineno", 0) + 1
            if isinstance(node, ast.ClassDef):
                if size > 500:
                    big.append(f"class {name}.{node.name}: {size} lines")
                if name.startswith("ibtmpi.train."):
                    train_classes.add(node.name)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and size > 100:
                big.append(f"{name}.{node.name}: {size} lines")
    assert big == []
    for name, path in modules().items():
        if not name.startswith("ibtmpi.train."):
            continue
        for node in ast.parse(open(path).read()).body:
            if isinstance(node, ast.ClassDef):
                parts = {getattr(b, "id", "") for b in node.bases} & train_classes
                assert all(p.startswith("_") for p in parts), f"{name}.{node.name} inherits {parts}"
