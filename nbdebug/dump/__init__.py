"""msProbe-format dumps: writing them from a live :class:`~nbdebug.Debugger`, and msProbe's API.

* :func:`attach_dump` — make a Debugger write ``step{N}/rank{R}|proc{pid}/{dump,stack,construct}.json``
  (and ``dump_tensor_data/*.pt`` / ``*.npy`` in the ``tensor`` task) as it captures.
* :class:`~nbdebug.dump.precision.PrecisionDebugger` — msProbe's ``PrecisionDebugger`` API on top of it
  (``nbdebug.PrecisionDebugger``).
* :func:`~nbdebug.dump.journal.recover` — rebuild a step's JSON after a crash.

What is written, and what is not:

* the entries msProbe writes, in its format: the same names (root module unnamed, ``parameters_grad.N``,
  the optimizer's ops as ``Tensor.add_.N.forward``), key order, ``indent=1``, statistics computed as
  msProbe computes them, ``data_name`` / ``md5`` (CRC32) fields, ``null`` for missing gradients;
* NOT nbdebug's own graph nodes (``Parameter.*``, ``Input.*``, ``Constant.*``, ``Optimizer.*.step.*``):
  msProbe's compare would see unknown entries; they remain in the live session only;
* known differences: msProbe loses ``Module.X.backward.N`` of a module whose output is changed in place
  afterwards (a hook limitation); nbdebug writes it. msProbe's md5 of a tensor later modified in place is
  racy; nbdebug's is the value at capture time. Tensor files hold CPU tensors.
"""

from __future__ import annotations

from typing import Any

from ..features import register
from .config import ConfigError, DumpConfig
from .journal import recover
from .writer import DumpWriter

__all__ = ["ConfigError", "DumpConfig", "DumpWriter", "attach_dump", "io_for", "recover"]

register("attach_dump", __name__, "attach_dump")  # Debugger(dump_dir=..., config=...)


def io_for(debugger: Any) -> Any:
    """The framework dump I/O for ``debugger``'s adapter (imports the framework's module only)."""
    from ..frameworks.registry import backend_named

    return backend_named(debugger.session.framework).dump_io(debugger._adapter)


def attach_dump(debugger: Any, dump_dir: str | None = None, task: str | None = None, config: Any = None) -> DumpWriter:
    """Make ``debugger`` write an msProbe dump of everything it captures; returns the :class:`DumpWriter`.

    ``dump_dir`` (or the config's ``dump_path``) receives ``step{N}/...``; ``task`` is ``"statistics"`` or
    ``"tensor"`` (default: the config's, else statistics); ``config`` is an msProbe ``config.json`` path or
    dict (step/rank lists, scope, list, data_mode, summary_mode ...). The config's ``level``, when given,
    must be the debugger's. ``writer.close()`` (or ``debugger.close()`` once wired) finalizes the last step.

    >>> import tempfile, os, torch, nbdebug
    >>> model = torch.nn.Sequential(torch.nn.Linear(3, 2))
    >>> dbg = nbdebug.Debugger(model, level="L0")
    >>> w = attach_dump(dbg, tempfile.mkdtemp(), task="tensor")
    >>> model(torch.ones(1, 3)).sum().backward(); dbg.step()
    >>> sorted(os.listdir(os.path.join(w.last_dir, "dump_tensor_data")))[:2]
    ['Module.0.Linear.backward.0.input.0.pt', 'Module.0.Linear.forward.0.input.0.pt']
    >>> w.close(); dbg.close()
    """
    cfg = DumpConfig.load(config, task=task, dump_path=dump_dir)
    given_level = None
    if isinstance(config, dict):
        given_level = config.get("level")
    elif config is not None and not isinstance(config, DumpConfig):
        import json

        with open(config, encoding="utf-8") as f:
            raw = json.load(f)
        given_level = raw.get("level") if isinstance(raw, dict) else None
    elif isinstance(config, DumpConfig):
        given_level = config.level
    if given_level is not None and given_level != debugger.level:
        raise ConfigError(f"{cfg.source}: level {given_level!r} differs from the Debugger's level "
                          f"{debugger.level!r}; create the Debugger with level={given_level!r}")
    return DumpWriter(debugger.session, io_for(debugger), None, None, cfg, level=debugger.level)
