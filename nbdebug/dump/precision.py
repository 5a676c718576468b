"""msProbe's ``PrecisionDebugger`` API, backed by a live :class:`~nbdebug.Debugger`.

Swap the import and keep the script::

    # from msprobe.pytorch import PrecisionDebugger, seed_all
    from nbdebug import PrecisionDebugger, seed_all

    debugger = PrecisionDebugger(config_path="./config.json")
    for x, y in loader:
        debugger.start(model)       # L0 / mix need the model; L1 may omit it
        loss = loss_fn(model(x), y)
        loss.backward(); opt.step()
        debugger.stop()
        debugger.step()             # flushes step{N}/rank{R}|proc{pid}/dump.json ...

The output is msProbe's (see :mod:`nbdebug.dump`); the same run is a live nbdebug session:
``debugger.debugger`` is the underlying :class:`~nbdebug.Debugger` (watchpoints, hits, tensors), and a
``PrecisionDebugger`` shown in a notebook cell displays its panel.

Semantics follow msProbe: data is collected between ``start()`` and ``stop()`` (several segments per
step are fine; an API's backward is recorded when its forward was, even after ``stop()``), and written at
``stop()``/``step()``; ``step`` numbers the directories (from ``set_init_step``); the config's ``step`` list
limits which steps are dumped, and past its last step nothing is captured any more. At level ``debug``
only :meth:`save` writes (``debug.json``). Unlike msProbe this class is not a process-wide singleton:
each instance is independent (create one per run).

>>> import tempfile, torch, nbdebug
>>> model = torch.nn.Sequential(torch.nn.Linear(4, 2))
>>> pd = nbdebug.PrecisionDebugger(dump_path=tempfile.mkdtemp(), level="mix")
>>> pd.start(model); model(torch.ones(1, 4)).sum().backward(); pd.stop(); pd.step()
>>> "Module.0.Linear.forward.0" in pd.debugger.graph
True
>>> pd.close()
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator
from typing import Any

from .config import DumpConfig
from .writer import DumpWriter


def _framework_of_value(value: Any) -> str | None:
    """'pytorch' / 'mindspore' for a tensor, model or a structure holding one; None otherwise."""
    stack = [value]
    while stack:
        v = stack.pop()
        mod = type(v).__module__ or ""
        if mod.startswith("torch"):
            return "pytorch"
        if mod.startswith("mindspore"):
            return "mindspore"
        for klass in type(v).__mro__:
            km = klass.__module__ or ""
            if km.startswith("torch.nn"):
                return "pytorch"
            if km.startswith("mindspore.nn"):
                return "mindspore"
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
    return None


def _default_framework() -> str:
    if "torch" in sys.modules or "mindspore" not in sys.modules:
        return "pytorch"
    return "mindspore"


class PrecisionDebugger:
    """msProbe's ``PrecisionDebugger(config_path=None, task=None, dump_path=None, level=None, step=None)``.

    ``config_path``: msProbe ``config.json`` (default: msProbe's defaults — statistics, L1,
    ``./dump_path``); the keyword arguments override it. Bad values raise
    :class:`~nbdebug.dump.config.ConfigError` naming the key.
    """

    def __init__(self, config_path: Any = None, task: str | None = None, dump_path: str | None = None,
                 level: str | None = None, step: Any = None) -> None:
        self.config = DumpConfig.load(config_path, task=task, dump_path=dump_path, level=level, step=step)
        if self.config.dump_path is None:
            self.config.dump_path = "./dump_path"
        self.debugger: Any = None  #: the live nbdebug.Debugger (None until start() with a model, or at level debug)
        self.writer: DumpWriter | None = None
        self.model: Any = None
        self.loop = 0
        self.init_step = 0
        self.finished = False
        self._io: Any = None
        self._framework: str | None = None
        self._custom: dict[tuple[int, str], tuple[Any, Any]] = {}
        self._token_hook: Any = None
        self._rank: int | None = None
        self._rank_given = False

    # -- msProbe API ------------------------------------------------------------------------------
    @property
    def current_step(self) -> int:
        """The step being collected (``step{N}`` directory): ``init_step`` + number of ``step()`` calls."""
        return self.loop + self.init_step

    def start(self, model: Any = None, token_range: list[int] | None = None, rank_id: int | None = None) -> None:
        """Start (or resume) collecting in the current step. ``model`` (a module/cell, or a list of them,
        named ``Module.{i}.…``) is required at L0 and mix; ``token_range=[a, b]`` dumps only the model's
        forward calls a..b (inference); ``rank_id`` names the ``rank{id}`` directory."""
        level = self.config.level
        if rank_id is not None:
            if isinstance(rank_id, bool) or not isinstance(rank_id, int) or rank_id < 0:
                raise ValueError(f"rank_id must be an int >= 0, got {rank_id!r}")
            self._rank, self._rank_given = rank_id, True
        if token_range is not None:
            if (not isinstance(token_range, (list, tuple)) or len(token_range) != 2
                    or not all(isinstance(v, int) and not isinstance(v, bool) for v in token_range)
                    or token_range[0] < 0 or token_range[0] > token_range[1]):
                raise ValueError(f"token_range must be [start, end] with 0 <= start <= end, got {token_range!r}")
            if model is None and self.model is None:
                raise ValueError("token_range needs the model: start(model=..., token_range=[a, b])")
        if level == "debug":
            return  # single-point saving only: save() writes
        if model is not None:
            self._attach(model)
        elif self.debugger is None:
            if level in ("L0", "mix"):
                raise ValueError(f"level {level!r} dumps modules: pass the model, start(model)")
            self._attach(None)
        dbg = self.debugger
        step = self.current_step
        if self.finished or self.config.past_last_step(step):
            self.finished = True
            dbg.capture = False
            return
        rank = self._rank if self._rank_given else self._io.rank()
        if not self.writer.open_step(step, rank):
            dbg.capture = False
            return
        self.writer.recording = True
        if token_range is not None:
            self._set_token_range(list(token_range))
        elif self._token_hook is None:
            dbg.capture = True
            self._io.begin()

    def stop(self) -> None:
        """Stop collecting and write the JSON so far. The backward of APIs recorded before ``stop()`` is still
        recorded when it runs before ``step()`` (msProbe's "forward and backward of a code block"), so the
        live debugger keeps its hooks on until ``step()``; nothing else is written."""
        if self.writer is None:
            return
        self.writer.recording = False
        self.writer.flush()

    def step(self) -> None:
        """End the step: write its files (``debug.json`` at level debug) and move to the next step."""
        if self.debugger is not None:
            self.debugger.capture = False
            self.debugger.step()  # the session's step event finalizes the writer's step
        if self.writer is not None:
            self.writer.finish_step()
        self.loop += 1

    def save(self, variable: Any, name: str, save_backward: bool = True) -> None:
        """Single-point saving (level ``debug``): ``variable`` (tensor, dict, list, tuple, number, str) as
        ``{name}.{n}.debug`` in ``debug.json``, and — with ``save_backward`` — the gradients of its tensors as
        ``{name}_grad.{n}.debug`` when backward computes them. Does nothing at other levels (as msProbe)."""
        if self.config.level != "debug":
            return
        if not isinstance(name, str) or not name:
            raise ValueError(f"save: name must be a non-empty string, got {name!r}")
        if not isinstance(save_backward, bool):
            raise ValueError(f"save: save_backward must be True or False, got {save_backward!r}")
        step = self.current_step
        if not self.config.dumps_step(step):
            return
        if self.writer is None:
            self._make_writer(_framework_of_value(variable) or _default_framework(), adapter=None, session=None)
        rank = self._rank if self._rank_given else self._io.rank()
        if self.writer.step_no != step and not self.writer.open_step(step, rank):
            return
        self.writer.save(variable, name, save_backward)

    def set_init_step(self, step: int) -> None:
        """Number the next step ``step`` (then step+1 ...); call before the training loop."""
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"set_init_step: step must be an int >= 0, got {step!r}")
        self.init_step = step
        self.loop = 0

    def register_custom_api(self, module: Any, api: str, api_prefix: str | None = None) -> None:
        """Record calls of ``module.api`` as one API node ``{api_prefix}.{api}.{n}`` (L1 / mix); the ops it
        runs inside are not recorded separately. ``restore_custom_api`` undoes it."""
        if not hasattr(module, api):
            raise ValueError(f"register_custom_api: {module!r} has no attribute {api!r}")
        if api_prefix is None:
            api_prefix = getattr(module, "__name__", "Custom")
        if not isinstance(api_prefix, str):
            raise ValueError(f"register_custom_api: api_prefix must be a string, got {api_prefix!r}")
        key = (id(module), api)
        original = self._custom[key][1] if key in self._custom else getattr(module, api)
        framework = self._framework or _framework_of_value(module) or (
            "mindspore" if (getattr(module, "__name__", "") or "").startswith("mindspore") else _default_framework())
        if framework == "mindspore":
            from ..frameworks.mindspore.io import custom_api_wrapper
        else:
            from ..frameworks.torch.io import custom_api_wrapper
        wrapper = custom_api_wrapper(self._adapter, original, api_prefix, api)
        self._custom[key] = (module, original)
        setattr(module, api, wrapper)

    def restore_custom_api(self, module: Any, api: str) -> None:
        """Put back the original ``module.api`` replaced by :meth:`register_custom_api`."""
        if not hasattr(module, api):
            raise ValueError(f"restore_custom_api: {module!r} has no attribute {api!r}")
        entry = self._custom.pop((id(module), api), None)
        if entry is not None:
            setattr(module, api, entry[1])

    # -- step loops -------------------------------------------------------------------------------
    def steps(self, iterable: Iterable[Any], model: Any = None) -> Iterator[Any]:
        """The PyTorch-loop equivalent of msProbe's ``MsprobeStep``: ``start`` before each item, ``stop`` and
        ``step`` after the loop body::

            for x, y in debugger.steps(loader, model):
                train_step(x, y)
        """
        for item in iterable:
            self.start(model)
            try:
                yield item
            finally:
                self.stop()
                self.step()

    # -- nbdebug ----------------------------------------------------------------------------------
    def _adapter(self) -> Any:
        dbg = self.debugger
        return None if dbg is None or dbg.closed else dbg._adapter

    def _make_writer(self, framework: str, adapter: Any, session: Any) -> None:
        if framework == "mindspore":
            from ..frameworks.mindspore.io import MindSporeIO as IO
        else:
            from ..frameworks.torch.io import TorchIO as IO
        self._framework = framework
        self._io = IO(adapter)
        self.writer = DumpWriter(session, self._io, None, None, self.config)

    def _attach(self, model: Any) -> None:
        if self.debugger is not None:
            if model is None or model is self.model:
                return
            raise ValueError("this PrecisionDebugger already watches another model; create a new one for it")
        from ..debugger import Debugger

        framework = _framework_of_value(model) if model is not None else _default_framework()
        if isinstance(model, (list, tuple)):
            model = self._container(model, framework)
        if model is None:
            if framework == "mindspore":
                from ..frameworks.mindspore.io import stand_in_model
            else:
                from ..frameworks.torch.io import stand_in_model
            model = stand_in_model()
        self.model = model
        dbg = Debugger(model, level=self.config.level, capture=False)
        dbg._adapter.auto_step = False  # steps end at PrecisionDebugger.step(), as in msProbe
        self.debugger = dbg
        self._make_writer(framework or "pytorch", dbg._adapter, dbg.session)

    @staticmethod
    def _container(models: Any, framework: str | None) -> Any:
        """A list of models is dumped as ``Module.{i}.…`` (``Cell.{i}.…``): wrap them in a list module."""
        if framework == "mindspore":
            import mindspore.nn as msnn

            return msnn.CellList(list(models))
        import torch

        return torch.nn.ModuleList(list(models))

    def _set_token_range(self, token_range: list[int]) -> None:
        dbg, io = self.debugger, self._io
        dbg.capture = False
        if self._token_hook is not None:
            self._token_hook.remove()
        count = [0]

        def on_call() -> None:
            n = count[0]
            count[0] += 1
            on = token_range[0] <= n <= token_range[1]
            dbg.capture = on
            if on:
                io.begin()

        self._token_hook = io.on_model_call(self.model, on_call)

    def close(self) -> None:
        """Finalize the open step, restore custom APIs and detach from the model."""
        for (_, api), (module, original) in list(self._custom.items()):
            setattr(module, api, original)
        self._custom.clear()
        if self._token_hook is not None:
            self._token_hook.remove()
            self._token_hook = None
        if self.writer is not None:
            self.writer.close()
        if self.debugger is not None:
            self.debugger.close()

    def _ipython_display_(self) -> None:
        if self.debugger is not None:
            self.debugger._ipython_display_()
            return
        from IPython.display import display

        display(repr(self))

    def __repr__(self) -> str:
        where = os.path.join(self.config.dump_path or ".", f"step{self.current_step}")
        return (f"<nbdebug.PrecisionDebugger task={self.config.task} level={self.config.level} "
                f"step={self.current_step} {where}>")


def MsprobeStep(debugger: PrecisionDebugger) -> Any:  # noqa: N802 - msProbe's name
    """msProbe's ``MsprobeStep`` callback for ``mindspore.train.Model.train``: ``start()`` at each step begin,
    ``stop()`` + ``step()`` at each step end. (PyTorch loops: :meth:`PrecisionDebugger.steps`.)"""
    from ..frameworks.mindspore.io import step_callback

    return step_callback(debugger)
