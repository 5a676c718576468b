"""Crash-safe dump JSON: a journal written as data is produced, assembled into msProbe's files.

While a step is dumped, every finished entry is appended to ``.nbdebug_journal.jsonl`` in the rank
directory (one JSON object per line, written with one ``write`` call as soon as the entry's tensor files
are on disk). At the step end (and at ``stop()``) the journal's content is assembled into ``dump.json``,
``stack.json``, ``construct.json`` (or ``debug.json`` at level ``debug``), each written atomically (a
temporary file renamed over the old one); the journal is removed once the step is final.

If the process dies mid-step, :func:`recover` turns what the journal holds into those files:

>>> import tempfile, json, os
>>> d = tempfile.mkdtemp()
>>> j = Journal(d, {"task": "statistics", "level": "L1", "framework": "pytorch", "dump_data_dir": None})
>>> j.add({"t": "e", "n": "Functional.relu.0.forward", "k": "api_f", "d": {"input_args": [], "output": []}})
>>> _ = recover(d)
>>> list(json.load(open(os.path.join(d, "dump.json")))["data"])
['Functional.relu.0.forward']

Record kinds: ``head`` (task, level, framework, dump_data_dir, extra_info); ``e`` an entry or a part of one
(``n`` name, ``d`` data merged into the entry as msProbe merges updates, ``k`` kind ``api_f|mod_f|api_b|
mod_b|pgrad``, ``c`` ancestor module calls, ``s`` call stack, ``o`` inside optimizer.step); ``dbg`` a
``save()`` entry; ``dbgfill`` a gradient arriving for a ``save()`` entry (``p`` the path inside it).
"""

from __future__ import annotations

import errno
import json
import os
import threading
from typing import Any

from ..frameworks.registry import module_prefixes

JOURNAL = ".nbdebug_journal.jsonl"


def write_json_atomic(path: str, obj: Any) -> None:
    """``json.dump(obj, indent=1)`` (msProbe's format) to ``path`` via a temporary file and a rename."""
    tmp = f"{path}.tmp{os.getpid()}.{threading.get_ident()}"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=1)
        os.replace(tmp, path)
    except BaseException:  # a full disk: no (empty) temporary file left behind
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise


def _bwd_name(fwd: str) -> str:
    """Backward name of a forward module call or API: ``...forward.0`` / ``...0.forward``."""
    if ".forward." in fwd:
        head, _, tail = fwd.rpartition(".forward.")
        return f"{head}.backward.{tail}"
    if fwd.endswith(".forward"):
        return fwd[: -len(".forward")] + ".backward"
    return fwd


class Assembler:
    """Builds msProbe's JSON files from journal records (in memory; used live and by :func:`recover`)."""

    def __init__(self) -> None:
        self.head: dict[str, Any] = {}
        self.data: dict[str, dict[str, Any]] = {}
        self.events: list[dict[str, Any]] = []  # entry records without their data, in order
        self.debug: dict[str, Any] = {}
        self.records = 0
        self._pending: dict[str, Any] | None = None
        self._module_heads = tuple(f"{p}." for p in module_prefixes())  # "Module.", "Cell."

    def add(self, rec: dict[str, Any]) -> None:
        self.records += 1
        t = rec.get("t")
        if t == "head":
            self.head = {k: rec.get(k) for k in ("task", "level", "framework", "dump_data_dir", "extra_info")}
        elif t == "e":
            name, part = rec["n"], rec.get("d") or {}
            old = self.data.get(name)
            if old is None:
                self.data[name] = dict(part)
            elif name.startswith(self._module_heads):  # msProbe moves an updated module entry to the end
                old.update(part)
                del self.data[name]
                self.data[name] = old
            else:
                old.update(part)
            event = {k: v for k, v in rec.items() if k != "d"}
            self.events.append(event)
            self._order_module_backward(event)
        elif t == "dbg":
            self.debug[rec["n"]] = rec.get("d")
        elif t == "dbgfill":
            self._fill(rec["n"], rec.get("p") or [], rec.get("d"))

    def _order_module_backward(self, event: dict[str, Any]) -> None:
        """Gradients reaching a module's output (``sl`` "input") and leaving the consumer module of that same
        tensor (``sl`` "output") arrive together; msProbe finishes the consumer first. A module backward that
        got only its output gradients so far is moved after such consumer records."""
        pending = self._pending
        if event.get("k") == "mod_b" and event.get("sl") == "output" and pending is not None \
                and pending["n"] != event["n"]:
            name = pending["n"]
            self.data[name] = self.data.pop(name)
            idx = next(i for i in range(len(self.events) - 1, -1, -1) if self.events[i] is pending)
            self.events.append(self.events.pop(idx))
            return
        self._pending = event if event.get("k") == "mod_b" and event.get("sl") == "input" else None

    def _fill(self, key: str, path: list[Any], value: Any) -> None:
        if key not in self.debug:
            return
        if not path:
            self.debug[key] = value
            return
        cur = self.debug[key]
        for p in path[:-1]:
            try:
                cur = cur[p]
            except (KeyError, IndexError, TypeError):
                return
        try:
            cur[path[-1]] = value
        except (KeyError, IndexError, TypeError):
            return

    # -- files ------------------------------------------------------------------------------------
    def _top(self) -> dict[str, Any]:
        h = self.head
        return {"task": h.get("task"), "level": h.get("level"), "framework": h.get("framework"),
                "dump_data_dir": h.get("dump_data_dir")}

    def dump_json(self) -> dict[str, Any]:
        out = self._top()
        out["data"] = self.data
        return out

    def debug_json(self) -> dict[str, Any]:
        out = self._top()
        out["data"] = self.debug
        return out

    def _forward_events(self) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("k") in ("api_f", "mod_f")]

    def stack_json(self) -> dict[str, Any]:
        """``{"0": [[names sharing a stack], [frames]], ...}``; modules in call (pre-)order, APIs as they finish."""
        stacks: dict[str, list[str]] = {}
        for e in self._forward_events():
            if e.get("s") is not None:
                stacks.setdefault(e["n"], e["s"])
        groups: dict[tuple[str, ...], list[str]] = {}
        done: set[str] = set()
        for e in self._forward_events():
            for name in [*(e.get("c") or []), e["n"]]:
                if name in done or name not in stacks:
                    continue
                done.add(name)
                groups.setdefault(tuple(stacks[name]), []).append(name)
        return {str(i): [names, list(frames)] for i, (frames, names) in enumerate(groups.items())}

    def construct_json(self) -> dict[str, Any]:
        """``{node: parent module call or None}`` as msProbe writes it ({} at L1)."""
        level = self.head.get("level")
        out: dict[str, Any] = {}
        if level not in ("L0", "mix"):
            return out
        first: dict[str, int] = {}
        last: dict[str, int] = {}
        for i, e in enumerate(self.events):
            if e.get("k") == "mod_b":
                first.setdefault(e["n"], i)
                last[e["n"]] = i
        for i, e in enumerate(self.events):
            kind, name = e.get("k"), e["n"]
            if kind == "pgrad" or (kind == "mod_b" and last[name] != i):
                continue  # a module backward is placed when it completes, as msProbe's hook does
            chain = list(e.get("c") or [])
            if kind in ("api_b", "mod_b"):  # enclosing = module backwards begun and not yet finished
                chain = [b for b in (_bwd_name(c) for c in chain) if b in first and first[b] < i < last[b]]
            if kind in ("api_f", "api_b"):
                if level != "mix":
                    continue
                if e.get("o"):
                    out.setdefault("optimizer", None)
                    out[name] = "optimizer"
                else:
                    out[name] = chain[-1] if chain else None
            for i, anc in enumerate(chain):
                out.setdefault(anc, chain[i - 1] if i else None)
            if kind in ("mod_f", "mod_b"):
                out.setdefault(name, chain[-1] if chain else None)
        return out

    def write(self, rank_dir: str) -> None:
        """Write the step's JSON files into ``rank_dir`` (atomically, one by one)."""
        if self.head.get("level") == "debug":
            write_json_atomic(os.path.join(rank_dir, "debug.json"), self.debug_json())
            return
        write_json_atomic(os.path.join(rank_dir, "dump.json"), self.dump_json())
        if self.head.get("extra_info", True):
            write_json_atomic(os.path.join(rank_dir, "stack.json"), self.stack_json())
            write_json_atomic(os.path.join(rank_dir, "construct.json"), self.construct_json())


class Journal:
    """Append-only record log of one step's rank directory, mirrored into an :class:`Assembler`."""

    def __init__(self, rank_dir: str, head: dict[str, Any]) -> None:
        self.rank_dir = rank_dir
        self.path = os.path.join(rank_dir, JOURNAL)
        self.asm = Assembler()
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        self._size = 0
        try:
            self.add({"t": "head", **head})
        except BaseException:
            self.close(remove=True)
            raise

    def add(self, rec: dict[str, Any]) -> None:
        line = (json.dumps(rec, separators=(",", ":")) + "\n").encode("utf-8")
        try:
            n = os.write(self._fd, line)  # one write: a killed process leaves at most one partial last line
        except OSError:
            self._cut()
            raise
        if n != len(line):  # a short write (disk full): cut the partial record off again
            self._cut()
            raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)}: a journal record of {len(line)} bytes "
                                        f"could not be written", self.path)
        self._size += n
        self.asm.add(rec)

    def _cut(self) -> None:
        try:
            os.ftruncate(self._fd, self._size)
        except OSError:
            pass

    def write_files(self) -> None:
        self.asm.write(self.rank_dir)

    def close(self, remove: bool = True) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if remove:
            try:
                os.remove(self.path)
            except FileNotFoundError:
                pass


def read_journal(path: str) -> Assembler:
    """Replay a journal; a truncated last line (the process died mid-write) is dropped.

    A damaged line anywhere else raises ``ValueError`` naming the file and the line.
    """
    asm = Assembler()
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    last = len(lines) - 1
    for i, raw in enumerate(lines):
        if not raw.strip():
            continue
        try:
            rec = json.loads(raw)
        except ValueError:
            if i == last:  # no newline after it: the partial last record of a killed writer
                break
            raise ValueError(f"{path}: line {i + 1} is not a journal record (damaged file)") from None
        asm.add(rec)
    if not asm.head:
        raise ValueError(f"{path}: no header record; not an nbdebug dump journal")
    return asm


def _rank_dirs(step_dir: str) -> list[str]:
    if os.path.exists(os.path.join(step_dir, JOURNAL)):
        return [step_dir]
    out = []
    for name in sorted(os.listdir(step_dir)):
        sub = os.path.join(step_dir, name)
        if os.path.isdir(sub) and os.path.exists(os.path.join(sub, JOURNAL)):
            out.append(sub)
    return out


def recover(step_dir: str, *, remove_journal: bool = True) -> list[str]:
    """Rebuild ``dump.json`` / ``stack.json`` / ``construct.json`` (or ``debug.json``) from the journal(s).

    ``step_dir`` is a ``step{N}`` directory (every ``rank*``/``proc*`` inside it with a journal is
    recovered) or one rank directory. Returns the rank directories written. Raises ``FileNotFoundError``
    when there is no journal (nothing to recover: the step was finalized or never started).
    """
    step_dir = os.fspath(step_dir)
    dirs = _rank_dirs(step_dir)
    if not dirs:
        raise FileNotFoundError(f"{step_dir}: no {JOURNAL} here or in its rank directories; nothing to recover")
    for d in dirs:
        journal = os.path.join(d, JOURNAL)
        asm = read_journal(journal)
        asm.write(d)
        if remove_journal:
            os.remove(journal)
    return dirs
