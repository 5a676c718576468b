"""Write a live session as an msProbe dump: ``step{N}/rank{R}|proc{pid}/dump.json, stack.json, construct.json``.

:class:`DumpWriter` installs itself as the framework adapter's ``tap``; the adapter calls it on the training
thread after every completed node. The tap applies the config's filters, takes the statistics (device-side,
no host sync) and, in the ``tensor`` task, a private copy of each tensor, and hands them to a writer thread
through a bounded queue (the training thread waits only when the queue holds more than ``max_pending_bytes``).
The writer thread saves each tensor file as soon as its node finished (atomically: temporary file +
rename), then journals the node's JSON (:mod:`nbdebug.dump.journal`). At the step end the JSON files are
assembled and written atomically; a crash mid-step leaves the journal, which :func:`~nbdebug.dump.journal.recover`
turns into the same files.

A write that fails (a full disk, a quota, a removed folder) never stops training and never stops the dump
for good: the step is reported — one ``UserWarning`` per step and a :class:`~nbdebug.offline.DumpProblem`
in :attr:`DumpWriter.problems` naming the folder, the step and the cause ("the disk holding ... is full") —,
no temporary file is left behind, the step's crash journal stays when it holds what ``dump.json`` could not
take (``nbdebug.load`` reads it), and the next step is dumped as usual once the cause is gone.

Only msProbe's own entries are written. nbdebug's extra graph nodes — ``Parameter.*``, ``Input.*``,
``Constant.*`` and ``Optimizer.*.step.*`` — are not: msProbe's compare expects none of them (the optimizer's
own ops still appear, as ``Tensor.add_.N.forward`` and so on, exactly as msProbe writes them).

>>> import tempfile, json, torch, nbdebug
>>> from nbdebug.dump import attach_dump
>>> model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
>>> dbg = nbdebug.Debugger(model, level="L0")
>>> out = tempfile.mkdtemp()
>>> writer = attach_dump(dbg, out, task="statistics")
>>> model(torch.ones(2, 4)).sum().backward()
>>> dbg.step()
>>> d = json.load(open(writer.last_dir + "/dump.json"))
>>> list(d["data"])[:2]
['Module.0.Linear.forward.0', 'Module.1.ReLU.forward.0']
>>> dbg.close()
"""

from __future__ import annotations

import atexit
import os
import threading
import traceback
import warnings
from dataclasses import fields, is_dataclass
from typing import Any

import numpy as np

from ..frameworks.core.recording import NO_OUTPUT
from ..frameworks.registry import backend_named
from .config import DumpConfig
from .entry_parts import (
    DROPOUT,
    NBDEBUG_ONLY,
    NdSnap,
    call_from_slots,
    call_stack,
    dropout_p,
    entry_kind,
    place,
    slot_path,
)
from .filters import Selection, risk_keeps
from .journal import Journal
from .write_queue import WriteQueue, close_at_exit, no_leftovers, write_cause


class DumpWriter:
    """Writes the session of one debugger as an msProbe dump (see the module docstring).

    ``session``: the debugger's :class:`~nbdebug.session.session.Session`; ``adapter_io``: the framework's
    dump I/O (:class:`~nbdebug.frameworks.torch.io.TorchIO`, :class:`~nbdebug.frameworks.mindspore.io.MindSporeIO`),
    which knows the adapter; ``dump_dir`` overrides the config's ``dump_path``; ``task`` (statistics | tensor)
    overrides the config's; ``config`` is an msProbe ``config.json`` path, a dict or a
    :class:`~nbdebug.dump.config.DumpConfig`.

    Step directories are numbered by the session's step index unless the owner opens steps itself
    (:meth:`open_step`, as :class:`~nbdebug.dump.precision.PrecisionDebugger` does).
    """

    def __init__(self, session: Any, adapter_io: Any, dump_dir: str | None = None, task: str | None = None,
                 config: Any = None, *, level: str | None = None, max_pending_bytes: int = 256 * 2**20,
                 max_pending_items: int = 4096) -> None:
        self.session = session
        self.io = adapter_io
        self.config = cfg = DumpConfig.load(config, task=task, dump_path=dump_dir, level=level)
        if not cfg.dump_path:
            raise ValueError("no dump directory: pass dump_dir= or set 'dump_path' in the config")
        self.io.precision = cfg.precision
        self.level = cfg.level
        self.framework = adapter_io.framework
        self.md5 = cfg.task == "statistics" and cfg.summary_mode == "md5"
        self.risk = cfg.risk_level if (backend_named(self.framework).supports_risk_level
                                       and cfg.level in ("L1", "mix") and not cfg.scope and not cfg.list) else "ALL"
        self.closed = False
        self.errors: list[str] = []
        #: every step that could not be written completely: ``DumpProblem(folder, "step N ...: cause")``
        self.problems: list[Any] = []
        self._failed_step: int | None = None  # an auto-numbered step whose folder could not be opened
        self.step_no: int | None = None  # the step directory open now
        self.rank_dir: str | None = None
        self.data_dir: str | None = None
        self.last_dir: str | None = None  # the rank directory of the last finished step
        self.rank: int | None = None
        self.auto_steps = True  # number steps after the session (off once the owner opens steps itself)
        #: whether nodes executing now are dumped (PrecisionDebugger's start/stop); an API whose forward was
        #: dumped still gets its backward dumped while this is off, as msProbe does
        self.recording = True
        self._queue = WriteQueue(max_pending_items, max_pending_bytes)
        self._journal: Journal | None = None
        self._bwd: dict[str, dict[str, dict[tuple, Any]]] = {}
        self._debug_counts: dict[str, int] = {}
        self._new_step_state()
        self._worker = threading.Thread(target=self._run, name="nbdebug-dump-writer", daemon=True)
        self._worker.start()
        self._snap_types = (adapter_io.snap_class, NdSnap)
        adapter_io.install(self.tap, self._snap)
        self._unsub = session.subscribe("step", self._on_session_step) if session is not None else None
        self._atexit = close_at_exit(self)
        atexit.register(self._atexit)

    # -- per-step state (training thread) ---------------------------------------------------------
    def _new_step_state(self) -> None:
        self._sel = Selection(self.config.scope, self.config.list, self.config.level)
        self._done_calls: dict[str, int] = {}  # module path -> finished calls this step
        self._chains: dict[str, list[str]] = {}  # recorded forward node -> its ancestor module calls
        self._arity: dict[str, tuple[int, int] | None] = {}
        self._begun: set[str] = set()
        self._debug_counts = {}

    # -- steps ------------------------------------------------------------------------------------
    def open_step(self, step: int, rank: int | None = None) -> bool:
        """Open ``step{step}/rank{rank}`` (``proc{pid}`` without a rank) for writing; False when the
        config's step/rank lists exclude it. Opening the step already open does nothing."""
        if self.closed:
            raise RuntimeError("this dump writer is closed")
        self.auto_steps = False
        if self.step_no == step:
            return True
        if self.step_no is not None:
            self.finish_step()
        if not self.config.dumps_step(step) or not self.config.dumps_rank(rank):
            return False
        sub = f"rank{rank}" if rank is not None else f"proc{os.getpid()}"
        self.rank, self.step_no = rank, step
        self.rank_dir = os.path.join(self.config.dump_path, f"step{step}", sub)
        self.data_dir = os.path.join(self.rank_dir, "dump_tensor_data") if self.config.needs_data else None
        head = {"task": self.config.task, "level": self.config.level, "framework": self.framework,
                "dump_data_dir": self.data_dir, "extra_info": self.config.extra_info}
        done = threading.Event()
        self._queue.put(("open", (self.rank_dir, self.data_dir, head, done)))
        done.wait()
        if self.errors:  # the step's folder or journal could not be written: this step is not dumped
            self._report(step, self.rank_dir, "not dumped")
            done = threading.Event()
            self._queue.put(("abort", done))  # drop what was half-opened (the journal and its descriptor)
            done.wait()
            self.errors = []
            self.step_no = self.rank_dir = self.data_dir = None
            self._failed_step = step
            return False
        self._failed_step = None
        return True

    def _report(self, step: int, where: str | None, what: str) -> None:
        """One warning and one problem record for a step that could not be written completely."""
        from ..session.dump_session import DumpProblem

        errs, self.errors = self.errors, []
        where = where or self.config.dump_path
        cause = write_cause(errs, where)
        msg = (f"step {step} {what}: {cause}. Training goes on; later steps are dumped as usual once the cause "
               f"is fixed")
        self.problems.append(DumpProblem(where, msg))
        warnings.warn(f"nbdebug dump: {where}: {msg}", UserWarning, stacklevel=2)

    def flush(self) -> None:
        """Write the JSON files of the open step from everything produced so far (msProbe's ``stop()``)."""
        if self.step_no is None:
            return
        done = threading.Event()
        self._queue.put(("flush", done))
        done.wait()
        if self.errors:
            self._report(self.step_no, self.rank_dir, "is not completely written yet")

    def finish_step(self) -> str | None:
        """Finalize the open step (JSON files written, journal removed); returns its rank directory."""
        if self.step_no is None:
            self._new_step_state()
            return None
        done = threading.Event()
        self._queue.put(("close", done))
        done.wait()
        step, where = self.step_no, self.rank_dir
        self.step_no = self.rank_dir = self.data_dir = None
        self._new_step_state()
        if self.errors:
            self._report(step, where, "was not dumped completely (what was written is in its folder; a crash "
                                      "journal left there holds what dump.json could not take and nbdebug.load "
                                      "reads it)")
            return None
        self.last_dir = where
        return self.last_dir

    def _on_session_step(self, index: int) -> None:
        if self.auto_steps or self.step_no is not None:
            self.finish_step()

    def _ensure_open(self) -> bool:
        if self.step_no is not None:
            return True
        if not self.auto_steps:
            return False
        step = self.session.step_index if self.session is not None else 0
        if step == self._failed_step:
            return False  # reported once; tried again at the next step
        try:
            self.open_step(step, self.io.rank())
        finally:
            self.auto_steps = True
        return self.step_no is not None

    @property
    def pending(self) -> int:
        """Items handed to the writer thread and not written yet."""
        return len(self._queue.items) + self._queue.busy

    # -- the tap (training thread) ----------------------------------------------------------------
    def _snap(self, t: Any) -> Any:
        return self.io.snapshot(t, data=self.config.needs_data, crc=self.md5)

    def tap(self, node: Any, tensors: list[tuple[str, Any]], call: tuple | None) -> None:
        """Adapter callback: ``node`` completed, with its ``(slot, tensor)`` list and ``(args, kwargs, out)``."""
        try:
            self._tap(node, tensors, call)
        finally:
            self.io.node_done(node.name)

    def _tap(self, node: Any, tensors: list[tuple[str, Any]], call: tuple | None) -> None:
        name = node.name
        if name.startswith(NBDEBUG_ONLY) or self.closed:
            return
        kind = entry_kind(node)
        level = self.level
        if kind is None or level == "debug":
            return
        if kind in ("mod_f", "mod_b", "pgrad") and level == "L1":
            return
        if kind in ("api_f", "api_b") and level == "L0":
            return
        if kind in ("api_f", "mod_f"):
            self._forward(node, kind, tensors, call)
        elif kind in ("api_b", "mod_b"):
            self._backward(node, kind, tensors)
        else:
            self._param_grad(node, tensors)

    def _chain(self, node: Any, kind: str) -> list[str]:
        """Names of the module calls enclosing ``node`` (outermost first; the root model is not named)."""
        if node.section == "optimizer":
            return []
        scope = node.scope
        parts = [p for p in scope.split("/") if p] if scope else []
        out = []
        prefix = self.io.module_prefix
        for i in range(len(parts)):
            path = "/".join(parts[: i + 1])
            cls = self.io.module_class(path)
            if cls is None:
                continue
            out.append(f"{prefix}.{path.replace('/', '.')}.{cls}.forward.{self._done_calls.get(path, 0)}")
        return out

    def _forward(self, node: Any, kind: str, tensors: list[tuple[str, Any]], call: tuple | None) -> None:
        name = node.name
        chain = self._chain(node, kind)
        sel = self._sel
        for anc in chain:
            if anc not in self._begun:
                self._begun.add(anc)
                sel.begin_module(anc)
        if kind == "mod_f" and name not in self._begun:
            self._begun.add(name)
            sel.begin_module(name)
        keep = self.recording and sel.check(name) and risk_keeps(self.risk, name)
        if kind == "mod_f":
            sel.end_module(name)
            path = self.io.module_path(name)
            self._done_calls[path] = self._done_calls.get(path, 0) + 1
        if not keep or not self._ensure_open():
            return
        self._chains[name] = chain  # its backward is dumped too
        cfg = self.config
        want_in, want_out = cfg.allowed("forward", "input"), cfg.allowed("forward", "output")
        if not (want_in or want_out):
            return
        args, kwargs, out = call if call is not None else call_from_slots(tensors)
        if kind == "mod_f":
            self._arity[name] = self.io.module_grad_arity(args, out)
        made = out is not NO_OUTPUT  # else the call raised inside (a checkpoint's early stop): inputs only
        if kind == "api_f":
            self._arity[name] = self.io.grad_arity(out) if made else 0
            args, kwargs = self.io.as_called(name, args, kwargs or {})
            if name.startswith(DROPOUT) and dropout_p(args, kwargs) == 0:
                del self._chains[name]  # msProbe records no backward for a dropout with p=0
        part: dict[str, Any] = {}
        if want_in:
            part["input_args"] = self._walk(args, name, "input", (), None, True)
            part["input_kwargs"] = self._walk(kwargs or {}, name, "kwargs", (), None, True)
        if want_out and made:
            part["output"] = self._walk(out if isinstance(out, tuple) else (out,), name, "output", (), None, False)
            if kind == "mod_f":
                params = {}
                for slot, t in tensors:
                    if slot.startswith("parameters."):
                        local = slot[len("parameters."):]
                        params[local] = self._walk(t, name, "parameters", (local,), local, False)
                part["parameters"] = params
        stack = call_stack() if cfg.extra_info else None
        rec = {"t": "e", "n": name, "k": kind, "c": chain}
        if stack is not None:
            rec["s"] = stack
        if node.section == "optimizer":
            rec["o"] = True
        self._queue.put(("e", (rec, part)), self._bytes(part))

    def _backward(self, node: Any, kind: str, tensors: list[tuple[str, Any]]) -> None:
        name = node.name
        pair = node.pair
        if pair not in self._chains:  # its forward was not dumped (filtered, or outside start/stop)
            return
        if kind == "mod_b" and not self.recording:
            return  # msProbe records module backward only while the dump runs
        keep = self._sel.check(name) and risk_keeps(self.risk, name)
        if not keep or not self._ensure_open():
            return
        want = {"input": self.config.allowed("backward", "input"), "output": self.config.allowed("backward", "output")}
        if not any(want.values()):
            return
        slots: dict[str, dict[tuple, Any]] = {"input": {}, "output": {}}
        for slot, t in tensors:
            head, path = slot_path(slot)
            if head in slots and want[head]:
                snap = self._snap(t)
                if self.config.needs_data:
                    snap.data_name = f"{name}.{slot}{self.io.ext}"
                slots[head][path] = snap
        rec = {"t": "e", "n": name, "k": kind, "c": self._chains[pair]}
        self._queue.put(("bwd", (rec, slots, self._arity.get(pair), want)),
                        self._bytes(slots))

    def _param_grad(self, node: Any, tensors: list[tuple[str, Any]]) -> None:
        if not self.recording:
            return
        name = node.name
        sel = self._sel
        if sel.active and not (sel.name_matches(name) and (not sel.scope or sel.in_scope)):
            return
        if not self._ensure_open():
            return
        part = {}
        for slot, t in tensors:
            snap = self._snap(t)
            if self.config.needs_data:
                snap.data_name = f"{name}.{slot}{self.io.ext}"
            part[slot] = [snap]
        if part:
            self._queue.put(("e", ({"t": "e", "n": name, "k": "pgrad"}, part)), self._bytes(part))

    def _walk(self, obj: Any, name: str, category: str, path: tuple, key: Any, input_side: bool) -> Any:
        """Describe ``obj`` msProbe-style; tensors become snapshots named ``{name}.{category}.{path}``."""
        io = self.io
        if io.is_tensor(obj):
            snap = (io.input_snap(name, obj) if input_side else None) or self._snap(obj)
            if self.config.needs_data and (snap.data is not None):
                snap.data_name = self._data_name(name, category, path)
            return snap
        if isinstance(obj, np.ndarray):
            snap = NdSnap(obj, self.config.needs_data)
            if self.config.needs_data:
                snap.data_name = self._data_name(name, category, path)
            return snap
        if obj is None:
            return None
        if isinstance(obj, io.leaf_types):
            return io.describe(obj, key)
        if isinstance(obj, tuple) and hasattr(obj, "_fields"):
            return {f: self._walk(getattr(obj, f), name, category, (*path, f), f, input_side) for f in obj._fields}
        if is_dataclass(obj) and not isinstance(obj, type):
            return {f.name: self._walk(getattr(obj, f.name), name, category, (*path, f.name), f.name, input_side)
                    for f in fields(obj)}
        if isinstance(obj, (list, tuple)):
            return [self._walk(o, name, category, (*path, i), i, input_side) for i, o in enumerate(obj)]
        if isinstance(obj, dict):
            return {k: self._walk(v, name, category, (*path, k), k, input_side) for k, v in obj.items()}
        return io.describe(obj, key)

    def _data_name(self, name: str, category: str, path: tuple) -> str:
        parts = [name] + ([category] if category else []) + [str(p) for p in path]
        return ".".join(parts) + self.io.ext

    def _bytes(self, obj: Any) -> int:
        if isinstance(obj, self._snap_types):
            if isinstance(obj, NdSnap):
                return 0 if obj.arr is None else int(obj.arr.nbytes)
            return obj.nbytes
        if isinstance(obj, dict):
            return sum(self._bytes(v) for v in obj.values())
        if isinstance(obj, (list, tuple)):
            return sum(self._bytes(v) for v in obj)
        return 0

    # -- single-point saving (PrecisionDebugger.save at level "debug") -----------------------------
    def save(self, variable: Any, name: str, save_backward: bool = True) -> None:
        """Record ``variable`` (tensor, dict, list ...) as ``{name}.{n}.debug`` and, when ``save_backward``,
        its gradients as ``{name}_grad.{n}.debug`` once backward computes them."""
        if not self._ensure_open():
            return
        n = self._debug_counts.get(name, 0)
        self._debug_counts[name] = n + 1
        key = f"{name}.{n}.debug"
        data = self._walk(variable, f"{name}.{n}", "debug", (), None, False)
        self._queue.put(("dbg", (key, data)), self._bytes(data))
        if not save_backward:
            return
        gkey = f"{name}_grad.{n}.debug"
        skeleton = self._skeleton(variable)
        self._queue.put(("dbg", (gkey, skeleton)))
        for path, t in self._grad_leaves(variable, ()):
            self.io.register_grad_hook(t, self._debug_grad_hook(gkey, path, f"{name}_grad.{n}"))

    def _debug_grad_hook(self, gkey: str, path: tuple, base: str) -> Any:
        step = self.step_no

        def hook(grad: Any) -> None:
            if self.closed or self.step_no != step:
                return
            snap = self._snap(grad)
            if self.config.needs_data and snap.data is not None:
                snap.data_name = self._data_name(base, "debug", path)
            self._queue.put(("dbgfill", (gkey, list(path), snap)), self._bytes(snap))

        return hook

    def _skeleton(self, obj: Any) -> Any:
        """msProbe's all-null copy of a structure (filled as gradients arrive)."""
        if self.io.is_tensor(obj) or obj is None or isinstance(obj, (np.ndarray, *self.io.leaf_types)):
            return None
        if isinstance(obj, tuple) and hasattr(obj, "_fields"):
            return {f: self._skeleton(getattr(obj, f)) for f in obj._fields}
        if isinstance(obj, (list, tuple)):
            return [self._skeleton(o) for o in obj]
        if isinstance(obj, dict):
            return {k: self._skeleton(v) for k, v in obj.items()}
        return None

    def _grad_leaves(self, obj: Any, path: tuple) -> Any:
        if self.io.is_tensor(obj):
            yield path, obj
        elif isinstance(obj, tuple) and hasattr(obj, "_fields"):
            for f in obj._fields:
                yield from self._grad_leaves(getattr(obj, f), (*path, f))
        elif isinstance(obj, (list, tuple)) and not isinstance(obj, self.io.leaf_types):
            for i, o in enumerate(obj):
                yield from self._grad_leaves(o, (*path, i))
        elif isinstance(obj, dict):
            for k, v in obj.items():
                yield from self._grad_leaves(v, (*path, k))

    # -- writer thread ----------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            cmd, payload = self._queue.get()
            if cmd == "stop":
                return
            try:
                self._handle(cmd, payload)
            except Exception as e:  # keep writing the rest; the training thread raises at the next flush
                self.errors.append(f"{type(e).__name__}: {e}")
                self._log_error(traceback.format_exc())
            finally:
                if cmd in ("open", "flush", "close", "abort"):
                    (payload[3] if cmd == "open" else payload).set()

    def _log_error(self, text: str) -> None:
        if self.rank_dir and os.path.isdir(self.rank_dir):
            path = os.path.join(self.rank_dir, "dump_error_info.log")
            try:
                with open(path, "a", encoding="utf-8") as f:
                    f.write(text + "\n")
            except OSError:
                try:  # a full disk: no empty log file left behind
                    if os.path.getsize(path) == 0:
                        os.remove(path)
                except OSError:
                    pass

    def _handle(self, cmd: str, payload: Any) -> None:
        if cmd == "open":
            rank_dir, data_dir, head, _ = payload
            if self._journal is not None:
                self._journal.close(remove=False)
                self._journal = None
            os.makedirs(rank_dir, exist_ok=True)
            if data_dir:
                os.makedirs(data_dir, exist_ok=True)
            self._bwd = {}
            self._journal = Journal(rank_dir, head)
            self._journal.write_files()
            return
        j = self._journal
        if j is None:
            return
        if cmd == "abort":
            self._journal = None
            j.close(remove=True)
            return
        if cmd == "e":
            rec, part = payload
            rec["d"] = self._resolve(part)
            j.add(rec)
        elif cmd == "bwd":
            rec, slots, arity, want = payload
            acc = self._bwd.setdefault(rec["n"], {"input": {}, "output": {}})
            for head in ("input", "output"):
                for path, snap in slots[head].items():
                    acc[head][path] = self._resolve(snap)
            rec["sl"] = "+".join(h for h in ("input", "output") if slots[h])
            data = {}
            for i, head in enumerate(("input", "output")):
                if not want[head]:
                    continue
                lst: list[Any] = []
                for path, value in sorted(acc[head].items(), key=lambda kv: tuple(str(p) for p in kv[0])):
                    place(lst, path or (0,), value)
                if arity is not None:
                    lst.extend([None] * (arity[i] - len(lst)))
                data[head] = lst
            rec["d"] = data
            j.add(rec)
        elif cmd == "dbg":
            key, data = payload
            j.add({"t": "dbg", "n": key, "d": self._resolve(data)})
        elif cmd == "dbgfill":
            key, path, snap = payload
            j.add({"t": "dbgfill", "n": key, "p": path, "d": self._resolve(snap)})
        elif cmd == "flush":
            j.write_files()
        elif cmd == "close":
            self._journal = None
            ok = False
            try:
                j.write_files()
                ok = True
            finally:
                j.close(remove=ok)  # files not written: the journal stays, for nbdebug.load and recover

    def _resolve(self, obj: Any) -> Any:
        if isinstance(obj, NdSnap):
            out = dict(obj.head)
            if obj.data_name and obj.arr is not None and self.data_dir:
                path = os.path.join(self.data_dir, obj.data_name)
                with no_leftovers(path):
                    out["data_name"] = self.io.save_ndarray(obj.arr, path)
            return out
        if isinstance(obj, self._snap_types):
            return self._tensor_json(obj)
        if isinstance(obj, list):
            return [self._resolve(o) for o in obj]
        if isinstance(obj, dict):
            return {k: self._resolve(v) for k, v in obj.items()}
        return obj

    def _tensor_json(self, s: Any) -> dict[str, Any]:
        io = self.io
        mx, mn, mean, norm = io.stats_values(s)
        out = {"type": io.tensor_type, "dtype": s.dtype, "shape": s.shape, "Max": mx, "Min": mn, "Mean": mean,
               "Norm": norm}
        if io.has_requires_grad:
            out["requires_grad"] = s.requires_grad
        if s.data_name and s.data is not None and self.data_dir:
            path = os.path.join(self.data_dir, s.data_name)
            with no_leftovers(path):
                io.save(s, path)
            out["data_name"] = s.data_name
        if self.md5:
            out["md5"] = io.crc32(s)
        return out

    # -- lifetime ---------------------------------------------------------------------------------
    def close(self) -> None:
        """Finalize the open step, stop the writer thread and remove the tap."""
        if self.closed:
            return
        try:
            self.finish_step()
        finally:
            self.closed = True
            self.io.uninstall()
            if self._unsub is not None:
                self._unsub()
            self._queue.put(("stop", None))
            self._worker.join(30)
            try:
                atexit.unregister(self._atexit)
            except Exception:  # pragma: no cover
                pass

    def __repr__(self) -> str:
        where = self.rank_dir or self.last_dir or self.config.dump_path
        return f"<nbdebug.DumpWriter {self.config.task} level={self.level} {where}>"
