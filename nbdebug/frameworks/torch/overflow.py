"""Drop-in replacement for HuggingFace's ``DebugUnderflowOverflow`` without a host sync per tensor.

HuggingFace's class checks every weight, input and output of every module call with ``.item()``,
i.e. several device-to-host round trips per tensor. This version computes the same numbers on the
tensor's device, keeps them there, and moves them to the host once per batch (dense CPU tensors are
read in place by nbdebug's C kernel, one pass each, so a CPU model needs no transfer at all).
"""

from __future__ import annotations

import collections
import threading
import weakref
from typing import Any

import numpy as np
import torch

from ...session.handle import Handles
from ..core.native import fastats as _fastats  # optional C kernel (None: CPU tensors use torch ops)

__all__ = ["DebugUnderflowOverflow"]

_INF = float("inf")
# placeholders for entries that have no statistics row (negative "row" numbers)
_NONE, _NOT_TENSOR, _EMPTY = -1, -2, -3
_LABELS = {_NONE: "None", _NOT_TENSOR: "not a tensor", _EMPTY: "empty"}
_DETECTED_MSG = (
    "DebugUnderflowOverflow: inf/nan detected, aborting as there is no point running further. "
    "Please scroll up above this traceback to see the activation values prior to this event."
)
# module calls buffered at most before a mid-batch transfer (only reached when the root module's
# forward does not run, e.g. submodules called on their own, or very large models)
_PENDING_LIMIT = 2048


def _cpu_codes() -> dict:
    if _fastats is None:
        return {}
    names = ("float32", "float64", "float16", "bfloat16", "int8", "uint8", "int16", "int32", "int64", "bool")
    return {getattr(torch, n): getattr(_fastats, n.upper()) for n in names}


_CPU_CODES = _cpu_codes()
_UNSIGNED = (torch.uint8, torch.bool)


def _host_row(t: torch.Tensor, out: np.ndarray, out_ptr: int) -> list[float] | None:
    """``[abs min, abs max, code]`` of a dense CPU tensor, read straight from host memory (no device involved).

    One pass of the C kernel over ``|t|`` into ``out`` (whose address is ``out_ptr``); ``None`` when the kernel
    does not apply (other devices, dtypes).
    """
    if _fastats is None or not t.is_cpu or t.layout is not torch.strided:
        return None
    dtype = t.dtype
    code = _CPU_CODES.get(dtype)
    if code is None:
        return None
    x = t.detach()
    x = x.contiguous() if dtype in _UNSIGNED else x.abs()
    _fastats.reduce(x.data_ptr(), x.numel(), code, out_ptr)
    hi, lo, _, _, _, _, nans, pinf, ninf = out.tolist()
    return [lo, hi, (1.0 if pinf or ninf else 0.0) + (2.0 if nans else 0.0)]


def _stat_row(t: torch.Tensor) -> torch.Tensor:
    """``[abs min, abs max, code]`` on ``t``'s device (code: bit 0 has inf, bit 1 has nan); nothing waits.

    For real floating tensors a nan shows as a nan abs max (the reductions propagate nan), so only
    the inf test needs its own pass; complex tensors test nan too (``|nan + inf j|`` is inf).
    """
    x = t.detach()
    acc = torch.float32 if x.device.type == "mps" else torch.float64
    if not (x.is_floating_point() or x.is_complex()):  # integers and bool: no inf/nan possible
        if x.dtype == torch.bool:
            x = x.to(torch.uint8)
        lo, hi = torch.aminmax(x.abs())
        return torch.stack([lo.to(acc), hi.to(acc), torch.zeros((), dtype=acc, device=x.device)])
    if x.device.type == "cpu":  # the CPU's inf-norm and isinf kernels are slow: reduce |x| instead
        a = x.abs()
        lo, hi = torch.aminmax(a)
        code = (torch.nan_to_num(a, nan=0.0, posinf=_INF).amax() == _INF).to(acc)
    else:  # two reads of x, no |x| in memory
        lo = torch.linalg.vector_norm(x, -_INF)
        hi = torch.linalg.vector_norm(x, _INF)
        code = torch.isinf(x).any().to(acc)
    if x.is_complex():
        code = code + 2 * torch.isnan(x).any().to(acc)
    return torch.stack([lo.to(acc), hi.to(acc), code])


def _fetch_rows(rows: list, stats: list[tuple[int, torch.Tensor]]) -> None:
    """Fill ``rows`` from the device rows in ``stats``: one transfer per device."""
    if not stats:
        return
    dev = stats[0][1].device
    if all(s.device == dev for _, s in stats):
        groups = [stats]
    else:
        by_device: dict[torch.device, list[tuple[int, torch.Tensor]]] = {}
        for item in stats:
            by_device.setdefault(item[1].device, []).append(item)
        groups = list(by_device.values())
    for group in groups:
        for (i, _), row in zip(group, torch.stack([s for _, s in group]).tolist(), strict=True):
            rows[i] = row


class _Frame:
    """One module call, rendered to HF's text only when somebody looks at it."""

    __slots__ = ("lead", "title", "entries", "rows")

    def __init__(self, lead: list[str], title: str, entries: list[tuple[str, int]], rows: list) -> None:
        self.lead, self.title, self.entries, self.rows = lead, title, entries, rows

    def render(self) -> str:
        lines = [*self.lead, self.title]
        rows = self.rows
        for ctx, i in self.entries:
            if i >= 0:
                lo, hi, _ = rows[i]
                lines.append(f"{lo:8.2e} {hi:8.2e} {ctx}")
            else:
                lines.append(f"{_LABELS[i]:>17} {ctx}")
        return "\n".join(lines)


def _text(frame: _Frame | str) -> str:
    return frame if isinstance(frame, str) else frame.render()


class DebugUnderflowOverflow:
    """Find where activations or weights first turn inf/nan, printing the module calls that led there.

    Same constructor, report and exceptions as ``transformers.debug_utils.DebugUnderflowOverflow``:

    * **Detection** (default): every module call becomes a *frame*: the module's qualified name and
      class, then ``abs min  abs max  name`` for each of its own parameters, each positional input and
      each output (one level of nested tuples). The first frame holding a tensor with inf or nan
      ends the run: its ``<name> has nans`` / ``<name> has infs`` lines, then
      ``Detected inf/nan during batch_number=N``, the last ``max_frames_to_save`` frames up to and
      including that one, and a ``ValueError``.
    * **Tracing**: the batches in ``trace_batch_nums`` (0-based) print all their frames and never
      raise for inf/nan.
    * ``abort_after_batch_num=N`` raises a ``ValueError`` once batch ``N`` has finished.

    The batch counter ``batch_number`` moves on when the root module's ``forward`` returns. The first
    frame of each batch carries a ``*** Starting batch number=N ***`` header, as in HuggingFace.

    **What is different: no host sync per tensor.** The hooks compute abs-min, abs-max and inf/nan
    flags on the tensor's device and only keep those small results (dense CPU tensors are measured
    in place by nbdebug's C kernel). When the root module's forward returns, the results of the whole
    batch reach the host in one transfer per device, and the batch is replayed through HuggingFace's
    bookkeeping: the text printed, the frames reported, ``batch_number`` and the exception message
    are the ones HuggingFace would give. Consequences:

    * the ``ValueError`` (and any trace output) comes when the root module's forward returns, not
      inside the hook of the offending module; frames recorded after the offending call are
      dropped, and ``batch_number``/``total_calls`` are set back to what they were at that call;
    * ``frames`` (a copy, as text) and ``detected_overflow`` are up to date after each batch (or
      :meth:`flush`);
    * when the root module is not called (submodules run on their own), the buffer is checked every
      2048 module calls, or at :meth:`flush`.

    Other deviations, all in cases where HuggingFace misbehaves:

    * after a traced batch HuggingFace's frame buffer stops being bounded, so a later report can
      exceed ``max_frames_to_save`` frames; here it never does;
    * empty tensors are listed as ``empty`` (HuggingFace's ``min()`` raises), bool tensors are
      measured as 0/1 (HuggingFace's ``abs()`` raises);
    * :meth:`detach` (also ``with DebugUnderflowOverflow(model): ...``) removes the hooks, and a new
      instance on the same model detaches the previous one (re-running a notebook cell does not
      stack hooks).

    As in HuggingFace, once inf/nan was seen (a traced batch included) the flag stays set: later
    batches raise again on their first frame.

    Args:
        model: the ``torch.nn.Module`` to watch.
        max_frames_to_save: how many frames the report shows (default 21).
        trace_batch_nums: batch numbers to trace (detection is off for them).
        abort_after_batch_num: raise once this batch number has finished.
    """

    _attached: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def __init__(self, model, max_frames_to_save=21, trace_batch_nums=None, abort_after_batch_num=None):
        self.model = model
        self.max_frames_to_save = max_frames_to_save
        self.trace_batch_nums = [] if trace_batch_nums is None else trace_batch_nums
        self.abort_after_batch_num = abort_after_batch_num
        self._frames: collections.deque = collections.deque([], max_frames_to_save)
        self.frame: list[str] = []  # lines waiting for the next frame (batch headers)
        self.batch_number = 0
        self.total_calls = 0
        self.detected_overflow = False
        self.prefix = " " * 17
        self._pending: list[tuple[Any, ...]] = []  # (module, is_root, entries, end row)
        self._rows: list[Any] = []  # [abs min, abs max, code] per tensor of the pending calls (None: on device)
        self._stats: list[tuple[int, torch.Tensor]] = []  # (row, device row) still to fetch
        self._local = threading.local()  # per-thread output buffer of the C kernel (it releases the GIL)
        self._done_batches = 0  # batch_number / total_calls as of the last replay
        self._done_calls = 0
        self._handles = Handles()
        self.analyse_model()
        previous = self._attached.get(model)
        if previous is not None:
            previous.detach()
        self.register_forward_hook()
        self._attached[model] = self

    # ------------------------------------------------------------------ HF-compatible surface

    @property
    def frames(self) -> collections.deque:
        """The saved frames as text (as of the last replay), oldest first."""
        return collections.deque((_text(f) for f in self._frames), self._frames.maxlen)

    @frames.setter
    def frames(self, value) -> None:
        self._frames = collections.deque(value, self.max_frames_to_save)

    def analyse_model(self) -> None:
        # a module reachable under several names keeps the first one, as in HuggingFace
        self.module_names = {m: name for name, m in self.model.named_modules()}

    def register_forward_hook(self) -> None:
        self.model.apply(self._register_forward_hook)

    def _register_forward_hook(self, module) -> None:
        self._handles.add(module.register_forward_hook(self._forward_hook))

    def reset_saved_frames(self) -> None:
        self._frames.clear()

    def trace_frames(self) -> None:
        print("\n".join(_text(f) for f in self._frames))
        self._frames.clear()

    def dump_saved_frames(self) -> None:
        print(f"\nDetected inf/nan during batch_number={self.batch_number}")
        print(f"Last {len(self._frames)} forward frames:")
        print(f"{'abs min':8} {'abs max':8} metadata")
        print("\n".join(_text(f) for f in self._frames))
        print("\n\n")
        self._frames.clear()

    # ------------------------------------------------------------------ nbdebug additions

    def detach(self) -> None:
        """Remove every hook. Module calls not yet checked are dropped (call :meth:`flush` first to keep them)."""
        self._handles.remove_all()
        self._pending, self._rows, self._stats = [], [], []
        self._done_batches, self._done_calls = self.batch_number, self.total_calls
        if self._attached.get(self.model) is self:
            del self._attached[self.model]

    def __enter__(self) -> DebugUnderflowOverflow:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is None:
                self.flush()
        finally:
            self.detach()

    def flush(self) -> None:
        """Check the module calls recorded since the last check now (one transfer per device).

        Prints what HuggingFace would have printed for them and raises its ``ValueError`` where it would.
        """
        pending, rows, stats = self._pending, self._rows, self._stats
        if not pending:
            return
        self._pending, self._rows, self._stats = [], [], []
        _fetch_rows(rows, stats)
        bad = [i for i, r in enumerate(rows) if r[2] or r[1] != r[1]]
        self._replay(pending, rows, bad)

    # ------------------------------------------------------------------ hot path (no host sync)

    def _measure(self, entries: list[tuple[str, int]], var: Any, ctx: str) -> None:
        if torch.is_tensor(var):
            if var.numel() == 0:
                entries.append((ctx, _EMPTY))
            else:
                i = len(self._rows)
                entries.append((ctx, i))
                buf = getattr(self._local, "buf", None)
                if buf is None:
                    scratch = np.empty(9, dtype=np.float64)
                    buf = self._local.buf = (scratch, scratch.ctypes.data)
                row = _host_row(var, *buf)
                if row is None:
                    self._stats.append((i, _stat_row(var)))
                self._rows.append(row)
        elif var is None:
            entries.append((ctx, _NONE))
        else:
            entries.append((ctx, _NOT_TENSOR))

    def _forward_hook(self, module, inputs, output) -> None:
        entries: list[tuple[str, int]] = []
        for name, p in module.named_parameters(recurse=False):
            self._measure(entries, p, name)
        if isinstance(inputs, tuple):
            for i, x in enumerate(inputs):
                self._measure(entries, x, f"input[{i}]")
        else:
            self._measure(entries, inputs, "input")
        if isinstance(output, tuple):
            for i, x in enumerate(output):
                if isinstance(x, tuple):
                    for j, y in enumerate(x):
                        self._measure(entries, y, f"output[{i}][{j}]")
                else:
                    self._measure(entries, x, f"output[{i}]")
        else:
            self._measure(entries, output, "output")
        is_root = module is self.model
        self._pending.append((module, is_root, entries, len(self._rows)))
        self.total_calls += 1
        if is_root:
            self.batch_number += 1
        abort = self.abort_after_batch_num
        if is_root or len(self._pending) >= _PENDING_LIMIT or (abort is not None and self.batch_number > abort):
            self.flush()

    # ------------------------------------------------------------------ replay of HF's bookkeeping

    def _batch_start_lines(self, batch: int) -> list[str]:
        return [f"\n\n{self.prefix} *** Starting batch number={batch} ***", f"{'abs min':8} {'abs max':8} metadata"]

    def _replay(self, pending: list[tuple[Any, ...]], rows: list, bad: list[int]) -> None:
        """Walk the recorded calls in order, doing what HuggingFace's hook did at each of them."""
        batch, calls = self._done_batches, self._done_calls
        abort = self.abort_after_batch_num
        nb, k = len(bad), 0  # bad rows are sorted; k points at the first one not yet passed
        for module, is_root, entries, end in pending:
            trace = batch in self.trace_batch_nums
            if trace:
                self._frames.clear()
            if calls == 0:
                self.frame.extend(self._batch_start_lines(batch))
            calls += 1
            if is_root:
                batch += 1
            title = f"{self.prefix} {self.module_names.get(module, '')} {module.__class__.__name__}"
            self._frames.append(_Frame(self.frame, title, entries, rows))
            self.frame = []
            if k < nb and bad[k] < end:  # this call holds inf/nan: report like HF's detect_overflow
                for ctx, i in entries:
                    if i >= 0:
                        _, hi, code = rows[i]
                        if hi != hi or code >= 2:
                            print(f"{ctx} has nans")
                            self.detected_overflow = True
                        if code % 2:
                            print(f"{ctx} has infs")
                            self.detected_overflow = True
                while k < nb and bad[k] < end:
                    k += 1
            if trace:
                self.trace_frames()
            if is_root:
                self.frame.extend(self._batch_start_lines(batch))
            found = self.detected_overflow and not trace
            if found or (abort is not None and batch > abort):
                # HF raised inside this call's hook, so the calls recorded after it never happened
                self.batch_number = self._done_batches = batch
                self.total_calls = self._done_calls = calls
                if found:
                    self.dump_saved_frames()
                    raise ValueError(_DETECTED_MSG)
                raise ValueError(
                    f"DebugUnderflowOverflow: aborting after {batch} batches due to `abort_after_batch_num={abort}` arg"
                )
        self._done_batches, self._done_calls = batch, calls
