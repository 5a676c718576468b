"""Comparing two runs: tensors and statistics (:func:`~nbdebug.compare.run.compare`), ``.npy`` folders
(:func:`~nbdebug.compare.npy.compare_npy_dir`) and checkpoints (:func:`~nbdebug.compare.weights.compare_weights`).

``nbdebug.compare`` is both this package and the function: importing a submodule (``nbdebug.compare.mapping``)
makes Python bind the package to ``nbdebug.compare``, so the package itself is callable and forwards to
:func:`nbdebug.compare.run.compare`.
"""

from __future__ import annotations

import sys
import types
from typing import Any


class _CallablePackage(types.ModuleType):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from .run import compare

        return compare(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
