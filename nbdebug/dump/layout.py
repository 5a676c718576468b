"""Which kind of dump a path holds (:func:`detect_layout`) and where its steps and ranks are
(:func:`step_rank_dirs`).

>>> import os, tempfile
>>> root = tempfile.mkdtemp(); os.makedirs(os.path.join(root, "step0", "rank0"))
>>> open(os.path.join(root, "step0", "rank0", "dump.json"), "w").close()
>>> detect_layout(root), list(step_rank_dirs(root)[0])
('msprobe', ['rank0'])
"""

from __future__ import annotations

import os
import re

_STEP_RE = re.compile(r"^step(\d+)$")
_RANK_RE = re.compile(r"^(?:rank(\d+)|proc(\d+))$")
_KERNEL_RANK_RE = re.compile(r"^rank_(\d+)$")

def detect_layout(path: str) -> str:
    """``"msprobe"``, ``"kernel"`` or ``"npy"`` for ``path``; ``ValueError`` saying what was found otherwise."""
    if os.path.isfile(path):
        if path.endswith(".json"):
            return "msprobe"
        raise ValueError(f"{path}: not a dump (expected a dump folder or a dump.json file)")
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{path}: no such file or folder")
    entries = _listdir(path)
    names = set(entries)
    if "dump.json" in names or any(_STEP_RE.match(e) or _RANK_RE.match(e) for e in entries):
        return "msprobe"
    if any(_KERNEL_RANK_RE.match(e) for e in entries) or {"graphs", "execution_order"} & names:
        return "kernel"
    if any(e.endswith((".npy", ".pt")) for e in entries):
        return "npy"
    for e in entries:  # e.g. a parent folder holding one dump
        sub = os.path.join(path, e)
        if os.path.isdir(sub) and any(_STEP_RE.match(x) for x in _listdir(sub)):
            return "msprobe"
    raise ValueError(f"{path}: no dump found (no step*/rank*/proc* folders, no dump.json, no rank_* kernel "
                     f"dump, no .npy files); it holds {sorted(entries)[:10]}")


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def step_rank_dirs(path: str) -> dict[int, dict[str, str]]:
    """``{step: {rank label: folder}}`` of an msProbe-layout dump (``rank0``/``proc123`` labels)."""
    if os.path.isfile(path):  # a dump.json
        d = os.path.dirname(os.path.abspath(path))
        return {_step_of(d): {_rank_label(d): d}}
    entries = _listdir(path)
    if "dump.json" in entries:
        return {_step_of(path): {_rank_label(path): path}}
    out: dict[int, dict[str, str]] = {}
    step_dirs = [(int(m.group(1)), os.path.join(path, e)) for e in entries if (m := _STEP_RE.match(e))]
    if not step_dirs and any(_RANK_RE.match(e) for e in entries):  # path is one step folder
        step_dirs = [(_step_of(path, default=0), path)]
    if not step_dirs:
        for e in sorted(entries):
            sub = os.path.join(path, e)
            if os.path.isdir(sub) and any(_STEP_RE.match(x) for x in _listdir(sub)):
                return step_rank_dirs(sub)
    for step, d in step_dirs:
        ranks = {}
        for e in sorted(_listdir(d)):
            if _RANK_RE.match(e) and os.path.isdir(os.path.join(d, e)):
                ranks[e] = os.path.join(d, e)
        if "dump.json" in _listdir(d):
            ranks.setdefault(_rank_label(d), d)
        out[step] = ranks
    return out


def _step_of(d: str, default: int = 0) -> int:
    for part in reversed(os.path.abspath(d).split(os.sep)):
        m = _STEP_RE.match(part)
        if m:
            return int(m.group(1))
    return default


def _rank_label(d: str) -> str:
    base = os.path.basename(os.path.abspath(d))
    return base if _RANK_RE.match(base) else "rank0"


def _rank_sort_key(label: str) -> tuple[int, int]:
    m = _RANK_RE.match(label)
    if not m:
        return (2, 0)
    return (0, int(m.group(1))) if m.group(1) is not None else (1, int(m.group(2)))
