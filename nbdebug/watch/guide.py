"""Optimization guide: what to try when a watchpoint condition fires.

:func:`advice` returns a few sentences for a condition, refined by the op type of the node that fired
(``"ReLU"``, ``"torch.log"``, ``"aten::sqrt"``, ``"Functional.softmax.3.forward"`` …) and by which
parameters fired.

>>> "clip" in advice("GE")
True
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from nbdebug.watch.conditions import get_condition

# Op families, keyed by normalized op name (see _op_family).
_FAMILIES: dict[str, frozenset[str]] = {
    "relu": frozenset({"relu", "relu6"}),
    "tanh": frozenset({"tanh"}),
    "sigmoid": frozenset({"sigmoid", "logsigmoid", "hardsigmoid"}),
    "softmax": frozenset({"softmax", "log_softmax", "logsoftmax"}),
    "log": frozenset({"log", "log2", "log10", "log1p", "xlogy"}),
    "sqrt": frozenset({"sqrt", "rsqrt", "pow", "square_root"}),
    "div": frozenset({"div", "divide", "true_divide", "floor_divide", "reciprocal", "realdiv", "truediv"}),
    "exp": frozenset({"exp", "exp2", "expm1", "logsumexp", "softplus", "cosh", "sinh"}),
    "norm": frozenset(
        {"batch_norm", "batchnorm", "batchnorm1d", "batchnorm2d", "layer_norm", "layernorm", "group_norm",
         "groupnorm", "instance_norm", "rms_norm", "rmsnorm", "normalize"}
    ),
    "matmul": frozenset(
        {"matmul", "mm", "bmm", "linear", "addmm", "conv1d", "conv2d", "conv3d", "conv", "baddbmm", "einsum",
         "scaled_dot_product_attention"}
    ),
    "dropout": frozenset({"dropout", "dropout2d", "feature_dropout"}),
    "embedding": frozenset({"embedding", "embedding_bag"}),
}

_SKIP_PARTS = frozenset(
    {"functional", "torch", "nn", "tensor", "aten", "forward", "backward", "module", "ops", "mindspore", "f",
     "default", "out"}
)


def _op_family(node_op_type: str) -> str:
    """Map an op/module name to one of the families above, or ``""``."""
    if not node_op_type:
        return ""
    parts = [p for p in re.split(r"[.:/\s]+", node_op_type.lower()) if p]
    for part in reversed(parts):
        if part.isdigit() or part in _SKIP_PARTS:
            continue
        name = part.strip("_")
        for fam, names in _FAMILIES.items():
            if name in names:
                return fam
    return ""


_BASE: dict[str, str] = {
    "OO": (
        "This op turned finite inputs into NaN/Inf, so the trouble starts here rather than upstream. "
        "Check the op's input range at this step; under float16/bfloat16 run the op in float32 (autocast "
        "keeps reductions and losses in float32) and use dynamic loss scaling."
    ),
    "TO": (
        "The tensor holds NaN or Inf. Find the earliest node in execution order that fired (an OO "
        "watchpoint pinpoints the op that created it); later NaNs are usually just propagated. Check the "
        "batch inputs and labels for NaN/Inf and consider a lower learning rate or gradient clipping."
    ),
    "TZ": (
        "Most of this tensor is exactly zero. Look for a mask or padding that wipes it out, an upstream "
        "layer that outputs zeros, or a zero-initialized weight; in float16 tiny values may underflow to 0."
    ),
    "TR": (
        "The value distribution left the expected range. Check input normalization and the scale of the "
        "layers feeding this tensor; a normalization layer (BatchNorm/LayerNorm) keeps it in range."
    ),
    "TL": (
        "Values are larger than expected. Normalize the inputs, add or check normalization layers, lower "
        "the learning rate or add weight decay, and look for a missing scale factor (e.g. 1/sqrt(d) in "
        "attention scores)."
    ),
    "TS": (
        "Values are smaller than expected. Check for a missing scale-up, an upstream layer that shrinks the "
        "signal, an initialization scale that is too small, and float16 underflow (below ~6e-8 becomes 0)."
    ),
    "WCL": (
        "The weight moved a lot relative to its size in one step. Lower the learning rate or add warmup, "
        "clip the gradient norm, and check the optimizer settings (Adam eps too small, momentum, loss scale "
        "not unscaled before the step)."
    ),
    "WCS": (
        "The weight barely moves. Raise the learning rate or check that the scheduler has not decayed it to "
        "~0, look for vanishing gradients reaching this layer, and check that weight decay is not "
        "cancelling the updates."
    ),
    "WI": (
        "The initial value looks wrong. Use a random initialization suited to the activation (Kaiming/He "
        "for ReLU, Xavier/Glorot for tanh/sigmoid) and check that a checkpoint meant to be loaded was "
        "actually loaded."
    ),
    "WNC": (
        "The weight did not change between steps. Usual causes: the parameter is frozen "
        "(requires_grad=False); it is missing from the optimizer's param groups (optimizer built before the "
        "layer was added or replaced); the learning rate is 0; its gradient is zero or None because it is "
        "not on the loss path (detach(), torch.no_grad(), unused branch); or the AMP GradScaler skipped the "
        "step after an overflow."
    ),
    "WO": (
        "The weight became NaN/Inf, so the optimizer applied an invalid update. Look for GE hits in the "
        "same step; lower the learning rate, clip gradients, use loss scaling, and check the optimizer eps "
        "(too small an Adam eps overflows in float16). Reload the last good checkpoint: training cannot "
        "recover from NaN weights."
    ),
    "WL": (
        "The weight grew large. Add or raise weight decay, lower the learning rate, clip gradients, and "
        "check for a feedback loop such as a missing normalization layer."
    ),
    "WS": (
        "The weight is tiny. Weight decay may be too strong for this layer or the initialization scale too "
        "small; check whether the layer is effectively switched off."
    ),
    "AR": (
        "The activation distribution left its useful range. Normalize the pre-activation (BatchNorm/"
        "LayerNorm), check the initialization scale, and lower the learning rate."
    ),
    "GE": (
        "The gradient holds NaN/Inf. Lower the learning rate, clip gradients "
        "(torch.nn.utils.clip_grad_norm_), use dynamic loss scaling with mixed precision, check this "
        "batch's inputs and labels for NaN/Inf, and check log/sqrt/div in the loss for invalid inputs."
    ),
    "GL": (
        "Exploding gradients. Clip the gradient norm, lower the learning rate or add warmup, add "
        "normalization layers or residual connections, and under AMP make sure gradients are unscaled "
        "before clipping."
    ),
    "GV": (
        "Vanishing gradients: this layer barely learns. Prefer ReLU/GELU over saturating sigmoid/tanh, add "
        "residual connections and normalization, use He/Xavier initialization, and watch for float16 "
        "underflow (use loss scaling). An all-zero gradient can also mean the layer is not on the loss path."
    ),
}

_DOMAIN = {
    "log": (
        "log of zero or a negative number gives -Inf/NaN: clamp the input (x.clamp_min(eps)), use log1p, "
        "or use the fused log_softmax / cross_entropy instead of log(softmax(x))."
    ),
    "sqrt": (
        "sqrt/rsqrt/pow of a negative number gives NaN and rsqrt(0) gives Inf; at 0 the gradient of sqrt is "
        "infinite: add an epsilon inside (sqrt(x + eps)) or clamp."
    ),
    "div": "Division by zero or by a tiny number: add an epsilon to the denominator or mask the zeros.",
    "exp": (
        "exp overflows for inputs above ~88 (float32) or ~11 (float16): subtract the max first, use "
        "logsumexp / log_softmax, or clamp the input."
    ),
    "softmax": (
        "Softmax of very large logits overflows or turns one-hot: scale the logits (temperature, 1/sqrt(d) "
        "in attention) and use log_softmax for losses."
    ),
    "norm": (
        "A normalization layer divides by the standard deviation: a constant or tiny-variance input (or a "
        "batch of 1) makes it blow up; raise eps or check the batch."
    ),
    "matmul": (
        "Large sums of products can exceed the float16 range (65504): keep this op in float32 under "
        "autocast, scale the inputs down, or lower the learning rate."
    ),
}

_DEAD_RELU = (
    "Dead ReLU units: inputs that stay negative give 0 output and 0 gradient, so the units never recover. "
    "Lower the learning rate, switch to LeakyReLU/GELU/ELU, use Kaiming/He initialization, and check the "
    "bias initialization and the input normalization."
)

_SATURATED = {
    "tanh": (
        "tanh is saturated: almost all values sit at +/-1 where its gradient is ~0. Normalize the "
        "pre-activation (LayerNorm/BatchNorm), use Xavier/Glorot initialization, lower the learning rate, or "
        "use ReLU/GELU instead."
    ),
    "sigmoid": (
        "sigmoid is saturated: almost all values sit at 0 or 1 where its gradient is ~0. Normalize the "
        "pre-activation, use Xavier/Glorot initialization, lower the learning rate; for a loss, pass logits "
        "to BCEWithLogitsLoss instead of applying sigmoid first."
    ),
}

_PARAM_NOTES: dict[str, str] = {
    "max_min_lt": (
        "max - min is tiny: the tensor is (nearly) constant, e.g. a collapsed feature, a dead or saturated "
        "layer, or a constant input."
    ),
    "max_min_gt": "max - min is very wide: outliers like these destabilize training; check normalization.",
}

_WI_NOTES = {
    "zero_percentage_ge": (
        "An all-zero weight gives every unit the same gradient, so the symmetry never breaks; zero init is "
        "only right for biases and deliberate cases (LoRA B matrices, zero-init residual branches)."
    ),
    "max_gt": "Initial values too large: check the init std (e.g. std=1 instead of ~1/sqrt(fan_in)).",
    "min_lt": "Initial values too negative: check the init std and the distribution's bounds.",
}


def _names(fired_params: Iterable[Any]) -> set[str]:
    out = set()
    for p in fired_params:
        out.add(p if isinstance(p, str) else str(p[0]))
    return out


def advice(condition: str, *, node_op_type: str = "", fired_params: Iterable[Any] = ()) -> str:
    """Short optimization advice for a fired condition.

    ``node_op_type`` refines the advice (ReLU outputs, log/sqrt/div domains, softmax, tanh/sigmoid
    saturation, float16 matmul overflow); ``fired_params`` takes parameter names or
    :class:`~nbdebug.watch.conditions.Hit` records.

    >>> "LeakyReLU" in advice("TZ", node_op_type="ReLU")
    True
    >>> "requires_grad" in advice("WNC")
    True
    >>> "clamp" in advice("TO", node_op_type="torch.log")
    True
    """
    abbr = get_condition(condition).abbr
    fam = _op_family(node_op_type)
    names = _names(fired_params)
    parts: list[str] = []

    if abbr in ("TO", "OO", "GE") and fam in _DOMAIN:
        parts.append(_DOMAIN[fam])
    if fam == "relu" and (
        abbr in ("TZ", "GV", "TS") or (abbr in ("TR", "AR") and ("range_percentage_gt" in names or not names))
    ):
        parts.append(_DEAD_RELU)
    if abbr in ("TR", "AR", "GV", "TZ") and fam in _SATURATED:
        if abbr != "TZ" or fam == "sigmoid":
            parts.append(_SATURATED[fam])
    if abbr in ("TR", "AR", "TL") and fam == "softmax":
        parts.append(_DOMAIN["softmax"])
    if abbr == "TZ" and fam == "dropout":
        parts.append("A dropout output that is mostly zero means the drop probability is too high.")
    if abbr in ("TZ", "GV") and fam == "embedding":
        parts.append("Embedding gradients are zero for rows not used in the batch; that is expected.")
    if abbr == "WI":
        parts.extend(_WI_NOTES[n] for n in ("zero_percentage_ge", "max_gt", "min_lt") if n in names)
    for n in ("max_min_lt", "max_min_gt"):
        if n in names and abbr in ("TR", "AR"):
            parts.append(_PARAM_NOTES[n])
    parts.append(_BASE[abbr])
    seen: list[str] = []
    for p in parts:
        if p and p not in seen:
            seen.append(p)
    return " ".join(seen)
