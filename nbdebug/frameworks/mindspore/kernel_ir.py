"""MindSpore's graph text: the optimized execution graph's ``.ir`` (:func:`parse_ir`), its ``.pb`` form
(:func:`parse_pb`) and the execution order's CSV (:func:`read_execution_order`).

>>> ir = parse_ir('''subgraph @kernel_graph_0() {
...   %8(CNode_36) = PrimFunc_Mul(%7, %7) primitive_attrs: {}
...       # Fullname with scope: (Default/network-WithLossCell/_loss_fn-MSELoss/Mul-op1)
...   Return(%8)
... }''')
>>> node = ir.by_fullname["Default/network-WithLossCell/_loss_fn-MSELoss/Mul-op1"]
>>> node.op, node.args
('Mul', ['%7', '%7'])
>>> is_optimizer_state("moments.fc.weight"), is_optimizer_state("fc.weight")
(True, False)
"""

from __future__ import annotations

import csv
import os
import re
from dataclasses import dataclass, field

# -- the .ir text -----------------------------------------------------------------------------------

#: optimizer-state parameter names (weights are the other ``is_parameter`` inputs)
_STATE_PREFIXES = ("moments.", "accum.", "stat.", "moment1.", "moment2.", "mean_grad.", "mean_square.",
                   "vhat.", "linear.", "ms.", "mom.", "adam_m.", "adam_v.", "accum_update.")
_STATE_NAMES = frozenset({"global_step", "learning_rate", "momentum", "beta1_power", "beta2_power", "lr",
                          "weight_decay", "loss_scale", "current_iterator_step", "last_overflow_iterator_step"})


def is_optimizer_state(name: str) -> bool:
    return name in _STATE_NAMES or name.startswith(_STATE_PREFIXES)


_PARAM_RE = re.compile(r"^%para(\d+)_(.*?): <(Ref\[)?Tensor\[(\w+)\]\]?, \(([^)]*)\)(.*)$")
#: most lines one IR statement may span (a constant tensor's value is printed in full)
MAX_CONTINUATION_LINES = 100_000
_NODE_RE = re.compile(r"^\s+%(\d+)\(([^)]*)\) = ([^\s(]+)\((.*)$")
_SCOPE_RE = re.compile(r"#\s*Fullname with scope: \((.*)\)\s*$")
_FRAME_RE = re.compile(r"#\s*In file (.+?):(\d+)(~\d+)?(?:, (\d+)~(\d+))?/(.*)/\s*$")
#: the kernel-info type line: ``: (<Float32xDefaultFormat[const vector]{8, 32}>, ...) -> (<Float16x...>)``
_DEVICE_LINE_RE = re.compile(r"^\s+: \(.*<((?:B?Float|U?Int|Complex)\d+|Bool|String)x\w+\[")
_DEVICE_TYPE_RE = re.compile(r"<((?:B?Float|U?Int|Complex)\d+|Bool|String)x\w+\[")
_ABSTRACT_LINE_RE = re.compile(r"^\s+: \(<")
_ABSTRACT_TENSOR_RE = re.compile(r"^<(?:Ref\[)?Tensor\[(\w+)\]\]?, \(([^)]*)\)")
_ABSTRACT_SCALAR_RE = re.compile(r"^<(\w+), NoShape>$")
_FILE_RE = re.compile(r"#\s*In file (.+?):(\d+)(?:~\d+)?(?:, [\d~]+)?/(.*)/\s*$")


@dataclass
class IRParam:
    name: str
    index: int
    dtype: str
    shape: tuple[int, ...]
    is_weight: bool


@dataclass
class IRNode:
    nid: str  # "{subgraph}:{N}"
    op: str
    args: list[str]
    fullname: str = ""
    stack: list[str] = field(default_factory=list)
    #: the call chain, outermost first: (file, line, first column, end column, source line); columns are
    #: -1 when the expression spans several lines
    frames: list[tuple[str, int, int, int, str]] = field(default_factory=list)
    #: the selected kernel's device dtypes (``("float32", ...)`` for the inputs, then the outputs), from the
    #: IR's kernel-info line; empty when the IR has none
    device_in: tuple[str, ...] = ()
    device_out: tuple[str, ...] = ()
    #: the graph's declared (dtype, shape) of each input (monads left out), then of each output (the abstract
    #: line); dtype "" or shape None where it says nothing usable (tuples; scalars have no shape)
    declared_in: tuple[tuple[str, tuple[int, ...] | None], ...] = ()
    declared_out: tuple[tuple[str, tuple[int, ...] | None], ...] = ()


@dataclass
class IRGraph:
    """The nodes, parameters and source lines of one ``ms_output_trace_code_graph_{g}.ir`` file."""

    file: str
    params: dict[str, IRParam]
    nodes: dict[str, IRNode]
    by_fullname: dict[str, IRNode]
    #: the arguments of the (last) subgraph's ``Return``: what the graph hands back to the control flow
    returns: list[str] = field(default_factory=list)


def _split_args(text: str) -> tuple[list[str], str]:
    """Split ``a, f(b, c), [d]) rest`` at top-level commas up to the closing parenthesis."""
    out, depth, cur = [], 0, []
    for i, ch in enumerate(text):
        if ch in "([{<":
            depth += 1
        elif ch in ")]}>":
            if depth == 0:
                if cur or out:
                    out.append("".join(cur).strip())
                return [a for a in out if a], text[i + 1:]
            depth -= 1
        elif ch == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
            continue
        cur.append(ch)
    raise ValueError("unbalanced parentheses")


def _entries(text: str) -> list[str]:
    """The top-level ``<...>`` entries of a type line's side."""
    out, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "<":
            if depth == 0:
                start = i
            depth += 1
        elif ch == ">" and depth:
            depth -= 1
            if depth == 0:
                out.append(text[start:i + 1])
    return out


def _declared(side: str) -> tuple[tuple[str, tuple[int, ...] | None], ...]:
    """``(dtype, shape)`` per non-monad entry of the abstract type line's inputs or outputs.

    >>> _declared("(<Tensor[Float16], (8, 64)>, <Bool, NoShape>, <UMonad, NoShape>, <Tuple[Int64*2], x>)")
    (('float16', (8, 64)), ('bool', None), ('', None))
    """
    out = []
    for e in _entries(side):
        if e.startswith(("<UMonad", "<IOMonad")):
            continue
        t = _ABSTRACT_TENSOR_RE.match(e)
        if t:
            out.append((t.group(1).lower(), _shape(t.group(2))))
            continue
        sc = _ABSTRACT_SCALAR_RE.match(e)
        out.append((sc.group(1).lower(), None) if sc else ("", None))
    return tuple(out)


def _shape(text: str) -> tuple[int, ...]:
    return tuple(int(s) for s in text.replace(" ", "").split(",") if s.strip().lstrip("-").isdigit())


def parse_ir(text: str, file: str = "<ir>") -> IRGraph:
    """Parse MindSpore's ``.ir`` dump of an optimized (kernel) graph."""
    params: dict[str, IRParam] = {}
    nodes: dict[str, IRNode] = {}
    sub = ""
    last: IRNode | None = None
    returns: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        lineno = i
        try:
            if line.startswith("%para"):
                m = _PARAM_RE.match(line)
                if m:
                    idx, name, ref, dtype, shape, rest = m.groups()
                    params[f"%para{idx}_{name}"] = IRParam(
                        name, int(idx), dtype.lower(), _shape(shape),
                        bool(ref) or "is_parameter" in rest or "IsWeight: true" in rest)
                continue
            if line.startswith("subgraph @"):
                sub = line.split("@", 1)[1].split("(", 1)[0]
                continue
            m = _NODE_RE.match(line)
            if m:
                n, _alias, op, rest = m.groups()
                # A constant tensor argument is printed over several lines (``value=`` then its rows):
                # the statement goes on until its parentheses balance.
                while True:
                    try:
                        args, _ = _split_args(rest)
                        break
                    except ValueError:
                        if i >= len(lines) or lines[i].startswith(("      #", "  %", "}")) or \
                                i - lineno > MAX_CONTINUATION_LINES:
                            raise
                        rest += " " + lines[i].strip()
                        i += 1
                last = IRNode(f"{sub}:{n}", op.removeprefix("PrimFunc_"), args)
                nodes[last.nid] = last
                continue
            if last is not None and line.startswith("      : (") and _DEVICE_LINE_RE.match(line):
                ins, _, outs = line.partition(" -> ")
                last.device_in = tuple(t.lower() for t in _DEVICE_TYPE_RE.findall(ins))
                last.device_out = tuple(t.lower() for t in _DEVICE_TYPE_RE.findall(outs))
                continue
            if last is not None and line.startswith("      : (") and not last.declared_in and \
                    not last.declared_out and _ABSTRACT_LINE_RE.match(line):
                ins, _, outs = line.partition(" -> ")
                last.declared_in, last.declared_out = _declared(ins), _declared(outs)
                continue
            if last is not None and line.startswith("      #"):
                s = _SCOPE_RE.search(line)
                if s:
                    last.fullname = s.group(1)
                    continue
                f = _FILE_RE.search(line)
                if f:
                    last.stack.append(f"File {f.group(1)}, line {f.group(2)}, in {f.group(3).strip()}")
                fr = _FRAME_RE.search(line)
                if fr:
                    src_file, lno, multi, c0, c1, src = fr.groups()
                    src = src.split("/<~~", 1)[0]  # MindSpore's note on lines shared by several nodes
                    cols = (int(c0), int(c1)) if c0 is not None and not multi else (-1, -1)
                    last.frames.append((src_file, int(lno), *cols, src))
            elif line.startswith("  Return(") or line.startswith("}"):
                if line.startswith("  Return("):
                    returns = _split_args(line[len("  Return("):])[0]
                last = None
        except ValueError as exc:
            raise ValueError(f"{file}:{lineno}: cannot parse MindSpore IR line ({exc}): {line[:120]!r}") from None
    by_fullname = {n.fullname: n for n in nodes.values() if n.fullname}
    return IRGraph(file, params, nodes, by_fullname, returns)


def read_execution_order(path: str) -> list[str]:
    """Kernel full names in execution order (``ms_execution_order_graph_{g}.csv``)."""
    with open(path, newline="") as f:
        rows = [r[0].strip() for r in csv.reader(f) if r and r[0].strip()]
    if rows and not rows[0].startswith(("Default", "Gradients", "Expand", "recompute", "Parameter")) and \
            "/" not in rows[0]:
        rows = rows[1:]  # header
    return rows


def parse_pb(path: str) -> IRGraph:
    """Read a ``.pb`` graph (MindSpore's ``anf_ir.proto``) when no ``.ir`` text was written.

    Needs ``protobuf`` and MindSpore's generated ``anf_ir_pb2`` (found in an installed MindSpore by file
    path, without importing MindSpore).
    """
    import importlib.util

    spec = importlib.util.find_spec("mindspore")
    pb2_path = None if spec is None or not spec.submodule_search_locations else \
        os.path.join(list(spec.submodule_search_locations)[0], "train", "anf_ir_pb2.py")
    if pb2_path is None or not os.path.exists(pb2_path):
        raise ValueError(f"{path}: reading .pb graphs needs MindSpore's anf_ir_pb2 (install mindspore), "
                         f"or the .ir text beside it")
    mod_spec = importlib.util.spec_from_file_location("_nbdebug_anf_ir_pb2", pb2_path)
    pb2 = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(pb2)
    model = pb2.ModelProto()
    try:
        with open(path, "rb") as f:
            model.ParseFromString(f.read())
    except Exception as exc:  # noqa: BLE001 - protobuf raises its own DecodeError
        raise ValueError(f"cannot parse MindSpore graph file {path}: {exc}") from None
    g = model.graph
    params: dict[str, IRParam] = {}
    for i, p in enumerate(g.parameters):
        token = f"%para{i + 1}_{p.name}"
        shape = tuple(d.size for d in p.type.tensor_type.shape.dim)
        # the .pb does not mark weights: parameter names are dotted paths or optimizer state
        weight = bool(p.default_val.ByteSize()) or "." in p.name or is_optimizer_state(p.name)
        params[token] = IRParam(p.name, i + 1, "", shape, weight)
    name_to_token = {p.name: t for t, p in params.items()}
    tensor_consts = {c.key for c in g.const_vals if c.value.dtype == pb2.DT_TENSOR}
    nodes: dict[str, IRNode] = {}
    for node in g.node:
        args = []
        for inp in node.input:
            if inp.name in name_to_token:
                args.append(name_to_token[inp.name])
            elif inp.name.isdigit():
                args.append(f"%{inp.name}")
            elif inp.name in tensor_consts:
                args.append(f"Tensor({inp.name})")
            else:
                args.append(inp.name)
        nodes[f"g:{node.name}"] = IRNode(f"g:{node.name}", node.op_type.removeprefix("PrimFunc_"), args,
                                         node.full_name or node.scope)
    by_fullname = {n.fullname: n for n in nodes.values() if n.fullname}
    return IRGraph(path, params, nodes, by_fullname)
