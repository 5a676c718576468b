"""Compute a kept step again at full detail, without changing the live run.

:func:`replay` swaps the step's pre-step state into the live model, optimizers, scaler, schedulers and
RNGs (the live ones are taken off, not copied over), turns the live capture off, attaches a temporary
capture at ``level`` with its own :class:`~nbdebug.session.session.Session` (every tensor retained), runs
the step function on the kept arguments, closes the temporary capture, and puts the live state and
capture back. It compares the result with what the live capture recorded for that step
(:func:`~nbdebug.replay.result.compare`).

>>> import torch, nbdebug
>>> model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU())
>>> opt = torch.optim.Adam(model.parameters())
>>> dbg = nbdebug.Debugger(model, level="L0")
>>> train = dbg.step_fn(lambda x: (opt.zero_grad(), model(x).sum().backward(), opt.step()), optimizers=opt)
>>> train(torch.ones(2, 3))
(None, None, None)
>>> r = dbg.replay(0, level="L1")
>>> r.bitwise, "Functional.linear.0.forward" in r.graph.nodes
(True, True)
>>> dbg.close()
"""

from __future__ import annotations

import traceback
from typing import Any

import numpy as np

from ..session.level import Level
from ..session.session import Session, StatsNotRetainedError
from .keeper import Kept
from .result import Mismatch, ReplayedStep, ReplayRefused, comparable, compare

#: bytes of tensor values a replay may retain (every tensor of one step)
REPLAY_BUDGET = 1 << 62


def replay(dbg: Any, kept: Kept, level: str = "mix", *, node: str | None = None, hits: Any = None,
           strict: bool = False, tap: Any = None, after: Any = None, keep: Any = ()) -> ReplayedStep:
    """Step ``kept.step`` computed again at ``level``; see the module docstring. ``tap(node, tensors, call)``
    sees each completed node with its call's arguments (``save_repro`` keeps one op's); ``after()`` is
    called once the step function has run, before the live state goes back (``save_repro`` reads the
    values the step left); ``keep``: nodes whose values are kept whatever their section (an in-place op's
    input is copied before the op writes it)."""
    if level not in dbg.backend.levels:
        raise ValueError(f"unknown level {level!r}; choose one of {', '.join(dbg.backend.levels)}")
    if kept.problems:
        raise ReplayRefused(f"step {kept.step} cannot be replayed: " + "; ".join(kept.problems))
    keeper = dbg._replay
    keeper.check_can_replay()
    rs = dbg.backend.replay_state()
    live_adapter = dbg._adapter
    model = live_adapter.model_ref()
    version, device = dbg.backend.info(model)
    session = Session(framework=dbg.backend.name, framework_version=version, device=device,
                      memory_budget=REPLAY_BUDGET, stats_window=None)
    session.step_index = session.store_step = kept.step  # the replayed step keeps its number
    session.store.keep_unpinned = True
    if keep:
        session.keep_values(frozenset(keep))
    outputs: list[Any] = []
    error = None
    capturing = live_adapter.capturing
    keeper.replaying = True
    live_adapter.capturing = False  # swapping the state in is not a step of the live run
    try:
        live = kept.state.swap_in(model)
    except BaseException:
        live_adapter.capturing, keeper.replaying = capturing, False
        raise
    notes: list[str] = []
    adapter = None
    ls_probe = getattr(dbg, "_ls_probe", None)  # track_loss_scale: scaler.scale() tells the capture's monitor
    on_scale = getattr(ls_probe, "on_scale", None)
    try:
        adapter = dbg.backend.adapter(model, level, session, retain=True)
        note = getattr(adapter, "replay_note", None)
        if note is not None and (text := note(live_adapter)):  # it runs the step otherwise (compiled code)
            kept.state.problems_at_replay.append(text)
        adapter.auto_step = False
        adapter.tap = tap
        if on_scale is not None:
            ls_probe.on_scale = adapter.note_scaled
        for args, kwargs in kept.calls():
            a, k = rs.fresh_args(args, kwargs)
            outputs.append(rs.output_ref(kept.fn(*a, **k)))
        if after is not None:
            after()
    except Exception:  # noqa: BLE001 - the step failed in replay: reported in the result
        error = traceback.format_exc(limit=-4)
    finally:
        try:
            if adapter is not None:
                try:
                    if len(session.recorder):
                        adapter.end_step()
                    hold = getattr(rs, "hold_values", None)
                    if hold is not None:  # values the capture deletes on close (a GRAPH-mode dump): read now
                        hold(session)
                finally:
                    adapter.close()
        finally:
            live.restore()
            if on_scale is not None:
                ls_probe.on_scale = on_scale
            live_adapter.capturing = capturing
            keeper.replaying = False
    notes += kept.state.problems_at_replay
    if kept.covers:
        notes.append(kept.covers)
    return _result(dbg, kept, session, level, outputs, notes, error, node, hits, strict, rs)


def _result(dbg: Any, kept: Kept, session: Session, level: str, outputs: list[Any], notes: list[str],
            error: str | None, node: str | None, hits: Any, strict: bool, rs: Any) -> ReplayedStep:
    mismatches: list[Mismatch] = []
    for i, (orig, new) in enumerate(zip(kept.outputs, outputs, strict=False)):
        if not rs.same_bits(orig, new):
            mismatches.append(Mismatch("loss", f"call.{i}" if len(outputs) > 1 else "output", "value",
                                       rs.describe(orig), rs.describe(new)))
    compared = 0
    try:
        live_table = dbg.session.table(kept.step)
    except (StatsNotRetainedError, KeyError) as e:
        notes.append(f"the live statistics of step {kept.step} are no longer kept ({e}); only the loss was compared")
        live_table = None
    if live_table is not None and kept.step in session.steps:
        table = session.steps[kept.step]
        # ``Input.N`` numbers the values no recorded op produced: which those are depends on the level
        skip = ("Input.",) if level != dbg.level else ()
        compared = len(comparable(live_table, table, skip))
        mismatches += compare(live_table, table, skip)
    loose = getattr(rs, "unread_outputs", lambda _s: set())(session)
    unread = [m for m in mismatches if (m.node, m.slot) in loose]
    if unread:  # outputs nothing reads, which the framework's kernels may leave unwritten (MindSpore GRAPH)
        mismatches = [m for m in mismatches if (m.node, m.slot) not in loose]
        notes.append(f"{len(unread)} values differ in kernel outputs MindSpore's kernels leave unwritten (outputs "
                     f"no kernel reads, BatchNorm's batch statistics and reserve spaces in training, and the inputs "
                     f"they feed: their memory's previous contents): not counted as differences; first {unread[0]}")
    same_way = dbg.level == level or (Level(dbg.level).modules and Level(level).modules)  # L0 and mix alike
    n, found = _compare_monitor(dbg.session, session, kept.step, None if same_way else MEASURED,
                                OPTIMIZER_FIELDS if kept.covers else ())
    compared += n
    mismatches += found
    loss = outputs[0] if outputs else None
    result = ReplayedStep(session, step=kept.step, level=level, loss=loss,
                          live_loss=kept.outputs[0] if kept.outputs else None, mismatches=mismatches,
                          notes=notes, compared=compared, node=node, hits=hits, error=error,
                          causes=list(kept.state.problems_at_replay),
                          generic=getattr(rs, "GENERIC_REASON", None))
    if node is None and result.bitwise:
        found = result.first_nonfinite()
        result.node = found[0] if found else None
    result.warn(strict)
    return result


#: monitor fields measured by the framework's probe at every level; the others (weight and output norms,
#: update ratios) are read off the statistics table at some levels and measured at others: their rounding
#: differs between such levels, so they are compared only between levels that compute them alike
MEASURED = frozenset({"grad_norm", "update_norm", "exp_avg_norm", "exp_avg_sq_norm", "momentum_norm", "loss",
                      "grad_norm_total", "loss_scale"})


#: monitor fields measured at the optimizer step (left out when the replay does not run it: a Trainer's)
OPTIMIZER_FIELDS = frozenset({"grad_norm", "update_norm", "exp_avg_norm", "exp_avg_sq_norm", "momentum_norm",
                              "grad_norm_total", "update_ratio", "loss_scale"})


def _compare_monitor(live: Any, replayed: Any, step: int, fields: Any = None,
                     leave_out: Any = ()) -> tuple[int, list[Mismatch]]:
    """The step's monitor series (every level records them; the only record at level ``monitor``): the
    series both runs recorded (of ``fields``, None: all; not those in ``leave_out``) must have the same
    float32 bits."""
    a_mon, b_mon = getattr(live, "monitor", None), getattr(replayed, "monitor", None)
    if a_mon is None or b_mon is None:
        return 0, []
    a, b = a_mon.row(step), b_mon.row(step)
    out = []
    common = [k for k in a if k in b and (fields is None or k[1] in fields) and k[1] not in leave_out]
    for key in common:
        if np.float32(a[key]).view(np.int32) != np.float32(b[key]).view(np.int32):
            out.append(Mismatch(key[0], "monitor", key[1], a[key], b[key]))
    return len(common), out
