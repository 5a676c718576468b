"""One step of one rank's ``dump.json`` turned into graph nodes, edges and statistics rows.

A :class:`StepBuild` makes numbered passes over the entries, TorchLens-style:

1. :meth:`StepBuild.add_parameters` — ``Parameter.{path}.{name}`` nodes for the parameters module entries list
   (when the dump has no ``Parameter.*`` entries of its own), first in the step;
2. :meth:`StepBuild.add_entry` — one node per entry (section and scope from its name and ``construct.json``)
   and one row per tensor slot; each input is linked to the latest earlier output with identical statistics
   (dtype, shape, Max, Min, Mean, Norm; constant tensors are too ambiguous to link);
3. :meth:`StepBuild.mark_optimizer` — without ``construct.json``, forward ops after the last backward entry are
   the optimizer's;
4. :meth:`StepBuild.tensor_files` — the tensor files the rows name that exist.

>>> from nbdebug.offline import DumpSession
>>> t = {"dtype": "torch.float32", "shape": [2], "Max": 1.0, "Min": -1.0, "Mean": 0.0, "Norm": 1.4}
>>> data = {"Functional.relu.0.forward": {"input_args": [dict(t)], "output": [dict(t, Min=0.0, Mean=0.5)]},
...         "Functional.neg.0.forward": {"input_args": [dict(t, Min=0.0, Mean=0.5)], "output": [dict(t)]}}
>>> b = StepBuild(DumpSession(framework="pytorch"), [], data, {}, {}, "dump.json")
>>> for name, entry in data.items():
...     b.add_entry(name, entry)
>>> b.graph.predecessors("Functional.neg.0.forward")
{'Functional.relu.0.forward'}
"""

from __future__ import annotations

import math
import os
from typing import Any

from ..offline import DumpProblem, DumpSession, TensorFile
from .entries import _STAT_TYPES, MAX_ELEMENTS, StepRows, _clean_tensor, _short, entry_slots
from .names import NameInfo, normalize_dtype, pair_name, parse_name

Producer = tuple[str, str, bool]  # (node, slot, is_module)


def _inside(node: str, module: str, construct: dict, limit: int = 64) -> bool:
    """Whether ``node`` ran inside ``module`` (per construct.json's parent links)."""
    parent = construct.get(node)
    while isinstance(parent, str) and limit:
        if parent == module:
            return True
        parent = construct.get(parent)
        limit -= 1
    return False


def _pick_producer(cands: list[Producer], consumer: str, is_module: bool, construct: dict) -> Producer | None:
    """The latest earlier output with the consumer's input statistics; a module's input never comes from
    inside the module itself (an identity-like op there has the same statistics)."""
    for cand in reversed(cands):
        if cand[0] == consumer:
            continue
        if is_module and construct and _inside(cand[0], consumer, construct):
            continue
        return cand
    return None


def _section_scope(name: str, info: NameInfo, parent: Any) -> tuple[str, str]:
    """The graph section and scope of an entry, from its name and its construct.json parent."""
    if info.direction in ("backward", "parameters_grad"):
        section = "backward"
    elif parent in ("optimizer", "clip_grad") or info.prefix == "Optimizer":
        section = "optimizer"
    else:
        section = "forward"
    if info.kind == "module" or info.direction == "parameters_grad":
        scope = info.path.rpartition(".")[0].replace(".", "/")
    elif section == "optimizer":
        scope = "optimizer"
    elif isinstance(parent, str):
        pinfo = parse_name(parent)
        scope = pinfo.path.replace(".", "/") if pinfo.kind == "module" else ""
    elif info.kind == "parameter":
        scope = info.path.replace(".", "/")
    else:
        scope = ""
    return section, scope


class StepBuild:
    """The state of one step's passes: its rows, the outputs seen so far by statistics, caches."""

    def __init__(self, session: DumpSession, problems: list[DumpProblem], data: dict, construct: dict,
                 stacks: dict, rel: str) -> None:
        self.graph = session.graph
        self.problems = problems
        self.data, self.construct, self.stacks, self.rel = data, construct, stacks, rel
        self.rows = StepRows()
        self.producers: dict[tuple, list[Producer]] = {}  # stats key -> outputs with those statistics
        self.order = 0
        self.has_optimizer = any(v == "optimizer" or v == "clip_grad" for v in construct.values())
        self.last_backward = -1
        self.forward_ops: list[tuple[int, str]] = []
        self.dtype_cache: dict[Any, str] = {}
        self.shape_cache: dict[tuple, float] = {}

    # -- tensors ----------------------------------------------------------------------------------
    def tensor_meta(self, name: str, slot: str, t: dict) -> tuple[str, tuple, float] | None:
        """``(dtype, shape, element count)`` of a tensor entry; None (reported) when its shape is damaged."""
        raw = t["shape"]
        shape = tuple(raw) if type(raw) is list else raw
        if not isinstance(shape, tuple) or not all(type(x) is int and x >= 0 for x in shape):
            self.problems.append(DumpProblem(self.rel, f"{name} {slot}: bad shape {_short(raw)}; tensor skipped"))
            return None
        count = self.shape_cache.get(shape)
        if count is None:
            count = float(math.prod(shape))
            if count > MAX_ELEMENTS:
                self.problems.append(DumpProblem(self.rel, f"{name} {slot}: implausible shape {_short(raw)} "
                                                           f"({count:.3g} elements); tensor skipped"))
                return None
            self.shape_cache[shape] = count
        rd = t.get("dtype", "")
        if type(rd) is not str:
            self.problems.append(DumpProblem(self.rel, f"{name} {slot}: bad dtype {_short(rd)}; shown as "
                                                       f"'unknown'"))
            rd = "unknown"
        return self.dtype(rd), shape, count

    def dtype(self, raw: str) -> str:
        dtype = self.dtype_cache.get(raw)
        if dtype is None:
            dtype = self.dtype_cache[raw] = normalize_dtype(raw)
        return dtype

    def _next_order(self) -> int:
        self.order += 1
        return self.order - 1

    # -- pass 1: parameters listed by module entries ------------------------------------------------
    def add_parameters(self) -> None:
        """``Parameter.{path}.{name}`` nodes for the parameters module entries list, first in the step."""
        if any(k.startswith("Parameter.") for k in self.data):
            return
        for name, entry in self.data.items():
            params = entry.get("parameters") if isinstance(entry, dict) else None
            if not params or not isinstance(params, dict):
                continue
            info = parse_name(name)
            if info.kind != "module" or info.direction != "forward":
                continue
            for pname, t in params.items():
                if isinstance(t, dict) and "shape" in t:
                    self._add_parameter(name, info, pname, t)

    def _add_parameter(self, name: str, info: NameInfo, pname: str, t: dict) -> None:
        t = _clean_tensor(t, name, f"parameters.{pname}", self.rel, self.problems)
        node_name = f"Parameter.{info.path}.{pname}" if info.path else f"Parameter.{pname}"
        key = (node_name, "output.0")
        if key in self.rows.index:
            return
        meta = self.tensor_meta(name, f"parameters.{pname}", t)
        if meta is None:
            return
        dtype, shape, count = meta
        node = self.graph.add_node(node_name, kind="parameter", op_type="Parameter",
                                   scope=info.path.replace(".", "/"))
        node.order = self._next_order()
        node.shapes["output.0"], node.dtypes["output.0"] = shape, dtype
        self.rows.add(key, dtype, shape, count, t)
        mx, mn = t.get("Max"), t.get("Min")
        if mx is not None and mx != mn and count >= 2:
            sk = (dtype, shape, mx, mn, t.get("Mean"), t.get("Norm"))
            self.producers.setdefault(sk, []).append((node_name, "output.0", False))

    # -- pass 2: entries ----------------------------------------------------------------------------
    def add_entry(self, name: str, entry: Any) -> None:
        """One entry: its node and a row (and edges) per tensor slot."""
        if not isinstance(entry, dict):
            self.problems.append(DumpProblem(self.rel, f"entry {name!r} is not an object; skipped"))
            return
        info = parse_name(name)
        section, scope = _section_scope(name, info, self.construct.get(name))
        graph, stacks = self.graph, self.stacks
        node = graph.nodes.get(name)
        if node is None:
            node = graph.add_node(name, kind=info.kind, op_type=info.op_type, scope=scope, section=section,
                                  stack=stacks.get(name), pair=pair_name(name, info))
        elif not node.stack and name in stacks:
            node.stack = stacks[name]
        node.order = self._next_order()
        if section == "backward":
            self.last_backward = node.order
        elif section == "forward" and info.kind == "op" and not self.has_optimizer:
            self.forward_ops.append((node.order, name))
        try:
            slots = entry_slots(entry)
        except RecursionError:
            self.problems.append(DumpProblem(self.rel, f"entry {name!r} is nested too deeply; skipped"))
            return
        for slot, t in slots:
            self.add_slot(name, info, node, slot, t)

    def add_slot(self, name: str, info: NameInfo, node: Any, slot: str, t: dict) -> None:
        """One tensor of an entry: its row, and its edge from a producer (inputs) or as a producer (outputs)."""
        g = t.get
        if not (type(g("Max")) in _STAT_TYPES and type(g("Min")) in _STAT_TYPES
                and type(g("Mean")) in _STAT_TYPES and type(g("Norm")) in _STAT_TYPES
                and type(g("dtype")) is str):
            t = _clean_tensor(t, name, slot, self.rel, self.problems)
            g = t.get
        raw = g("shape")
        shape = tuple(raw) if type(raw) is list else raw
        try:
            count = self.shape_cache.get(shape) if type(shape) is tuple else None
        except TypeError:  # unhashable shape elements
            count = None
        if count is None:
            meta = self.tensor_meta(name, slot, t)
            if meta is None:
                return
            count = meta[2]
        dtype = self.dtype(g("dtype"))
        key = (name, slot)
        self.rows.add(key, dtype, shape, count, t)
        node.shapes[slot] = shape
        node.dtypes[slot] = dtype
        if slot.startswith("parameters."):
            pnode = f"Parameter.{info.path}.{slot[11:]}" if info.path else f"Parameter.{slot[11:]}"
            if pnode in self.graph.nodes:
                self.graph.add_edge(pnode, name, "output.0", slot)
            return
        mx, mn = g("Max"), g("Min")
        if mx is None or count < 2 or mx == mn:
            return  # constant tensors: too ambiguous to link by statistics
        self._link(name, info, slot, (dtype, shape, mx, mn, g("Mean"), g("Norm")))

    def _link(self, name: str, info: NameInfo, slot: str, sk: tuple) -> None:
        is_module = info.kind == "module"
        cands = self.producers.get(sk)
        if slot[0] == "i":  # input.*: link to the latest earlier output with the same statistics
            if cands:
                prod: Producer | None = cands[-1]
                if prod[0] == name or (is_module and self.construct):
                    prod = _pick_producer(cands, name, is_module, self.construct)
                if prod is not None:
                    self.graph.add_edge(prod[0], name, prod[1], slot)
            return
        if cands is None:
            self.producers[sk] = [(name, slot, is_module)]
        else:
            prev = cands[-1]
            if not is_module or prev[2] or prev[0].startswith("Parameter."):
                cands.append((name, slot, is_module))
        if info.direction == "parameters_grad":
            pnode = f"Parameter.{info.path}.{slot}" if info.path else f"Parameter.{slot}"
            if pnode in self.graph.nodes:
                self.graph.add_edge(pnode, name, "output.0", slot)

    # -- pass 3, 4 ----------------------------------------------------------------------------------
    def mark_optimizer(self) -> None:
        """L1 dumps have no construct.json: forward ops after the last backward entry are the optimizer's."""
        if self.last_backward < 0 or self.has_optimizer:
            return
        for o, name in self.forward_ops:
            if o > self.last_backward:
                node = self.graph.nodes[name]
                if node.section == "forward" and node.pair is not None and node.pair not in self.data:
                    node.section, node.scope = "optimizer", "optimizer"

    def tensor_files(self, data_dir: str, listing: set[str]) -> dict[tuple[str, str], TensorFile]:
        """The rows' tensor files that exist (the first 20 missing ones named in ``problems``)."""
        rows = self.rows
        files: dict[tuple[str, str], TensorFile] = {}
        missing = 0
        for key, fname in rows.files.items():
            if fname not in listing:
                missing += 1
                if missing <= 20:
                    self.problems.append(DumpProblem(os.path.join(os.path.relpath(data_dir), fname),
                                                     f"missing (tensor {key[0]} {key[1]} keeps its statistics "
                                                     f"only)"))
                continue
            i = rows.index[key]
            files[key] = TensorFile(os.path.join(data_dir, fname), rows.shapes[i], rows.dtypes[i])
        if missing > 20:
            self.problems.append(DumpProblem(os.path.relpath(data_dir), f"{missing - 20} more tensor files missing"))
        return files
