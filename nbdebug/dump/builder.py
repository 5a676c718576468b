"""Dump folders turned into a :class:`~nbdebug.offline.DumpSession`: one rank folder of one step at a time
(``dump.json`` or its crash journal, ``construct.json``, ``stack.json``, ``dump_tensor_data/``), then, on
request, the statistics msProbe does not record computed from the tensor files.

>>> import json, os, tempfile
>>> from nbdebug.offline import DumpSession
>>> d = tempfile.mkdtemp()
>>> t = {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2], "Max": 1.0, "Min": 0.0,
...      "Mean": 0.5, "Norm": 1.0}
>>> with open(os.path.join(d, "dump.json"), "w") as f:
...     json.dump({"framework": "pytorch", "data": {"Functional.relu.0.forward": {"output": [t]}}}, f)
>>> session, problems = DumpSession(framework=""), []
>>> Builder(session, problems).read_rank_dir(3, d)
>>> sorted(session.steps), session.framework, problems
([3], 'pytorch', [])
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np

from ..offline import DumpProblem, DumpSession, read_tensor_file
from ..session.stats import COL
from .entries import _short
from .json_read import FAILED, MAX_JSON_BYTES, _json_kind, _parse_stack, _read_json, read_regular
from .layout import _listdir
from .names import parse_name
from .step_build import StepBuild


class Builder:
    """Turns dump files into a :class:`DumpSession` (graph + steps + files)."""

    def __init__(self, session: DumpSession, problems: list[DumpProblem]) -> None:
        self.s = session
        self.problems = problems
        self.meta: dict[str, Any] = {}

    def read_rank_dir(self, step: int, d: str, json_path: str | None = None) -> None:
        """Add ``step`` from the rank folder ``d`` (its ``dump.json``, or ``json_path``)."""
        json_path = json_path or os.path.join(d, "dump.json")
        journaled = self._from_journal(d)
        if journaled is not None:
            doc, construct, stacks = journaled
        else:
            if not os.path.lexists(json_path):
                self.problems.append(DumpProblem(json_path, "missing; this step is skipped"))
                return
            doc = _read_json(json_path, self.problems, salvage_data=True)
            if doc is FAILED:
                return
        data = self._data_of(doc, json_path)
        if data is None:
            return
        if journaled is None:
            construct, stacks = self._construct(d), self._stacks(d)
        data_dir = os.path.join(d, "dump_tensor_data")
        if not os.path.isdir(data_dir):
            alt = doc.get("dump_data_dir")
            if isinstance(alt, str) and alt and os.path.normpath(alt) != os.path.normpath(data_dir):
                self.problems.append(DumpProblem(
                    data_dir, f"missing; dump.json's dump_data_dir {_short(alt, 120)} is not read: only files "
                              f"inside the dump's own folder are (a copied or crafted dump.json could point "
                              f"anywhere); tensors keep their statistics only"))
        listing = set(_listdir(data_dir))
        self._build_step(step, data, construct, stacks, data_dir, listing, json_path)

    def _data_of(self, doc: Any, json_path: str) -> dict | None:
        """The ``data`` object of a dump.json document (None, reported, when there is none); its metadata
        is taken into the session."""
        if not isinstance(doc, dict):
            self.problems.append(DumpProblem(json_path, f"holds {_json_kind(doc)}, not a JSON object; this step "
                                                        f"is skipped"))
            return None
        data = doc.get("data")
        if not isinstance(data, dict):
            self.problems.append(DumpProblem(json_path, "has no \"data\" object; this step is skipped"))
            return None
        for k in ("task", "level", "framework"):
            if doc.get(k) is not None:
                self.meta.setdefault(k, doc[k])
        if doc.get("framework") and not self.s.framework:
            self.s.framework = str(doc["framework"])
        if doc.get("framework_version") and not self.s.framework_version:
            self.s.framework_version = str(doc["framework_version"])
        return data

    def _construct(self, d: str) -> dict[str, Any]:
        """``construct.json``'s parent links (entries whose parent is not a name dropped, reported)."""
        cpath = os.path.join(d, "construct.json")
        if not os.path.lexists(cpath):
            return {}
        c = _read_json(cpath, self.problems)
        if isinstance(c, dict):
            bad = [k for k, v in c.items() if v is not None and type(v) is not str]
            if not bad:
                return c
            self.problems.append(DumpProblem(cpath, f"{len(bad)} entries whose parent is not a name (e.g. "
                                                    f"{_short(bad[0])}); their scopes come from the names"))
            return {k: v for k, v in c.items() if v is None or type(v) is str}
        if c is not FAILED:
            self.problems.append(DumpProblem(cpath, f"holds {_json_kind(c)}, not a JSON object; scopes come "
                                                    f"from the names"))
        return {}

    def _stacks(self, d: str) -> dict[str, list[str]]:
        """``stack.json``'s call stacks by entry name ({} when absent or unreadable, reported)."""
        spath = os.path.join(d, "stack.json")
        if not os.path.lexists(spath):
            return {}
        sdoc = _read_json(spath, self.problems)
        if not isinstance(sdoc, dict) and sdoc is not FAILED:
            self.problems.append(DumpProblem(spath, f"holds {_json_kind(sdoc)}, not a JSON object; no call "
                                                    f"stacks"))
        stacks = _parse_stack(sdoc)
        if isinstance(sdoc, dict) and sdoc and not any(stacks.values()):
            self.problems.append(DumpProblem(spath, "holds no call stacks in msProbe's layout ({\"0\": [[names], "
                                                    "[frames]], ...}); ignored"))
        return stacks

    def _from_journal(self, d: str) -> tuple[dict, dict, dict] | None:
        """A step cut mid-write (kill -9) left its crash journal: its entries, as ``recover`` would write
        them (read-only; the problem says how to make it permanent)."""
        from .journal import JOURNAL, read_journal

        jpath = os.path.join(d, JOURNAL)
        if not os.path.lexists(jpath):
            return None
        try:
            read_regular(jpath, MAX_JSON_BYTES)  # type and size checks before reading
            asm = read_journal(jpath)
            doc = asm.dump_json()
            construct, stacks = asm.construct_json(), _parse_stack(asm.stack_json())
        except (ValueError, OSError, RecursionError, KeyError, TypeError, AttributeError, StopIteration) as e:
            self.problems.append(DumpProblem(jpath, f"crash journal of an unfinished step, unreadable "
                                                    f"({str(e).split(': ', 1)[-1]}); dump.json is loaded as is"))
            return None
        self.problems.append(DumpProblem(
            jpath, f"the step was cut before it finished (the writing process ended mid-step); "
                   f"{len(doc['data'])} entries recovered from this crash journal. "
                   f"nbdebug.dump.recover({os.path.dirname(d)!r}) writes them into dump.json"))
        return doc, construct, stacks

    def _build_step(self, step: int, data: dict, construct: dict, stacks: dict, data_dir: str,
                    listing: set[str], json_path: str) -> None:
        build = StepBuild(self.s, self.problems, data, construct, stacks, os.path.relpath(json_path))
        build.add_parameters()
        for name, entry in data.items():
            build.add_entry(name, entry)
        build.mark_optimizer()
        files = build.tensor_files(data_dir, listing)
        rows = build.rows
        values, est = rows.matrix()
        self.s.add_step(step, rows.keys, rows.dtypes, rows.shapes, values, files=files, estimated=est,
                        index=rows.index)
        self._param_files(step)

    def _param_files(self, step: int) -> None:
        """Give synthesized ``Parameter.*`` rows the file of the module entry they came from."""
        files = self.s.files[step]
        table = self.s.steps[step]
        for key in table.keys:
            node, slot = key
            if not node.startswith("Parameter.") or key in files:
                continue
            path, _, pname = node[len("Parameter."):].rpartition(".")
            for (n2, s2), tf in files.items():
                if s2 == f"parameters.{pname}" and parse_name(n2).path == path:
                    files[key] = tf
                    break

    # -- exact statistics from tensor files -------------------------------------------------------
    def exact_stats(self, progress: Callable[[int, int, str], Any], base: int, total: int) -> None:
        """Fill the statistics msProbe does not record (abs_mean, zero/NaN/Inf counts) from the tensor
        files; msProbe's own max/min/mean/norm stay."""
        from ..watch.conditions import compute_stats

        done = base
        for step in sorted(self.s.steps):
            table, est, files = self.s.steps[step], self.s.estimated[step], self.s.files[step]
            bad: list[tuple[str, str]] = []
            for key, tf in files.items():
                done += 1
                if done % 50 == 0:
                    progress(done, total, f"statistics from tensor files (step {step})")
                try:
                    arr = read_tensor_file(tf)
                except ValueError as e:
                    self.problems.append(DumpProblem(tf.path, str(e).split(": ", 1)[-1] +
                                                     f"; {key[0]} {key[1]} keeps its statistics only"))
                    bad.append(key)
                    continue
                row = compute_stats(np.asarray(arr))
                i = table.index[key]
                cur = table.values[i]
                for f in ("abs_mean", "zero_count", "nan_count", "pos_inf_count", "neg_inf_count"):
                    cur[COL[f]] = row[COL[f]]
                    est[i, COL[f]] = False
                for f in ("max", "min", "mean", "norm"):  # msProbe's own values stay; fill its gaps
                    if np.isnan(cur[COL[f]]) and not np.isnan(row[COL[f]]):
                        cur[COL[f]] = row[COL[f]]
            for key in bad:
                files.pop(key, None)
