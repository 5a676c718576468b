"""pytest plugin for the torch-only numpy-2 run of ``make test`` only: ``PYTHONPATH=tests pytest -p torch_only``.

That environment (``.venv-np2``) has torch and numpy 2 but no MindSpore, msProbe, JupyterLab or browser.
With this plugin, a test module or package module whose imports (its own, and those of the helper modules
it imports from ``tests/``) name a package the environment lacks is not collected, and one line says which
modules were left out and for want of what. The main environment never loads it: there a missing package
is a collection error, as everything must run.

Give pytest directories (``nbdebug tests``): it asks plugins about what it finds in them, never about a file
named on the command line. Scripts a test module holds as strings (run in a subprocess) count as its code.
For ``nbdebug/`` modules (their doctests) only module-level imports count: a lazy import inside a function
that a doctest does not reach is no reason to skip the module's examples.
"""

from __future__ import annotations

import ast
import importlib.util
from functools import cache
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
_excluded: dict[str, str] = {}
_left_to_main: list[str] = []


def _imported(tree: ast.AST, top_level_only: bool) -> set[str]:
    nodes = ast.iter_child_nodes(tree) if top_level_only else ast.walk(tree)
    names: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
        elif not top_level_only and isinstance(node, ast.Constant) and "import" in str(node.value):
            try:  # a script a test writes out and runs in a subprocess counts as the test's code
                names |= _imported(ast.parse(node.value), top_level_only=False)
            except SyntaxError:
                pass
    return names


@cache
def _available(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


@cache
def _missing(path: Path, top_level_only: bool = False) -> frozenset[str]:
    """Packages the module at ``path`` imports (through tests/ helpers too) that cannot be found here."""
    in_tests = path.parent == TESTS
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names = _imported(tree, top_level_only=top_level_only or not in_tests)
    plugins: set[str] = set()
    if in_tests:
        # `from ms_fixtures import …` reaches another file of tests/ (all its imports count); a plugin
        # (pytest_plugins = ["browser"]) is loaded for every module, so only its module-level imports count
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "pytest_plugins" for t in node.targets):
                plugins.update(e.value for e in getattr(node.value, "elts", []) if isinstance(e, ast.Constant))
    missing: set[str] = set()
    if not in_tests:  # a package module's top-level relative imports (``from .ops import …``) count too
        for node in ast.iter_child_nodes(tree):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = path.parent
                for _ in range(node.level - 1):
                    base = base.parent
                target = base.joinpath(*(node.module or "").split(".")) if node.module else base
                for cand in (target.with_suffix(".py"), target / "__init__.py"):
                    if cand.is_file() and cand != path:
                        missing |= _missing(cand, True)
                        break
    for name in names | plugins:
        helper = TESTS / f"{name}.py"
        if in_tests and helper.is_file() and helper != path:
            missing |= _missing(helper, top_level_only or name in plugins or name == "conftest")
        elif name != "__future__" and not (ROOT / name).is_dir() and not helper.is_file() and not _available(name):
            missing.add(name)
    return frozenset(missing)


def pytest_ignore_collect(collection_path: Path, config):
    if collection_path.suffix != ".py":
        return None
    path = Path(collection_path).resolve()
    if path.name == "conftest.py":
        return None
    missing = _missing(path)
    if missing:
        _excluded[str(path.relative_to(ROOT))] = ", ".join(sorted(missing))
        return True
    return None


def pytest_collection_modifyitems(config, items):
    """A test marked ``own_environment`` (tests/conftest.py) builds the environment it checks and uses nothing
    of this one: its result here would be the main run's, so it is left to the main run (and named)."""
    own = [item for item in items if item.get_closest_marker("own_environment")]
    if own:
        _left_to_main.extend(item.nodeid for item in own)
        config.hook.pytest_deselected(items=own)
        items[:] = [item for item in items if not item.get_closest_marker("own_environment")]


def pytest_report_collectionfinish(config, start_path, items):
    wants = sorted(set(v for m in _excluded.values() for v in m.split(", ")))
    return (f"torch_only: {len(_excluded)} modules not collected, they import what this environment lacks "
            f"({', '.join(wants) or 'nothing'}): {', '.join(sorted(_excluded)) or 'none'}; "
            f"left to the main run (own_environment): {', '.join(_left_to_main) or 'none'}")
