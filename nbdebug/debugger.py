"""``Debugger``: attach to a model, capture every step, read statistics and tensors.

>>> import torch, nbdebug
>>> model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
>>> dbg = nbdebug.Debugger(model, level="L0")
>>> model(torch.ones(2, 4)).sum().backward()
>>> dbg.step()
>>> dbg.stats("Module.0.Linear.forward.0", "output.0", step=0)["shape"]
(2, 3)
>>> dbg.close()
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Mapping
from typing import Any

import numpy as np

from .control import Controller, EventHub, State
from .features import PanelOwner, feature
from .frameworks.core import gc_tuning
from .frameworks.registry import backend_for_model
from .session.graph import Graph
from .session.level import Level
from .session.session import Session
from .watch.loss_scale import LossScaleTracker
from .watch.reader import Reader
from .watch.watchpoints import WatchManager, count_hits

_ATTACHED: dict[int, tuple[weakref.ref, weakref.ref]] = {}  # id(model) -> (model, Debugger)
#: the watchpoint conditions that read the monitor series (all a level="monitor" Debugger can check)
MONITOR_CONDITIONS = ("TO", "SPIKE", "DRIFT", "STALL", "ODD_RANK")  # TO: NaN/Inf in a monitor series
_LAST: list[weakref.ref | None] = [None]


def last_debugger() -> Debugger | None:
    """The most recently created live Debugger (for ``%nbdebug``)."""
    ref = _LAST[0]
    dbg = ref() if ref is not None else None
    return dbg if dbg is not None and not dbg.closed else None


def check_budget(value: Any) -> int:
    """``memory_budget`` as an int of bytes; a clear ``TypeError``/``ValueError`` for anything else.

    >>> check_budget(2**20)
    1048576
    >>> check_budget("1MiB")
    Traceback (most recent call last):
    ...
    TypeError: memory_budget must be a number of bytes (e.g. 512 * 2**20), got the str '1MiB'

    A float is taken when it is a whole number of bytes (``5e8``); a fraction of a byte is refused:

    >>> check_budget(5e8)
    500000000
    >>> check_budget(1.5)
    Traceback (most recent call last):
    ...
    ValueError: memory_budget must be a whole number of bytes (e.g. 512 * 2**20), got 1.5
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"memory_budget must be a number of bytes (e.g. 512 * 2**20), got the "
                        f"{type(value).__name__} {value!r}")
    if not np.isfinite(value) or value < 0:
        raise ValueError(f"memory_budget must be a finite number of bytes >= 0, got {value!r}")
    if value != int(value):
        raise ValueError(f"memory_budget must be a whole number of bytes (e.g. 512 * 2**20), got {value!r}")
    return int(value)


def check_window(value: Any) -> int:
    """``stats_window`` as an int >= 1."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"stats_window must be an int >= 1 (finished steps that keep full statistics), "
                         f"got {value!r}")
    return int(value)


def _replay_options(window: Any, budget: Any, on_hit: Any, memory_budget: int) -> tuple[int, int | None]:
    """``(replay_window, replay_budget)`` checked; ``replay_budget`` None is ``memory_budget``."""
    if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 0:
        raise ValueError(f"replay_window must be an int >= 0 (steps whose pre-step state is kept), got {window!r}")
    if on_hit not in ("pause", "replay"):
        raise ValueError(f"on_hit must be 'pause' or 'replay', got {on_hit!r}")
    return int(window), memory_budget if budget is None else check_budget(budget)


class Debugger(Reader, PanelOwner):
    """A live debugging session on one model.

    Parameters
    ----------
    model: the ``torch.nn.Module`` to watch.
    level: ``"L0"`` (module calls), ``"L1"`` (every op), ``"mix"`` (both) or ``"monitor"`` (no graph,
        statistics or values: only the per-step norms of ``session.monitor``, which every level records; a
        few percent of the step — README "Monitor level").
    capture: start capturing at once (``dbg.capture = False`` pauses capture; hooks stay attached).
    memory_budget: bytes of tensor values kept for the current and previous step (default 512 MiB).
    retain: keep tensor values at all (statistics are always kept).
    check: when watchpoints are evaluated — ``"step"`` (at the end of every step; a hit pauses there
        with all hits of the step) or ``"node"`` (right after each watched node; a hit pauses at it).
    dump_dir, task, config: write an msProbe-format dump (``task`` "statistics" or "tensor"; ``config`` an
        msProbe config.json path or dict with its filters).
    stats_window: how many finished steps keep their full statistics tables (default 8); older steps
        keep a compact per-tensor history (max, min, mean, norm, NaN/Inf count: :meth:`timeline`).
    benign_nonfinite: node names or globs whose NaN/±Inf is intended (e.g. a decoding mask returned beside
        the loss): :meth:`first_nonfinite` skips them. ±Inf that the model absorbs (an attention mask before
        its softmax) needs no entry: it does not propagate, so it is not reported.
    replay_window, replay_budget, on_hit: steps run through a step function (:meth:`step_fn`) keep the state
        they start from, for the last ``replay_window`` steps (0: none), each under ``replay_budget`` bytes
        (default ``memory_budget``; a larger state is not kept, with a warning); ``on_hit="replay"``
        replays a hit's step at ``mix`` before pausing (:attr:`replayed`). See :meth:`replay`.
    graph_every: MindSpore GRAPH mode only: capture every k-th run of the training graph (MindSpore's dump
        runs for those only; the others are steps with no statistics, and watchpoints see captured steps
        only). Default 1: every step. Fixed for the process by its first GRAPH-mode Debugger.
    """

    def __init__(self, model: Any, level: str = "L0", *, capture: bool = True,
                 memory_budget: int = 512 * 2**20, retain: bool = True, retain_copy: bool = False,
                 check: str = "step", dump_dir: str | None = None, task: str | None = None,
                 config: Any = None, stats_window: int = 8, benign_nonfinite: Any = (),
                 graph_every: int = 1, replay_window: int = 1, replay_budget: int | None = None,
                 on_hit: str = "pause") -> None:
        if check not in ("step", "node"):
            raise ValueError(f"check must be 'step' or 'node', got {check!r}")
        self._replay_opts = _replay_options(replay_window, replay_budget, on_hit, memory_budget)
        self.on_hit = on_hit
        self._replay: Any = None  # nbdebug.replay.Keeper, made by the first step_fn
        #: the last step replayed on a hit (``on_hit="replay"``), and why the last such replay failed
        self.replayed: Any = None
        self.replay_error: str | None = None
        memory_budget = check_budget(memory_budget)
        stats_window = check_window(stats_window)
        self.check = check
        self.benign_nonfinite = (benign_nonfinite,) if isinstance(benign_nonfinite, str) else tuple(benign_nonfinite)
        self.backend = backend_for_model(model)
        prev_model, prev = _ATTACHED.get(id(model), (lambda: None, lambda: None))
        if prev_model() is model and prev() is not None and not prev().closed:
            raise RuntimeError(
                f"a Debugger is already attached to this {type(model).__name__}; call close() on it first")
        self.level = level
        self.closed = False
        if level not in self.backend.levels:
            raise ValueError(f"unknown level {level!r}; choose one of {', '.join(self.backend.levels)}")
        self.level = Level(level)
        version, device = self.backend.info(model)
        self.session = Session(framework=self.backend.name, framework_version=version, device=device,
                               memory_budget=memory_budget, stats_window=stats_window)
        self.session.api_parameters = self.backend.api_parameters  # a dump's slot names answer too (slot_of)
        self._adapter = self.backend.adapter(model, level, self.session, retain=retain, retain_copy=retain_copy,
                                             graph_every=graph_every)
        # fewer young collections while capturing (see gc_tuning); let go at close or when collected
        self._gc_release = weakref.finalize(self, gc_tuning.hold())
        self.session.store.keep_unpinned = bool(retain)
        self.dump = None  # DumpWriter when dumping (msProbe layout); finalized before watchpoints pause
        try:
            self._attach(model, capture, dump_dir, task, config)
        except BaseException:  # the model is hooked by now: unhook it, or no later Debugger could attach
            self.closed = True
            try:
                if self.dump is not None:
                    self.dump.close()
            finally:
                self._adapter.close()
                self._gc_release()
                entry = _ATTACHED.get(id(model))
                if entry is not None and entry[1]() is self:
                    del _ATTACHED[id(model)]
            raise

    def _attach(self, model: Any, capture: bool, dump_dir: str | None, task: str | None, config: Any) -> None:
        self._adapter.capturing = capture
        _ATTACHED[id(model)] = (weakref.ref(model), weakref.ref(self))
        self._model_id = id(model)
        self.hub = EventHub()
        self._ctl = Controller(self.hub, in_optimizer=lambda: self._adapter.section == "optimizer",
                               node_exists=lambda name: name in self.session.graph.nodes,
                               on_thread_exit=self._thread_exit)
        self._node_sub: Any = None
        self.watchpoints = WatchManager(self.session)
        self.watchpoints.benign = self.benign_nonfinite
        self.loss_scale = LossScaleTracker()
        self._ls_probe: Any = None
        if dump_dir is not None or config is not None:
            if not self.level.records_tensors:
                raise ValueError("level='monitor' records no tensors, so it writes no dump: use L0, L1 or mix "
                                 "with dump_dir / config")
            self.dump = feature("attach_dump")(self, dump_dir, task, config)
        self.session.subscribe("step", self._on_step)
        _LAST[0] = weakref.ref(self)
        feature("announce")(self)  # JupyterLab status item and commands; no-op outside a kernel

    # -- events from the session (training thread) ------------------------------------------------
    def _on_node(self, node: Any) -> None:
        self._ctl.at_node(node.name, self._check_node(node))

    def _check_node(self, node: Any) -> bool:
        if self.check != "node" or not self.watchpoints.watchpoints:
            return False
        new = self.watchpoints.check_node(node, self.session.step_index)
        for h in new:
            self.hub.emit("hit", h)
        return any(h.hits for h in new)

    def _on_step(self, step: int) -> None:
        hits = self._check_step(step)
        if self._replay is not None:  # on_hit="replay": the hit's step is replayed before the pause
            hits = self._replay.step_ended(step, hits, self.on_hit)
        self.hub.emit("step", step)
        self._ctl.at_step_end(step, hits)

    def _check_step(self, step: int) -> int:
        if not self.watchpoints.watchpoints or step in self.session.skipped:  # sampled out: nothing to check
            return 0
        before = {(h.watchpoint, h.node, h.slot) for h in self.watchpoints.hits if h.step == step}
        found = self.watchpoints.check(step)
        new = [h for h in found if (h.watchpoint, h.node, h.slot) not in before]
        for h in new:
            self.hub.emit("hit", h)
        return count_hits(new)

    def _thread_exit(self) -> None:
        if self._node_sub is not None:
            self._node_sub()
            self._node_sub = None
        self._adapter.thread_exit()

    # -- watchpoints (the rest is Reader's) ------------------------------------------------------
    def watch(self, condition: str, nodes: Any = None, **params: Any) -> Any:
        """As :meth:`Reader.watch`; at ``level="monitor"`` only the conditions over the monitor series
        (temporal: SPIKE, DRIFT, STALL, ODD_RANK) have something to check: any other is a ``ValueError``."""
        if not self.level.records_tensors and str(condition).upper() not in MONITOR_CONDITIONS:
            raise ValueError(f"watchpoint {condition!r} checks tensors, and level='monitor' records none (only the "
                             f"per-step monitor series): use {', '.join(MONITOR_CONDITIONS)} on the series, or "
                             f"attach at level L0, L1 or mix")
        return super().watch(condition, nodes, **params)

    def _watch_changed(self) -> None:
        if self.check == "node" and self._node_sub is None:
            self._node_sub = self.session.subscribe("node", self._on_node)

    # -- training control -------------------------------------------------------------------------
    def run(self, fn: Any, *args: Any, block: bool = False, paused: bool = False, steps: int | None = None,
            **kwargs: Any) -> None:
        """Run ``fn(*args, **kwargs)`` — your training loop — on a worker thread and return at once.

        The notebook stays responsive; pause, continue, step and inspect while it trains. ``block=True``
        runs in this thread (for scripts): nothing else could resume a pause there, so a hit is kept
        without pausing (a warning says so once) unless a notebook is attached to this process
        (``nbdebug.attach``); ``paused=True`` waits for :meth:`cont` before the first node;
        ``steps=N`` pauses after N steps. An exception in ``fn`` sets :attr:`state` to ``failed`` and
        keeps the traceback in :attr:`error`.

        >>> import torch, nbdebug
        >>> model = torch.nn.Linear(2, 1)
        >>> dbg = nbdebug.Debugger(model)
        >>> dbg.run(lambda: model(torch.ones(1, 2)).sum().backward())
        >>> dbg.wait(10)
        <State.FINISHED: 'finished'>
        >>> dbg.close()
        """
        if self.closed:
            raise RuntimeError("this Debugger is closed")
        if self._node_sub is None:
            self._node_sub = self.session.subscribe("node", self._on_node)
        self._ctl.resumable_elsewhere = getattr(self, "remote", None) is not None  # a notebook attached to us
        try:
            self._ctl.run(fn, *args, block=block, paused=paused, steps=steps, **kwargs)
        except BaseException:
            if self._ctl.state not in (State.RUNNING, State.PAUSED) and self._node_sub is not None:
                self._node_sub()
                self._node_sub = None
            raise

    def end_abandoned_step(self) -> bool:
        """Close the step a notebook cell left open when it raised inside it (the kernel's Interrupt in a plain
        training loop, an error): that iteration is over, so the next cell's training starts a step of its own
        instead of being recorded into it. Call it from the thread that trained (a shown panel does, once the
        cell ended); False when no step is open, or training runs under :meth:`run` (its thread closes its own)."""
        if self.closed or self._ctl.state in (State.RUNNING, State.PAUSED) or not len(self.session.recorder):
            return False
        adapter = self._adapter
        (getattr(adapter, "interrupted", None) or adapter.thread_exit)()
        return True

    def adopt(self) -> None:
        """Control training that runs in the calling thread without :meth:`run` (a script's plain loop):
        pauses, steps and terminate act on it as on a worker (used by ``nbdebug.attach``)."""
        if self._node_sub is None:
            self._node_sub = self.session.subscribe("node", self._on_node)
        self._ctl.adopt()

    def cont(self, steps: int | None = None) -> None:
        """Continue: run ``steps`` steps, or (None) until a watchpoint hit or the end."""
        self._ctl.cont(steps)

    def pause(self) -> None:
        """Pause at the next node boundary."""
        self._ctl.pause()

    def pause_after(self, step: int | None) -> None:
        """Pause at the boundary after step ``step`` (or the next one when already past it); None forgets it."""
        self._ctl.pause_after(step)

    def terminate(self) -> None:
        """Stop training cleanly; the worker thread ends and the model stays consistent."""
        self._ctl.terminate()

    def run_to(self, node: str) -> None:
        """Pause right after ``node`` executes (within at most one step)."""
        self._ctl.run_to(node)

    def next_node(self) -> None:
        """Execute exactly one more node, then pause."""
        self._ctl.next_node()

    def wait(self, timeout: float | None = None) -> State:
        """Block until training is paused or over, or ``timeout`` seconds pass; returns the state."""
        return self._ctl.wait(timeout)

    @property
    def pausing(self) -> bool:
        """Whether hits, pause requests and step counts stop training (``False`` while nobody could resume
        it: a remote process whose notebook stayed away past its pause timeout); terminate always acts."""
        return self._ctl.pausing

    @pausing.setter
    def pausing(self, on: bool) -> None:
        self._ctl.pausing = bool(on)

    @property
    def state(self) -> State:
        """idle, running, paused, finished, terminated or failed."""
        return self._ctl.state

    @property
    def current_node(self) -> str | None:
        """The node training is paused at (None while running or when paused at a step boundary)."""
        return self._ctl.current_node

    @property
    def pause_reason(self) -> str:
        return self._ctl.pause_reason

    @property
    def error(self) -> str | None:
        """Traceback of the exception that ended the training function, if any."""
        return self._ctl.error

    def on(self, event: str, callback: Any) -> Any:
        """Subscribe to ``state``, ``step``, ``hit``, ``node`` or ``error`` events; returns a
        :class:`~nbdebug.session.handle.Handle` (``.remove()``, ``with``, or called). In a Jupyter kernel
        callbacks run on the kernel's event loop, at most ~10 per second."""
        return self.hub.on(event, callback)

    # -- loss scale -------------------------------------------------------------------------------
    def track_loss_scale(self, scaler: Any) -> LossScaleTracker:
        """Record each step's loss scale and overflow flag from a ``torch.amp.GradScaler``.

        One host read per step (at ``scaler.update()``); an overflowing step skips ``optimizer.step()``,
        so the step boundary is taken at the scaler's update instead."""
        if self._ls_probe is not None:
            self._ls_probe.close()

        def boundary(_record: Any) -> None:
            if self._adapter.auto_step and len(self.session.recorder):
                self._adapter.end_step()

        self._ls_probe = self.backend.loss_scale_probe(scaler, self.loss_scale, step=lambda: self.current_step,
                                                      on_update=boundary)
        self._ls_probe.on_scale = self._adapter.note_scaled  # the monitor's loss and loss_scale
        return self.loss_scale

    def record_loss(self, loss: Any) -> None:
        """The loss of the step in progress for the monitor's ``Run.loss`` (a single-value tensor or number;
        no host read). Without it the monitor takes the loss given to a tracked GradScaler's ``scale()``,
        else the model's own (a ``loss`` in its output, or a scalar output)."""
        self._adapter.note_loss(loss)

    def loss_scale_history(self) -> list[Any]:
        """Per step: loss scale and whether the step overflowed."""
        return self.loss_scale.history()

    def watch_loss_scale(self, k: int) -> Any:
        """Fire (a hit event, and a pause when training runs under ``run``) when overflow persists for
        ``k`` consecutive steps."""
        return self.loss_scale.watch(k, lambda hit: (self.hub.emit("hit", hit), self._ctl.pause()))

    # -- capture ----------------------------------------------------------------------------------
    @property
    def capture(self) -> bool:
        """Whether hooks record anything (they stay attached either way)."""
        return self._adapter.capturing

    @capture.setter
    def capture(self, on: bool) -> None:
        self._adapter.capturing = bool(on) and not self.closed

    @property
    def graph(self) -> Graph:
        return self.session.graph

    @property
    def step_index(self) -> int:
        """The step in progress (0-based); finished steps are ``0 .. step_index - 1``."""
        return self.session.step_index

    def callback(self) -> Any:
        """The training-loop callback that makes each step of the framework's own trainer a debugger step:
        for MindSpore ``model.train(1, ds, callbacks=[dbg.callback()], dataset_sink_mode=False)`` (a
        :class:`nbdebug.StepCallback`). A ``TypeError`` for a framework whose steps need none (PyTorch: the
        optimizer's step ends a step)."""
        return self.backend.train_callback(self)

    def step(self) -> None:
        """Mark a step boundary (turns off the automatic boundary at ``optimizer.step()``). Called once before
        the training loop, before anything ran, it only turns that off: a loop with several optimizers (a GAN)
        then has one step per iteration from the first one (else the first optimizer's step ended step 0)."""
        a = self._adapter
        if self._replay is not None and self._replay.replaying:
            return  # a replay's run of the step function: the replay ends its own step
        if a.auto_step:
            a.auto_step = False
            if not len(self.session.recorder):
                if self.session.step_index > 1:
                    warnings.warn(
                        f"nbdebug: steps 0..{self.session.step_index - 1} were each ended by an optimizer.step() "
                        "before this first dbg.step(); steps end at dbg.step() only from now on. With several "
                        "optimizers an iteration was split into several steps: call dbg.step() once before the "
                        "training loop (or use @dbg.step_fn) for one step per iteration from the first one",
                        UserWarning, stacklevel=2)
                return  # the optimizer already closed this step, or nothing ran yet (before the loop)
        a.end_step()

    # -- replay (nbdebug/replay/, README "Replay a step") ---------------------------------------------
    def step_fn(self, fn: Any = None, **objects: Any) -> Any:
        """Mark ``fn(*batch)`` — one training step — so that each call keeps the state it starts from (the
        last ``replay_window`` steps) and :meth:`replay` can compute it again. A decorator (``@dbg.step_fn``,
        or ``@dbg.step_fn(optimizers=opt, scalers=scaler, schedulers=sched)`` when they are not in its
        closure); a HuggingFace ``Trainer`` (``dbg.step_fn(trainer)``) has its ``training_step`` kept."""
        if fn is None:
            return lambda f: self.step_fn(f, **objects)
        if self._replay is None:
            self._replay = feature("replay")(self, self._replay_opts[0], self._replay_opts[1])
        if hasattr(fn, "training_step") and hasattr(fn, "create_optimizer"):
            return self._replay.wrap_trainer(fn)
        return self._replay.wrap(fn, **objects)

    @property
    def replay_steps(self) -> list[int]:
        """The steps whose pre-step state is kept (replayable)."""
        return list(self._replay.kept) if self._replay is not None else []

    def replay(self, step: int | str = "last", level: str = "mix", *, strict: bool = False) -> Any:
        """Step ``step`` computed again from its kept state at ``level`` with every tensor retained; the
        live model, optimizer, scaler, RNGs and capture are as before afterwards. Returns a replayed step
        (reader surface, ``panel()``); ``.bitwise`` / ``.mismatches`` say whether it is the original's bits
        (a :class:`~nbdebug.replay.ReplayMismatch` warning, or an error when ``strict``, when not)."""
        if self._replay is None:
            raise feature("replay_refused")("no step function is marked: decorate the training step with "
                                            "@dbg.step_fn so that its pre-step state is kept")
        return feature("replay_run")(self, self._replay.get(step), level, strict=strict)

    def save_repro(self, path: Any, step: int | str = "last", node: str | None = None, *,
                   model_factory: str | None = None) -> Any:
        """A folder reproducing step ``step`` (or, with ``node``, one op of it) in a fresh process: weights,
        optimizer state, batch, RNG states, versions and a generated ``repro.py`` (README "Replay a step")."""
        return feature("save_repro")(self, path, step, node, model_factory=model_factory)

    # -- reading (stats, tensor: Reader's) -------------------------------------------------------
    def stats(self, node: str, slot: str, step: int | str = "current", fields: Any = None) -> Mapping[str, Any]:
        """Statistics of one tensor: ``dtype, shape, count, max, min, mean, abs_mean, norm, zero_count,
        nan_count, pos_inf_count, neg_inf_count``; ``fields`` picks some.

        Full statistics are kept for the last ``stats_window`` finished steps; an older step raises
        ``NotRetainedError`` saying so, unless ``fields`` asks only for what its compact history keeps
        (``max, min, mean, norm, nonfinite_count`` of output tensors)."""
        return self.session.stats(node, slot, step, fields)

    def timeline(self, node: str, slot: str, field: str = "norm") -> tuple[list[int], list[float]]:
        """``(steps, values)``: one statistic of one tensor over every finished step (``max``, ``min``,
        ``mean``, ``norm`` or ``nonfinite_count``)."""
        return self.session.timeline(node, slot, field)

    # -- lifetime ---------------------------------------------------------------------------------
    def close(self) -> None:
        """Detach: remove every hook and mode; the model is as if never attached.

        A training thread still running is terminated first (and waited for, up to 10 s)."""
        if self.closed:
            return
        self._ctl.release()  # training adopted in the foreground (adopt) is over
        if self._ctl.state in (State.RUNNING, State.PAUSED):
            self._ctl.terminate()
            if self._ctl.thread is not None and self._ctl.thread is not __import__("threading").current_thread():
                self._ctl.thread.join(10)
        self.closed = True
        if self.dump is not None:
            self.dump.close()
        if self._ls_probe is not None:
            self._ls_probe.close()
        self._adapter.close()
        self._gc_release()
        entry = _ATTACHED.get(self._model_id)
        if entry is not None and entry[1]() is self:
            del _ATTACHED[self._model_id]

    def __enter__(self) -> Debugger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "attached"
        return (f"<nbdebug.Debugger {self.session.framework} level={self.level} {state} "
                f"step={self.step_index} nodes={len(self.graph)}>")
