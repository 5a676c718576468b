"""Tolerant, safe reading of a dump's JSON files: regular files only, a size limit, truncated
``dump.json`` files salvaged entry by entry, every problem recorded instead of raised.

>>> problems = []
>>> _read_json("/dev/null", problems) is FAILED, "not a regular file" in str(problems[0])
(True, True)
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

from ..offline import DumpProblem

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
