"""The native reduction kernel (``nbdebug.frameworks._fastats``) and the dtype codes it reads, by dtype name.

Each framework maps its own dtypes onto these codes by name (``float32``, ``bfloat16``, ``bool`` ...).

>>> CODES["bfloat16"], CODES["bool"]
(3, 9)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

try:  # the optional native kernel; each framework's own ops are the fallback
    from .. import _fastats as fastats  # built inside frameworks/: no import reaches up to the package root
except ImportError:  # pragma: no cover - exercised on machines without a compiler
    fastats = None

CODES = {"float32": 0, "float64": 1, "float16": 2, "bfloat16": 3, "int8": 4, "uint8": 5, "int16": 6,
         "int32": 7, "int64": 8, "bool": 9}


def codes_for(dtypes: Iterable[Any], name_of: Callable[[Any], str]) -> dict[Any, int]:
    """``{framework dtype: kernel code}`` for the dtypes the kernel reads."""
    return {d: CODES[name_of(d)] for d in dtypes if name_of(d) in CODES}
