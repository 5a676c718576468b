"""``nbdebug.load(path)``: open a dump as an :class:`~nbdebug.offline.OfflineSession`.

Layouts recognised (``detect_layout``):

* ``msprobe`` — ``dump_path/step{N}/{rank{R}|proc{pid}}/dump.json`` (+ ``construct.json``, ``stack.json``,
  ``dump_tensor_data/*.npy|*.pt``), written by nbdebug or by ``mindstudio-probe`` for PyTorch or MindSpore.
  ``path`` may be the dump root, one ``step{N}`` folder, one rank folder, or a ``dump.json`` file.
* ``kernel`` — a MindSpore graph-mode kernel dump (``rank_*/{net}/{graph}/{iteration}/*.npy`` with
  ``graphs/`` and ``execution_order/``); read by the backend whose ``dump_layouts`` holds it (MindSpore's
  ``load_dump``, ``frameworks/registry.py``: :func:`~nbdebug.frameworks.registry.backend_for_layout`).
* ``npy`` — a folder of ``.npy`` files saved by hand (TroubleShooter style, ``0_conv1.npy`` ...): one node
  per file, in the order of their numeric prefix (then name), statistics computed from the values.

The graph: one node per dump entry (msProbe name), ``Parameter.{path}.{name}`` nodes for the parameters
that module entries list, scopes from ``construct.json`` (else from the module path in the name), stacks
from ``stack.json``, and data-flow edges inferred by matching each input's statistics
(dtype, shape, Max, Min, Mean, Norm) with the latest earlier output that has identical ones (constant
tensors are not matched: too ambiguous). Without ``construct.json``, forward ops after the last backward
entry of a step are put in the optimizer section.

Damaged dumps load what is valid: a truncated ``dump.json`` keeps its complete entries, a missing or
malformed file is skipped, a missing tensor file leaves statistics only. Each problem names its file in
``OfflineSession.problems`` and one ``UserWarning`` sums them up.

>>> import json, os, tempfile
>>> root = tempfile.mkdtemp(); d = os.path.join(root, "step0", "rank0"); os.makedirs(d)
>>> t = {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2], "Max": 1.0, "Min": -1.0,
...      "Mean": 0.0, "Norm": 1.4142135}
>>> entry = {"input_args": [t], "input_kwargs": {}, "output": [dict(t, Min=0.0, Mean=0.5, Norm=1.0)]}
>>> with open(os.path.join(d, "dump.json"), "w") as f:
...     json.dump({"task": "statistics", "level": "L1", "framework": "pytorch", "dump_data_dir": None,
...                "data": {"Functional.relu.0.forward": entry}}, f)
>>> off = load(root)
>>> off.stats("Functional.relu.0.forward", "output.0", 0)["abs_mean"]
0.5
"""

from __future__ import annotations

import gc
import os
import re
import sys
import time
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from ..frameworks.registry import backend_for_layout
from ..offline import DumpProblem, DumpSession, OfflineSession, TensorFile, read_framework_file, read_tensor_file
from ..session.stats import FIELDS
from .builder import Builder
from .entries import _short, entry_slots
from .json_read import MAX_JSON_BYTES, require_regular
from .layout import _listdir, _rank_sort_key, detect_layout, step_rank_dirs
from .names import normalize_dtype, parse_name

__all__ = ["load", "detect_layout", "step_rank_dirs", "parse_name", "normalize_dtype", "entry_slots",
           "require_regular", "MAX_JSON_BYTES", "EXACT_AUTO_BYTES"]

_NPY_PREFIX_RE = re.compile(r"^(\d+)[_\-.](.*)$")
#: bytes of tensor files under which ``exact="auto"`` computes the statistics msProbe does not record
EXACT_AUTO_BYTES = 256 * 2**20

Progress = Callable[[int, int, str], Any]


# ------------------------------------------------------------------------------------------------
# other layouts
# ------------------------------------------------------------------------------------------------


def _npy_sort_key(fname: str) -> tuple[int, int, str]:
    m = _NPY_PREFIX_RE.match(fname)
    return (0, int(m.group(1)), fname) if m else (1, 0, fname)


def _load_npy_dir(path: str, session: DumpSession, problems: list[DumpProblem], progress: Progress) -> None:
    from ..watch.conditions import compute_stats

    files = sorted((f for f in _listdir(path) if f.endswith((".npy", ".pt"))), key=_npy_sort_key)
    keys, dtypes, shapes, rows = [], [], [], []
    tfiles: dict[tuple[str, str], TensorFile] = {}
    for k, fname in enumerate(files):
        full = os.path.join(path, fname)
        try:
            arr = read_tensor_file(TensorFile(full, None, ""))  # type: ignore[arg-type]
        except ValueError as e:
            problems.append(DumpProblem(full, str(e).split(": ", 1)[-1] + "; skipped"))
            continue
        stem = fname.rsplit(".", 1)[0]
        m = _NPY_PREFIX_RE.match(stem)
        op_type = m.group(2) if m else stem
        node = session.graph.add_node(stem, kind="op", op_type=op_type or stem)
        node.order = len(keys)
        shape = tuple(int(x) for x in arr.shape)
        dtype = normalize_dtype(arr.dtype)
        node.shapes["output.0"], node.dtypes["output.0"] = shape, dtype
        keys.append((stem, "output.0"))
        dtypes.append(dtype)
        shapes.append(shape)
        rows.append(compute_stats(np.asarray(arr)))
        tfiles[(stem, "output.0")] = TensorFile(full, shape, dtype)
        if k % 50 == 49:
            progress(k + 1, len(files), "reading .npy files")
    values = np.stack(rows) if rows else np.zeros((0, len(FIELDS)))
    session.add_step(0, keys, dtypes, shapes, values, files=tfiles)


def _load_framework_layout(layout: str, path: str, rank: int | str | None) -> Any:
    """A dump in a layout of one framework's own (``"kernel"``), read by that framework's backend."""
    backend = backend_for_layout(layout)
    if backend is None:
        raise NotImplementedError(f"{path} is a {layout} dump, which no framework backend reads")
    if isinstance(rank, str):
        digits = re.sub(r"\D", "", rank)
        rank = int(digits) if digits else None
    try:
        return backend.load_dump(layout, path, rank=rank)
    except ImportError as e:
        raise NotImplementedError(f"{path} is a {backend.name} {layout} dump, which needs {backend.name}'s "
                                  f"reader (not available: {e})") from None


# ------------------------------------------------------------------------------------------------
# entry point
# ------------------------------------------------------------------------------------------------


def _stderr_progress() -> Progress:
    state = {"t0": time.perf_counter(), "shown": False}

    def report(done: int, total: int, what: str) -> None:
        if time.perf_counter() - state["t0"] < 1.0 and done < total:
            return
        if not state["shown"] and done >= total:
            return  # finished within a second: say nothing
        state["shown"] = True
        end = "\n" if done >= total else ""
        sys.stderr.write(f"\rnbdebug.load: {done}/{total} {what}".ljust(72) + end)
        sys.stderr.flush()

    return report


def load(path: str | os.PathLike, *, rank: int | str | None = None, steps: Iterable[int] | None = None,
         exact: bool | None = None, progress: Progress | None = None, warn: bool = True) -> OfflineSession:
    """Open a dump (see the module docstring for layouts) as an :class:`~nbdebug.offline.OfflineSession`.

    Parameters
    ----------
    path: dump root, a ``step{N}`` folder, a rank folder, a ``dump.json``, a MindSpore kernel dump or a
        folder of ``.npy`` files.
    rank: which rank to load (an int, or a folder name such as ``"proc1234"``); default the lowest.
    steps: load only these steps.
    exact: compute the statistics msProbe does not record (abs_mean, zero/NaN/Inf counts) from the tensor
        files. None (default): when the dump has tensor files totalling at most 256 MiB.
    progress: ``progress(done, total, what)`` during the load (a UI passes its own; by default a line on
        stderr once a load takes more than a second).
    warn: emit one ``UserWarning`` summing up the problems found.

    Raises only ``ValueError`` (nothing in ``path`` is a dump, or no step matches) and ``OSError``
    (``FileNotFoundError``: no such path). Damage inside a dump is never raised: every damaged, hostile or
    unreadable file (truncated or non-object JSON, statistics that are not numbers, nesting too deep,
    symlinks to devices, FIFOs, files over :data:`MAX_JSON_BYTES`) is skipped and named in ``problems``;
    only regular files inside the dump folder are read, and a step cut by a crash is read from its journal.
    """
    path = os.fspath(path)
    layout = detect_layout(path)
    gc_was = gc.isenabled()
    gc.disable()  # millions of parsed JSON containers: collections during the load are pure overhead
    try:
        return _load(path, layout, rank, steps, exact, progress, warn)
    finally:
        if gc_was:
            gc.enable()


def _load(path: str, layout: str, rank: int | str | None, steps: Iterable[int] | None, exact: bool | None,
          progress: Progress | None, warn: bool) -> OfflineSession:
    report = progress or _stderr_progress()
    if layout not in ("msprobe", "npy"):  # a framework's own layout ("kernel")
        session = _load_framework_layout(layout, path, rank)
        off = OfflineSession(session, path=path, layout=layout)
        _warn(off, warn)
        return off
    session = DumpSession(framework="", read_file=read_framework_file)
    problems: list[DumpProblem] = session.problems  # the loader reports into the session's list
    meta: dict[str, Any] = {}
    if layout == "npy":
        _load_npy_dir(path, session, problems, report)
        session.framework = "numpy"
    else:
        found = step_rank_dirs(path)
        wanted = None if steps is None else {int(s) for s in steps}
        plan: list[tuple[int, str, str]] = []
        ranks_seen: set[str] = set()
        for step in sorted(found):
            if wanted is not None and step not in wanted:
                continue
            ranks = found[step]
            ranks_seen.update(ranks)
            if not ranks:
                problems.append(DumpProblem(path, f"step{step} has no rank folder with a dump.json; skipped"))
                continue
            if rank is None:
                label = min(ranks, key=_rank_sort_key)
            else:
                label = f"rank{rank}" if isinstance(rank, int) else str(rank)
                if label not in ranks:
                    problems.append(DumpProblem(path, f"step{step} has no {label} (it has {sorted(ranks)}); "
                                                      f"skipped"))
                    continue
            plan.append((step, label, ranks[label]))
        if not plan and not problems:
            raise ValueError(f"{path}: no step of the dump matches (steps {sorted(found)}, asked for "
                             f"{sorted(wanted) if wanted is not None else 'all'})")
        builder = Builder(session, problems)
        json_file = path if os.path.isfile(path) else None
        total = len(plan)
        for k, (step, label, d) in enumerate(plan):
            report(k, total, f"steps ({label})")
            try:
                builder.read_rank_dir(step, d, json_file)
            except (TypeError, ValueError, KeyError, AttributeError, IndexError, RecursionError, OverflowError,
                    UnicodeError) as e:  # damage no specific check names: the step is skipped, named
                _drop_step(session, step)
                problems.append(DumpProblem(json_file or os.path.join(d, "dump.json"),
                                            f"damaged ({type(e).__name__}: {_short(str(e), 200)}); step {step} "
                                            f"is skipped"))
        report(total, total, "steps")
        meta = dict(builder.meta)
        meta["ranks"] = sorted(ranks_seen, key=_rank_sort_key)
        meta["rank"] = plan[0][1] if plan else None
        nfiles = sum(len(f) for f in session.files.values())
        if nfiles and exact is not False:
            nbytes = 0
            if exact is None:
                for f in session.files.values():
                    for tf in f.values():
                        try:
                            nbytes += os.path.getsize(tf.path)
                        except OSError:
                            pass
                        if nbytes > EXACT_AUTO_BYTES:
                            break
            if exact or nbytes <= EXACT_AUTO_BYTES:
                builder.exact_stats(report, 0, nfiles)
                report(nfiles, nfiles, "tensor files")
        if not session.framework:
            session.framework = str(meta.get("framework") or "")
    off = OfflineSession(session, path=path, layout=layout, meta=meta)
    if layout == "msprobe":
        off.rank_loader = lambda label: load(path, rank=label, steps=wanted, exact=exact, progress=progress,
                                             warn=warn)
    _warn(off, warn)
    return off


def _drop_step(session: DumpSession, step: int) -> None:
    for d in (session.steps, session.files, session.estimated):
        d.pop(step, None)


def _warn(off: OfflineSession, warn: bool) -> None:
    problems = off.problems
    if warn and problems:
        more = f" (and {len(problems) - 3} more; see .problems)" if len(problems) > 3 else ""
        warnings.warn(f"nbdebug.load({off.path!r}): {len(problems)} problem(s): "
                      + "; ".join(str(p) for p in problems[:3]) + more, UserWarning, stacklevel=3)
