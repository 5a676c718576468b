"""MindSpore GRAPH mode: the kernel-by-kernel dump, read into a framework-neutral session.

MindSpore (CPU, GPU, Ascend O0/O1) writes a kernel dump when ``MINDSPORE_DUMP_CONFIG`` names a JSON
config before the first graph is compiled (REFERENCE §6)::

    {path}/rank_{r}/graphs/ms_output_trace_code_graph_{g}.ir     optimized execution graph (text)
    {path}/rank_{r}/execution_order/ms_execution_order_graph_{g}.csv
    {path}/rank_{r}/{net}/{g}/{iteration}/{Op}.{scope}.{task}.{stream}.{timestamp}.{input|output}.{i}.{format}.{dtype}.npy

This module needs numpy only (no MindSpore import): it writes the config (:func:`arm_kernel_dump`),
parses the ``.ir`` text (:func:`parse_ir`) and the execution order into a :class:`KernelGraph` whose
kernels are named by their full scope name (``Default/network-WithLossCell/_backbone-Net/fc1-Dense/MatMul-op0``),
turns the ``.npy`` files of one graph run into statistics rows, node slots and retained values
(:class:`RunRecorder`), and opens an existing dump as an offline session (:func:`load_kernel_dump`).
The live GRAPH-mode adapter is :mod:`nbdebug.frameworks.mindspore.graph_live`.

>>> cfg = dump_config("/tmp/dump")
>>> cfg["common_dump_settings"]["iteration"], cfg["e2e_dump_settings"]["enable"]
('all', True)
"""

from __future__ import annotations

import atexit
import csv
import heapq
import json
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...session.session import RawRows, Session
from ...session.store import NotRetainedError
from ..core.native import fastats as _fastats  # the optional native kernel (None: numpy is the fallback)
from ..npy_read import read_npy, read_npy_shape

NET_NAME = "Net"
ENV = "MINDSPORE_DUMP_CONFIG"
_NAN_ROW = [float("nan")] * 5 + [0.0] * 4
_NP_CODES = {np.dtype(np.float32): 0, np.dtype(np.float64): 1, np.dtype(np.float16): 2, np.dtype(np.int8): 4,
             np.dtype(np.uint8): 5, np.dtype(np.int16): 6, np.dtype(np.int32): 7, np.dtype(np.int64): 8,
             np.dtype(np.bool_): 9}
#: kernels that update parameters (the optimizer section)
OPTIMIZER_KERNELS = frozenset({
    "SGD", "ApplyMomentum", "Adam", "AdamWeightDecay", "FusedSparseAdam", "FusedSparseLazyAdam", "ApplyAdagrad",
    "ApplyAdagradV2", "ApplyRMSProp", "ApplyCenteredRMSProp", "ApplyFtrl", "ApplyProximalAdagrad", "LARSUpdate",
    "LambApplyOptimizerAssign", "LambApplyWeightAssign", "ApplyAdaMax", "ApplyAddSign", "ApplyPowerSign",
    "ApplyAdadelta", "ApplyGradientDescent", "ApplyProximalGradientDescent", "AdamApplyOne",
    "AdamApplyOneWithDecay", "FusedAdam", "FusedAdamWeightDecay", "ApplyAdamWithAmsgrad",
})
#: optimizer-state parameter names (weights are the other ``is_parameter`` inputs)
_STATE_PREFIXES = ("moments.", "accum.", "stat.", "moment1.", "moment2.", "mean_grad.", "mean_square.",
                   "vhat.", "linear.", "ms.", "mom.", "adam_m.", "adam_v.", "accum_update.")
_STATE_NAMES = frozenset({"global_step", "learning_rate", "momentum", "beta1_power", "beta2_power", "lr",
                          "weight_decay", "loss_scale", "current_iterator_step", "last_overflow_iterator_step"})
_NONKERNEL = frozenset({"Load", "Depend", "UpdateState", "MakeTuple", "TupleGetItem", "Return", "Partial",
                        "Switch", "make_tuple", "tuple_getitem", "depend", "load", "update_state"})


# -- the dump config --------------------------------------------------------------------------------

def dump_config(path: str, net_name: str = NET_NAME) -> dict[str, Any]:
    """MindSpore's e2e kernel dump settings: every kernel's inputs and outputs, every iteration."""
    return {
        "common_dump_settings": {
            "dump_mode": 0, "path": path, "net_name": net_name, "iteration": "all", "saved_data": "tensor",
            "input_output": 0, "kernels": [], "support_device": [0, 1, 2, 3, 4, 5, 6, 7],
        },
        "e2e_dump_settings": {"enable": True, "trans_flag": True},
    }


#: how many runs a sampled dump (``graph_every=k``) captures: MindSpore's ``iteration`` field has no
#: "every k-th" form, so the captured iterations are listed (``0|k|2k|…``), and MindSpore scans that list
#: for every run: a longer one slows every step (on CPU, 400 entries cost about as much as a small plain
#: step; 100 a sixth of it)
SAMPLED_CAPTURES = 100


def sampled_iterations(every: int, captures: int = SAMPLED_CAPTURES) -> str:
    """MindSpore's dump ``iteration`` value for every ``every``-th run, ``captures`` of them.

    >>> sampled_iterations(5, 4)
    '0|5|10|15'
    """
    return "|".join(str(i * every) for i in range(captures))


def check_every(every: Any) -> int:
    """``graph_every`` as an int ≥ 1, or a ``ValueError`` saying what is accepted."""
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ValueError(f"graph_every must be an int >= 1 (capture every k-th graph run), got {every!r}")
    return every


_ARMED: dict[str, Any] = {}
_ARM_LOCK = threading.Lock()


def armed_every() -> int | None:
    """The ``graph_every`` the process's dump was armed with (None before :func:`arm_kernel_dump`)."""
    return _ARMED.get("every")


def arm_kernel_dump(every: int = 1) -> str:
    """Point ``MINDSPORE_DUMP_CONFIG`` at a config nbdebug owns (once per process); returns the dump root.

    MindSpore reads the variable when it compiles the first graph of the process and never again, so
    this must run before any GRAPH-mode compile (creating a GRAPH-mode ``Debugger`` does it). The
    directory is a private temporary one, emptied when debuggers close and removed at exit. ``every``
    > 1 has MindSpore dump only every ``every``-th run of each graph (:func:`sampled_iterations`); it is
    fixed for the process by the first call, and a later call asking for another value is an error.
    """
    every = check_every(every)
    with _ARM_LOCK:
        if "root" in _ARMED:
            if _ARMED["every"] != every:
                raise RuntimeError(
                    f"MindSpore's kernel dump of this process was armed with graph_every={_ARMED['every']}; "
                    f"it reads its dump configuration once per process, so graph_every={every} cannot take "
                    f"effect. Use graph_every={_ARMED['every']}, or restart the kernel and create this "
                    f"Debugger first")
            return _ARMED["root"]
        current = os.environ.get(ENV)
        inherited = bool(current) and os.path.basename(os.path.dirname(current)).startswith("nbdebug-msdump-")
        if current and not inherited:  # (an nbdebug parent process's config is replaced by our own)
            raise RuntimeError(
                f"{ENV} is already set to {current!r}; in GRAPH mode nbdebug drives MindSpore's kernel dump "
                f"itself. Unset the variable (and restart the kernel), or open that dump offline with "
                f"nbdebug.load(<its path>)")
        root = tempfile.mkdtemp(prefix="nbdebug-msdump-", dir=dump_parent())
        cfg_path = os.path.join(root, "dump_config.json")
        cfg = dump_config(os.path.join(root, "dump"))
        if every > 1:
            cfg["common_dump_settings"]["iteration"] = sampled_iterations(every)
        with open(cfg_path, "w") as f:
            json.dump(cfg, f)
        os.environ[ENV] = cfg_path
        _ARMED.update(root=root, dump=os.path.join(root, "dump"), config=cfg_path, every=every)
        atexit.register(shutil.rmtree, root, True)
        return root


#: free space a memory file system must have to hold the dump (two steps of tensors stay on it)
SHM_MIN_FREE = 1 << 30
SHM = "/dev/shm"


def dump_parent() -> str | None:
    """Where the dump directory goes: ``/dev/shm`` (memory) when it exists, is writable and has
    :data:`SHM_MIN_FREE` bytes free — MindSpore writes every tensor of every step, and on a disk that
    write is about half the dump's cost — else the system's temporary directory (None).
    ``NBDEBUG_DUMP_PARENT`` overrides both."""
    chosen = os.environ.get("NBDEBUG_DUMP_PARENT")
    if chosen:
        return chosen
    try:
        st = os.statvfs(SHM)
    except OSError:
        return None
    return SHM if os.access(SHM, os.W_OK) and st.f_bavail * st.f_frsize >= SHM_MIN_FREE else None


def armed_dump_dir() -> str | None:
    """Where MindSpore writes the armed kernel dump (None before :func:`arm_kernel_dump`)."""
    return _ARMED.get("dump")


# -- the .ir text -----------------------------------------------------------------------------------

_PARAM_RE = re.compile(r"^%para(\d+)_(.+?): <(Ref\[)?Tensor\[(\w+)\]\]?, \(([^)]*)\)(.*)$")
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
                last = None
        except ValueError as exc:
            raise ValueError(f"{file}:{lineno}: cannot parse MindSpore IR line ({exc}): {line[:120]!r}") from None
    by_fullname = {n.fullname: n for n in nodes.values() if n.fullname}
    return IRGraph(file, params, nodes, by_fullname)


def read_execution_order(path: str) -> list[str]:
    """Kernel full names in execution order (``ms_execution_order_graph_{g}.csv``)."""
    with open(path, newline="") as f:
        rows = [r[0].strip() for r in csv.reader(f) if r and r[0].strip()]
    if rows and not rows[0].startswith(("Default", "Gradients", "Expand", "recompute", "Parameter")) and \
            "/" not in rows[0]:
        rows = rows[1:]  # header
    return rows


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
    #: input slot -> ("kernel", producer name, "output.i") | ("param", name) | ("const", text)
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


def is_optimizer_state(name: str) -> bool:
    return name in _STATE_NAMES or name.startswith(_STATE_PREFIXES)


@dataclass
class KernelGraph:
    """A graph's kernels in execution order, with data-flow sources; built from the .ir and the csv."""

    graph_id: int
    file: str  # the graph file name, e.g. ms_output_trace_code_graph_0.ir
    kernels: list[Kernel]
    params: dict[str, IRParam]  # by parameter name
    #: dump file key -> kernel name, learnt from the first run (see :func:`match_kernel_files`)
    pairing: dict[str, str] = field(default_factory=dict)

    @property
    def weight_names(self) -> set[str]:
        return {p.name for p in self.params.values() if p.is_weight}


def build_kernel_graph(ir: IRGraph, order: list[str], graph_id: int) -> KernelGraph:
    kernel_names = set(order) if order else {n.fullname for n in ir.nodes.values()
                                             if n.fullname and n.op not in _NONKERNEL}
    params_by_token = ir.params

    def resolve(arg: str, depth: int = 0) -> tuple[str, ...] | None:
        if depth > 16:
            return None
        if arg.startswith("%para"):
            p = params_by_token.get(arg)
            return ("param", p.name) if p else None
        if arg.startswith("%"):
            sub_n = arg[1:]
            node = None
            for key in (f"{sub}:{sub_n}" for sub in subgraphs):
                node = ir.nodes.get(key)
                if node is not None:
                    break
            if node is None:
                return None
            if node.fullname in kernel_names:
                return ("kernel", node.fullname, "output.0")
            if node.op == "TupleGetItem" and len(node.args) >= 2:
                src = resolve(node.args[0], depth + 1)
                m = re.match(r"I64\((\d+)\)", node.args[1])
                if src and src[0] == "kernel" and m:
                    return ("kernel", src[1], f"output.{m.group(1)}")
                return src
            if node.op in ("Load", "Depend", "Cast") and node.args:
                return resolve(node.args[0], depth + 1)
            return None
        if arg.startswith(("UMonad", "IOMonad")):
            return None
        if arg.startswith("Tensor("):
            return ("const", arg)
        return ("scalar", arg)

    subgraphs = list(dict.fromkeys(nid.split(":", 1)[0] for nid in ir.nodes))
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
            i = 0
            for arg in node.args:
                if arg.startswith(("UMonad", "IOMonad")):
                    continue
                if arg.startswith("%") and not arg.startswith("%para"):
                    ref = None
                    for sub in subgraphs:
                        ref = ir.nodes.get(f"{sub}:{arg[1:]}")
                        if ref is not None:
                            break
                    if ref is not None and ref.op == "UpdateState":
                        continue
                src = resolve(arg)
                if src is not None and src[0] != "scalar":
                    k.sources[f"input.{i}"] = src
                i += 1
        kernels.append(k)
    # kernels the compiler made up (e.g. "Expand/..." from graph-kernel expansion) have lost their scope:
    # they belong to the backward pass when they consume its results, or run amid it
    sections = {k.name: k.section for k in kernels}
    prev = "forward"
    for k in kernels:
        if not k.name.startswith(("Default", "Gradients")) and k.section == "forward":
            srcs = [sections.get(src[1]) for src in k.sources.values() if src[0] == "kernel"]
            if "backward" in srcs or (not srcs and prev == "backward"):
                k.section = sections[k.name] = "backward"
        prev = k.section
    params = {p.name: p for p in ir.params.values()}
    return KernelGraph(graph_id, os.path.basename(ir.file), kernels, params)


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


# -- the .npy files of one iteration ----------------------------------------------------------------

def _mapping(iter_dir: str) -> dict[str, str]:
    mapping: dict[str, str] = {}
    mapping_csv = os.path.join(iter_dir, "mapping.csv")
    if os.path.exists(mapping_csv):  # long names were replaced by numbers
        with open(mapping_csv, newline="") as f:
            for row in csv.reader(f):
                if len(row) >= 2:
                    mapping[row[0].strip()] = row[1].strip()
    return mapping


def parse_dump_name(fname: str, mapping: dict[str, str] | None = None) -> tuple[str, str, int, str] | None:
    """``(file key, slot, timestamp, dtype)`` of a kernel dump file name, or None for other files."""
    if not fname.endswith(".npy"):
        return None
    real = (mapping.get(fname) or mapping.get(fname[:-4]) or fname) if mapping else fname
    parts = (real[:-4] if real.endswith(".npy") else real).rsplit(".", 7)
    if len(parts) != 8 or parts[4] not in ("input", "output") or not parts[3].isdigit():
        return None
    key, _task, _stream, ts, io, idx, _fmt, dtype = parts
    return key, f"{io}.{idx}", int(ts), dtype.lower()


def index_files(iter_dir: str, names: Iterable[str]) -> dict[str, dict[str, str]]:
    """``{file key: {"input.0": path, ..., "__dtype__.input.0": dtype}}`` for dump files of one run."""
    mapping = _mapping(iter_dir)
    out: dict[str, dict[str, str]] = {}
    first: dict[str, int] = {}
    prefix = os.path.join(iter_dir, "")
    for fname in names:
        parsed = parse_dump_name(fname, mapping)
        if parsed is None:
            continue
        key, slot, ts, dtype = parsed
        entry = out.get(key)
        if entry is None:
            entry = out[key] = {}
        entry[slot] = prefix + fname
        entry["__dtype__." + slot] = dtype
        if ts < first.get(key, ts + 1):
            first[key] = ts
            entry["__ts__"] = str(ts)
    return out


_OP_INDEX = re.compile(r"-op\d+$")


def match_kernel_files(kg: KernelGraph, files: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
    """``{kernel name: its files}`` for one run.

    The ``-op{N}`` suffix in dump file names is MindSpore's own numbering, not the graph file's and the
    execution order's (under AMP the graph's ``Cast-op2..op6`` of a scope are dumped as ``Cast-op0..op4``,
    and where both count ``op0..op5`` they may name different kernels), and the runtime may run independent
    kernels in another order than the csv. So the kernels of one scope and type are paired with its files
    by the declared dtype and shape of every slot (from the IR; shapes from the files' headers), ties in
    execution order against dump (timestamp) order. A file keeps its kernel across runs: the pairing is
    learnt once per graph (``kg.pairing``).
    """
    groups: dict[str, list[Kernel]] = {}
    for k in kg.kernels:
        groups.setdefault(_OP_INDEX.sub("", k.file_key), []).append(k)
    spare: dict[str, list[tuple[int, str]]] = {}
    for key, f in files.items():
        if not key.startswith("Parameter."):
            spare.setdefault(_OP_INDEX.sub("", key), []).append((int(f.get("__ts__", 0)), key))
    out: dict[str, dict[str, str]] = {}
    for group, kernels in groups.items():
        keys = [key for _ts, key in sorted(spare.get(group, ()))]
        if len(kernels) == 1 and len(keys) == 1:
            out[kernels[0].name] = files[keys[0]]
            continue
        if keys and all(key in kg.pairing for key in keys):
            out.update((kg.pairing[key], files[key]) for key in keys)
            continue
        unused = [(_file_signature(files[key]), key) for key in keys]
        for k in kernels:
            if not unused:
                break
            pick = next((i for i, (sig, _key) in enumerate(unused) if _signature_fits(k, sig)), 0)
            key = unused.pop(pick)[1]
            out[k.name] = files[key]
            kg.pairing[key] = k.name
    return out


def _file_signature(kfiles: dict[str, str]) -> dict[str, tuple[str, tuple[int, ...] | None]]:
    sig = {}
    for slot, path in kfiles.items():
        if slot.startswith("__"):
            continue
        try:
            shape = read_npy_shape(path)
        except ValueError:
            shape = None
        sig[slot] = (kfiles.get(f"__dtype__.{slot}", ""), shape)
    return sig


def _signature_fits(k: Kernel, sig: dict[str, tuple[str, tuple[int, ...] | None]]) -> bool:
    if not k.declared:
        return True
    for slot, (dtype, shape) in sig.items():
        want_dtype, want_shape = k.declared.get(slot, ("", None))
        if want_dtype and want_dtype != dtype:
            return False
        if want_shape is not None and shape is not None and (len(want_shape) != len(shape) or any(
                w >= 0 and w != d for w, d in zip(want_shape, shape, strict=True))):  # -1: a dynamic dimension
            return False
    return True


def index_iteration(iter_dir: str) -> dict[str, dict[str, str]]:
    """:func:`index_files` for every file of a ``{graph}/{iteration}`` directory (one run)."""
    return index_files(iter_dir, os.listdir(iter_dir))


def split_runs(iter_dir: str) -> list[tuple[int, dict[str, dict[str, str]]]]:
    """The graph runs dumped into one iteration directory, in time order: ``[(first timestamp, index)]``.

    MindSpore's iteration counter does not always advance between runs of a graph, so one directory
    can hold several runs; the k-th file of a (kernel, slot) belongs to the k-th run.
    """
    mapping = _mapping(iter_dir)
    entries = []
    for fname in os.listdir(iter_dir):
        parsed = parse_dump_name(fname, mapping)
        if parsed is not None:
            entries.append((parsed[2], parsed[0], parsed[1], fname))
    entries.sort()
    seen: dict[tuple[str, str], int] = {}
    runs: list[list[str]] = []
    starts: list[int] = []
    for ts, key, slot, fname in entries:
        k = seen.get((key, slot), 0)
        seen[(key, slot)] = k + 1
        while len(runs) <= k:
            runs.append([])
            starts.append(ts)
        runs[k].append(fname)
    return [(starts[i], index_files(iter_dir, names)) for i, names in enumerate(runs)]


def _slot_order(slot: str) -> tuple[int, int, str]:
    io, _, idx = slot.partition(".")
    return (0 if io == "input" else 1, int(idx) if idx.isdigit() else 1 << 30, idx)


def load_npy(path: str) -> np.ndarray:
    try:
        return read_npy(path)
    except ValueError:
        raise
    except Exception as exc:  # noqa: BLE001 - any unreadable file: name it
        raise ValueError(f"cannot read dump file {path}: {exc}") from None


def array_row(arr: np.ndarray, out: np.ndarray) -> str | None:
    """Write the raw stats row of ``arr`` into ``out`` (9 floats); returns an unsupported reason or None."""
    if arr.size == 0:
        out[:] = _NAN_ROW[:2] + [0.0] * 7
        return None
    if arr.dtype.kind == "c":
        out[:] = _NAN_ROW
        return f"unsupported: complex dtype {arr.dtype}"
    if arr.dtype.kind == "V" and arr.dtype.itemsize == 2:  # bfloat16 saved as raw 16-bit words
        arr = arr.view(np.uint16)
        code = 3
    else:
        code = _NP_CODES.get(arr.dtype)
    if not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr)
    if _fastats is not None and code is not None:
        _fastats.reduce(arr.ctypes.data, arr.size, code, out.ctypes.data)
        return None
    if arr.dtype.kind not in "biuf":
        out[:] = _NAN_ROW
        return f"unsupported: dtype {arr.dtype}"
    x = arr.astype(np.float64).ravel()
    with np.errstate(all="ignore"):
        out[:] = [x.max(), x.min(), x.sum(), np.abs(x).sum(), (x * x).sum(), np.count_nonzero(x == 0),
                  np.count_nonzero(np.isnan(x)), np.count_nonzero(x == np.inf), np.count_nonzero(x == -np.inf)]
    return None


_EMPTY = np.zeros(0, np.float32)


def misdump_reason(path: str, file_dtype: str, device_dtype: str) -> str:
    """Why a dump file that disagrees with its kernel's dtype is not shown (see :meth:`RunRecorder._load`).

    >>> misdump_reason("/d/MatMul.x.output.0.DefaultFormat.Float16.npy", "float16", "float32").split(", so")[0]
    "not the value used: MindSpore's kernel dump wrote this float32 tensor as float16 (the graph's declared \
type; the CPU kernel computes in float32)"
    """
    return (f"not the value used: MindSpore's kernel dump wrote this {device_dtype} tensor as {file_dtype} "
            f"(the graph's declared type; the CPU kernel computes in {device_dtype}), so "
            f"{os.path.basename(path)} holds the buffer's bytes misread as {file_dtype}; "
            f"no statistics or value are shown for it")


class NpyRef:
    """Retention handle for a tensor that lives in a dump file (read on demand)."""

    __slots__ = ("path", "nbytes", "__weakref__")

    def __init__(self, path: str, nbytes: int) -> None:
        self.path, self.nbytes = path, nbytes

    def numpy(self) -> np.ndarray:
        if not os.path.exists(self.path):
            raise NotRetainedError(f"the dump file {os.path.basename(self.path)} was removed (only the current "
                                   f"and previous iterations are kept on disk)")
        arr = load_npy(self.path)
        if arr.dtype.kind == "V" and arr.dtype.itemsize == 2:
            arr = (arr.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        return arr


class RowBuffer(RawRows):
    """Host rows of the step in progress (GRAPH mode computes them from files, on the host)."""

    def add(self, arr: np.ndarray) -> tuple[int, str | None]:
        row = self._next_row()
        return row, array_row(arr, self._host[row])

    def add_unknown(self) -> int:
        """A row for a tensor whose values are unknown: NaN statistics, no NaN/Inf counted."""
        row, _ = self.add(_EMPTY)
        self._host[row] = _NAN_ROW
        return row

    def raw(self) -> np.ndarray:
        return self._host[: self._n]


class RunRecorder:
    """Writes graph runs (one iteration directory of one graph each) into the step in progress."""

    def __init__(self, session: Session, *, retain: bool = True, weights: set[str] | None = None,
                 emit: Callable[[Any], None] | None = None) -> None:
        self.session = session
        self.retain = retain
        #: names of the model's parameters (kind "parameter"); None: guess (not optimizer state)
        self.weights = weights
        self.emit = emit or (lambda node: None)
        self.buf = RowBuffer()
        #: (file, message) for every dump file that could not be read (the slot is left out)
        self.problems: list[tuple[str, str]] = []
        #: ``{(node, slot): (path, shape, dtype)}`` of the step in progress
        self.files: dict[tuple[str, str], tuple[str, tuple[int, ...], str]] = {}
        self._graph_edges: set[int] = set()
        self._names: dict[tuple[int, str], str] = {}
        self._owner: dict[str, int] = {}
        self._inputs: dict[str, str] = {}

    def new_step(self) -> None:
        self.buf = RowBuffer()
        self.files = {}

    def raw(self) -> np.ndarray:
        return self.buf.raw()

    def node_name(self, kg: KernelGraph, kernel: str) -> str:
        """A kernel's node name: its full scope name, prefixed by the graph when another graph has it."""
        key = (kg.graph_id, kernel)
        name = self._names.get(key)
        if name is None:
            owner = self._owner.setdefault(kernel, kg.graph_id)
            name = kernel if owner == kg.graph_id else f"graph_{kg.graph_id}/{kernel}"
            self._names[key] = name
        return name

    def _source_name(self, kg: KernelGraph, src: tuple[str, ...], consumer: Kernel, slot: str) -> tuple[str, str]:
        """The (node, slot) an input of ``consumer`` comes from."""
        kind, ref = src[0], src[1]
        if kind == "kernel":
            return self.node_name(kg, ref), src[2]
        if kind == "param":
            p = kg.params.get(ref)
            if p is not None and not p.is_weight:
                return self._inputs.setdefault(ref, f"Input.{len(self._inputs)}"), "output.0"
            return f"Parameter.{ref}", "output.0"
        return f"Constant.{self.node_name(kg, consumer.name)}.{slot}", "output.0"

    def _source_node(self, kg: KernelGraph, src: tuple[str, ...], consumer: Kernel, slot: str) -> Any:
        """Register the parameter / input / constant feeding ``consumer`` (it executes now)."""
        s = self.session
        name, _ = self._source_name(kg, src, consumer, slot)
        ref = src[1]
        if src[0] == "param":
            p = kg.params.get(ref)
            weight = (ref in self.weights) if self.weights is not None else \
                (p is not None and p.is_weight and not is_optimizer_state(ref))
            if p is not None and not p.is_weight:
                node = s.node(name, kind="input", op_type=ref, scope="")
            elif weight:
                node = s.node(name, kind="parameter", op_type="Parameter", scope=consumer.scope)
            else:
                node = s.node(name, kind="constant", op_type="Parameter", scope=consumer.scope,
                              section="optimizer" if is_optimizer_state(ref) else "forward")
        else:
            node = s.node(name, kind="constant", op_type="Tensor", scope=consumer.scope, section=consumer.section)
        node.graph = kg.file  # type: ignore[attr-defined]  # the panel's graph filter
        return node

    def record(self, kg: KernelGraph, iter_dir: str, *, files: dict[str, dict[str, str]] | None = None) -> int:
        """Record one run of ``kg`` from ``iter_dir``; returns the number of kernels recorded."""
        return self.record_runs([(kg, index_iteration(iter_dir) if files is None else files)])

    def record_runs(self, runs: list[tuple[KernelGraph, dict[str, dict[str, str]]]]) -> int:
        """Record the graph runs of one call (a model with control flow runs several kernel graphs: the
        main one and its branches/loop bodies). Each graph's kernels keep their execution order; the graphs
        are interleaved by the kernels' dump timestamps, so a value born in a branch comes before what the
        main graph computed from it. Returns the number of kernels recorded."""
        s = self.session
        states = []
        queues = []
        # a parameter is recorded where the step first uses it: a later graph of the same call (the
        # optimizer's) may dump it after updating it in place
        sources_done: set[str] = set()
        for r, (kg, files) in enumerate(runs):
            first = kg.graph_id not in self._graph_edges
            self._graph_edges.add(kg.graph_id)
            states.append((kg, first, {}, sources_done))
            matched = match_kernel_files(kg, files)
            queues.append([(int(matched[k.name].get("__ts__", 0)), r, k, matched[k.name])
                           for k in kg.kernels if k.name in matched])
        order = queues[0] if len(queues) == 1 else heapq.merge(*queues, key=lambda item: item[0])
        count = 0
        for _ts, r, k, kfiles in order:
            kg, first, produced, sources_done = states[r]
            name = self.node_name(kg, k.name)
            # parameters, inputs and constants first consumed here execute just before it
            for slot, src in k.sources.items():
                if src[0] == "kernel":
                    continue
                sname, _ = self._source_name(kg, src, k, slot)
                if sname not in sources_done and slot in kfiles:
                    sources_done.add(sname)
                    snode = self._source_node(kg, src, k, slot)
                    entry = self._load(kfiles[slot], kfiles.get(f"__dtype__.{slot}", ""), k.device_dtypes.get(slot))
                    if entry is not None:
                        self._put(snode, "output.0", entry)
                        produced[(sname, "output.0")] = entry
                    self.emit(snode)
            node = s.node(name, kind="op", op_type=k.op_type, scope=k.scope, section=k.section,
                          stack=(lambda st=k.stack: list(st)))
            node.graph = kg.file  # type: ignore[attr-defined]  # the panel's graph filter
            for slot in sorted((sl for sl in kfiles if not sl.startswith("__")), key=_slot_order):
                src = k.sources.get(slot)
                entry = None
                if src is not None:
                    pname, pslot = self._source_name(kg, src, k, slot)
                    entry = produced.get((pname, pslot))
                    if first:
                        s.graph.add_edge(pname, name, pslot, slot)
                if entry is None:
                    entry = self._load(kfiles[slot], kfiles.get(f"__dtype__.{slot}", ""), k.device_dtypes.get(slot))
                    if entry is None:
                        continue
                self._put(node, slot, entry)
                if slot.startswith("output"):
                    produced[(name, slot)] = entry
            count += 1
            self.emit(node)
        return count

    def _load(self, path: str, dtype: str, device: str | None = None) -> tuple | None:
        """Statistics row and handle of one file; None (and a problem naming the file) when unreadable.

        ``device`` is the dtype the kernel really reads or writes in that slot (the IR's kernel-info line).
        When the file was written with another dtype, it is not the value used: MindSpore names and sizes
        the file by the graph's declared type (e.g. float16 under AMP O2) while a CPU kernel selected for
        float32 holds float32 in the buffer, so the file is the buffer's first bytes read as float16. Such a
        slot gets no statistics and no value, and says why (:func:`misdump_reason`)."""
        try:
            arr = load_npy(path)
        except ValueError as exc:
            self.problems.append((path, str(exc).split(": ", 1)[-1]))
            return None
        shape = tuple(int(d) for d in arr.shape)
        name = dtype or str(arr.dtype)
        if arr.dtype.kind == "V" and arr.dtype.itemsize == 2:
            name = "bfloat16"
        if device and dtype and device != dtype:
            row = self.buf.add_unknown()
            return row, device, shape, int(arr.size), misdump_reason(path, dtype, device), None, path, True
        row, why = self.buf.add(arr)
        handle = NpyRef(path, int(arr.nbytes)) if self.retain else None
        return row, name, shape, int(arr.size), why, handle, path, False

    def _put(self, node: Any, slot: str, entry) -> None:
        row, dtype, shape, count, why, handle, path, misdumped = entry
        s = self.session
        key = (node.name, slot)
        if not misdumped:
            self.files[key] = (path, shape, dtype)
        s.recorder.add(key, row, dtype, shape, count)
        if why is not None:
            s.recorder.unsupported[s.recorder.index[key]] = why
        node.shapes[slot] = shape
        node.dtypes[slot] = dtype
        if handle is not None:
            s.store.offer(key, handle)
        elif misdumped and self.retain:
            s.store.refuse(key, why)


# -- directory layout ---------------------------------------------------------------------------------

_RANK_RE = re.compile(r"^rank_(\d+)$")


def find_rank_dirs(path: str) -> list[str]:
    """``rank_{r}`` directories under a kernel dump root (or ``path`` itself when it is one)."""
    base = os.path.basename(os.path.normpath(path))
    if _RANK_RE.match(base):
        return [path]
    out = []
    if os.path.isdir(path):
        for name in sorted(os.listdir(path), key=lambda n: (len(n), n)):
            if _RANK_RE.match(name) and os.path.isdir(os.path.join(path, name)):
                out.append(os.path.join(path, name))
    return out


def is_kernel_dump(path: str) -> bool:
    """True when ``path`` looks like a MindSpore kernel dump (a root with rank_*/ or a rank_* dir)."""
    for rank in find_rank_dirs(path):
        if os.path.isdir(os.path.join(rank, "graphs")) or os.path.isdir(os.path.join(rank, "execution_order")):
            return True
    return False


def graph_dirs(rank_dir: str) -> list[tuple[int, str]]:
    """``(graph id, path)`` of every ``{net}/{graph}`` directory of a rank."""
    out = []
    for net in sorted(os.listdir(rank_dir)) if os.path.isdir(rank_dir) else []:
        if net in ("graphs", "execution_order") or net.startswith("."):
            continue
        net_dir = os.path.join(rank_dir, net)
        if not os.path.isdir(net_dir):
            continue
        for g in os.listdir(net_dir):
            gdir = os.path.join(net_dir, g)
            if g.isdigit() and os.path.isdir(gdir):
                out.append((int(g), gdir))
    return out


def iteration_dirs(rank_dir: str) -> list[tuple[int, int, str]]:
    """``(iteration, graph id, path)`` for every ``{net}/{graph}/{iteration}`` directory of a rank."""
    out = []
    for g, gdir in graph_dirs(rank_dir):
        for it in os.listdir(gdir):
            if it.isdigit() and os.path.isdir(os.path.join(gdir, it)):
                out.append((int(it), g, os.path.join(gdir, it)))
    out.sort()
    return out


def graph_ids(rank_dir: str) -> list[int]:
    ids = set()
    for sub, pat in (("graphs", r"ms_output_trace_code_graph_(\d+)\.(?:ir|pb)$"),
                     ("execution_order", r"ms_execution_order_graph_(\d+)\.csv$")):
        d = os.path.join(rank_dir, sub)
        for name in os.listdir(d) if os.path.isdir(d) else []:
            m = re.match(pat, name)
            if m:
                ids.add(int(m.group(1)))
    return sorted(ids)


# -- offline ----------------------------------------------------------------------------------------------

class KernelDump:
    """An opened kernel dump: graphs and per-iteration files of one rank (any iteration is readable)."""

    def __init__(self, rank_dir: str) -> None:
        self.rank_dir = rank_dir
        self.graphs: dict[int, KernelGraph] = {}
        self.iterations = iteration_dirs(rank_dir)
        for g in sorted({g for _, g, _ in self.iterations} | set(graph_ids(rank_dir))):
            try:
                self.graphs[g] = load_kernel_graph(rank_dir, g)
            except ValueError:
                if any(gg == g for _, gg, _ in self.iterations):
                    raise

    def runs(self, iteration: int, graph_id: int) -> list[tuple[int, dict[str, dict[str, str]]]]:
        """The runs of graph ``graph_id`` dumped under iteration ``iteration`` (see :func:`split_runs`)."""
        for it, g, path in self.iterations:
            if it == iteration and g == graph_id:
                return split_runs(path)
        raise KeyError(f"no iteration {iteration} of graph {graph_id} in {self.rank_dir}")


def load_kernel_dump(path: str, *, rank: int | None = None) -> Any:
    """Open a MindSpore kernel dump directory as an offline session (``live=False``).

    ``path`` is the dump root (holding ``rank_*``) or one ``rank_*`` directory; ``rank`` picks a rank
    (default: the lowest). Graph runs are grouped into training steps (:func:`group_runs`), in time order
    (``session.step_iterations`` maps a step to the ``(graph id, iteration)`` of its main graph,
    ``session.step_runs`` to every run it holds). The result is a :class:`nbdebug.session.dump_session.DumpSession`:
    statistics of every step, tensors of any step read from the files on demand, and ``problems`` naming
    every file that could not be read (its slot is left out). Needs numpy only.

    >>> # s = load_kernel_dump("/path/to/dump"); s.graph.in_order()[0].name
    """
    from ...session.dump_session import DumpProblem, DumpSession, TensorFile
    from ...session.session import StepRecorder, raw_to_fields
    from ...session.stats import FIELDS

    ranks = find_rank_dirs(path)
    if not ranks:
        raise ValueError(f"{path} is not a MindSpore kernel dump (no rank_* directory with graphs/)")
    if rank is not None:
        ranks = [r for r in ranks if os.path.basename(os.path.normpath(r)) == f"rank_{rank}"]
        if not ranks:
            raise ValueError(f"{path} has no rank_{rank}")
    rank_dir = ranks[0]
    dump = KernelDump(rank_dir)
    version, device = _dump_metadata(rank_dir)
    s = DumpSession(framework="mindspore", framework_version=version, device=device)
    s.kernel_dump = dump  # type: ignore[attr-defined]
    rec = RunRecorder(s, retain=False)
    runs = []  # (first timestamp, iteration, graph id, files)
    for it, g, p in dump.iterations:
        if g in dump.graphs:
            runs.extend((ts, it, g, files) for ts, files in split_runs(p))
    runs.sort(key=lambda r: (r[0], r[1], r[2]))
    s.step_iterations = {}  # type: ignore[attr-defined]
    s.step_runs = {}  # type: ignore[attr-defined]
    for step, group in enumerate(group_runs(runs, {g: bool(kg.weight_names) for g, kg in dump.graphs.items()})):
        rec.record_runs([(dump.graphs[g], files) for _ts, _it, g, files in group])
        main = next((r for r in group if dump.graphs[r[2]].weight_names), group[0])
        s.step_iterations[step] = (main[2], main[1])  # type: ignore[attr-defined]
        s.step_runs[step] = [(g, it) for _ts, it, g, _f in group]  # type: ignore[attr-defined]
        r = s.recorder
        raw = rec.raw()
        values = raw_to_fields(raw[np.asarray(r.rows, dtype=np.intp)], np.asarray(r.counts, dtype=np.float64)) \
            if r.keys else np.zeros((0, len(FIELDS)))
        tfiles = {key: TensorFile(*rec.files[key]) for key in r.keys if key in rec.files}
        table = s.add_step(step, r.keys, r.dtypes, r.shapes, values, files=tfiles)
        table.unsupported = dict(r.unsupported)
        s.recorder = StepRecorder()
        s.order = 0
        rec.new_step()
    s.problems.extend(DumpProblem(f, m) for f, m in dict.fromkeys(rec.problems))
    return s


def group_runs(runs: list[tuple], weighted: dict[int, bool]) -> list[list[tuple]]:
    """Group graph runs ``(first timestamp, iteration, graph id, files)``, in time order, into steps.

    A model with control flow runs several kernel graphs per step: the main graph (it has the weights) and
    its branches and loop bodies (no weights; a loop body can run several times a step). A step holds the
    runs from one run of a weighted graph up to the next run of a weighted graph that already ran in it;
    runs of weightless graphs join the step in progress. A dump without any weighted graph (inference)
    makes every run a step.

    >>> runs = [(0, 0, 0, "main"), (1, 0, 1, "branch"), (2, 1, 0, "main"), (3, 1, 1, "branch")]
    >>> [[r[3] for r in g] for g in group_runs(runs, {0: True, 1: False})]
    [['main', 'branch'], ['main', 'branch']]
    >>> len(group_runs(runs, {0: False, 1: False}))
    4
    """
    if not any(weighted.get(r[2], False) for r in runs):
        return [[r] for r in runs]
    groups: list[list[tuple]] = []
    seen: set[int] = set()
    for r in runs:
        g = r[2]
        if weighted.get(g, False) and (not groups or g in seen):
            groups.append([])
            seen = set()
        if not groups:
            groups.append([])
        groups[-1].append(r)
        seen.add(g)
    return groups


def _dump_metadata(rank_dir: str) -> tuple[str, str]:
    meta = os.path.join(rank_dir, ".dump_metadata", "config.json")
    try:
        with open(meta) as f:
            d = json.load(f)
        return str(d.get("ms_version", "")), str(d.get("device_target", "cpu")).lower()
    except (OSError, ValueError):
        return "", "cpu"


def prune_dirs(paths: Iterable[str]) -> None:
    """Delete directories (offline copies; never a live dump's: MindSpore would fail to write into it)."""
    for p in paths:
        shutil.rmtree(p, ignore_errors=True)


def remove_files(paths: Iterable[str]) -> None:
    """Delete dump files (the live adapter's pruning: directories stay for MindSpore to write into)."""
    for p in paths:
        try:
            os.remove(p)
        except OSError:
            pass
