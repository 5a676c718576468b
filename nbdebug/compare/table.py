"""CSV and DataFrame export shared by the TroubleShooter-style results (one tuple per row).

>>> class T(TupleTable):
...     COLUMNS = ("a", "b")
...     def records(self): return [(1, None)]
>>> T().to_dataframe().to_dict("records")
[{'a': 1, 'b': None}]
"""

from __future__ import annotations

import csv
import os
from typing import Any


class TupleTable:
    """Mixin: a result with ``COLUMNS`` and ``records()`` (tuples in that order) exports itself."""

    COLUMNS: tuple[str, ...] = ()

    def records(self) -> list[tuple]:  # pragma: no cover - provided by the result class
        raise NotImplementedError

    def to_csv(self, path: str | os.PathLike) -> str:
        """Write the rows as CSV (None as an empty cell); returns the path."""
        path = os.fspath(path)
        with open(path, "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(self.COLUMNS)
            for rec in self.records():
                w.writerow(["" if v is None else v for v in rec])
        return path

    def to_dataframe(self) -> Any:
        """The rows as a ``pandas.DataFrame`` (pandas needed)."""
        import pandas as pd

        return pd.DataFrame(self.records(), columns=list(self.COLUMNS))
