"""The kernels of one compiled graph (:class:`KernelGraph`): named by their full scope name, in execution
order, each input traced back through ``Load``/``Depend``/``TupleGetItem`` to the kernel output, parameter or
graph input it reads; sections (forward, backward, optimizer) from the scope names.

>>> section_of("Default/optimizer-SGD/SGD-op0", "SGD"), section_of("Gradients/Default/fc-Dense/MatMul-op1", "MatMul")
('optimizer', 'backward')
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any

from .kernel_ir import IRGraph, IRParam, parse_ir, parse_pb, read_execution_order

#: kernels that update parameters (the optimizer section)
OPTIMIZER_KERNELS = frozenset({
    "SGD", "ApplyMomentum", "Adam", "AdamWeightDecay", "FusedSparseAdam", "FusedSparseLazyAdam", "ApplyAdagrad",
    "ApplyAdagradV2", "ApplyRMSProp", "ApplyCenteredRMSProp", "ApplyFtrl", "ApplyProximalAdagrad", "LARSUpdate",
    "LambApplyOptimizerAssign", "LambApplyWeightAssign", "ApplyAdaMax", "ApplyAddSign", "ApplyPowerSign",
    "ApplyAdadelta", "ApplyGradientDescent", "ApplyProximalGradientDescent", "AdamApplyOne",
    "AdamApplyOneWithDecay", "FusedAdam", "FusedAdamWeightDecay", "ApplyAdamWithAmsgrad",
})
_NONKERNEL = frozenset({"Load", "Depend", "UpdateState", "MakeTuple", "TupleGetItem", "Return", "Partial",
                        "Switch", "make_tuple", "tuple_getitem", "depend", "load", "update_state"})


# -- kernels and their inputs ---------------------------------------------------------------------

@dataclass
class Kernel:
    """One executed kernel of a graph, with where each of its inputs comes from."""

    name: str  # full scope name
    op_type: str
    scope: str
    section: str
    file_key: str  # the .npy file-name prefix
    stack: list[str]
    #: input slot -> ("kernel", producer name, "output.i") | ("param", name) | ("const", text) |
    #: ("bound", parameter index, dtype, shape): a graph input the control flow binds to another graph's output
    sources: dict[str, tuple[str, ...]] = field(default_factory=dict)
    #: the IR's call chain of the kernel (see :class:`IRNode`), for recovering Cell scopes
    frames: list[tuple[str, int, int, int, str]] = field(default_factory=list)
    #: ``{"input.0": "float32", "output.0": ...}``: the dtypes the selected kernel reads and writes
    device_dtypes: dict[str, str] = field(default_factory=dict)
    #: ``{"input.0": ("float16", (8, 64)), ...}``: the graph's declared dtype and shape (what the dump names;
    #: see :attr:`IRNode.declared_in`)
    declared: dict[str, tuple[str, tuple[int, ...] | None]] = field(default_factory=dict)


def file_key(op_type: str, fullname: str) -> str:
    return f"{op_type}.{fullname.replace('/', '_')}"


def section_of(fullname: str, op_type: str) -> str:
    parts = fullname.split("/")
    if parts and parts[0] == "Gradients":
        return "backward"
    if op_type in OPTIMIZER_KERNELS or any(p.startswith("optimizer-") for p in parts):
        return "optimizer"
    return "forward"


@dataclass
class KernelGraph:
    """A graph's kernels in execution order, with data-flow sources; built from the .ir and the csv."""

    graph_id: int
    file: str  # the graph file name, e.g. ms_output_trace_code_graph_0.ir
    kernels: list[Kernel]
    params: dict[str, IRParam]  # by parameter name
    #: dump file key -> kernel name, learnt from the first run (see :func:`match_kernel_files`)
    pairing: dict[str, str] = field(default_factory=dict)
    #: what a run hands back to the control flow: ``("kernel", name, slot)`` or ``("bound", index, dtype,
    #: shape)`` (a bound input passed through), in the ``Return``'s order
    returns: list[tuple[str, ...]] = field(default_factory=list)

    @property
    def weight_names(self) -> set[str]:
        return {p.name for p in self.params.values() if p.is_weight}


#: a kernel graph's parameter that the control flow binds (a branch's or loop body's argument, the value a
#: branch hands back to the main graph): the .ir names it ``%para4_`` or ``%para1__12575`` in its header
_BOUND_NAME = re.compile(r"^(_\d+)?$")
_PARA_INDEX = re.compile(r"^%para(\d+)_")


class _Resolver:
    """Traces an IR argument back through ``Load``/``Depend``/``Cast``/``TupleGetItem``/``MakeTuple`` to the
    kernel output, parameter, bound graph input or constant it reads."""

    def __init__(self, ir: IRGraph, kernel_names: set[str]) -> None:
        self.ir = ir
        self.kernel_names = kernel_names
        self.subgraphs = list(dict.fromkeys(nid.split(":", 1)[0] for nid in ir.nodes))
        self.by_index = {p.index: p for p in ir.params.values()}

    def node(self, arg: str) -> Any:
        for sub in self.subgraphs:
            node = self.ir.nodes.get(f"{sub}:{arg[1:]}")
            if node is not None:
                return node
        return None

    def param(self, arg: str) -> tuple[str, ...] | None:
        p = self.ir.params.get(arg)
        if p is None:  # the body may spell a parameter otherwise than the header (``%para1_Parameter_95``)
            m = _PARA_INDEX.match(arg)
            p = self.by_index.get(int(m.group(1))) if m else None
        if p is None:
            return None
        if not p.is_weight and _BOUND_NAME.match(p.name):
            return ("bound", str(p.index), p.dtype, p.shape)
        return ("param", p.name)

    def resolve(self, arg: str, depth: int = 0) -> tuple[str, ...] | None:
        if depth > 16:
            return None
        if arg.startswith("%para"):
            return self.param(arg)
        if arg.startswith("%"):
            node = self.node(arg)
            if node is None:
                return None
            if node.fullname in self.kernel_names:
                return ("kernel", node.fullname, "output.0")
            if node.op == "TupleGetItem" and len(node.args) >= 2:
                m = re.match(r"I64\((\d+)\)", node.args[1])
                inner = self.node(node.args[0]) if node.args[0].startswith("%") and \
                    not node.args[0].startswith("%para") else None
                if inner is not None and inner.op == "MakeTuple" and m and int(m.group(1)) < len(inner.args):
                    return self.resolve(inner.args[int(m.group(1))], depth + 1)
                src = self.resolve(node.args[0], depth + 1)
                if src and src[0] == "kernel" and m:
                    return ("kernel", src[1], f"output.{m.group(1)}")
                return src
            if node.op in ("Load", "Depend", "Cast") and node.args:
                return self.resolve(node.args[0], depth + 1)
            return None
        if arg.startswith(("UMonad", "IOMonad")):
            return None
        if arg.startswith("Tensor("):
            return ("const", arg)
        return ("scalar", arg)

    def flatten(self, arg: str, depth: int = 0) -> list[tuple[str, ...]]:
        """The tensors a ``Return`` argument hands back (nested ``MakeTuple`` flattened)."""
        node = self.node(arg) if arg.startswith("%") and not arg.startswith("%para") else None
        if node is not None and node.op == "MakeTuple" and depth < 16:
            return [src for a in node.args for src in self.flatten(a, depth + 1)]
        if node is not None and node.op == "Depend" and node.args and depth < 16:
            return self.flatten(node.args[0], depth + 1)
        src = self.resolve(arg)
        return [src] if src is not None and src[0] in ("kernel", "bound") else []

    def kernel_sources(self, node: Any) -> dict[str, tuple[str, ...]]:
        sources: dict[str, tuple[str, ...]] = {}
        i = 0
        for arg in node.args:
            if arg.startswith(("UMonad", "IOMonad")):
                continue
            if arg.startswith("%") and not arg.startswith("%para"):
                ref = self.node(arg)
                if ref is not None and ref.op == "UpdateState":
                    continue
            src = self.resolve(arg)
            if src is not None and src[0] != "scalar":
                sources[f"input.{i}"] = src
            i += 1
        return sources


def build_kernel_graph(ir: IRGraph, order: list[str], graph_id: int) -> KernelGraph:
    kernel_names = set(order) if order else {n.fullname for n in ir.nodes.values()
                                             if n.fullname and n.op not in _NONKERNEL}
    res = _Resolver(ir, kernel_names)
    kernels: list[Kernel] = []
    for name in order or [n.fullname for n in ir.nodes.values() if n.fullname in kernel_names]:
        node = ir.by_fullname.get(name)
        last = name.rsplit("/", 1)[-1]
        op_type = last.rsplit("-op", 1)[0] if "-op" in last else (node.op if node else last)
        k = Kernel(name, op_type, name.rpartition("/")[0], section_of(name, op_type), file_key(op_type, name),
                   _user_frames(node.stack) if node else [])
        if node is not None:
            k.frames = node.frames
            k.declared = {**{f"input.{i}": t for i, t in enumerate(node.declared_in)},
                          **{f"output.{i}": t for i, t in enumerate(node.declared_out)}}
            k.device_dtypes = {**{f"input.{i}": t for i, t in enumerate(node.device_in)},
                               **{f"output.{i}": t for i, t in enumerate(node.device_out)}}
            k.sources = res.kernel_sources(node)
        kernels.append(k)
    _expand_sections(kernels)
    params = {p.name: p for p in ir.params.values()}
    returns = [src for arg in ir.returns for src in res.flatten(arg)]
    return KernelGraph(graph_id, os.path.basename(ir.file), kernels, params, returns=returns)


def _expand_sections(kernels: list[Kernel]) -> None:
    """Kernels the compiler made up (e.g. "Expand/..." from graph-kernel expansion) have lost their scope:
    they belong to the backward pass when they consume its results, or run amid it."""
    sections = {k.name: k.section for k in kernels}
    prev = "forward"
    for k in kernels:
        if not k.name.startswith(("Default", "Gradients")) and k.section == "forward":
            srcs = [sections.get(src[1]) for src in k.sources.values() if src[0] == "kernel"]
            if "backward" in srcs or (not srcs and prev == "backward"):
                k.section = sections[k.name] = "backward"
        prev = k.section


def _user_frames(stack: list[str], limit: int = 8) -> list[str]:
    """Source lines innermost first, the framework's own frames left out."""
    frames = [s for s in reversed(stack) if "/mindspore/" not in s.split(", line", 1)[0]]
    return frames[:limit]


def load_kernel_graph(rank_dir: str, graph_id: int) -> KernelGraph:
    """Parse ``graphs/ms_output_trace_code_graph_{g}.ir`` and the execution order of graph ``g``."""
    ir_path = os.path.join(rank_dir, "graphs", f"ms_output_trace_code_graph_{graph_id}.ir")
    order_path = os.path.join(rank_dir, "execution_order", f"ms_execution_order_graph_{graph_id}.csv")
    if os.path.exists(ir_path):
        try:
            with open(ir_path, encoding="utf-8", errors="replace") as f:
                ir = parse_ir(f.read(), ir_path)
        except OSError as exc:
            raise ValueError(f"cannot read MindSpore graph file {ir_path}: {exc}") from None
    else:
        pb_path = ir_path[:-3] + ".pb"
        if not os.path.exists(pb_path):
            raise ValueError(f"graph {graph_id} has no graph file in {os.path.join(rank_dir, 'graphs')} "
                             f"(expected {os.path.basename(ir_path)} or .pb)")
        ir = parse_pb(pb_path)
    order = read_execution_order(order_path) if os.path.exists(order_path) else []
    return build_kernel_graph(ir, order, graph_id)
