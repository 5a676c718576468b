"""A kernel dump on disk: its rank, graph and iteration folders, and :func:`load_kernel_dump`, which opens one as
an offline session (graph runs grouped into training steps).

>>> find_rank_dirs("/nonexistent")
[]
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from typing import Any

import numpy as np

from .kernel_files import split_runs
from .kernel_graph import KernelGraph, load_kernel_graph
from .kernel_recorder import CPU_UNFILLED_OUTPUTS, RunRecorder

# -- directory layout ---------------------------------------------------------------------------------

_RANK_RE = re.compile(r"^rank_(\d+)$")


def find_rank_dirs(path: str) -> list[str]:
    """``rank_{r}`` directories under a kernel dump root (or ``path`` itself when it is one)."""
    base = os.path.basename(os.path.normpath(path))
    if _RANK_RE.match(base):
        return [path]
    out = []
    if os.path.isdir(path):
        for name in sorted(os.listdir(path), key=lambda n: (len(n), n)):
            if _RANK_RE.match(name) and os.path.isdir(os.path.join(path, name)):
                out.append(os.path.join(path, name))
    return out




def graph_dirs(rank_dir: str) -> list[tuple[int, str]]:
    """``(graph id, path)`` of every ``{net}/{graph}`` directory of a rank."""
    out = []
    for net in sorted(os.listdir(rank_dir)) if os.path.isdir(rank_dir) else []:
        if net in ("graphs", "execution_order") or net.startswith("."):
            continue
        net_dir = os.path.join(rank_dir, net)
        if not os.path.isdir(net_dir):
            continue
        for g in os.listdir(net_dir):
            gdir = os.path.join(net_dir, g)
            if g.isdigit() and os.path.isdir(gdir):
                out.append((int(g), gdir))
    return out


def iteration_dirs(rank_dir: str) -> list[tuple[int, int, str]]:
    """``(iteration, graph id, path)`` for every ``{net}/{graph}/{iteration}`` directory of a rank."""
    out = []
    for g, gdir in graph_dirs(rank_dir):
        for it in os.listdir(gdir):
            if it.isdigit() and os.path.isdir(os.path.join(gdir, it)):
                out.append((int(it), g, os.path.join(gdir, it)))
    out.sort()
    return out


def graph_ids(rank_dir: str) -> list[int]:
    ids = set()
    for sub, pat in (("graphs", r"ms_output_trace_code_graph_(\d+)\.(?:ir|pb)$"),
                     ("execution_order", r"ms_execution_order_graph_(\d+)\.csv$")):
        d = os.path.join(rank_dir, sub)
        for name in os.listdir(d) if os.path.isdir(d) else []:
            m = re.match(pat, name)
            if m:
                ids.add(int(m.group(1)))
    return sorted(ids)


# -- offline ----------------------------------------------------------------------------------------------

class KernelDump:
    """An opened kernel dump: graphs and per-iteration files of one rank (any iteration is readable)."""

    def __init__(self, rank_dir: str) -> None:
        self.rank_dir = rank_dir
        self.graphs: dict[int, KernelGraph] = {}
        self.iterations = iteration_dirs(rank_dir)
        for g in sorted({g for _, g, _ in self.iterations} | set(graph_ids(rank_dir))):
            try:
                self.graphs[g] = load_kernel_graph(rank_dir, g)
            except ValueError:
                if any(gg == g for _, gg, _ in self.iterations):
                    raise

    def runs(self, iteration: int, graph_id: int) -> list[tuple[int, dict[str, dict[str, str]]]]:
        """The runs of graph ``graph_id`` dumped under iteration ``iteration`` (see :func:`split_runs`)."""
        for it, g, path in self.iterations:
            if it == iteration and g == graph_id:
                return split_runs(path)
        raise KeyError(f"no iteration {iteration} of graph {graph_id} in {self.rank_dir}")


def load_kernel_dump(path: str, *, rank: int | None = None) -> Any:
    """Open a MindSpore kernel dump directory as an offline session (``live=False``).

    ``path`` is the dump root (holding ``rank_*``) or one ``rank_*`` directory; ``rank`` picks a rank
    (default: the lowest). Graph runs are grouped into training steps (:func:`group_runs`), in time order
    (``session.step_iterations`` maps a step to the ``(graph id, iteration)`` of its main graph,
    ``session.step_runs`` to every run it holds). The result is a :class:`nbdebug.session.dump_session.DumpSession`:
    statistics of every step, tensors of any step read from the files on demand, and ``problems`` naming
    every file that could not be read (its slot is left out). Needs numpy only.

    >>> # s = load_kernel_dump("/path/to/dump"); s.graph.in_order()[0].name
    """
    from ...session.dump_session import DumpProblem, DumpSession, TensorFile
    from ...session.session import StepRecorder, raw_to_fields
    from ...session.stats import FIELDS

    ranks = find_rank_dirs(path)
    if not ranks:
        raise ValueError(f"{path} is not a MindSpore kernel dump (no rank_* directory with graphs/)")
    if rank is not None:
        ranks = [r for r in ranks if os.path.basename(os.path.normpath(r)) == f"rank_{rank}"]
        if not ranks:
            raise ValueError(f"{path} has no rank_{rank}")
    rank_dir = ranks[0]
    dump = KernelDump(rank_dir)
    version, device = _dump_metadata(rank_dir)
    s = DumpSession(framework="mindspore", framework_version=version, device=device)
    s.kernel_dump = dump  # type: ignore[attr-defined]
    # a CPU dump's BatchNorm outputs 1-4 were never written by the kernel: refused with the reason, as live
    rec = RunRecorder(s, retain=False, unfilled=CPU_UNFILLED_OUTPUTS if device == "cpu" else None)
    runs = []  # (first timestamp, iteration, graph id, files)
    for it, g, p in dump.iterations:
        if g in dump.graphs:
            runs.extend((ts, it, g, files) for ts, files in split_runs(p))
    runs.sort(key=lambda r: (r[0], r[1], r[2]))
    s.step_iterations = {}  # type: ignore[attr-defined]
    s.step_runs = {}  # type: ignore[attr-defined]
    for step, group in enumerate(group_runs(runs, {g: bool(kg.weight_names) for g, kg in dump.graphs.items()})):
        rec.record_runs([(dump.graphs[g], files) for _ts, _it, g, files in group])
        main = next((r for r in group if dump.graphs[r[2]].weight_names), group[0])
        s.step_iterations[step] = (main[2], main[1])  # type: ignore[attr-defined]
        s.step_runs[step] = [(g, it) for _ts, it, g, _f in group]  # type: ignore[attr-defined]
        r = s.recorder
        raw = rec.raw()
        values = raw_to_fields(raw[np.asarray(r.rows, dtype=np.intp)], np.asarray(r.counts, dtype=np.float64)) \
            if r.keys else np.zeros((0, len(FIELDS)))
        tfiles = {key: TensorFile(*rec.files[key]) for key in r.keys if key in rec.files}
        table = s.add_step(step, r.keys, r.dtypes, r.shapes, values, files=tfiles)
        table.unsupported = dict(r.unsupported)
        s.recorder = StepRecorder()
        s.order = 0
        rec.new_step()
    s.problems.extend(DumpProblem(f, m) for f, m in dict.fromkeys(rec.problems))
    return s


def group_runs(runs: list[tuple], weighted: dict[int, bool]) -> list[list[tuple]]:
    """Group graph runs ``(first timestamp, iteration, graph id, files)``, in time order, into steps.

    A model with control flow runs several kernel graphs per step: the main graph (it has the weights), its
    branches and loop bodies (a loop body runs several times a step, a loop's body may hold weights too).
    MindSpore numbers the iteration once per call, for every graph of it: the runs in a row that share an
    iteration are one step. Where one iteration holds several calls (the counter did not advance), each
    run of the weighted graph that ran fewest times there starts a step. A dump without any weighted
    graph (inference) makes every run a step.

    >>> runs = [(0, 0, 0, "main"), (1, 0, 1, "body"), (2, 0, 1, "body"), (3, 1, 0, "main"), (4, 1, 1, "body")]
    >>> [[r[3] for r in g] for g in group_runs(runs, {0: True, 1: True})]
    [['main', 'body', 'body'], ['main', 'body']]
    >>> same = [(0, 0, 0, "main"), (1, 0, 1, "branch"), (2, 0, 0, "main"), (3, 0, 1, "branch")]
    >>> [[r[3] for r in g] for g in group_runs(same, {0: True, 1: False})]
    [['main', 'branch'], ['main', 'branch']]
    >>> len(group_runs(runs, {0: False, 1: False}))
    5
    """
    if not any(weighted.get(r[2], False) for r in runs):
        return [[r] for r in runs]
    blocks: list[list[tuple]] = []
    for r in runs:
        if not blocks or blocks[-1][-1][1] != r[1]:
            blocks.append([])
        blocks[-1].append(r)
    groups: list[list[tuple]] = []
    for block in blocks:
        counts: dict[int, int] = {}
        for r in block:
            if weighted.get(r[2], False):
                counts[r[2]] = counts.get(r[2], 0) + 1
        if not counts or min(counts.values()) == 1:
            groups.append(block)
            continue
        fewest = min(counts.values())
        opener = next(r[2] for r in block if counts.get(r[2]) == fewest)
        start = len(groups)
        for r in block:
            if r[2] == opener or len(groups) == start:
                groups.append([])
            groups[-1].append(r)
        if len(groups) > start + fewest:  # runs before the opener's first: they belong to its step
            groups[start:start + 2] = [groups[start] + groups[start + 1]]
    return groups


def _dump_metadata(rank_dir: str) -> tuple[str, str]:
    meta = os.path.join(rank_dir, ".dump_metadata", "config.json")
    try:
        with open(meta) as f:
            d = json.load(f)
        return str(d.get("ms_version", "")), str(d.get("device_target", "cpu")).lower()
    except (OSError, ValueError):
        return "", "cpu"




def remove_files(paths: Iterable[str]) -> None:
    """Delete dump files (the live adapter's pruning: directories stay for MindSpore to write into)."""
    for p in paths:
        try:
            os.remove(p)
        except OSError:
            pass
