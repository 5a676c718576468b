"""Which node of one run corresponds to which node of the other.

Four ways, tried in this order for every target node:

1. a user ``mapping`` — ``{target name: golden name}``; a key ending in ``*`` maps a prefix
   (``{"Cell.backbone.*": "Module.model.*"}``); or a callable ``name -> golden name | None``;
2. ``match="exact"`` — the same name; across frameworks (MindSpore target, PyTorch golden or the reverse)
   names are first brought to PyTorch's spelling: ``Cell.a.b.Dense.forward.0`` ↔ ``Module.a.b.Linear.forward.0``
   (module path, direction and call count; the class may differ), ``Mint.x`` → ``Torch.x``,
   ``MintFunctional.x`` → ``Functional.x``, ``Functional.x`` (mindspore.ops) → ``Torch.x`` or
   ``Functional.x``, a few renamed APIs (the backend's ``api_to_torch``), and parameter names
   ``gamma/beta/moving_mean/moving_variance/embedding_table`` → ``weight/bias/running_mean/running_var/weight``;
   Across frameworks an op is first paired by its module: the k-th call of an API inside one module
   (``x.relu()`` and ``F.relu(x)`` alike) with the k-th call of that API inside the same module of the
   other run (``matched_by="scoped"``), so that counters shifted by calls elsewhere do not pair a conv
   block's ``relu`` with an fc block's;
3. ``match="fuzzy"`` — as exact but without call counts: the k-th call of an API (or module) in the
   target pairs with its k-th call in the golden run;
4. ``match="structural"`` — align the two execution orders (per section) by node kind, op type (with
   synonyms such as Dense ~ Linear) and output shapes, for graphs whose names do not line up.

>>> canonical_keys("Cell.block.lin.Dense.forward.1", "mindspore", cross=True)
['Module.block.lin.forward.1']
>>> canonical_keys("Mint.add.0.forward", "mindspore", cross=True)
['Torch.add.0.forward', 'Tensor.add.0.forward']
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Callable, Mapping, Sequence

from ..dump.names import parse_name
from ..frameworks.registry import Backend, backend_for_names, backend_named, backends

#: module / op class synonyms used by structural matching (lower case → canonical); each backend adds its own
#: spellings of PyTorch's classes (``Backend.class_to_torch``: ``Dense`` → ``Linear``, ``SequentialCell``)
CLASS_SYNONYMS = {
    "matmul": "linear",
    "batchnorm1d": "batchnorm",
    "batchnorm2d": "batchnorm",
    "batchnorm3d": "batchnorm",
    "mseloss": "mseloss",
    "mse_loss": "mseloss",
}


@functools.lru_cache(maxsize=4)
def _synonyms(of: tuple[Backend, ...]) -> tuple[dict[str, str], dict[str, str]]:
    """(class synonyms, API names in PyTorch's spelling) over the backends ``of``."""
    classes, apis = dict(CLASS_SYNONYMS), {}
    for b in of:
        for k, v in b.class_to_torch.items():
            classes.setdefault(k, v)
        for k, v in b.api_to_torch.items():
            apis.setdefault(k, v)
    return classes, apis


def framework_of_names(names: Sequence[str]) -> str:
    """``"mindspore"`` when the names use MindSpore-only prefixes, else ``"pytorch"``."""
    return backend_for_names(names).name


def _spelling(framework: str, cross: bool) -> Backend | None:
    """The backend whose names are brought to PyTorch's spelling (None: leave names as they are)."""
    if not cross:
        return None
    b = backend_named(framework)
    return b if b.param_to_torch or b.api_to_torch or b.prefix_to_torch else None


def canonical_slot(slot: str, framework: str, cross: bool) -> str:
    """``parameters.gamma`` → ``parameters.weight`` (and ``gamma`` → ``weight``) across frameworks."""
    b = _spelling(framework, cross)
    if b is None:
        return slot
    if slot.startswith("parameters."):
        return "parameters." + b.torch_param(slot[11:])
    return b.torch_param(slot)


def canonical_keys(name: str, framework: str, *, cross: bool, counts: bool = True) -> list[str]:
    """Candidate keys of ``name`` in PyTorch's spelling (first = preferred); without call counts for fuzzy
    matching (``counts=False``)."""
    info = parse_name(name)
    b = _spelling(framework, cross)
    if info.kind == "module" or info.direction == "parameters_grad":
        if not cross:
            base = name if counts else name.rsplit(".", 1)[0]
            return [base]
        core = f"{backend_named('pytorch').module_prefix}.{info.path}.{info.direction}"  # the common spelling
        return [f"{core}.{info.count}" if counts else core]
    if info.kind == "parameter":  # Parameter.{path}.{name}
        if b is not None:
            path, _, pname = name[len("Parameter."):].rpartition(".")
            pname = b.torch_param(pname)
            return [f"Parameter.{path}.{pname}" if path else f"Parameter.{pname}"]
        return [name]
    if info.kind != "op" or info.count is None:
        return [name]
    if b is None:
        if counts:
            return [name]
        return [f"{info.api}.{info.direction}"]
    parts = info.api.split(".")
    api = parts[1] if len(parts) > 1 else parts[0]  # Primitive.{api}.{Class}: the api
    api_pt = b.api_to_torch.get(api.lower(), api)
    out = []
    for prefix in b.prefix_to_torch.get(info.prefix, (info.prefix,)):
        for a in dict.fromkeys((api_pt, api)):
            key = f"{prefix}.{a}.{info.count}.{info.direction}" if counts else f"{prefix}.{a}.{info.direction}"
            if key not in out:
                out.append(key)
    return out


def _apply_user_mapping(name: str, mapping: Mapping[str, str] | Callable[[str], str | None] | None) -> str | None:
    if mapping is None:
        return None
    if callable(mapping):
        return mapping(name)
    hit = mapping.get(name)
    if hit is not None:
        return hit
    best = None
    for k, v in mapping.items():
        if k.endswith("*") and name.startswith(k[:-1]) and (best is None or len(k) > len(best[0])):
            best = (k, v)
    if best is None:
        return None
    k, v = best
    return (v[:-1] if v.endswith("*") else v) + name[len(k) - 1:]


class NodeDesc:
    """What matching looks at for one node (``scope``: the module path it ran in, None when unknown)."""

    __slots__ = ("name", "kind", "section", "op_type", "out_shapes", "scope", "api")

    def __init__(self, name: str, kind: str, section: str, op_type: str, out_shapes: tuple,
                 scope: str | None = None) -> None:
        self.name, self.kind, self.section, self.op_type, self.out_shapes = name, kind, section, op_type, out_shapes
        self.scope = scope
        #: the API in PyTorch's spelling when the node stands for more than its own op (a fused bias add)
        self.api: str | None = None

    def signature(self) -> tuple:
        op = self.op_type.lower().lstrip("_").rstrip("_")
        classes, apis = _synonyms(tuple(backends()))
        op = classes.get(op, op)
        op = apis.get(op, op)
        return (self.kind, op, self.out_shapes)


def match_nodes(target: Sequence[NodeDesc], golden: Sequence[NodeDesc], *, how: str = "exact",
                mapping: Mapping[str, str] | Callable[[str], str | None] | None = None,
                target_framework: str = "pytorch", golden_framework: str = "pytorch",
                cross: bool | None = None) -> tuple[list[tuple[str, str, str]], list[str], list[str]]:
    """Pair target nodes with golden nodes (both in execution order).

    Returns ``(pairs, unmatched_target, unmatched_golden)``; each pair is ``(target, golden, how)`` where
    ``how`` says which rule matched (``mapping``, ``exact``, ``fuzzy`` or ``structural``).
    """
    if how not in ("exact", "fuzzy", "structural"):
        raise ValueError(f"match must be 'exact', 'fuzzy' or 'structural', got {how!r}")
    if cross is None:
        cross = backend_named(target_framework) is not backend_named(golden_framework)
    golden_names = {g.name for g in golden}
    used_g: set[str] = set()
    pairs: dict[str, tuple[str, str]] = {}

    for t in target:  # 1. the user's mapping
        g = _apply_user_mapping(t.name, mapping)
        if g is not None and g in golden_names and g not in used_g:
            pairs[t.name] = (g, "mapping")
            used_g.add(g)

    if cross:  # 2a. across frameworks, an op pairs first with the same API's k-th call in the same module
        for t_name, g_name in _scoped_pairs(target, golden, target_framework, golden_framework, pairs, used_g):
            pairs[t_name] = (g_name, "scoped")
            used_g.add(g_name)

    # 2. exact names (canonical across frameworks); also the first pass of fuzzy and structural
    index: dict[str, str] = {}
    for g in golden:
        if g.name in used_g:
            continue
        for key in canonical_keys(g.name, golden_framework, cross=cross):
            index.setdefault(key, g.name)
    for t in target:
        if t.name in pairs:
            continue
        for key in canonical_keys(t.name, target_framework, cross=cross):
            g = index.get(key)
            if g is not None and g not in used_g:
                pairs[t.name] = (g, "exact")
                used_g.add(g)
                break

    if how == "fuzzy":  # 3. the k-th call with the k-th call
        groups: dict[str, list[str]] = {}
        for g in golden:
            if g.name in used_g:
                continue
            key = canonical_keys(g.name, golden_framework, cross=cross, counts=False)[0]
            groups.setdefault(key, []).append(g.name)
        taken: dict[str, int] = {}
        for t in target:
            if t.name in pairs:
                continue
            for key in canonical_keys(t.name, target_framework, cross=cross, counts=False):
                cands = groups.get(key)
                k = taken.get(key, 0)
                if cands and k < len(cands):
                    pairs[t.name] = (cands[k], "fuzzy")
                    used_g.add(cands[k])
                    taken[key] = k + 1
                    break
    elif how == "structural":  # 4. align the execution orders
        for section in ("forward", "backward", "optimizer"):
            ts = [t for t in target if t.section == section and t.name not in pairs]
            gs = [g for g in golden if g.section == section and g.name not in used_g]
            for t, g in _align(ts, gs):
                pairs[t.name] = (g.name, "structural")
                used_g.add(g.name)

    out = [(t.name, pairs[t.name][0], pairs[t.name][1]) for t in target if t.name in pairs]
    unmatched_t = [t.name for t in target if t.name not in pairs]
    unmatched_g = [g.name for g in golden if g.name not in used_g]
    return out, unmatched_t, unmatched_g


def scoped_key(desc: NodeDesc, framework: str) -> tuple[str, str, str] | None:
    """``(module path, API in PyTorch's spelling, direction)`` of an op whose module path is known; None
    otherwise. The call prefix (``Tensor``/``Torch``/``Functional``/``Primitive``…) is left out: a faithful
    port may spell one call ``x.relu()`` on one side and ``F.relu(x)`` on the other.

    >>> scoped_key(NodeDesc("Primitive.relu.ReLU.0.forward", "op", "forward", "ReLU", (), "relu"), "mindspore")
    ('relu', 'relu', 'forward')
    >>> scoped_key(NodeDesc("Functional.relu.3.forward", "op", "forward", "relu", (), "relu"), "pytorch")
    ('relu', 'relu', 'forward')
    """
    if desc.scope is None or desc.kind != "op":
        return None
    info = parse_name(desc.name)
    if info.kind != "op" or info.count is None:
        return None
    if desc.api is not None:
        return desc.scope, desc.api, info.direction
    parts = info.api.split(".")
    api = (parts[1] if len(parts) > 1 else parts[0]).lower()
    b = backend_named(framework)
    return desc.scope, b.api_to_torch.get(api, api), info.direction


def _scoped_pairs(target: Sequence[NodeDesc], golden: Sequence[NodeDesc], tfw: str, gfw: str,
                  pairs: Mapping[str, tuple[str, str]], used_g: set[str]) -> list[tuple[str, str]]:
    """The k-th call of an API inside one module of the target with its k-th call inside the same module of
    the golden run (both in execution order)."""
    calls: dict[tuple, list[str]] = {}
    for g in golden:
        key = scoped_key(g, gfw) if g.name not in used_g else None
        if key is not None:
            calls.setdefault(key, []).append(g.name)
    taken: dict[tuple, int] = {}
    out = []
    for t in target:
        key = scoped_key(t, tfw) if t.name not in pairs else None
        if key is None:
            continue
        k = taken.get(key, 0)
        taken[key] = k + 1
        cands = calls.get(key, ())
        if k < len(cands):
            out.append((t.name, cands[k]))
    return out


def _align(ts: list[NodeDesc], gs: list[NodeDesc]) -> list[tuple[NodeDesc, NodeDesc]]:
    """Pairs of an alignment of two node sequences by signature (kind, op type, output shapes)."""
    if not ts or not gs:
        return []
    a = [t.signature() for t in ts]
    b = [g.signature() for g in gs]
    sm = difflib.SequenceMatcher(None, a, b, autojunk=False)
    out: list[tuple[NodeDesc, NodeDesc]] = []
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        if tag == "equal":
            out.extend(zip(ts[i1:i2], gs[j1:j2], strict=True))
        elif tag == "replace":
            # different op types: pair in order those with the same kind and output shapes
            j = j1
            for i in range(i1, i2):
                while j < j2 and (b[j][0], b[j][2]) != (a[i][0], a[i][2]):
                    j += 1
                if j < j2:
                    out.append((ts[i], gs[j]))
                    j += 1
    return out

