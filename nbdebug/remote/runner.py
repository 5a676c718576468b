"""``python -m nbdebug.run [options] train.py args...``: run a training script attached to a notebook's
listener without editing it.

The script runs as ``__main__`` (like ``python train.py``). The model is found without help: when
torch or mindspore is imported, the runner arranges that the first *top-level* call of a module/cell
that has parameters (the training loop's ``model(x)``; a loss module without parameters is not taken)
attaches ``nbdebug.attach(model)`` to it, in that call, before it runs. A script that calls
``nbdebug.attach(model)`` itself is left alone (the first call then finds a Debugger attached).

Options (else the environment): ``--connect host:port`` (``NBDEBUG_CONNECT``), ``--token``
(``NBDEBUG_TOKEN``), ``--level L0|L1|mix`` (``NBDEBUG_LEVEL``). Under torchrun use
``torchrun ... -m nbdebug.run train.py``: each rank attaches and says its rank in its hello.

>>> parse(["--level", "L1", "train.py", "--epochs", "2"])
({'level': 'L1'}, 'train.py', ['--epochs', '2'])
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import runpy
import sys
from typing import Any

from .attach import ENV_CONNECT, ENV_LEVEL, ENV_TOKEN, settings

USAGE = "usage: python -m nbdebug.run [--connect HOST:PORT] [--token TOKEN] [--level L0|L1|mix] script.py [args...]"
OPTIONS = {"--connect": "connect", "--token": "token", "--level": "level"}


def parse(argv: list[str]) -> tuple[dict[str, str], str, list[str]]:
    """``(options, script, script_args)``; ``SystemExit(2)`` with the usage on a mistake."""
    opts: dict[str, str] = {}
    i = 0
    while i < len(argv) and argv[i].startswith("--"):
        flag, eq, value = argv[i].partition("=")
        if flag not in OPTIONS:
            raise SystemExit(f"nbdebug.run: unknown option {flag}\n{USAGE}")
        if not eq:
            i += 1
            if i >= len(argv):
                raise SystemExit(f"nbdebug.run: {flag} needs a value\n{USAGE}")
            value = argv[i]
        opts[OPTIONS[flag]] = value
        i += 1
    if i >= len(argv):
        raise SystemExit(f"nbdebug.run: no script given\n{USAGE}")
    return opts, argv[i], argv[i + 1:]


class _AfterImport(importlib.abc.MetaPathFinder):
    """Calls ``callback(name)`` right after the top-level package ``name`` finishes importing."""

    def __init__(self, names: tuple[str, ...], callback: Any) -> None:
        self.names, self.callback = set(names), callback

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name not in self.names:
            return None
        self.names.discard(name)
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            if self.names:
                sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run, callback = spec.loader.exec_module, self.callback

        def exec_module(module: Any) -> None:
            run(module)
            callback(name)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _arm(framework: str) -> None:
    from ..debugger import last_debugger
    from ..frameworks.first_call import on_first_model_call
    from .attach import attach

    def first(model: Any) -> None:
        if last_debugger() is None:  # the script did not attach by itself
            attach(model)

    on_first_model_call(framework, first)


def main(argv: list[str] | None = None) -> None:
    opts, script, args = parse(list(sys.argv[1:] if argv is None else argv))
    for key, env in (("connect", ENV_CONNECT), ("token", ENV_TOKEN), ("level", ENV_LEVEL)):
        if key in opts:
            os.environ[env] = opts[key]
    try:
        settings()
    except ValueError as e:
        raise SystemExit(f"nbdebug.run: {e}") from None
    if not os.path.isfile(script):
        raise SystemExit(f"nbdebug.run: no such script {script!r}")
    from ..frameworks.registry import backends

    packages = [b.packages[0] for b in backends()]  # the frameworks' top-level packages, by the registry
    already = [fw for fw in packages if fw in sys.modules]
    for fw in already:
        _arm(fw)
    pending = tuple(fw for fw in packages if fw not in already)
    if pending:
        sys.meta_path.insert(0, _AfterImport(pending, _arm))
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    runpy.run_path(script, run_name="__main__")
