"""What a step function can reach: the values of its closure cells, the globals its code names and its bound
object's attributes — where replay finds the optimizers, scalers and schedulers a step uses.

>>> class Opt: pass
>>> opt = Opt()
>>> def make():
...     lr = 0.1
...     def step(x):
...         return opt, lr
...     return step
>>> vals = reachable_values(make())
>>> any(v is opt for v in vals), 0.1 in vals
(True, True)
"""

from __future__ import annotations

from typing import Any


def reachable_values(fn: Any) -> list[Any]:
    """The closure cells' values (filled ones), the globals ``fn``'s code names and its bound object's
    attributes (``fn.__wrapped__`` is looked through)."""
    fn = getattr(fn, "__wrapped__", fn)
    values: list[Any] = []
    code = getattr(fn, "__code__", None)
    if code is not None:
        values += [c.cell_contents for c in (fn.__closure__ or ()) if _filled(c)]
        values += [fn.__globals__[n] for n in code.co_names if n in fn.__globals__]
    bound = getattr(fn, "__self__", None)
    if bound is not None and hasattr(bound, "__dict__"):
        values += list(vars(bound).values())
    return values


def _filled(cell: Any) -> bool:
    try:
        _ = cell.cell_contents
    except ValueError:
        return False
    return True
