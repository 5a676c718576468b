"""Reading ``.npy`` files quickly: the kernel dump writes a hundred small ones per training step.

``numpy.load`` parses the header with ``ast.literal_eval`` (a compile per file), which is most of the cost
of reading a small tensor. :func:`read_npy` parses the header of the files MindSpore writes (format
versions 1–3, a ``descr`` string, ``fortran_order`` and a shape of integers) with a regular expression and
reads the file with one ``readinto`` (the array is a view of that buffer); any other header (structured
dtypes, pickled objects) goes to ``numpy.load(allow_pickle=False)``, so nothing is unpickled. Needs numpy
only.

>>> import os, tempfile, numpy as np
>>> p = os.path.join(tempfile.mkdtemp(), "x.npy"); np.save(p, np.arange(6, dtype=np.float32).reshape(2, 3))
>>> read_npy(p).tolist()
[[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
"""

from __future__ import annotations

import math
import os
import re

import numpy as np

_MAGIC = b"\x93NUMPY"
_HEADER = re.compile(
    r"^\{\s*'descr':\s*'([^']+)',\s*'fortran_order':\s*(True|False),\s*'shape':\s*\(([\d,\s]*)\),?\s*\}\s*$")


def _header(buf: bytes | bytearray) -> tuple[np.dtype, tuple[int, ...], bool, int] | None:
    """``(dtype, shape, fortran order, data offset)`` from a file's first bytes; None for a header this
    parser leaves to numpy; ``ValueError`` for what is not a readable ``.npy``."""
    if len(buf) < 10 or buf[:6] != _MAGIC:
        raise ValueError("not a .npy file")
    major = buf[6]
    if major == 1:
        start = 10
        hlen = buf[8] | buf[9] << 8
    elif major in (2, 3):
        start = 12
        hlen = int.from_bytes(buf[8:12], "little")
    else:
        raise ValueError(f"unknown .npy format version {major}")
    if len(buf) < start + hlen:
        raise ValueError("truncated header")
    m = _HEADER.match(bytes(buf[start:start + hlen]).decode("latin1" if major < 3 else "utf-8").strip())
    if m is None:
        return None
    descr, fortran, dims = m.groups()
    dtype = np.dtype(descr)
    if dtype.hasobject:
        raise ValueError("object arrays are not read (they need unpickling)")
    shape = tuple(int(d) for d in dims.replace(" ", "").split(",") if d)
    return dtype, shape, fortran == "True", start + hlen


def read_npy_shape(path: str) -> tuple[int, ...]:
    """The shape stored in ``path``'s header (the data is not read); ``ValueError`` when unreadable."""
    try:
        with open(path, "rb", buffering=0) as f:
            head = f.read(4096)
        parsed = _header(head)
    except (OSError, TypeError, ValueError) as exc:
        raise ValueError(f"cannot read dump file {path}: {exc}") from None
    return parsed[1] if parsed is not None else tuple(_fallback(path).shape)


def read_npy(path: str) -> np.ndarray:
    """The array in ``path`` (writable, C or Fortran order as written); raises ``ValueError`` naming the file
    when it cannot be read (truncated, not ``.npy``, or an object array)."""
    try:
        with open(path, "rb", buffering=0) as f:
            size = os.fstat(f.fileno()).st_size
            buf = bytearray(size)  # one read; the array is a (writable) view of this buffer
            got = f.readinto(buf)
        if got != size:
            raise ValueError("file changed while read")
        parsed = _header(buf)
        if parsed is None:
            return _fallback(path)
        dtype, shape, fortran, offset = parsed
        count = math.prod(shape)  # numpy's prod costs more than the rest of a small file's read
        if size - offset < count * dtype.itemsize:
            raise ValueError(f"truncated: {(size - offset) // max(dtype.itemsize, 1)} of {count} values")
        data = np.frombuffer(buf, dtype=dtype, count=count, offset=offset)
    except (OSError, TypeError, ValueError) as exc:
        raise ValueError(f"cannot read dump file {path}: {exc}") from None
    return data.reshape(shape, order="F" if fortran else "C")


def _fallback(path: str) -> np.ndarray:
    return np.load(path, allow_pickle=False)
