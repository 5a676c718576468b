"""The ``.npy`` files of one iteration of a kernel dump: their names parsed, indexed by kernel, split into graph
runs, and read into statistics rows (:mod:`~nbdebug.frameworks.mindspore.kernel_pairing` pairs them with the
kernels of a :class:`~nbdebug.frameworks.mindspore.kernel_graph.KernelGraph`).

>>> parse_dump_name("MatMul.MatMul-op0.0.0.1700000000.output.0.DefaultFormat.float32.npy")
('MatMul.MatMul-op0', 'output.0', 1700000000, 'float32')
"""

from __future__ import annotations

import csv
import os
from collections.abc import Iterable

import numpy as np

from ..core.native import fastats as _fastats  # the optional native kernel (None: numpy is the fallback)
from ..npy_read import read_npy

_NAN_ROW = [float("nan")] * 5 + [0.0] * 4
_NP_CODES = {np.dtype(np.float32): 0, np.dtype(np.float64): 1, np.dtype(np.float16): 2, np.dtype(np.int8): 4,
             np.dtype(np.uint8): 5, np.dtype(np.int16): 6, np.dtype(np.int32): 7, np.dtype(np.int64): 8,
             np.dtype(np.bool_): 9}


# -- the .npy files of one iteration ----------------------------------------------------------------

def _mapping(iter_dir: str) -> dict[str, str]:
    mapping: dict[str, str] = {}
    mapping_csv = os.path.join(iter_dir, "mapping.csv")
    if os.path.exists(mapping_csv):  # long names were replaced by numbers
        with open(mapping_csv, newline="") as f:
            for row in csv.reader(f):
                if len(row) >= 2:
                    mapping[row[0].strip()] = row[1].strip()
    return mapping


def parse_dump_name(fname: str, mapping: dict[str, str] | None = None) -> tuple[str, str, int, str] | None:
    """``(file key, slot, timestamp, dtype)`` of a kernel dump file name, or None for other files."""
    if not fname.endswith(".npy"):
        return None
    real = (mapping.get(fname) or mapping.get(fname[:-4]) or fname) if mapping else fname
    parts = (real[:-4] if real.endswith(".npy") else real).rsplit(".", 7)
    if len(parts) != 8 or parts[4] not in ("input", "output") or not parts[3].isdigit():
        return None
    key, _task, _stream, ts, io, idx, _fmt, dtype = parts
    return key, f"{io}.{idx}", int(ts), dtype.lower()


def index_files(iter_dir: str, names: Iterable[str]) -> dict[str, dict[str, str]]:
    """``{file key: {"input.0": path, ..., "__dtype__.input.0": dtype}}`` for dump files of one run."""
    return _index(os.path.join(iter_dir, ""), _parsed(iter_dir, names))


def _parsed(iter_dir: str, names: Iterable[str]) -> list[tuple[int, str, str, str, str]]:
    """``(timestamp, file key, slot, dtype, name)`` of every dump file among ``names`` (each parsed once; the
    loop is :func:`parse_dump_name` written out: a step's hundreds of names go through it)."""
    mapping = _mapping(iter_dir)
    if mapping:
        return [(p[2], p[0], p[1], p[3], fname) for fname in names
                if (p := parse_dump_name(fname, mapping)) is not None]
    out = []
    append = out.append
    for fname in names:
        parts = fname.rsplit(".", 8)
        if len(parts) == 9 and parts[8] == "npy" and parts[4] in _IO and parts[3].isdigit():
            append((int(parts[3]), parts[0], f"{parts[4]}.{parts[5]}", parts[7].lower(), fname))
    return out


_IO = frozenset(("input", "output"))
#: ``"__dtype__.{slot}"`` by slot (the index's dtype keys, made once)
_DTYPE_KEYS: dict[str, str] = {}


def _index(prefix: str, entries: Iterable[tuple[int, str, str, str, str]]) -> dict[str, dict[str, str]]:
    """:func:`index_files` of parsed entries (:func:`_parsed`); ``prefix``: the directory and a separator."""
    out: dict[str, dict[str, str]] = {}
    first: dict[str, int] = {}
    for ts, key, slot, dtype, fname in entries:
        entry = out.get(key)
        if entry is None:
            entry = out[key] = {}
        entry[slot] = prefix + fname
        dkey = _DTYPE_KEYS.get(slot)
        if dkey is None:
            dkey = _DTYPE_KEYS[slot] = "__dtype__." + slot
        entry[dkey] = dtype
        if ts < first.get(key, ts + 1):
            first[key] = ts
            entry["__ts__"] = str(ts)
    return out


def index_iteration(iter_dir: str) -> dict[str, dict[str, str]]:
    """:func:`index_files` for every file of a ``{graph}/{iteration}`` directory (one run)."""
    return index_files(iter_dir, os.listdir(iter_dir))


def split_runs(iter_dir: str) -> list[tuple[int, dict[str, dict[str, str]]]]:
    """The graph runs dumped into one iteration directory, in time order: ``[(first timestamp, index)]``.

    MindSpore's iteration counter does not always advance between runs of a graph, so one directory
    can hold several runs; the k-th file of a (kernel, slot) belongs to the k-th run.
    """
    return split_names(iter_dir, os.listdir(iter_dir))


def split_names(iter_dir: str, names: Iterable[str]) -> list[tuple[int, dict[str, dict[str, str]]]]:
    """:func:`split_runs` over the files ``names`` of ``iter_dir`` (a loop body's repetitions in one call)."""
    entries = _parsed(iter_dir, names)
    prefix = os.path.join(iter_dir, "")
    if len({(e[1], e[2]) for e in entries}) == len(entries):  # each kernel's slot once: one run
        return [(min(entries)[0], _index(prefix, entries))] if entries else []
    entries.sort()
    seen: dict[tuple[str, str], int] = {}
    runs: list[list[tuple[int, str, str, str, str]]] = []
    for e in entries:
        k = seen.get((e[1], e[2]), 0)
        seen[(e[1], e[2])] = k + 1
        while len(runs) <= k:
            runs.append([])
        runs[k].append(e)
    return [(run[0][0], _index(prefix, run)) for run in runs]


def _slot_order(slot: str) -> tuple[int, int, str]:
    io, _, idx = slot.partition(".")
    return (0 if io == "input" else 1, int(idx) if idx.isdigit() else 1 << 30, idx)


def load_npy(path: str) -> np.ndarray:
    try:
        return read_npy(path)
    except ValueError:
        raise
    except Exception as exc:  # noqa: BLE001 - any unreadable file: name it
        raise ValueError(f"cannot read dump file {path}: {exc}") from None


def array_row(arr: np.ndarray, out: np.ndarray) -> str | None:
    """Write the raw stats row of ``arr`` into ``out`` (9 floats); returns an unsupported reason or None."""
    if arr.size == 0:
        out[:] = _NAN_ROW[:2] + [0.0] * 7
        return None
    if arr.dtype.kind == "c":
        out[:] = _NAN_ROW
        return f"unsupported: complex dtype {arr.dtype}"
    if arr.dtype.kind == "V" and arr.dtype.itemsize == 2:  # bfloat16 saved as raw 16-bit words
        arr = arr.view(np.uint16)
        code = 3
    else:
        code = _NP_CODES.get(arr.dtype)
    if not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr)
    if _fastats is not None and code is not None:
        _fastats.reduce(arr.ctypes.data, arr.size, code, out.ctypes.data)
        return None
    if arr.dtype.kind not in "biuf":
        out[:] = _NAN_ROW
        return f"unsupported: dtype {arr.dtype}"
    x = arr.astype(np.float64).ravel()
    with np.errstate(all="ignore"):
        out[:] = [x.max(), x.min(), x.sum(), np.abs(x).sum(), (x * x).sum(), np.count_nonzero(x == 0),
                  np.count_nonzero(np.isnan(x)), np.count_nonzero(x == np.inf), np.count_nonzero(x == -np.inf)]
    return None


_EMPTY = np.zeros(0, np.float32)

#: a file's statistics: ``(raw stats row, dtype name, shape, size, nbytes, unsupported reason or None)``
FileStats = tuple[np.ndarray, str, tuple[int, ...], int, int, "str | None"]


def file_stats(path: str) -> FileStats:
    """The statistics of one dump file, read with numpy (``ValueError`` naming the file when unreadable)."""
    arr = load_npy(path)
    row = np.empty(9, np.float64)
    why = array_row(arr, row)
    name = "bfloat16" if arr.dtype.kind == "V" and arr.dtype.itemsize == 2 else str(arr.dtype)
    return row, name, tuple(int(d) for d in arr.shape), int(arr.size), int(arr.nbytes), why


#: the native batch reader (None: every file is read with numpy, :func:`file_stats`)
_read_batch = getattr(_fastats, "read_npy_stats", None)


def files_stats(paths: list[str], rows: np.ndarray | None = None) -> list[FileStats | ValueError]:
    """:func:`file_stats` of many files at once: the native kernel reads and reduces the files it can in one
    call (the GIL released, no array made); the others, and every file when it is not built, are read with
    numpy. An unreadable file's item is the ``ValueError`` that names it. ``rows``: where the statistics rows
    go (C-contiguous float64, ``len(paths)`` x 9; the items' rows are views of it).

    >>> import os, tempfile
    >>> p = os.path.join(tempfile.mkdtemp(), "x.npy"); np.save(p, np.array([1.0, -2.0], np.float32))
    >>> row, dtype, shape, size, nbytes, why = files_stats([p])[0]
    >>> row[:3].tolist(), dtype, shape, size, nbytes, why
    ([1.0, -2.0, -1.0], 'float32', (2,), 2, 8, None)
    """
    if rows is None:
        rows = np.empty((len(paths), 9), np.float64)
    native = _read_batch(paths, rows) if _read_batch is not None and paths else [None] * len(paths)
    out: list[FileStats | ValueError] = []
    for i, got in enumerate(native):
        if got is not None:
            out.append((rows[i], got[0], got[1], got[2], got[3], None))
            continue
        try:
            st = file_stats(paths[i])
        except ValueError as exc:
            rows[i] = _NAN_ROW
            out.append(exc)
            continue
        rows[i] = st[0]
        out.append((rows[i], *st[1:]))
    return out


def misdump_reason(path: str, file_dtype: str, device_dtype: str) -> str:
    """Why a dump file that disagrees with its kernel's dtype is not shown (see :meth:`RunRecorder._load`).

    >>> misdump_reason("/d/MatMul.x.output.0.DefaultFormat.Float16.npy", "float16", "float32").split(", so")[0]
    "not the value used: MindSpore's kernel dump wrote this float32 tensor as float16 (the graph's declared \
type; the CPU kernel computes in float32)"
    """
    return (f"not the value used: MindSpore's kernel dump wrote this {device_dtype} tensor as {file_dtype} "
            f"(the graph's declared type; the CPU kernel computes in {device_dtype}), so "
            f"{os.path.basename(path)} holds the buffer's bytes misread as {file_dtype}; "
            f"no statistics or value are shown for it")
