"""``seed_all``: msProbe's reproducibility switch for Python, numpy, PyTorch and MindSpore.

>>> import random
>>> seed_all(7, frameworks=())
>>> a = random.random(); seed_all(7, frameworks=()); a == random.random()
True
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import random
import sys
from typing import Any

import numpy as np

_MAX_SEED = 2**32 - 1
_DROPOUT_FUNCS = ("dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout")


def _available(name: str) -> bool:
    if name in sys.modules:
        return True
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def seed_all(seed: int = 1234, mode: bool = False, rm_dropout: bool = False, *,
             frameworks: tuple[str, ...] | None = None) -> None:
    """Fix every random source, as msProbe's ``seed_all``.

    * Python ``random``, ``PYTHONHASHSEED`` (for subprocesses), numpy;
    * PyTorch: ``manual_seed`` (all devices); ``mode=True`` turns on deterministic algorithms
      (``torch.use_deterministic_algorithms``, cuDNN deterministic / no benchmark, ``CUBLAS_WORKSPACE_CONFIG``);
    * MindSpore: ``set_seed``; ``mode=True`` turns deterministic computing on (and ``HCCL_DETERMINISTIC``) —
      MindSpore lets a process switch it on only once;
    * ``rm_dropout=True`` makes dropout a no-op: PyTorch's functional dropouts run with ``p=0`` (which
      covers ``nn.Dropout*``); MindSpore's ``ops.Dropout*``, ``nn.Dropout``, ``mint.nn.Dropout`` and
      ``mint.nn.functional.dropout`` are replaced by keep-everything versions (create the model after this).

    A framework is imported only when it is already imported or installed; ``frameworks`` (nbdebug's
    addition) limits which ones are touched, e.g. ``("torch",)``.
    """
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= _MAX_SEED:
        raise ValueError(f"seed must be an int in 0..{_MAX_SEED}, got {seed!r}")
    if not isinstance(mode, bool):
        raise ValueError(f"mode must be True or False, got {mode!r}")
    if not isinstance(rm_dropout, bool):
        raise ValueError(f"rm_dropout must be True or False, got {rm_dropout!r}")
    random.seed(seed)
    os.environ["PYTHONHASHSEED"] = str(seed)
    np.random.seed(seed)
    from .registry import backends

    by_package = {b.packages[0]: b for b in backends()}
    wanted = tuple(by_package) if frameworks is None else tuple(frameworks)
    for name in wanted:
        if name not in by_package:
            raise ValueError(f"frameworks: unknown framework {name!r}; use "
                             f"{' and/or '.join(repr(p) for p in by_package)}")
    for name in wanted:
        if _available(name):
            by_package[name].seed(seed, mode, rm_dropout)


def _seed_torch(torch: Any, seed: int, mode: bool, rm_dropout: bool) -> None:
    if mode:
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
    torch.use_deterministic_algorithms(mode)
    cudnn = torch.backends.cudnn
    cudnn.deterministic = mode
    cudnn.benchmark = False if mode else cudnn.benchmark
    if rm_dropout:
        _torch_no_dropout(torch)


def _torch_no_dropout(torch: Any) -> None:
    import functools

    F = torch.nn.functional
    for name in _DROPOUT_FUNCS:
        fn = getattr(F, name, None)
        if fn is None or getattr(fn, "__nbdebug_no_dropout__", False):
            continue

        def make(orig: Any) -> Any:
            @functools.wraps(orig)
            def no_dropout(input, p=0.5, training=True, inplace=False):  # noqa: A002 - torch's names
                if not 0.0 <= p <= 1.0:
                    raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
                return orig(input, 0.0, training, inplace)

            no_dropout.__nbdebug_no_dropout__ = True  # type: ignore[attr-defined]
            return no_dropout

        setattr(F, name, make(fn))


def _seed_mindspore(ms: Any, seed: int, mode: bool, rm_dropout: bool) -> None:
    ms.set_seed(seed)
    # MindSpore accepts set_deterministic once per process; off is its default, so only "on" is set
    if mode:
        try:
            ms.set_deterministic(True)
        except (AttributeError, RuntimeError):  # MindSpore < 2.5, or already set in this process
            ms.set_context(deterministic="ON")
    elif str(ms.get_context("deterministic")) == "ON":
        ms.set_context(deterministic="OFF")
    os.environ["HCCL_DETERMINISTIC"] = str(mode)
    if rm_dropout:
        _mindspore_no_dropout(ms)


def _mindspore_no_dropout(ms: Any) -> None:
    from mindspore import mint, nn, ops

    if getattr(ops.Dropout, "__nbdebug_no_dropout__", False):
        return

    class Dropout(ops.Dropout):
        __nbdebug_no_dropout__ = True

        def __init__(self, keep_prob=0.5, Seed0=0, Seed1=0):  # noqa: N803 - MindSpore's names
            super().__init__(1.0, Seed0, Seed1)

    class Dropout2D(ops.Dropout2D):
        def __init__(self, keep_prob=0.5):
            super().__init__(1.0)

    class Dropout3D(ops.Dropout3D):
        def __init__(self, keep_prob=0.5):
            super().__init__(1.0)

    class NnDropout(nn.Dropout):
        def __init__(self, keep_prob=None, p=None, dtype=None):
            super().__init__(p=0.0)

    def dropout(input, p=0.5, training=True, inplace=False):  # noqa: A002 - MindSpore's names
        return input

    ops.Dropout = Dropout
    ops.operations.Dropout = Dropout
    ops.Dropout2D = Dropout2D
    ops.operations.Dropout2D = Dropout2D
    ops.Dropout3D = Dropout3D
    ops.operations.Dropout3D = Dropout3D
    nn.Dropout = NnDropout
    if hasattr(mint, "nn"):
        if hasattr(mint.nn, "Dropout"):
            base = mint.nn.Dropout

            class MintDropout(base):
                def __init__(self, p=0.5, inplace=False):
                    super().__init__(p=0.0)

            mint.nn.Dropout = MintDropout
        if hasattr(mint.nn, "functional"):
            mint.nn.functional.dropout = dropout
