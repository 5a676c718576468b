"""The import structure of ``nbdebug/``: data flows frameworks → session → watch → control → ui, with
offline/dump/compare beside; no cycle between parts; the debugger core never imports the layers above it
(it reaches optional features through ``nbdebug.features`` only); only ``frameworks/`` imports torch or
mindspore. Read from the source with ``ast`` (module- and function-level imports alike)."""

from __future__ import annotations

import ast
import os
from collections import defaultdict

import nbdebug

ROOT = os.path.dirname(nbdebug.__file__)
#: parts whose imports are fixed here; a part not listed (a new package) may import the parts below it
CORE = ("frameworks", "session", "watch", "control", "debugger", "features")
UPPER = ("lab", "ui", "dump", "compare", "remote", "offline", "job", "replay")
#: what each part may import (besides itself); the root package ``nbdebug`` (the public facade) imports all
ALLOWED = {
    "session": set(),
    # the GradScaler probe feeds watch.loss_scale's tracker; _fastats is the native statistics kernel
    "frameworks": {"session", "watch", "_fastats"},
    "watch": {"session"},
    "control": {"session", "watch"},
    "features": set(),  # imports what the layers above registered (features.register), on first use
    "debugger": {"frameworks", "session", "watch", "control", "features"},
    "offline": {"frameworks", "session", "watch", "control", "features"},
    "dump": {"frameworks", "session", "watch", "control", "features", "offline", "debugger"},
    "compare": {"frameworks", "session", "watch", "control", "features", "offline", "dump"},
    "ui": {"frameworks", "session", "watch", "control", "features", "offline", "dump", "compare", "debugger",
           "nbdebug"},
    "lab": {"session", "watch", "control", "features", "debugger", "ui"},
    "replay": {"frameworks", "session", "watch", "control", "features", "offline"},
}


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "nbdebug"


def _is_module(dotted: str) -> bool:
    rel = os.path.join(ROOT, *dotted.split(".")[1:])
    if os.path.isdir(rel) or os.path.exists(rel + ".py"):
        return True
    folder, name = os.path.split(rel)
    return os.path.isdir(folder) and any(f.startswith(name + ".") and f.endswith((".so", ".pyd"))
                                         for f in os.listdir(folder))


def _file_imports(module: str, package: str, tree: ast.AST) -> list[tuple[str, str, int, bool]]:
    out = []

    def visit(node: ast.AST, top: bool) -> None:
        for ch in ast.iter_child_nodes(node):
            inner = top and not isinstance(ch, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(ch, ast.Import):
                out.extend((module, a.name, ch.lineno, top) for a in ch.names)
            elif isinstance(ch, ast.ImportFrom):
                base = ch.module or ""
                if ch.level:
                    up = package.split(".")[: len(package.split(".")) - ch.level + 1]
                    base = ".".join(up + ([ch.module] if ch.module else []))
                for a in ch.names:
                    sub = f"{base}.{a.name}"
                    out.append((module, sub if base.startswith("nbdebug") and _is_module(sub) else base,
                                ch.lineno, top))
            visit(ch, inner)

    visit(tree, True)
    return out


def imports() -> list[tuple[str, str, int, bool]]:
    """``(importer, imported, line, at module level)`` for every import of the package (nbdebug.* or not)."""
    out = []
    for folder, _, files in os.walk(ROOT):
        for f in files:
            if not f.endswith(".py"):
                continue
            path = os.path.join(folder, f)
            rel = os.path.relpath(path, os.path.dirname(ROOT))[:-3].replace(os.sep, ".")
            module = rel[: -len(".__init__")] if rel.endswith(".__init__") else rel
            package = module if f == "__init__.py" else module.rsplit(".", 1)[0]
            with open(path, encoding="utf-8") as fh:
                out.extend(_file_imports(module, package, ast.parse(fh.read())))
    return out


def part_edges() -> dict[tuple[str, str], list[str]]:
    edges: dict[tuple[str, str], list[str]] = defaultdict(list)
    for src, dst, line, _top in imports():
        if dst == "nbdebug" or dst.startswith("nbdebug."):
            a, b = _part(src), _part(dst)
            if a != b:
                edges[(a, b)].append(f"{src}:{line} imports {dst}")
    return edges


def test_the_import_scan_sees_both_kinds_of_import():
    found = {(s, d, top) for s, d, _l, top in imports()}
    assert ("nbdebug.debugger", "nbdebug.control", True) in found
    assert ("nbdebug.frameworks.torch.backend", "nbdebug.frameworks.torch.adapter", False) in found
    assert ("nbdebug.frameworks.core.native", "nbdebug.frameworks._fastats", True) in found


def test_the_frameworks_never_reach_up_to_the_package_root():
    """The package root imports the debugger, lab and ui: a framework module importing from it (``from nbdebug
    import _fastats``, as the native kernel once was) depends on every layer above it."""
    bad = [f"{src}:{line} imports {dst}" for src, dst, line, _top in imports()
           if src.startswith("nbdebug.frameworks") and dst in ("nbdebug", "nbdebug._fastats")]
    assert bad == []


def test_each_part_imports_only_the_parts_beside_or_below_it():
    known = set(ALLOWED) | {"nbdebug", "_fastats"}
    bad = [why for (a, b), whys in part_edges().items()  # a new part (remote/, job.py): core and cycle rules only
           if a in ALLOWED and b in known and b not in ALLOWED[a] for why in whys]
    assert bad == []


def test_the_core_never_imports_the_layers_above_it():
    bad = [why for (a, b), whys in part_edges().items() if a in CORE and b in UPPER for why in whys]
    assert bad == []


def test_no_import_cycle_between_parts():
    graph: dict[str, set[str]] = defaultdict(set)
    for a, b in part_edges():
        if "nbdebug" not in (a, b):  # the public facade re-exports every part
            graph[a].add(b)
    cycles = []

    def walk(node: str, path: list[str]) -> None:
        for nxt in sorted(graph[node]):
            if nxt in path:
                cycles.append(path[path.index(nxt):] + [nxt])
            elif len(path) < 12:
                walk(nxt, path + [nxt])

    for start in sorted(graph):
        walk(start, [start])
    assert cycles == []


def test_only_frameworks_imports_torch_or_mindspore():
    bad = [f"{s}:{line} imports {d}" for s, d, line, _top in imports()
           if d.split(".")[0] in ("torch", "mindspore") and _part(s) != "frameworks"]
    assert bad == []


def test_features_name_existing_objects():
    from nbdebug.features import FEATURES, feature

    for name, (module, _attr) in FEATURES.items():
        assert _part(module) in UPPER, f"{name}: a feature is something above the core"
        assert callable(feature(name))


def test_upper_layers_register_their_features_and_the_core_names_none():
    from nbdebug.features import FEATURES

    with open(os.path.join(ROOT, "features.py"), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    docstrings = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)}
    named = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
             and id(n) not in docstrings and n.value.startswith("nbdebug.")]
    assert named == [], "features.py names modules above the core: let their layers register them"
    for name, (module, _attr) in FEATURES.items():  # each in the package __init__ of its own layer
        with open(os.path.join(ROOT, _part(module), "__init__.py"), encoding="utf-8") as f:
            assert f'register("{name}"' in f.read(), f"{name} is not registered by {_part(module)}"


def test_finding_a_backend_imports_no_framework_it_does_not_need():
    import subprocess
    import sys

    code = (
        "import sys, nbdebug\n"
        "from nbdebug.frameworks.registry import backend_for_model, backend_for_value, backend_named\n"
        "assert 'torch' not in sys.modules and 'mindspore' not in sys.modules\n"
        "try:\n    backend_for_model(object())\n    raise SystemExit('no TypeError for a plain object')\n"
        "except TypeError as e:\n    assert 'torch.nn.Module' in str(e)\n"
        "assert backend_for_value({'a': [1]}) is None and backend_named('ms').name == 'mindspore'\n"
        "assert 'torch' not in sys.modules and 'mindspore' not in sys.modules\n"
        "import torch\n"
        "dbg = nbdebug.Debugger(torch.nn.Linear(2, 1), level='L1')\n"
        "assert dbg.backend.name == 'pytorch' and dbg.backend.levels == ('L0', 'L1', 'mix', 'monitor')\n"
        "dbg.close()\n"
        "assert 'mindspore' not in sys.modules, 'a torch Debugger imported mindspore'\n"
        "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": os.path.dirname(ROOT)})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "ok"


#: string constants outside ``frameworks/`` allowed to spell a framework's module-call prefix ("path:text");
#: docstrings and doctests are examples, not knowledge, and are not scanned. Empty: ask the registry
#: (``module_prefixes()``, ``is_module_name()``, ``Backend.module_prefix``) instead.
PREFIX_ALLOWED: set[str] = set()
_PREFIX_TEXT = r"^(?:Module|Cell)(?:\.|$)|\b(?:Module|Cell)\|"


def framework_prefix_strings() -> list[str]:
    """``path:line text`` of every string constant outside ``frameworks/`` (docstrings aside) that is a
    framework's module prefix (``"Module"``, ``"Cell."``, ``f"Module.{path}"``, ``r"(?:Module|Cell)\\."``)."""
    import re

    pattern = re.compile(_PREFIX_TEXT)
    out = []
    for folder, _, files in os.walk(ROOT):
        if os.path.relpath(folder, ROOT).split(os.sep)[0] == "frameworks":
            continue
        for f in files:
            if not f.endswith(".py"):
                continue
            path = os.path.join(folder, f)
            with open(path, encoding="utf-8") as fh:
                tree = ast.parse(fh.read())
            docs = {id(n.body[0].value) for n in ast.walk(tree)
                    if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                    and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
            rel = os.path.relpath(path, os.path.dirname(ROOT))
            out.extend(f"{rel}:{n.lineno} {n.value!r}" for n in ast.walk(tree)
                       if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
                       and pattern.search(n.value) and f"{rel}:{n.value}" not in PREFIX_ALLOWED)
    return out


def test_the_prefix_scan_sees_what_it_looks_for():
    import re

    pattern = re.compile(_PREFIX_TEXT)
    assert all(pattern.search(s) for s in ("Module", "Cell.", "Module.fc", "^(?:Module|Cell)\\."))
    assert not any(pattern.search(s) for s in ("Modules", ".jp-Cell-outputArea", "Parameter.", "a Module"))


def test_no_module_outside_frameworks_spells_a_frameworks_module_prefix():
    """Which first name component marks a module (cell) call is framework knowledge: ``frameworks/registry.py``
    answers it (``module_prefixes``, ``is_module_name``, ``Backend.module_prefix``)."""
    assert framework_prefix_strings() == []
