"""``nbdebug.load(path)``: open a dump as an :class:`~nbdebug.offline.OfflineSession`.

Layouts recognised (``detect_layout``):

* ``msprobe`` — ``dump_path/step{N}/{rank{R}|proc{pid}}/dump.json`` (+ ``construct.json``, ``stack.json``,
  ``dump_tensor_data/*.npy|*.pt``), written by nbdebug or by ``mindstudio-probe`` for PyTorch or MindSpore.
  ``path`` may be the dump root, one ``step{N}`` folder, one rank folder, or a ``dump.json`` file.
* ``kernel`` — a MindSpore graph-mode kernel dump (``rank_*/{net}/{graph}/{iteration}/*.npy`` with
  ``graphs/`` and ``execution_order/``); read by ``nbdebug.frameworks.mindspore.graph.load_kernel_dump``.
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
import json
import math
import os
import re
import sys
import time
import warnings
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import numpy as np

from ..offline import DumpProblem, DumpSession, OfflineSession, TensorFile, read_framework_file, read_tensor_file
from ..session.stats import COL, FIELDS

_STEP_RE = re.compile(r"^step(\d+)$")
_RANK_RE = re.compile(r"^(?:rank(\d+)|proc(\d+))$")
_KERNEL_RANK_RE = re.compile(r"^rank_(\d+)$")
_NPY_PREFIX_RE = re.compile(r"^(\d+)[_\-.](.*)$")
_DIRECTIONS = ("forward", "backward", "parameters_grad")
_MODULE_PREFIXES = ("Module", "Cell")
#: bytes of tensor files under which ``exact="auto"`` computes the statistics msProbe does not record
EXACT_AUTO_BYTES = 256 * 2**20
NAN = float("nan")

Progress = Callable[[int, int, str], Any]


# ------------------------------------------------------------------------------------------------
# names
# ------------------------------------------------------------------------------------------------


class NameInfo(NamedTuple):
    """What an msProbe (or nbdebug) node name says.

    >>> info = parse_name("Module.block.lin.Linear.forward.1")
    >>> info.kind, info.path, info.cls, info.direction, info.count
    ('module', 'block.lin', 'Linear', 'forward', 1)
    >>> parse_name("Primitive.matmul.MatMul.0.backward").op_type
    'MatMul'
    """

    kind: str  # module | op | parameter | input | constant
    op_type: str
    direction: str  # forward | backward | parameters_grad
    path: str  # dotted module path (modules, parameter gradients, parameters)
    cls: str  # module class, or primitive class
    api: str  # "Functional.linear" for ops
    count: int | None
    prefix: str


_NAME_CACHE: dict[str, NameInfo] = {}
_new_info = tuple.__new__


def parse_name(name: str) -> NameInfo:
    """Split a node name into its parts (cached)."""
    info = _NAME_CACHE.get(name)
    if info is not None:
        return info
    head, _, last = name.rpartition(".")
    api, _, count = head.rpartition(".")
    if (last == "forward" or last == "backward") and count.isdigit() and "." in api:  # the common case: an API
        prefix, _, rest = api.partition(".")
        op_type = rest.rpartition(".")[2]
        cls = op_type if prefix == "Primitive" and "." in rest else ""
        info = _new_info(NameInfo, ("op", op_type, last, "", cls, api, int(count), prefix))
    else:
        info = _parse_other(name)
    if len(_NAME_CACHE) < 1_000_000:
        _NAME_CACHE[name] = info
    return info


def _parse_other(name: str) -> NameInfo:
    parts = name.split(".")
    prefix = parts[0]
    n = len(parts)
    if prefix == "Parameter" and n >= 2:
        return NameInfo("parameter", "Parameter", "forward", ".".join(parts[1:-1]), "", "", None, prefix)
    if prefix in ("Input", "Constant") and n >= 2:
        return NameInfo(prefix.lower(), prefix.lower() if prefix == "Input" else "buffer", "forward", "", "", "",
                        None, prefix)
    if n >= 4 and parts[-1].isdigit() and parts[-2] in _DIRECTIONS:
        direction = parts[-2]
        path = ".".join(parts[1:-3])
        cls = parts[-3]
        if direction == "parameters_grad":
            return NameInfo("parameter", "parameters_grad", direction, path, cls, "", int(parts[-1]), prefix)
        return NameInfo("module", cls, direction, path, cls, "", int(parts[-1]), prefix)
    if n >= 3 and parts[-1] in ("forward", "backward") and parts[-2].isdigit():
        api_parts = parts[1:-2]
        op_type = api_parts[-1] if api_parts else prefix
        cls = api_parts[-1] if prefix == "Primitive" and len(api_parts) > 1 else ""
        return NameInfo("op", op_type, parts[-1], "", cls, ".".join(parts[:-2]), int(parts[-2]), prefix)
    if prefix == "Optimizer" and n >= 3:
        return NameInfo("op", parts[2] if n > 2 else "step", "forward", "", parts[1], ".".join(parts[:-1]),
                        int(parts[-1]) if parts[-1].isdigit() else None, prefix)
    return NameInfo("op", parts[-1] if n > 1 else name, "forward", "", "", name, None, prefix)


def pair_name(name: str, info: NameInfo) -> str | None:
    """The forward node a backward node mirrors, and vice versa."""
    if info.kind == "module":
        if ".forward." in name:
            return name[::-1].replace(".forward."[::-1], ".backward."[::-1], 1)[::-1]
        return name[::-1].replace(".backward."[::-1], ".forward."[::-1], 1)[::-1]
    if info.kind == "op" and info.direction in ("forward", "backward") and name.endswith(("forward", "backward")):
        other = "backward" if info.direction == "forward" else "forward"
        return name[: -len(info.direction)] + other
    return None


def normalize_dtype(dtype: Any) -> str:
    """``torch.float32`` / ``Float32`` / ``float32`` → ``float32``."""
    s = str(dtype)
    for p in ("torch.", "mindspore.", "numpy.", "np."):
        if s.startswith(p):
            s = s[len(p):]
    return s.lower()


# ------------------------------------------------------------------------------------------------
# layout detection
# ------------------------------------------------------------------------------------------------


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


def find_rank_dirs(path: str) -> dict[int, dict[str, str]]:
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
                return find_rank_dirs(sub)
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


# ------------------------------------------------------------------------------------------------
# JSON reading (tolerant)
# ------------------------------------------------------------------------------------------------


try:  # 2-3x faster than the standard library on large dump.json files; optional
    import orjson as _orjson
except ImportError:  # pragma: no cover - depends on the environment
    _orjson = None


#: what :func:`_read_json` returns for a file it could not parse (reported); JSON ``null`` is ``None``
FAILED: Any = type("_Failed", (), {"__repr__": lambda self: "FAILED", "__bool__": lambda self: False})()
#: JSON files larger than this are not read (named in ``problems``); ``nbdebug.dump.load.MAX_JSON_BYTES``
MAX_JSON_BYTES = 4 * 2**30


def require_regular(path: Any) -> os.stat_result:
    """``os.stat`` of ``path`` if it is a regular file (after symlinks); else ``ValueError`` saying what it
    is (a FIFO, a device, a socket, a directory). Call it before handing a path to a reader that would block
    or read forever on such a file (``torch.load``, ``np.load``).

    >>> require_regular("/dev/null")
    Traceback (most recent call last):
    ValueError: is a device, not a regular file; not read
    """
    import stat

    try:
        st = os.stat(path)
    except OSError as e:
        raise ValueError(f"cannot be read ({e.strerror or e})") from None
    if not stat.S_ISREG(st.st_mode):
        kind = ("a FIFO" if stat.S_ISFIFO(st.st_mode) else "a device" if stat.S_ISCHR(st.st_mode) or
                stat.S_ISBLK(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode) else "a directory"
                if stat.S_ISDIR(st.st_mode) else "not a regular file")
        raise ValueError(f"is {kind}, not a regular file; not read")
    return st


def read_regular(path: str, limit: int) -> bytes:
    """The bytes of ``path`` if it is a regular file (after symlinks) of at most ``limit`` bytes; else
    ``ValueError`` saying what it is. FIFOs, devices (``/dev/zero``) and sockets are never opened for
    reading, so a hostile dump cannot hang or exhaust memory."""
    st = require_regular(path)
    if st.st_size > limit:
        raise ValueError(f"is {st.st_size} bytes, over the {limit}-byte limit for this file; not read")
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as f:
            raw = f.read(limit + 1)
    except OSError as e:
        raise ValueError(f"cannot be read ({e.strerror or e})") from None
    if len(raw) > limit:
        raise ValueError(f"grew over the {limit}-byte limit while being read; not read")
    return raw


def _read_json(path: str, problems: list[DumpProblem], *, salvage_data: bool = False) -> Any:
    """Parse ``path``; on damage report it and, for dump.json, keep every complete ``data`` entry.

    Returns :data:`FAILED` when nothing could be read (the problem is recorded)."""
    try:
        raw = read_regular(path, MAX_JSON_BYTES)
    except ValueError as e:
        problems.append(DumpProblem(path, str(e)))
        return FAILED
    try:
        return _parse_json(path, raw, problems, salvage_data)
    except RecursionError:
        problems.append(DumpProblem(path, "nested too deeply to be a dump file; ignored"))
        return FAILED


def _parse_json(path: str, raw: bytes, problems: list[DumpProblem], salvage_data: bool) -> Any:
    # orjson rejects NaN/Infinity literals (msProbe writes them with Python's json): those files take the
    # standard parser
    if _orjson is not None and b"NaN" not in raw and b"Infinity" not in raw:
        try:
            return _orjson.loads(raw)
        except _orjson.JSONDecodeError as e:
            if "depth limit" in str(e):
                raise RecursionError(str(e)) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        problems.append(DumpProblem(path, "not UTF-8 text"))
        return FAILED
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        if not salvage_data:
            problems.append(DumpProblem(path, f"invalid JSON ({e.msg} at line {e.lineno} column {e.colno}); "
                                              f"ignored"))
            return FAILED
        doc, n = _salvage_dump(text)
        problems.append(DumpProblem(path, f"truncated or invalid JSON ({e.msg} at line {e.lineno} column "
                                          f"{e.colno}); loaded the {n} complete entries before it"))
        return doc


def _salvage_dump(text: str) -> tuple[dict[str, Any], int]:
    """The header fields and the complete ``data`` entries of a damaged dump.json."""
    dec = json.JSONDecoder()
    doc: dict[str, Any] = {"data": {}}
    for key in ("task", "level", "framework", "dump_data_dir"):
        m = re.search('"' + re.escape(key) + r'"\s*:\s*', text)
        if m:
            try:
                doc[key] = dec.raw_decode(text, m.end())[0]
            except (json.JSONDecodeError, RecursionError):
                pass
    m = re.search(r'"data"\s*:\s*\{', text)
    if not m:
        return doc, 0
    pos, n, data = m.end(), 0, doc["data"]
    ws = re.compile(r"[\s,]*")
    while True:
        pos = ws.match(text, pos).end()
        if pos >= len(text) or text[pos] == "}":
            break
        try:
            key, pos = dec.raw_decode(text, pos)
            pos = re.compile(r"\s*:\s*").match(text, pos).end()
            value, pos = dec.raw_decode(text, pos)
        except (json.JSONDecodeError, AttributeError, RecursionError):
            break
        if type(key) is not str:
            break
        data[key] = value
        n += 1
    return doc, n


def _parse_stack(obj: Any) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    if not isinstance(obj, dict):
        return out
    for key, value in obj.items():
        if isinstance(value, list) and len(value) == 2 and isinstance(value[0], list) and isinstance(value[1], list):
            frames = [_frame(f) for f in value[1] if isinstance(f, str)]
            for name in value[0]:
                if isinstance(name, str):
                    out[name] = frames
        elif isinstance(value, list):  # older layout: {name: [frames]}
            out[key] = [_frame(f) for f in value if isinstance(f, str)]
    return out


def _json_kind(v: Any) -> str:
    if v is None:
        return "JSON null"
    return {list: "a JSON array", str: "a JSON string", bool: "a JSON boolean", int: "a JSON number",
            float: "a JSON number"}.get(type(v), f"a {type(v).__name__}")


def _frame(s: str) -> str:
    return s.split(", \n", 1)[0].split("\n", 1)[0].strip()


# ------------------------------------------------------------------------------------------------
# one step of one rank
# ------------------------------------------------------------------------------------------------


def _num(v: Any) -> float:
    t = type(v)
    if t is float:
        return v
    if t is int or t is bool:
        return float(v)
    if v is None:
        return NAN
    if t is str:
        try:
            return float(v)
        except ValueError:
            return NAN
    try:
        return float(v)
    except (TypeError, ValueError):
        return NAN


def _floats(values: list[Any]) -> np.ndarray:
    """JSON statistics (float, int, bool, None, "nan"/"inf" strings) as float64; None becomes NaN."""
    try:
        return np.array(values, dtype=np.float64)
    except (TypeError, ValueError):
        return np.array([_num(v) for v in values], dtype=np.float64)


MAX_NESTING = 32  # tensors nested deeper than this inside one argument are not read
MAX_ELEMENTS = 2.0**53  # more elements than any device holds: a damaged shape


def _tensor_leaves(obj: Any, prefix: str, out: list[tuple[str, dict]], depth: int = 0) -> None:
    if depth > MAX_NESTING:
        raise RecursionError(f"{prefix}: nested deeper than {MAX_NESTING}")
    if isinstance(obj, dict):
        if "shape" in obj and "dtype" in obj and "value" not in obj:
            out.append((prefix, obj))
        elif "value" in obj or "type" in obj:
            return  # a non-tensor argument
        else:  # a namedtuple / dict output
            for k, v in obj.items():
                _tensor_leaves(v, f"{prefix}.{k}", out, depth + 1)
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            _tensor_leaves(v, f"{prefix}.{i}", out, depth + 1)


_STAT_TYPES = frozenset({float, int, bool, str, type(None)})
_STATS = ("Max", "Min", "Mean", "Norm")


def _short(v: Any, n: int = 60) -> str:
    try:
        text = repr(v)
    except RecursionError:
        text = f"<{type(v).__name__}>"
    return text if len(text) <= n else text[: n - 3] + "..."


def _clean_tensor(t: dict, name: str, slot: str, rel: str, problems: list[DumpProblem]) -> dict:
    """``t`` with statistics that are not numbers (``"Max": {}``) and a non-string dtype replaced by
    unknowns, each reported."""
    bad = {k: t.get(k) for k in _STATS if type(t.get(k)) not in _STAT_TYPES}
    if type(t.get("dtype", "")) is not str:
        bad["dtype"] = t.get("dtype")
    if not bad:
        return t
    out = dict(t)
    for k, v in bad.items():
        out[k] = "unknown" if k == "dtype" else None
        problems.append(DumpProblem(rel, f"{name} {slot}: {k} is {_short(v)}, not a "
                                         f"{'string' if k == 'dtype' else 'number'}; shown as unknown"))
    return out


def _is_tensor(v: Any) -> bool:
    return type(v) is dict and "shape" in v and "dtype" in v and "value" not in v


def entry_slots(entry: dict) -> list[tuple[str, dict]]:
    """``[(slot, tensor dict)]`` of a dump.json entry, in nbdebug slot names (``input.0``, ``output.1.0``,
    ``input.{kwarg}``, ``parameters.weight``, and the parameter name for ``parameters_grad``)."""
    out: list[tuple[str, dict]] = []
    for key, value in entry.items():
        if key in ("input_args", "input", "output"):
            base = "output." if key == "output" else "input."
            if type(value) is list:
                for i, v in enumerate(value):
                    if _is_tensor(v):
                        out.append((base + str(i), v))
                    elif v is not None:
                        _tensor_leaves(v, base + str(i), out)
            else:
                _tensor_leaves(value, base + "0", out)
        elif key == "input_kwargs":
            if isinstance(value, dict):
                for k, v in value.items():
                    _tensor_leaves(v, f"input.{k}", out)
        elif key == "parameters":
            if isinstance(value, dict):
                for k, v in value.items():
                    _tensor_leaves(v, f"parameters.{k}", out)
        elif isinstance(value, list):  # parameters_grad: {name: [stats]}
            if len(value) == 1:
                _tensor_leaves(value[0], key, out)
            else:
                for i, v in enumerate(value):
                    _tensor_leaves(v, f"{key}.{i}", out)
        elif isinstance(value, dict) and "shape" in value:
            _tensor_leaves(value, key, out)
    return out


class _Step:
    """Rows of one step being assembled."""

    __slots__ = ("keys", "dtypes", "shapes", "mx", "mn", "mean", "norm", "count", "files", "index")

    def __init__(self) -> None:
        self.keys: list[tuple[str, str]] = []
        self.dtypes: list[str] = []
        self.shapes: list[tuple[int, ...]] = []
        self.mx: list[float] = []
        self.mn: list[float] = []
        self.mean: list[float] = []
        self.norm: list[float] = []
        self.count: list[float] = []
        self.files: dict[tuple[str, str], str] = {}
        self.index: dict[tuple[str, str], int] = {}

    def add(self, key: tuple[str, str], dtype: str, shape: tuple[int, ...], count: float, t: dict) -> None:
        """Add (or replace) one tensor's row; statistics stay raw JSON values until :meth:`matrix`."""
        g = t.get
        i = self.index.get(key)
        if i is not None:  # the same slot twice: keep the latest
            self.dtypes[i], self.shapes[i], self.count[i] = dtype, shape, count
            self.mx[i], self.mn[i], self.mean[i], self.norm[i] = g("Max"), g("Min"), g("Mean"), g("Norm")
        else:
            self.index[key] = len(self.keys)
            self.keys.append(key)
            self.dtypes.append(dtype)
            self.shapes.append(shape)
            self.mx.append(g("Max"))
            self.mn.append(g("Min"))
            self.mean.append(g("Mean"))
            self.norm.append(g("Norm"))
            self.count.append(count)
        name = g("data_name")
        if name is not None and type(name) is str and name and name != "-1":
            self.files[key] = name

    def matrix(self) -> tuple[np.ndarray, np.ndarray]:
        """The FIELDS matrix (inferred where msProbe has no statistic) and the *estimated* mask."""
        n = len(self.keys)
        v = np.full((n, len(FIELDS)), np.nan)
        est = np.zeros((n, len(FIELDS)), dtype=bool)
        if not n:
            return v, est
        mx, mn, mean = _floats(self.mx), _floats(self.mn), _floats(self.mean)
        count = np.asarray(self.count, dtype=np.float64)
        v[:, COL["max"]] = mx
        v[:, COL["min"]] = mn
        v[:, COL["mean"]] = mean
        v[:, COL["norm"]] = _floats(self.norm)
        v[:, COL["count"]] = count
        with np.errstate(invalid="ignore"):
            v[:, COL["abs_mean"]] = np.where(mn >= 0, mean, np.where(mx <= 0, -mean, np.nan))
            # Max/Min absent (xor summary mode, unknown types) say nothing; NaN Max/Min mean NaN in the data
            missing = np.fromiter((a is None or b is None for a, b in zip(self.mx, self.mn, strict=True)), bool, n)
            nan_mx, nan_mn = np.isnan(mx) & ~missing, np.isnan(mn) & ~missing
            data_nan = nan_mx | nan_mn
            v[:, COL["nan_count"]] = np.where(data_nan, 1.0, np.where(missing, np.nan, 0.0))
            est[:, COL["nan_count"]] = data_nan
            pinf = mx == np.inf
            v[:, COL["pos_inf_count"]] = np.where(pinf, 1.0, np.where(nan_mx | missing, np.nan, 0.0))
            est[:, COL["pos_inf_count"]] = pinf
            ninf = mn == -np.inf
            v[:, COL["neg_inf_count"]] = np.where(ninf, 1.0, np.where(nan_mn | missing, np.nan, 0.0))
            est[:, COL["neg_inf_count"]] = ninf
            zero = np.where((mx == 0) & (mn == 0), count, np.where((mn > 0) | (mx < 0), 0.0, np.nan))
            v[:, COL["zero_count"]] = zero
        empty = count == 0
        if empty.any():
            v[empty] = 0.0
            v[empty, COL["max"]] = v[empty, COL["min"]] = v[empty, COL["mean"]] = v[empty, COL["abs_mean"]] = np.nan
            est[empty] = False
        return v, est


def _inside(node: str, module: str, construct: dict, limit: int = 64) -> bool:
    """Whether ``node`` ran inside ``module`` (per construct.json's parent links)."""
    parent = construct.get(node)
    while isinstance(parent, str) and limit:
        if parent == module:
            return True
        parent = construct.get(parent)
        limit -= 1
    return False


def _pick_producer(cands: list[tuple[str, str, bool]], consumer: str, is_module: bool,
                   construct: dict) -> tuple[str, str, bool] | None:
    """The latest earlier output with the consumer's input statistics; a module's input never comes from
    inside the module itself (an identity-like op there has the same statistics)."""
    for cand in reversed(cands):
        if cand[0] == consumer:
            continue
        if is_module and construct and _inside(cand[0], consumer, construct):
            continue
        return cand
    return None


class _Builder:
    """Turns dump files into a :class:`DumpSession` (graph + steps + files)."""

    def __init__(self, session: DumpSession, problems: list[DumpProblem]) -> None:
        self.s = session
        self.problems = problems
        self.meta: dict[str, Any] = {}

    def read_rank_dir(self, step: int, d: str, json_path: str | None = None) -> None:
        problems = self.problems
        json_path = json_path or os.path.join(d, "dump.json")
        journaled = self._from_journal(d)
        if journaled is not None:
            doc, construct, stacks = journaled
        else:
            if not os.path.lexists(json_path):
                problems.append(DumpProblem(json_path, "missing; this step is skipped"))
                return
            doc = _read_json(json_path, problems, salvage_data=True)
            if doc is FAILED:
                return
        if not isinstance(doc, dict):
            problems.append(DumpProblem(json_path, f"holds {_json_kind(doc)}, not a JSON object; this step is "
                                                   f"skipped"))
            return
        data = doc.get("data")
        if not isinstance(data, dict):
            problems.append(DumpProblem(json_path, "has no \"data\" object; this step is skipped"))
            return
        for k in ("task", "level", "framework"):
            if doc.get(k) is not None:
                self.meta.setdefault(k, doc[k])
        if doc.get("framework") and not self.s.framework:
            self.s.framework = str(doc["framework"])
        if doc.get("framework_version") and not self.s.framework_version:
            self.s.framework_version = str(doc["framework_version"])
        if journaled is None:
            construct: dict[str, Any] = {}
            cpath = os.path.join(d, "construct.json")
            if os.path.lexists(cpath):
                c = _read_json(cpath, problems)
                if isinstance(c, dict):
                    construct = c
                    bad = [k for k, v in c.items() if v is not None and type(v) is not str]
                    if bad:
                        problems.append(DumpProblem(cpath, f"{len(bad)} entries whose parent is not a name (e.g. "
                                                           f"{_short(bad[0])}); their scopes come from the names"))
                        construct = {k: v for k, v in c.items() if v is None or type(v) is str}
                elif c is not FAILED:
                    problems.append(DumpProblem(cpath, f"holds {_json_kind(c)}, not a JSON object; scopes come "
                                                       f"from the names"))
            stacks = {}
            spath = os.path.join(d, "stack.json")
            if os.path.lexists(spath):
                sdoc = _read_json(spath, problems)
                if not isinstance(sdoc, dict) and sdoc is not FAILED:
                    problems.append(DumpProblem(spath, f"holds {_json_kind(sdoc)}, not a JSON object; no call "
                                                       f"stacks"))
                stacks = _parse_stack(sdoc)
                if isinstance(sdoc, dict) and sdoc and not any(stacks.values()):
                    problems.append(DumpProblem(spath, "holds no call stacks in msProbe's layout ({\"0\": [[names], "
                                                       "[frames]], ...}); ignored"))
        data_dir = os.path.join(d, "dump_tensor_data")
        if not os.path.isdir(data_dir):
            alt = doc.get("dump_data_dir")
            if isinstance(alt, str) and alt and os.path.normpath(alt) != os.path.normpath(data_dir):
                problems.append(DumpProblem(
                    data_dir, f"missing; dump.json's dump_data_dir {_short(alt, 120)} is not read: only files "
                              f"inside the dump's own folder are (a copied or crafted dump.json could point "
                              f"anywhere); tensors keep their statistics only"))
        listing = set(_listdir(data_dir))
        self._build_step(step, data, construct, stacks, data_dir, listing, json_path)

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

    # -- the main pass --------------------------------------------------------------------------------
    def _build_step(self, step: int, data: dict, construct: dict, stacks: dict, data_dir: str,
                    listing: set[str], json_path: str) -> None:
        graph = self.s.graph
        rows = _Step()
        producers: dict[tuple, list[tuple[str, str, bool]]] = {}  # stats key -> [(node, slot, is_module)]
        order = 0
        has_params = any(k.startswith("Parameter.") for k in data)
        has_optimizer = any(v == "optimizer" or v == "clip_grad" for v in construct.values())
        problems = self.problems
        rel = os.path.relpath(json_path)

        dtype_cache: dict[Any, str] = {}
        shape_cache: dict[tuple, float] = {}

        def stat_key(dtype, shape, count, t):
            mx, mn = t.get("Max"), t.get("Min")
            if mx is None or mx == mn or count < 2:
                return None
            return (dtype, shape, mx, mn, t.get("Mean"), t.get("Norm"))

        def tensor_meta(name, slot, t):
            raw = t["shape"]
            shape = tuple(raw) if type(raw) is list else raw
            if not isinstance(shape, tuple) or not all(type(x) is int and x >= 0 for x in shape):
                problems.append(DumpProblem(rel, f"{name} {slot}: bad shape {_short(raw)}; tensor skipped"))
                return None
            count = shape_cache.get(shape)
            if count is None:
                count = float(math.prod(shape))
                if count > MAX_ELEMENTS:
                    problems.append(DumpProblem(rel, f"{name} {slot}: implausible shape {_short(raw)} "
                                                     f"({count:.3g} elements); tensor skipped"))
                    return None
                shape_cache[shape] = count
            rd = t.get("dtype", "")
            if type(rd) is not str:
                problems.append(DumpProblem(rel, f"{name} {slot}: bad dtype {_short(rd)}; shown as 'unknown'"))
                rd = "unknown"
            dtype = dtype_cache.get(rd)
            if dtype is None:
                dtype = dtype_cache[rd] = normalize_dtype(rd)
            return dtype, shape, count

        # parameters listed by module entries become Parameter.{path}.{name} nodes, first in the step
        if not has_params:
            for name, entry in data.items():
                if not isinstance(entry, dict):
                    continue
                params = entry.get("parameters")
                if not params or not isinstance(params, dict):
                    continue
                info = parse_name(name)
                if info.kind != "module" or info.direction != "forward":
                    continue
                for pname, t in params.items():
                    if not isinstance(t, dict) or "shape" not in t:
                        continue
                    t = _clean_tensor(t, name, f"parameters.{pname}", rel, problems)
                    node_name = f"Parameter.{info.path}.{pname}" if info.path else f"Parameter.{pname}"
                    key = (node_name, "output.0")
                    if key in rows.index:
                        continue
                    meta = tensor_meta(name, f"parameters.{pname}", t)
                    if meta is None:
                        continue
                    node = graph.add_node(node_name, kind="parameter", op_type="Parameter",
                                          scope=info.path.replace(".", "/"))
                    node.order = order
                    order += 1
                    node.shapes["output.0"], node.dtypes["output.0"] = meta[1], meta[0]
                    rows.add(key, meta[0], meta[1], meta[2], t)
                    sk = stat_key(meta[0], meta[1], meta[2], t)
                    if sk is not None:
                        producers.setdefault(sk, []).append((node_name, "output.0", False))

        last_backward = -1
        forward_ops: list[tuple[int, str]] = []
        rows_add, add_edge = rows.add, graph.add_edge
        index, keys_append, dtypes_append, shapes_append = rows.index, rows.keys.append, rows.dtypes.append, \
            rows.shapes.append
        keys = rows.keys
        mx_append, mn_append, mean_append, norm_append = rows.mx.append, rows.mn.append, rows.mean.append, \
            rows.norm.append
        count_append = rows.count.append
        shape_get, dtype_get = shape_cache.get, dtype_cache.get
        producers_get, files_by_key = producers.get, rows.files
        for name, entry in data.items():
            if not isinstance(entry, dict):
                problems.append(DumpProblem(rel, f"entry {name!r} is not an object; skipped"))
                continue
            info = parse_name(name)
            parent = construct.get(name)
            if info.direction in ("backward", "parameters_grad"):
                section = "backward"
            elif parent in ("optimizer", "clip_grad") or info.prefix == "Optimizer":
                section = "optimizer"
            else:
                section = "forward"
            if info.kind == "module" or info.direction == "parameters_grad":
                scope = info.path.rpartition(".")[0].replace(".", "/")
            elif section == "optimizer":
                scope = "optimizer"
            elif isinstance(parent, str):
                pinfo = parse_name(parent)
                scope = pinfo.path.replace(".", "/") if pinfo.kind == "module" else ""
            elif info.kind == "parameter":
                scope = info.path.replace(".", "/")
            else:
                scope = ""
            node = graph.nodes.get(name)
            if node is None:
                node = graph.add_node(name, kind=info.kind, op_type=info.op_type, scope=scope, section=section,
                                      stack=stacks.get(name), pair=pair_name(name, info))
            elif not node.stack and name in stacks:
                node.stack = stacks[name]
            node.order = order
            order += 1
            if section == "backward":
                last_backward = node.order
            elif section == "forward" and info.kind == "op" and not has_optimizer:
                forward_ops.append((node.order, name))
            is_module = info.kind == "module"
            is_pgrad = info.direction == "parameters_grad"
            shapes, dtypes = node.shapes, node.dtypes
            try:
                slots = entry_slots(entry)
            except RecursionError:
                problems.append(DumpProblem(rel, f"entry {name!r} is nested too deeply; skipped"))
                continue
            for slot, t in slots:
                g = t.get
                if not (type(g("Max")) in _STAT_TYPES and type(g("Min")) in _STAT_TYPES
                        and type(g("Mean")) in _STAT_TYPES and type(g("Norm")) in _STAT_TYPES
                        and type(g("dtype")) is str):
                    t = _clean_tensor(t, name, slot, rel, problems)
                    g = t.get
                raw = g("shape")
                shape = tuple(raw) if type(raw) is list else raw
                try:
                    count = shape_get(shape) if type(shape) is tuple else None
                except TypeError:  # unhashable shape elements
                    count = None
                if count is None:
                    meta = tensor_meta(name, slot, t)
                    if meta is None:
                        continue
                    count = meta[2]
                rd = g("dtype")
                dtype = dtype_get(rd)
                if dtype is None:
                    dtype = dtype_cache[rd] = normalize_dtype(rd)
                key = (name, slot)
                mx, mn, mean, norm = g("Max"), g("Min"), g("Mean"), g("Norm")
                if key in index:
                    rows_add(key, dtype, shape, count, t)
                else:
                    index[key] = len(keys)
                    keys_append(key)
                    dtypes_append(dtype)
                    shapes_append(shape)
                    mx_append(mx)
                    mn_append(mn)
                    mean_append(mean)
                    norm_append(norm)
                    count_append(count)
                    fname = g("data_name")
                    if fname is not None and type(fname) is str and fname and fname != "-1":
                        files_by_key[key] = fname
                shapes[slot] = shape
                dtypes[slot] = dtype
                c0 = slot[0]
                if c0 == "p" and slot.startswith("parameters."):
                    pnode = f"Parameter.{info.path}.{slot[11:]}" if info.path else f"Parameter.{slot[11:]}"
                    if pnode in graph.nodes:
                        add_edge(pnode, name, "output.0", slot)
                    continue
                if mx is None or count < 2 or mx == mn:
                    continue  # constant tensors: too ambiguous to link by statistics
                sk = (dtype, shape, mx, mn, mean, norm)
                cands = producers_get(sk)
                if c0 == "i":  # input.*: link to the latest earlier output with the same statistics
                    if cands:
                        prod = cands[-1]
                        if prod[0] == name or (is_module and construct):
                            prod = _pick_producer(cands, name, is_module, construct)
                        if prod is not None:
                            add_edge(prod[0], name, prod[1], slot)
                    continue
                if cands is None:
                    producers[sk] = [(name, slot, is_module)]
                else:
                    prev = cands[-1]
                    if not is_module or prev[2] or prev[0].startswith("Parameter."):
                        cands.append((name, slot, is_module))
                if is_pgrad:
                    pnode = f"Parameter.{info.path}.{slot}" if info.path else f"Parameter.{slot}"
                    if pnode in graph.nodes:
                        add_edge(pnode, name, "output.0", slot)

        # L1 dumps have no construct.json: forward ops after the last backward entry are the optimizer's
        if last_backward >= 0 and not has_optimizer:
            for o, name in forward_ops:
                if o > last_backward:
                    node = graph.nodes[name]
                    if node.section == "forward" and node.pair is not None and node.pair not in data:
                        node.section, node.scope = "optimizer", "optimizer"

        files: dict[tuple[str, str], TensorFile] = {}
        missing = 0
        for key, fname in rows.files.items():
            if fname not in listing:
                missing += 1
                if missing <= 20:
                    problems.append(DumpProblem(os.path.join(os.path.relpath(data_dir), fname),
                                                f"missing (tensor {key[0]} {key[1]} keeps its statistics only)"))
                continue
            i = rows.index[key]
            files[key] = TensorFile(os.path.join(data_dir, fname), rows.shapes[i], rows.dtypes[i])
        if missing > 20:
            problems.append(DumpProblem(os.path.relpath(data_dir), f"{missing - 20} more tensor files missing"))
        values, est = rows.matrix()
        self.s.add_step(step, rows.keys, rows.dtypes, rows.shapes, values, files=files, estimated=est,
                        index=rows.index)
        self._param_files(step, data)

    def _param_files(self, step: int, data: dict) -> None:
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
        from ..watch.conditions import compute_stats

        done = base
        for step in sorted(self.s.steps):
            table = self.s.steps[step]
            est = self.s.estimated[step]
            files = self.s.files[step]
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


def _load_kernel(path: str, rank: int | str | None) -> Any:
    try:
        from ..frameworks.mindspore.graph import load_kernel_dump
    except ImportError as e:
        raise NotImplementedError(
            f"{path} is a MindSpore kernel dump, which needs nbdebug.frameworks.mindspore.graph.load_kernel_dump "
            f"(not available: {e})") from None
    if isinstance(rank, str):
        digits = re.sub(r"\D", "", rank)
        rank = int(digits) if digits else None
    return load_kernel_dump(path, rank=rank)


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
    if layout == "kernel":
        session = _load_kernel(path, rank)
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
        found = find_rank_dirs(path)
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
        builder = _Builder(session, problems)
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
