"""The recommended watchpoints offered when a session starts (as MindInsight's debugger offers them).

>>> [c for c, _, _ in recommended({"ReLU"})]
['TO', 'GE', 'WNC', 'GV', 'WCL', 'WI', 'AR']
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from nbdebug.watch.conditions import CATEGORIES, validate


@dataclass(frozen=True)
class Target:
    """Which nodes a recommended watchpoint selects.

    ``category`` is one of ``"tensor"`` (every captured tensor), ``"weight"``, ``"gradient"`` or
    ``"activation"``; ``op_kinds`` narrows activations to the given normalized kinds (``"relu"``,
    ``"tanh"``, ``"sigmoid"``); ``min_ndim`` skips tensors with fewer dimensions (used to keep 1-D biases
    and normalization parameters out of WI).

    >>> t = Target("activation", frozenset({"tanh"}))
    >>> t.matches("activation", "nn.Tanh"), t.matches("activation", "ReLU"), str(t)
    (True, False, 'activation:tanh')
    """

    category: str
    op_kinds: frozenset[str] = frozenset()
    min_ndim: int = 0

    def __post_init__(self) -> None:
        if self.category not in CATEGORIES:
            raise ValueError(f"category must be one of {', '.join(CATEGORIES)}, got {self.category!r}")

    def matches(self, category: str, op_kind: str = "", ndim: int | None = None) -> bool:
        """Whether a node of ``category`` (with op/module kind ``op_kind`` and ``ndim`` dims) is selected."""
        if self.category != "tensor" and category != self.category:
            return False
        if self.op_kinds and activation_kind(op_kind) not in self.op_kinds:
            return False
        return not (self.min_ndim and ndim is not None and ndim < self.min_ndim)

    def __str__(self) -> str:
        s = self.category
        if self.op_kinds:
            s += ":" + ",".join(sorted(self.op_kinds))
        if self.min_ndim:
            s += f" (ndim >= {self.min_ndim})"
        return s


_KINDS = ("relu", "tanh", "sigmoid")
_SKIP = frozenset(
    {"torch", "nn", "functional", "f", "aten", "ops", "mindspore", "forward", "backward", "module", "tensor",
     "default"}
)


def activation_kind(name: str) -> str:
    """Normalize an activation op/module name: ``"torch.nn.ReLU"``, ``"aten::relu_"``,
    ``"Functional.relu.0.forward"`` all give ``"relu"``; unknown names give their lower-cased last part.

    >>> activation_kind("nn.Sigmoid"), activation_kind("aten::tanh_"), activation_kind("GELU")
    ('sigmoid', 'tanh', 'gelu')
    """
    parts = [p.strip("_") for p in re.split(r"[.:/\s]+", name.lower()) if p.strip("_")]
    parts = [p for p in parts if not p.isdigit() and p not in _SKIP]
    for p in reversed(parts):
        if p in _KINDS:
            return p
    return parts[-1] if parts else ""


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def recommended(activation_kinds: Iterable[str] = ()) -> list[tuple[str, dict[str, Any], Target]]:
    """The recommended watchpoints as ``(condition, params, target)``, params complete (validated).

    Always: TO on every tensor, GE on gradients, WNC on weights (default tolerances), GV with
    ``abs_mean_lt = 1e-9`` on gradients, WCL with ratio 1 on weights, WI with ``zero_percentage_ge =
    100`` on weights of 2+ dimensions. Then one AR rule per activation kind present in the model
    (``activation_kinds``, any spelling :func:`activation_kind` understands):

    * tanh — saturated when fewer than 0.1% of values lie within [tanh(-8.8), tanh(8.8)];
    * sigmoid — the same with [sigmoid(-16.2), sigmoid(16.2)];
    * relu — dead when more than 99.9% of values lie in [-1, 0].

    OO is not recommended: MindInsight offers it only on Ascend, where a hardware overflow flag exists.

    >>> rules = recommended({"Tanh"})
    >>> rules[-1][0], rules[-1][1]["range_percentage_lt"], str(rules[-1][2])
    ('AR', 0.1, 'activation:tanh')
    """
    kinds = {activation_kind(k) for k in activation_kinds}
    out: list[tuple[str, dict[str, Any], Target]] = [
        ("TO", validate("TO", {}), Target("tensor")),
        ("GE", validate("GE", {}), Target("gradient")),
        ("WNC", validate("WNC", {}), Target("weight")),
        ("GV", validate("GV", {"abs_mean_lt": 1e-9}), Target("gradient")),
        ("WCL", validate("WCL", {"abs_mean_update_ratio_gt": 1.0}), Target("weight")),
        # WI: "all zero at initialization" (zero_percentage_ge 100). Biases and normalization shifts are
        # zero-initialized on purpose (nn.LayerNorm, BatchNorm, many Linear inits), so the recommended rule
        # only selects weights of 2+ dimensions (matrices, conv kernels), where all-zero init is almost
        # always a bug (identical units). The user can still add 1-D weights by hand.
        ("WI", validate("WI", {"zero_percentage_ge": 100.0}), Target("weight", min_ndim=2)),
    ]
    # The activation rules. Our range parameters are inclusive; the reference's open intervals have
    # irrational ends, so inclusive vs. exclusive makes no difference. Ends are float64: float32 outputs
    # round near saturation (float32 tanh(x) is 0.99999994 for x in ~[8.5, 9.1], which counts as inside),
    # so the boundary is fuzzy by a fraction of a unit in x, which is fine for a saturation alarm.
    if "tanh" in kinds:
        params = {
            "range_start_inclusive": math.tanh(-8.8),
            "range_end_inclusive": math.tanh(8.8),
            "range_percentage_lt": 0.1,
        }
        out.append(("AR", validate("AR", params), Target("activation", frozenset({"tanh"}))))
    if "sigmoid" in kinds:
        params = {
            "range_start_inclusive": _sigmoid(-16.2),
            "range_end_inclusive": _sigmoid(16.2),
            "range_percentage_lt": 0.1,
        }
        out.append(("AR", validate("AR", params), Target("activation", frozenset({"sigmoid"}))))
    if "relu" in kinds:
        params = {"range_start_inclusive": -1.0, "range_end_inclusive": 0.0, "range_percentage_gt": 99.9}
        out.append(("AR", validate("AR", params), Target("activation", frozenset({"relu"}))))
    return out


def recommended_temporal() -> list[tuple[str, dict[str, Any], Target]]:
    """The recommended watchpoints over time (on the monitor series, so they cost a few array operations a
    step): SPIKE ×10 over the 50-step median of the total gradient norm and of every parameter's update ratio
    (a learning-rate or data accident; an update-ratio spike often comes a few steps before a loss spike), and
    STALL of a parameter whose update ratio stayed below 1e-8 for 20 steps (a frozen or forgotten parameter).
    They fire nothing on 200 clean steps of GPT-2 and ResNet training (tests/test_watch_temporal.py).

    >>> [(c, p["field"]) for c, p, _ in recommended_temporal()]
    [('SPIKE', 'grad_norm_total'), ('SPIKE', 'update_ratio'), ('STALL', 'update_ratio')]
    """
    every = Target("tensor")  # a monitor field: every series that has it
    return [
        ("SPIKE", validate("SPIKE", {"field": "grad_norm_total", "factor": 10, "window": 50}), every),
        ("SPIKE", validate("SPIKE", {"field": "update_ratio", "factor": 10, "window": 50}), every),
        ("STALL", validate("STALL", {"field": "update_ratio", "below": 1e-8, "steps": 20}), every),
    ]
