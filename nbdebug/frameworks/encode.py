"""msProbe's encoding of plain Python call arguments, shared by the PyTorch and MindSpore dump sides.

>>> describe_plain(slice(1, None, 2)), describe_plain(...), describe_plain(3)
({'type': 'slice', 'value': [1, None, 2]}, {'type': 'ellipsis', 'value': '...'}, {'type': 'int', 'value': 3})
>>> describe_plain(object()) is None
True
"""

from __future__ import annotations

from typing import Any


def describe_plain(x: Any) -> dict[str, Any] | None:
    """A slice, ``...`` or a bool/int/float/str as msProbe writes it in dump.json; None for anything else."""
    if isinstance(x, slice):
        vals = []
        for v in (x.start, x.stop, x.step):
            try:
                vals.append(None if v is None else int(v))
            except (TypeError, ValueError):
                vals.append(None)
        return {"type": "slice", "value": vals}
    if x is Ellipsis:
        return {"type": "ellipsis", "value": "..."}
    if isinstance(x, (bool, int, float, str)):
        return {"type": type(x).__name__, "value": x}
    return None
