"""The worker thread that runs training, and the pause/step state machine.

Commands (:meth:`Controller.cont`, :meth:`pause`, :meth:`terminate`, :meth:`run_to`,
:meth:`next_node`) may come from any thread — a notebook cell, a panel button, the JupyterLab
extension. The training thread calls :meth:`Controller.at_node` after every captured node and
:meth:`Controller.at_step_end` at every step boundary; that is where it blocks while paused and
where a terminate request unwinds it.

>>> c = Controller()
>>> c.run(lambda: 41 + 1, block=True)
>>> c.state, c.result
(<State.FINISHED: 'finished'>, 42)
"""

from __future__ import annotations

import atexit
import contextvars
import enum
import threading
import time
import traceback
import warnings
import weakref
from collections.abc import Callable
from typing import Any

from .events import EventHub


class State(str, enum.Enum):
    IDLE = "idle"
    RUNNING = "running"
    PAUSED = "paused"
    FINISHED = "finished"
    TERMINATED = "terminated"
    FAILED = "failed"

    def __str__(self) -> str:
        return self.value


ACTIVE = (State.RUNNING, State.PAUSED)
SETTLED = (State.IDLE, State.PAUSED, State.FINISHED, State.TERMINATED, State.FAILED)


class TrainingTerminated(BaseException):  # noqa: N818 - not an error: the user asked for it
    """Raised inside the training thread to unwind it after ``terminate()``.

    A ``BaseException`` so that a training loop's ``except Exception`` does not swallow it.
    """


class TerminatedExit(TrainingTerminated, SystemExit):
    """``TrainingTerminated`` in a thread the controller adopted (:meth:`Controller.adopt`: a script that
    trains in its main thread): uncaught, it ends the script like ``sys.exit(0)``, without a traceback."""


class Controller:
    """Runs a training function and answers control commands."""

    def __init__(self, hub: EventHub | None = None, *, in_optimizer: Callable[[], bool] = lambda: False,
                 node_exists: Callable[[str], bool] = lambda name: True,
                 on_thread_exit: Callable[[], None] = lambda: None) -> None:
        self.hub = hub or EventHub()
        self._in_optimizer = in_optimizer
        self._node_exists = node_exists
        self._on_thread_exit = on_thread_exit
        self._cv = threading.Condition(threading.RLock())
        self.state = State.IDLE
        self.current_node: str | None = None
        self.pause_reason = ""
        self.error: str | None = None
        self.exception: BaseException | None = None
        self.result: Any = None
        self.thread: threading.Thread | None = None
        self._train_ident: int | None = None
        self._steps_left: int | None = None
        self._pause_after: int | None = None  # pause at the first step boundary >= this (pause_after)
        self._paused_after_step: int | None = None  # the finished step of the boundary paused at now
        self._pause_requested = False
        self._terminate_requested = False
        self._run_to: str | None = None
        self._next_node = False
        #: True while a thread trains in the foreground under control (:meth:`adopt`), not under run()
        self.adopted = False
        #: False while nobody could resume a pause (a remote process whose notebook stayed away past its
        #: pause timeout): hits, pause requests, run_to and step counts no longer stop training
        self.pausing = True
        #: whether something other than the training thread can resume a pause of a ``run(block=True)`` (a
        #: notebook attached to this process: ``nbdebug.attach``); else such a pause would wait forever
        self.resumable_elsewhere = False
        self._blocking: int | None = None  # the thread a run(block=True) trains on, while it does
        self._told_blocking = False

    # -- starting ---------------------------------------------------------------------------------
    def run(self, fn: Callable[..., Any], *args: Any, block: bool = False, paused: bool = False,
            steps: int | None = None, **kwargs: Any) -> None:
        """Run ``fn(*args, **kwargs)`` on a worker thread (or here with ``block=True``).

        ``paused=True`` waits for a command before the first node; ``steps=N`` pauses after N steps.
        """
        with self._cv:
            if self.adopted and self.controlling:
                self.release(State.IDLE)  # the adopted thread hands training to run()
            if self.state in ACTIVE:
                raise RuntimeError(f"training is already {self.state}; terminate() it or wait() for it first")
            if block and paused:
                raise ValueError("block=True with paused=True would wait forever in this thread")
            if block and steps is not None and not self.resumable_elsewhere:
                raise ValueError("block=True with steps=N would wait forever in this thread after N steps "
                                 "(nothing else could continue it); leave block out to pause after N steps")
            self._reset_requests()
            self._steps_left = _check_steps(steps)
            self.error = self.exception = self.result = None
            self.current_node = None
            self.pause_reason = "waiting for a command before the first node" if paused else ""
            self._set_state(State.PAUSED if paused else State.RUNNING)

        def target() -> None:
            self._train_ident = threading.get_ident()
            final = State.FINISHED
            try:
                if paused:
                    self._block_while_paused()
                self.result = fn(*args, **kwargs)
            except TrainingTerminated:
                final = State.TERMINATED
            except BaseException as exc:  # noqa: BLE001 - every failure must reach the panel
                final = State.FAILED
                self.exception = exc
                self.error = traceback.format_exc()
            finally:
                self._train_ident = None
                try:
                    self._on_thread_exit()
                    if final is State.FAILED:  # before the state settles: whoever wait()s for it has the error
                        self.hub.emit("error", self.error)
                finally:
                    with self._cv:
                        self.current_node = None
                        self._reset_requests()
                        self._set_state(final)

        if block:
            self._blocking, self._told_blocking = threading.get_ident(), False
            try:
                target()
            finally:
                self._blocking = None
            if self.state is State.FAILED and isinstance(self.exception, KeyboardInterrupt):
                raise self.exception
            return
        # The thread runs in a copy of the caller's context: in a Jupyter kernel that holds the header of the
        # cell that called run(), so the training loop's prints go to that cell (ipykernel routes a write by
        # the writer's context), not to whatever message came last — a panel button's comm message, which no
        # cell shows, or a later cell.
        self.thread = threading.Thread(target=contextvars.copy_context().run, args=(target,),
                                       name="nbdebug-training", daemon=True)
        _at_exit_stop(self)
        self.thread.start()

    def adopt(self) -> None:
        """Control the calling thread, which trains in the foreground (no :meth:`run`): its nodes and step
        ends pause and unwind it as a worker's would, and ``terminate()`` ends it with
        :class:`TerminatedExit` (a clean ``sys.exit(0)`` when nothing catches it). Used when a script is
        attached to a notebook (``nbdebug.attach``); :meth:`release` ends it."""
        with self._cv:
            if self.state in ACTIVE:
                raise RuntimeError(f"training is already {self.state} under run(); a thread cannot be adopted")
            self._reset_requests()
            self._steps_left = None
            self.error = self.exception = self.result = None
            self.current_node = None
            self.pause_reason = ""
            self._train_ident = threading.get_ident()
            self.adopted = True
            self._set_state(State.RUNNING)

    def release(self, final: State = State.FINISHED) -> None:
        """Stop controlling the adopted thread (it ended, or the debugger closes); state becomes ``final``."""
        with self._cv:
            if not self.adopted:
                return
            self.adopted = False
            self._train_ident = None
            self.current_node = None
            self._reset_requests()
            self._set_state(final)

    def _terminated(self) -> TrainingTerminated:
        return TerminatedExit(0) if self.adopted else TrainingTerminated()

    # -- commands (any thread) --------------------------------------------------------------------
    def cont(self, steps: int | None = None) -> None:
        """Run ``steps`` more steps (None: until a hit or the end)."""
        steps = _check_steps(steps)
        with self._cv:
            self._steps_left = steps
            self._resume()

    def pause(self) -> None:
        """Pause at the next node boundary."""
        with self._cv:
            if self.state is State.RUNNING:
                self._pause_requested = True

    def pause_after(self, step: int | None) -> None:
        """Pause at the first step boundary whose finished step is ``step`` or later (None: forget it).

        Unlike :meth:`pause` (next node) and ``cont(steps)`` (counted from now), the boundary is named, so
        several processes asked at slightly different moments pause after the same step (see
        :class:`nbdebug.job.Job`). A paused worker stays paused; :meth:`cont` keeps the request. A worker
        already paused at the boundary after ``step`` or a later one (it paused there by itself, e.g. on a
        hit, before the request came) has done what was asked: nothing is left pending, else it would pause
        again one step after the next :meth:`cont` and leave its peers waiting in a collective.
        """
        if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
            raise ValueError(f"step must be an int >= 0 or None, got {step!r}")
        with self._cv:
            done = self._paused_after_step
            if (step is not None and self.state is State.PAUSED and self.current_node is None
                    and done is not None and done >= step):
                step = None
            self._pause_after = step

    def terminate(self) -> None:
        """End training cleanly: the worker unwinds at the next node (after the optimizer's step if
        one is in progress, so parameters are never half-updated)."""
        with self._cv:
            if self.state in ACTIVE:
                self._terminate_requested = True
                self._resume()  # a paused worker wakes up and unwinds

    def run_to(self, node: str) -> None:
        """Resume and pause right after ``node`` executes (at the latest at the end of the step)."""
        if not self._node_exists(node):
            raise KeyError(f"no node named {node!r} to run to")
        with self._cv:
            self._run_to = node
            self._steps_left = None
            self._resume()

    def next_node(self) -> None:
        """Execute exactly one more node, then pause."""
        with self._cv:
            self._next_node = True
            self._steps_left = None
            self._resume()

    def wait(self, timeout: float | None = None) -> State:
        """Block until training is paused or over (or ``timeout`` seconds pass); returns the state."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cv:
            while self.state is State.RUNNING:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                self._cv.wait(left)
            return self.state

    # -- called by the training thread ------------------------------------------------------------
    @property
    def controlling(self) -> bool:
        """True in the thread that ``run`` started (pauses only ever block that thread)."""
        return self._train_ident is not None and threading.get_ident() == self._train_ident

    def at_node(self, name: str, hit: bool = False) -> None:
        if not self.controlling:
            return
        if self._terminate_requested:
            if self._in_optimizer():
                return  # finish the parameter update first; the step end unwinds
            raise self._terminated()
        reason = None
        if hit:
            reason = "watchpoint hit"
        elif self._next_node:
            reason = "next node"
        elif self._run_to == name:
            reason = f"ran to {name}"
        elif self._pause_requested:
            reason = "paused"
        if reason is not None and self.pausing:
            self._pause_at(name, reason)

    def at_step_end(self, step: int, hits: int = 0) -> None:
        if not self.controlling:
            return
        if self._terminate_requested:
            raise self._terminated()
        reason = None
        if hits:
            reason = f"{hits} watchpoint hit{'s' if hits != 1 else ''} in step {step}"
        elif self._steps_left is not None:
            self._steps_left -= 1
            if self._steps_left <= 0:
                reason = f"step {step} done"
        if reason is None and self._run_to is not None:
            reason = f"{self._run_to} did not execute in step {step}"
        if reason is None and self._pause_requested:
            reason = "paused"
        if reason is None and self._pause_after is not None and step >= self._pause_after:
            reason = f"step {step} done (asked to pause after step {self._pause_after})"
        if reason is not None and self.pausing:
            self._pause_at(None, reason, step)

    def pause_here(self, reason: str) -> None:
        """Pause the training thread where it is — a step boundary outside any hook (a hit's step was
        replayed first: ``on_hit="replay"``) — for ``reason``; nothing outside the training thread."""
        if not self.controlling:
            return
        if self._terminate_requested:
            raise self._terminated()
        self._pause_at(None, reason)

    # -- internals --------------------------------------------------------------------------------
    def _pause_at(self, node: str | None, reason: str, step: int | None = None) -> None:
        if self._blocking == threading.get_ident() and not self.resumable_elsewhere:
            self._no_pause_in_block(reason)
            return
        with self._cv:
            self._paused_after_step = step
            self.current_node = node
            self.pause_reason = reason
            self._pause_requested = self._next_node = False
            self._run_to = None
            self._steps_left = None
            self._pause_after = None
            self._set_state(State.PAUSED)
        self._block_while_paused()

    def _no_pause_in_block(self, reason: str) -> None:
        """A pause of ``run(block=True)`` that only this thread could resume (the notebook's panel and cells
        wait for it): training goes on — the hit stays in the hit list — and the first one says so."""
        with self._cv:
            self._pause_requested = self._next_node = False
            self._run_to = None
            self._pause_after = None
        if not self._told_blocking:
            self._told_blocking = True
            warnings.warn(f"nbdebug: not pausing ({reason}): under run(..., block=True) this thread is the one "
                          "that would have to resume it, so it would wait forever; training goes on (hits are "
                          "kept in dbg.hits). Leave block out to pause on hits", RuntimeWarning, stacklevel=2)

    def _block_while_paused(self) -> None:
        with self._cv:
            while self.state is State.PAUSED:
                self._cv.wait()
            terminate = self._terminate_requested and not self._in_optimizer()
        if terminate:
            raise self._terminated()

    def _resume(self) -> None:
        if self.state is State.PAUSED:
            self._paused_after_step = None
            self.current_node = None
            self.pause_reason = ""
            self._set_state(State.RUNNING)
            self._cv.notify_all()

    def _reset_requests(self) -> None:
        self._pause_requested = self._terminate_requested = self._next_node = False
        self._run_to = None
        self._pause_after = None

    def _set_state(self, state: State) -> None:
        self.state = state
        self._cv.notify_all()
        self.hub.emit("state", state)


_RUNNING: weakref.WeakSet[Controller] = weakref.WeakSet()
_HOOKED: list[bool] = []
#: seconds the interpreter's exit waits for a training thread to unwind
EXIT_WAIT_S = 30.0


def _at_exit_stop(ctl: Controller) -> None:
    """Stop ``ctl``'s training thread when the interpreter exits, before it tears down what the thread
    runs on (a daemon thread still inside torch at finalization aborts the process)."""
    _RUNNING.add(ctl)
    if _HOOKED:
        return
    _HOOKED.append(True)
    register = getattr(threading, "_register_atexit", None)  # runs when the main thread ends, first
    try:
        if register is None:
            raise RuntimeError
        register(_stop_all)
    except RuntimeError:  # no such hook, or the interpreter is already shutting down
        atexit.register(_stop_all)


def _stop_all() -> None:
    for ctl in list(_RUNNING):
        t = ctl.thread
        if t is None or not t.is_alive() or t is threading.current_thread():
            continue
        ctl.terminate()
        t.join(EXIT_WAIT_S)


def _check_steps(steps: int | None) -> int | None:
    if steps is None:
        return None
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive int or None, got {steps!r}")
    return steps
