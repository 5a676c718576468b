"""What a step is, and the pre-step state kept for the last ``replay_window`` steps of a Debugger.

A step is one call of a function marked with ``@dbg.step_fn`` (forward, backward, optimizer step; the
model, optimizers, ``GradScaler`` and LR schedulers reached through its closure or globals, or named:
``dbg.step_fn(optimizers=opt, scalers=scaler)``), or one optimizer step of a HuggingFace ``Trainer``
given to ``dbg.step_fn(trainer)`` (its ``training_step`` calls of that step are kept and replayed:
forward and backward; the optimizer step is the Trainer's own loop and is not replayed), or one step of a
MindSpore ``mindspore.train.Model`` given to ``dbg.step_fn(model)`` (its ``train`` runs with the backend's
callback keeping the batch; the replay runs the Model's train network: forward, backward, update). At each call
the framework's backend keeps the pre-step state (``frameworks/<fw>/replay_state.py``); the window drops
the oldest step's state and its buffers take the next copies. A step whose state is larger than
``replay_budget`` bytes is not kept (``replay`` of it says so).

>>> import torch, nbdebug
>>> model = torch.nn.Linear(2, 1); opt = torch.optim.SGD(model.parameters(), lr=0.1)
>>> dbg = nbdebug.Debugger(model, level="L0")
>>> @dbg.step_fn
... def train_step(x):
...     opt.zero_grad(); loss = model(x).sum(); loss.backward(); opt.step(); return loss
>>> _ = train_step(torch.ones(3, 2)); _ = train_step(torch.ones(3, 2))
>>> dbg.replay_steps
[1]
>>> dbg.replay(1).bitwise
True
>>> dbg.close()
"""

from __future__ import annotations

import functools
import threading
import warnings
from collections import OrderedDict
from typing import Any

from ..session.store import NotRetainedError
from .result import ReplayRefused

#: what the replay of a HuggingFace Trainer's step covers (a note of its result)
TRAINER_COVERS = ("this replay covers the Trainer's training_step calls of the step (forward, loss and backward, "
                  "as many as the step accumulated) from the pre-step state; the Trainer's own loop after them "
                  "(gradient clipping, optimizer.step, lr_scheduler.step, zero_grad) is not replayed: its "
                  "optimizer node is not compared")


class Kept:
    """One step's kept state: the framework's pre-step state and the step function's calls in the step."""

    def __init__(self, step: int, fn: Any, state: Any) -> None:
        self.step = step
        self.fn = fn
        self.state = state
        self.more: list[tuple[tuple, dict]] = []  # later calls of the same step (gradient accumulation)
        self.outputs: list[Any] = []  # what each live call returned (its loss), by reference
        self.problems = list(state.problems)
        self.objects: dict[str, list[Any]] = {}  # the optimizers, scalers and schedulers the step uses
        self.covers = ""  # what a replay of it leaves out (a Trainer's step: its own loop's optimizer step)

    def calls(self) -> list[tuple[tuple, dict]]:
        return [(self.state.args, self.state.kwargs)] + self.more

    @property
    def nbytes(self) -> int:
        return self.state.nbytes


class Keeper:
    """The window of kept steps of one Debugger, and the step-function wrapper that fills it."""

    def __init__(self, dbg: Any, window: int, budget: int | None) -> None:
        self.dbg = dbg
        self.window = window
        self.budget = budget
        self.kept: OrderedDict[int, Kept] = OrderedDict()
        self.refused: dict[int, str] = {}  # steps not kept, and why
        self.replaying = False
        self.in_step = False
        self.deferred: list[tuple[int, int]] = []  # (step, hits) whose replay and pause wait for the call's end
        self._thread: int | None = None
        self._warned = False
        self._auto = True  # whether the optimizer's step ended steps when the current call started

    # -- the wrapper ------------------------------------------------------------------------------
    def wrap(self, fn: Any, ends_step: bool = True, **objects: Any) -> Any:
        """``fn`` as a step function: each call keeps the pre-step state, then runs ``fn``."""
        if getattr(fn, "__nbdebug_step_fn__", None) is self:
            return fn
        backend = self.dbg.backend
        rs = backend.replay_state()
        if getattr(rs, "is_train_model", lambda _: False)(fn):
            if objects:
                raise TypeError("step_fn(model): a Model's optimizer is its train network's; name nothing else")
            return self.wrap_model(fn)
        model = self.dbg._adapter.model_ref()
        found = rs.find_objects(fn, model, **objects)

        @functools.wraps(fn)
        def step_fn(*args: Any, **kwargs: Any) -> Any:
            if self.replaying or self.in_step or self.window == 0 or self.dbg.closed:
                return fn(*args, **kwargs)
            return self._call(fn, rs, model, found, ends_step, args, kwargs)

        step_fn.__nbdebug_step_fn__ = self  # type: ignore[attr-defined]
        return step_fn

    def wrap_trainer(self, trainer: Any) -> Any:
        """Keep the state of every ``trainer.training_step`` (an instance attribute; ``unwrap_trainer``)."""
        if "training_step" in vars(trainer):
            raise RuntimeError("this Trainer's training_step is wrapped already")
        method = trainer.training_step
        rs = self.dbg.backend.replay_state()
        model = self.dbg._adapter.model_ref()

        @functools.wraps(method)
        def training_step(*args: Any, **kwargs: Any) -> Any:
            if self.replaying or self.in_step or self.window == 0 or self.dbg.closed:
                return method(*args, **kwargs)
            found = rs.find_objects(method, model)  # the Trainer makes its optimizer when training starts
            return self._call(method, rs, model, found, False, args, kwargs, TRAINER_COVERS)

        trainer.training_step = training_step
        return trainer

    def wrap_model(self, model: Any) -> Any:
        """A MindSpore ``mindspore.train.Model``: its ``train`` (an instance attribute) runs with the backend's
        callback that keeps each step's state and batch, and ends the step (``dbg.callback()`` not needed)."""
        if "train" in vars(model):
            raise RuntimeError("this Model's train is wrapped already")
        rs = self.dbg.backend.replay_state()
        rs.check_model(model, self.dbg._adapter.model_ref())  # refused now, with the reason, when it cannot be
        method = model.train

        @functools.wraps(method)
        def train(*args: Any, **kwargs: Any) -> Any:
            given = args[2] if len(args) >= 3 else kwargs.get("callbacks")
            cbs = [] if given is None else list(given) if isinstance(given, (list, tuple)) else [given]
            cbs.insert(0, rs.KeepCallback(self, rs))  # first: its step end ends the step, before the others
            if len(args) >= 3:
                args = args[:2] + (cbs,) + args[3:]
            else:
                kwargs["callbacks"] = cbs
            return method(*args, **kwargs)

        model.train = train
        return model

    def begin(self, fn: Any, rs: Any, model: Any, found: dict, args: tuple, kwargs: dict, covers: str = "") -> int:
        """A step function's call starts: its state kept (or the call added to its step's); returns the step."""
        step = self.dbg.session.step_index
        kept = self.kept.get(step)
        if kept is not None and kept.fn is fn:  # a later call within the same step
            a, k, problems = rs.keep_args(args, kwargs)
            kept.more.append((a, k))
            kept.problems += problems
        else:
            self._keep(fn, rs, model, found, step, args, kwargs)
            if step in self.kept:
                self.kept[step].covers = covers
        self.in_step, self._thread = True, threading.get_ident()
        return step

    def end(self, step: int, rs: Any, out: Any, ends_step: bool) -> None:
        """The call of ``step`` returned ``out``: kept as its loss; the step ends (``ends_step``), and the
        replays a hit of it asked for run."""
        dbg = self.dbg
        try:
            kept = self.kept.get(step)
            if kept is not None:
                kept.outputs.append(rs.output_ref(out))
            a = dbg._adapter
            if ends_step and dbg.session.step_index == step and (len(dbg.session.recorder) or (
                    self._auto and a.capturing)):  # the boundary the optimizer's step would have made
                a.end_step()  # the call is the step: its end is the step boundary
        finally:
            self.in_step = False
        deferred, self.deferred = self.deferred, []
        for s, hits in deferred:
            self.replay_on_hit(s, hits)

    def _call(self, fn: Any, rs: Any, model: Any, found: dict, ends_step: bool, args: tuple, kwargs: dict,
              covers: str = "") -> Any:
        step = self.begin(fn, rs, model, found, args, kwargs, covers)
        adapter = self.dbg._adapter
        self._auto = auto = adapter.auto_step
        if ends_step:  # the call is one step: its optimizers' steps (a GAN's two) end none, the call's end does
            adapter.auto_step = False
        try:
            out = fn(*args, **kwargs)
        except BaseException:
            self.in_step = False
            raise
        finally:  # a dbg.step() inside the call marks steps by hand from now on
            adapter.auto_step = auto and self.dbg.session.step_index == step
        self.end(step, rs, out, ends_step)
        return out

    def _keep(self, fn: Any, rs: Any, model: Any, found: dict, step: int, args: tuple, kwargs: dict) -> None:
        budget = self.budget
        if budget is not None:
            need = rs.planned_bytes(model, found)
            if need > budget:
                self.refused[step] = (f"the pre-step state of step {step} ({need / 2**20:.1f} MiB) is over "
                                      f"replay_budget ({budget / 2**20:.1f} MiB); Debugger(replay_budget=...) "
                                      f"keeps larger states")
                if not self._warned:
                    self._warned = True
                    warnings.warn(self.refused[step] + " (this warning is given once)", RuntimeWarning, stacklevel=4)
                return
        recycle = {}
        while len(self.kept) >= self.window:
            _, old = self.kept.popitem(last=False)
            recycle = old.state.recyclable()
        self.kept[step] = Kept(step, fn, rs.keep(model, found, args, kwargs, recycle))
        self.kept[step].objects = found
        for old in [s for s in self.refused if s < step - 4 * self.window]:
            del self.refused[old]

    # -- on a hit ---------------------------------------------------------------------------------
    def step_ended(self, step: int, hits: int, on_hit: str) -> int:
        """The Debugger's step end: a hit in a kept step on its training thread is replayed when the call
        returns (then training pauses there) — the first step of consecutive hitting steps only (a NaN in
        the weights hits every later step); returns the hit count the controller should pause for now."""
        if on_hit == "replay" and hits and self.in_step and step in self.kept \
                and threading.get_ident() == self._thread:
            if any(h.step == step - 1 and h.hits for h in self.dbg.watchpoints.hits):
                return hits  # the hits go on from the step before: that one (where they started) was replayed
            self.deferred.append((step, hits))
            return 0
        return hits

    def replay_on_hit(self, step: int, hits: int) -> None:
        from .replayer import replay

        dbg = self.dbg
        recs = [h for h in dbg.watchpoints.hits if h.step == step and h.hits]
        node = recs[0].node if recs else None
        try:
            dbg.replayed = replay(dbg, self.get(step), "mix", node=node, hits=recs)
            what = f"replayed at mix: dbg.replayed (first non-finite: {dbg.replayed.first_nonfinite()})"
        except Exception as e:  # noqa: BLE001 - the training goes on (or pauses); the reason is kept
            dbg.replay_error = f"{type(e).__name__}: {e}"
            warnings.warn(f"replay of step {step} on its hit failed: {dbg.replay_error}", RuntimeWarning,
                          stacklevel=2)
            what = f"its replay failed: {dbg.replay_error}"
        dbg._ctl.pause_here(f"{hits} watchpoint hit{'s' if hits != 1 else ''} in step {step}; {what}")

    # -- reading ----------------------------------------------------------------------------------
    def get(self, step: int | str) -> Kept:
        """The kept state of ``step`` (``"last"``: the latest kept); ``NotRetainedError`` saying why not."""
        if step == "last":
            if not self.kept:
                raise NotRetainedError("no step's state is kept: mark the step function with @dbg.step_fn "
                                       "(or dbg.step_fn(trainer)); Debugger(replay_window=N) keeps the last N")
            step = next(reversed(self.kept))
        kept = self.kept.get(int(step))
        if kept is not None:
            return kept
        if step in self.refused:
            raise NotRetainedError(self.refused[step])
        have = ", ".join(map(str, self.kept)) or "none"
        last = "the last step" if self.window == 1 else f"the last {self.window} steps"
        raise NotRetainedError(f"the state step {step} started from is not kept: only {last} run through a step "
                               f"function can be replayed (kept: {have}); Debugger(replay_window=N) keeps more")

    def check_can_replay(self) -> None:
        dbg = self.dbg
        state = str(dbg.state)
        on_thread = self._thread == threading.get_ident() and not self.in_step
        if state == "running" and not on_thread and not dbg._ctl.controlling:
            raise ReplayRefused("training is running: pause it first (dbg.pause(), or pause_after), or let "
                                "on_hit='replay' replay a hit's step on the training thread")
        if dbg.current_node is not None:
            raise ReplayRefused(f"training is paused inside a step (at {dbg.current_node}): replay at a step "
                                f"boundary (dbg.pause_after(dbg.step_index), then dbg.cont())")
