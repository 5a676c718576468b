"""The names one tensor slot goes by: the live session's and the dump's (msProbe's layout).

>>> slot_aliases("output.last_hidden_state")
['output.0.last_hidden_state']
"""

from __future__ import annotations

from collections.abc import Sequence


def slot_aliases(slot: str, params: Sequence[str] | None = None) -> list[str]:
    """The other names of one tensor slot between a live session and the dump written from it.

    A dump follows msProbe's layout: a call's output is a list (a dict output ``{k: t}`` is slot
    ``output.0.k``, live ``output.k``), and an op's arguments are named as the caller passed them
    (positional: ``input.2``), where live they are named as the framework handed them on (PyTorch's
    ``F.layer_norm`` passes ``weight`` by keyword: ``input.weight``). ``params``: the op's parameter names
    in order, relating ``input.{i}`` and ``input.{params[i]}``.

    >>> slot_aliases("output.last_hidden_state"), slot_aliases("output.0.last_hidden_state")
    (['output.0.last_hidden_state'], ['output.last_hidden_state'])
    >>> ps = ["input", "normalized_shape", "weight", "bias", "eps"]
    >>> slot_aliases("input.weight", ps), slot_aliases("input.2", ps), slot_aliases("input.bias.0", ps)
    (['input.2'], ['input.weight'], ['input.3.0'])
    """
    head, _, rest = slot.partition(".")
    first, dot, tail = rest.partition(".")
    if not first:
        return []
    if head == "output":
        if not first.isdigit():
            return [f"output.0.{rest}"]
        if first == "0" and tail and not tail.partition(".")[0].isdigit():
            return [f"output.{tail}"]
        return []
    if head != "input" or not params:
        return []
    if first.isdigit():
        i = int(first)
        return [f"input.{params[i]}{dot}{tail}"] if i < len(params) else []
    if first in params:
        return [f"input.{list(params).index(first)}{dot}{tail}"]
    return []
