"""Reading MindSpore checkpoints (``.ckpt``) into numpy, for offline analysis.

Only this module (of the offline tools) imports mindspore, and only when a checkpoint is read.

A ``.ckpt`` file does not record which parameters are trainable (``load_checkpoint`` returns every
parameter with ``requires_grad=True``), so for a file the trainable set is inferred: BatchNorm
statistics (``moving_mean``/``moving_variance``) and optimizer state are not trainable. Pass the network
itself (a ``mindspore.nn.Cell``) to get the exact set.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: name endings of non-trainable entries in a checkpoint file
_NOT_TRAINABLE_SUFFIXES = ("moving_mean", "moving_variance")
#: names / prefixes of optimizer state that checkpoints often carry
_OPTIMIZER_STATE = ("global_step", "learning_rate", "current_iterator_step", "last_overflow_iterator_step",
                    "epoch_num", "step_num", "loss_scale", "scale_sense", "beta1_power", "beta2_power")
_OPTIMIZER_PREFIXES = ("moments.", "accum.", "moment1.", "moment2.", "adam_m.", "adam_v.", "mean_grad.",
                       "mean_square.", "momentum.", "linear.", "exp_avg.", "exp_avg_sq.")


def is_optimizer_state(name: str) -> bool:
    """Whether a checkpoint entry is optimizer state rather than a network parameter."""
    return name in _OPTIMIZER_STATE or name.startswith(_OPTIMIZER_PREFIXES)


def load_ckpt(path_or_cell: Any) -> tuple[dict[str, np.ndarray], set[str], set[str]]:
    """Network parameters of a ``.ckpt`` file (or of a ``mindspore.nn.Cell``).

    Returns ``(values, trainable, skipped)``: arrays by parameter name, the names that are trainable, and
    the optimizer-state names that were left out.
    """
    import mindspore as ms

    if isinstance(path_or_cell, ms.nn.Cell):
        values, trainable = {}, set()
        for name, p in path_or_cell.parameters_and_names():
            values[name] = p.asnumpy()
            if p.requires_grad:
                trainable.add(name)
        return values, trainable, set()
    path = str(path_or_cell)
    try:
        params = ms.load_checkpoint(path)
    except Exception as e:
        raise ValueError(f"{path}: cannot be read by mindspore.load_checkpoint ({type(e).__name__}: {e})") \
            from None
    values, trainable, skipped = {}, set(), set()
    for name, p in params.items():
        if is_optimizer_state(name):
            skipped.add(name)
            continue
        values[name] = p.asnumpy()
        if not name.endswith(_NOT_TRAINABLE_SUFFIXES):
            trainable.add(name)
    return values, trainable, skipped
