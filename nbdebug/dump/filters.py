"""Which nodes a dump keeps: msProbe's ``scope`` / ``list`` selection and its API risk levels.

* ``list``: a node is kept when one entry is a substring of its name (``"fc1"``, ``"Functional.linear"``);
  an entry ``name-regex(PATTERN)`` matches by regular expression instead.
* ``scope``: ``[start, end]`` keeps everything executed from ``start`` through ``end`` (API names at L1;
  module names at L0 — a module range includes everything inside those modules; either at mix). Combined
  with ``list``, both must match.
* at mix level a ``list`` entry that names a module keeps everything executed inside that module.
* ``risk_level`` (PyTorch, L1 and mix, only when neither scope nor list is set): ``FOCUS`` (msProbe's default)
  drops shape/dtype/creation APIs (view, reshape, to, zeros, cat, clone ...), ``CORE`` keeps only the matmul,
  convolution, normalization, embedding and attention family, ``ALL`` keeps every API. Modules are always kept.

>>> sel = Selection(scope=[], names=["fc1"], level="L1")
>>> sel.check("Functional.linear.0.forward"), sel.check("Module.fc1.Linear.forward.0")
(False, True)
>>> risk_keeps("FOCUS", "Tensor.reshape.0.forward"), risk_keeps("FOCUS", "Functional.relu.0.forward")
(False, True)
"""

from __future__ import annotations

import re

from ..frameworks.registry import is_module_name, module_prefixes

# APIs that only reshape, cast, copy or create tensors: msProbe's "low risk" set, skipped under FOCUS.
LOW_RISK_APIS = frozenset({
    "squeeze", "unsqueeze", "reshape", "reshape_as", "view", "view_as", "flatten", "unflatten", "expand",
    "expand_as", "repeat", "repeat_interleave", "tile", "transpose", "permute", "moveaxis", "movedim",
    "swapaxes", "swapdims", "chunk", "unsafe_chunk", "split", "split_with_sizes", "unsafe_split",
    "unsafe_split_with_sizes", "tensor_split", "hsplit", "vsplit", "dsplit", "unbind", "stack", "cat", "concat",
    "concatenate", "hstack", "vstack", "dstack", "column_stack", "row_stack", "align_as", "align_to",
    "atleast_1d", "atleast_2d", "atleast_3d", "ravel", "clamp", "unfold", "type_as", "to", "float", "double",
    "int", "long", "half", "bfloat16", "byte", "char", "bool", "cfloat", "numpy", "empty", "empty_like", "zeros",
    "zeros_like", "ones", "ones_like", "full", "full_like", "arange", "linspace", "logspace", "eye", "identity",
    "diag", "diagflat", "diag_embed", "triu", "tril", "triu_indices", "tril_indices", "clone", "__bool__",
    "stride",
})

# The "core" family kept under CORE. msProbe 26.2's own set lacks ``linear`` (a missing comma glues it to
# ``chain_matmul``); we follow what it writes, so ``linear`` is not core here either.
CORE_APIS = frozenset({
    "_fused_adamw_", "_fused_adam_", "matmul", "__matmul__", "bmm", "addmm", "addmm_", "addbmm", "addbmm_",
    "baddbmm", "baddbmm_", "mm", "mv", "addmv", "addmv_", "addr", "addr_", "conv1d", "conv2d", "conv3d",
    "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "conv_tbc", "convolution", "_convolution",
    "chain_matmullinear", "bilinear", "linalg.matmul", "linalg.multi_dot", "linalg.vecdot", "batch_norm",
    "instance_norm", "layer_norm", "group_norm", "local_response_norm", "_batch_norm_impl_index",
    "batch_norm_elemt", "batch_norm_stats", "batch_norm_update_stats", "batch_norm_gather_stats",
    "batch_norm_gather_stats_with_counts", "batch_norm_backward_elemt", "batch_norm_backward_reduce",
    "embedding", "embedding_bag", "multi_head_attention_forward", "scaled_dot_product_attention",
})

_API_SUFFIX = re.compile(r"\.\d+\.(forward|backward)$")


def _api_of(name: str) -> tuple[str, str]:
    """(prefix, api) of an API node name: ``Functional.linear.0.forward`` -> (Functional, linear)."""
    base = _API_SUFFIX.sub("", name)
    prefix, _, api = base.partition(".")
    return prefix, api


def risk_keeps(risk_level: str, name: str) -> bool:
    """Whether msProbe's risk level keeps API node ``name`` (modules and parameter gradients always)."""
    if risk_level == "ALL":
        return True
    prefix, api = _api_of(name)
    if prefix in module_prefixes():
        return True
    if risk_level == "CORE":
        return api in CORE_APIS
    return api not in LOW_RISK_APIS


class Selection:
    """msProbe's scope/list state machine, fed with node events in execution order."""

    def __init__(self, scope: list[str], names: list[str], level: str) -> None:
        self.scope = list(scope)
        self.level = level
        self.plain: list[str] = []
        self.regex: list[re.Pattern[str]] = []
        for n in names:
            if n.startswith("name-regex(") and n.endswith(")"):
                self.regex.append(re.compile(n[len("name-regex("):-1]))
            else:
                self.plain.append(n)
        self.has_names = bool(names)
        kinds = {is_module_name(n) for n in self.scope}
        self.module_range = bool(self.scope) and kinds == {True} and level != "mix"
        self.in_scope = False
        self._in_list: set[str] = set()  # modules (mix) whose name matched the list and are running

    @property
    def active(self) -> bool:
        return bool(self.scope) or self.has_names

    def name_matches(self, name: str) -> bool:
        if not self.has_names:
            return True
        return any(p in name for p in self.plain) or any(r.search(name) for r in self.regex)

    # module range events (pre/post of module calls, reconstructed by the writer)
    def begin_module(self, name: str) -> None:
        if self.scope and name == self.scope[0] and (self.module_range or self.level == "mix"):
            self.in_scope = True
        if self.level == "mix" and self.has_names and self.name_matches(name):
            self._in_list.add(name)

    def end_module(self, name: str) -> None:
        if self.scope and name == self.scope[1] and (self.module_range or self.level == "mix"):
            self.in_scope = False
        self._in_list.discard(name)

    def check(self, name: str) -> bool:
        """Whether node ``name`` (executing now) is selected."""
        if not self.active:
            return True
        if self.module_range:
            return self.in_scope and self.name_matches(name)
        if self.scope and name == self.scope[0]:
            self.in_scope = True
        ok = (not self.scope or self.in_scope) and (bool(self._in_list) or self.name_matches(name))
        if self.scope and name == self.scope[1]:
            self.in_scope = False
        return ok
