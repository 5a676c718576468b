"""The wire format between a training process (the agent) and the notebook (the hub).

Every message is one ZeroMQ multipart message: a JSON header (UTF-8, an object with ``"v"`` and
``"type"``) and, for some types, raw binary frames (little-endian numpy buffers whose dtype and shape
the header names). Nothing is pickled and nothing received is executed: a request names one of the
operations of :data:`OPS`, with JSON arguments checked here. ``PROTOCOL.md`` beside this module
documents every type.

>>> frames = encode({"type": "ping"})
>>> decode(frames)
({'type': 'ping', 'v': 1}, [])
>>> decode([b'{"v": 1, "type": "exec"}'])
Traceback (most recent call last):
...
nbdebug.remote.protocol.ProtocolError: unknown message type 'exec'
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..session.graph import Graph, Node
from ..session.stats import FIELDS, StatsTable
from ..watch.conditions import Hit
from ..watch.recommend import Target
from ..watch.watchpoints import HitRecord, Watchpoint

VERSION = 1

#: agent → hub
AGENT_TYPES = ("hello", "sync", "step", "monitor", "state", "hits", "reply", "ping", "bye")
#: hub → agent
HUB_TYPES = ("welcome", "refused", "request", "pong")
TYPES = AGENT_TYPES + HUB_TYPES

#: the operations a request may name (and nothing else): name -> argument names it takes
OPS: dict[str, tuple[str, ...]] = {
    "tensor": ("node", "slot", "step", "max_bytes"),
    "watch": ("condition", "nodes", "params", "target"),
    "update_watch": ("wp", "changes"),
    "unwatch": ("wp",),
    "keep": ("nodes", "on"),
    "recheck": (),
    "cont": ("steps",),
    "pause": (),
    "pause_at_step": ("step",),
    "terminate": (),
    "run_to": ("node",),
    "next_node": (),
    "resync": (),
    "tables": ("on",),
}

#: largest JSON header accepted (a step's header holds only node records and new keys)
MAX_HEADER = 64 * 2**20
MAX_FRAMES = 8
#: exception types a reply may name; they are raised again in the notebook (anything else: RemoteError)
ERRORS = ("KeyError", "ValueError", "TypeError", "RuntimeError", "LookupError", "NotRetainedError",
          "StatsNotRetainedError", "IndexError")
#: numpy dtype kinds a tensor may travel as (bool, ints, unsigned, floats, complex)
TENSOR_KINDS = "biufc"


class ProtocolError(ValueError):
    """A message that does not follow this schema (it is dropped; the connection may be refused)."""


class RemoteError(RuntimeError):
    """An error raised in the training process that has no local counterpart (its type is in the text)."""


# -- framing ---------------------------------------------------------------------------------------

def encode(header: Mapping[str, Any], frames: Sequence[bytes | memoryview] = ()) -> list[Any]:
    """A header (``type`` required) and binary frames as one multipart message."""
    h = dict(header)
    h.setdefault("v", VERSION)
    if h.get("type") not in TYPES:
        raise ProtocolError(f"unknown message type {h.get('type')!r}")
    return [json.dumps(h, separators=(",", ":"), default=_plain).encode(), *frames]


def _plain(value: Any) -> Any:
    """JSON for numpy scalars and sets (watchpoint parameters, node selections); anything else is refused."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (set, frozenset, tuple)):
        return sorted(value) if isinstance(value, (set, frozenset)) else list(value)
    raise TypeError(f"{type(value).__name__} cannot travel in a message (plain JSON values only)")


def decode(parts: Sequence[Any]) -> tuple[dict[str, Any], list[Any]]:
    """``(header, frames)`` of a received multipart message; :class:`ProtocolError` when malformed."""
    if not parts:
        raise ProtocolError("empty message")
    if len(parts) > 1 + MAX_FRAMES:
        raise ProtocolError(f"{len(parts) - 1} binary frames; at most {MAX_FRAMES}")
    raw = bytes(parts[0])
    if len(raw) > MAX_HEADER:
        raise ProtocolError(f"header of {len(raw)} bytes; at most {MAX_HEADER}")
    try:
        header = json.loads(raw.decode())
    except (UnicodeDecodeError, ValueError) as e:
        raise ProtocolError(f"header is not JSON: {e}") from None
    if not isinstance(header, dict):
        raise ProtocolError("header is not a JSON object")
    if header.get("v") != VERSION:
        raise ProtocolError(f"protocol version {header.get('v')!r}; this nbdebug speaks {VERSION}")
    if header.get("type") not in TYPES:
        raise ProtocolError(f"unknown message type {header.get('type')!r}")
    return header, list(parts[1:])


def token_ok(given: Any, expected: str) -> bool:
    """Constant-time token comparison (a wrong type is simply wrong)."""
    return isinstance(given, str) and hmac.compare_digest(given.encode(), expected.encode())


def check_request(header: Mapping[str, Any]) -> tuple[int, str, dict[str, Any]]:
    """``(id, op, args)`` of a request, its op one of :data:`OPS` and its args only the op's names."""
    rid, op, args = header.get("id"), header.get("op"), header.get("args", {})
    if not isinstance(rid, int) or isinstance(rid, bool):
        raise ProtocolError("request without an integer id")
    if op not in OPS:
        raise ProtocolError(f"unknown operation {op!r}; operations: {', '.join(OPS)}")
    if not isinstance(args, dict) or set(args) - set(OPS[op]):
        raise ProtocolError(f"{op}: arguments must be a subset of {OPS[op]}, got {args!r}")
    return rid, op, args


# -- numpy buffers ---------------------------------------------------------------------------------

def array_meta(arr: np.ndarray) -> dict[str, Any]:
    """What travels in the header for a binary frame: dtype (numpy string) and shape."""
    return {"dtype": arr.dtype.str, "shape": list(arr.shape)}


def array_frame(arr: np.ndarray) -> memoryview:
    """The bytes of ``arr`` (C order) as one frame; its shape travels in :func:`array_meta`. Flat first: a
    memoryview of an empty array of two dimensions (a monitor-level step's table, 0 rows × FIELDS) cannot
    be cast to bytes."""
    return memoryview(np.ascontiguousarray(arr).reshape(-1)).cast("B")


def frame_array(meta: Mapping[str, Any], frame: Any) -> np.ndarray:
    """The array a frame holds; its dtype must be plain numbers and its size must match the shape."""
    try:
        dtype = np.dtype(str(meta["dtype"]))
        shape = tuple(int(s) for s in meta["shape"])
    except (KeyError, TypeError, ValueError) as e:
        raise ProtocolError(f"bad array metadata {meta!r}: {e}") from None
    if dtype.kind not in TENSOR_KINDS or dtype.hasobject or any(s < 0 for s in shape):
        raise ProtocolError(f"refused array dtype {dtype} / shape {shape}")
    buf = memoryview(frame)
    if buf.nbytes != dtype.itemsize * int(np.prod(shape, dtype=np.int64)):
        raise ProtocolError(f"frame of {buf.nbytes} bytes does not hold {dtype} {shape}")
    return np.frombuffer(buf, dtype=dtype).reshape(shape).copy()


# -- statistics tables -----------------------------------------------------------------------------

class KeyBook:
    """The (node, slot) → integer id dictionary of one connection: a row travels as its id; a key's name,
    dtype and shape travel once (again only when its dtype or shape changes).

    >>> book = KeyBook()
    >>> book.ids([("a", "output.0"), ("b", "output.0")], ["float32"] * 2, [(2,), (3,)]), book.take_new()
    ([0, 1], [[0, 'a', 'output.0', 'float32', [2]], [1, 'b', 'output.0', 'float32', [3]]])
    >>> book.ids([("a", "output.0")], ["float16"], [(2,)]), book.take_new()
    ([0], [[0, 'a', 'output.0', 'float16', [2]]])
    """

    def __init__(self) -> None:
        self._ids: dict[tuple[str, str], int] = {}
        self._meta: list[tuple[str, tuple[int, ...]]] = []
        self._new: list[list[Any]] = []

    def ids(self, keys: Sequence[tuple[str, str]], dtypes: Sequence[str], shapes: Sequence[Any]) -> list[int]:
        out = []
        for key, dtype, shape in zip(keys, dtypes, shapes, strict=True):
            i = self._ids.get(key)
            meta = (dtype, tuple(shape))
            if i is None:
                i = self._ids[key] = len(self._meta)
                self._meta.append(meta)
                self._new.append([i, key[0], key[1], dtype, list(meta[1])])
            elif self._meta[i] != meta:
                self._meta[i] = meta
                self._new.append([i, key[0], key[1], dtype, list(meta[1])])
            out.append(i)
        return out

    def take_new(self) -> list[list[Any]]:
        new, self._new = self._new, []
        return new


def table_header(table: StatsTable, book: KeyBook) -> tuple[dict[str, Any], list[Any]]:
    """A step's statistics: row key ids (int32) and values (float64, rows × FIELDS) as two frames."""
    ids = np.asarray(book.ids(table.keys, table.dtypes, table.shapes), dtype="<i4")
    values = np.ascontiguousarray(table.values, dtype="<f8")
    head = {"rows": len(table.keys), "unsupported": {str(k): v for k, v in table.unsupported.items()},
            "keys": book.take_new()}
    return head, [array_frame(ids), array_frame(values)]


def read_table(head: Mapping[str, Any], frames: Sequence[Any], names: dict[int, tuple[str, str, str, Any]]
               ) -> StatsTable:
    """Rebuild a :class:`StatsTable` from :func:`table_header`'s output; ``names`` (id → node, slot, dtype,
    shape) is the receiving side of the connection's :class:`KeyBook` and grows with each table."""
    for i, node, slot, dtype, shape in head.get("keys", ()):
        names[int(i)] = (str(node), str(slot), str(dtype), tuple(int(x) for x in shape))
    n = int(head["rows"])
    if len(frames) < 2:
        raise ProtocolError("a statistics table needs two frames (ids, values)")
    ids = frame_array({"dtype": "<i4", "shape": [n]}, frames[0])
    values = frame_array({"dtype": "<f8", "shape": [n, len(FIELDS)]}, frames[1])
    try:
        rows = [names[i] for i in ids.tolist()]
    except KeyError as e:
        raise ProtocolError(f"unknown key id {e}") from None
    table = StatsTable()
    table.keys = [(r[0], r[1]) for r in rows]
    table.index = {k: i for i, k in enumerate(table.keys)}
    table.dtypes = [r[2] for r in rows]
    table.shapes = [r[3] for r in rows]
    table.values = values
    table.unsupported = {int(k): str(v) for k, v in (head.get("unsupported") or {}).items()}
    return table


# -- graph -----------------------------------------------------------------------------------------

def node_record(node: Node) -> dict[str, Any]:
    return {"name": node.name, "kind": node.kind, "op_type": node.op_type, "scope": node.scope,
            "section": node.section, "order": node.order,  # dict(): as of now (training may add a slot meanwhile)
            "shapes": {k: list(v) for k, v in dict(node.shapes).items()},
            "dtypes": dict(node.dtypes), "stack": list(node.stack), "pair": node.pair, "graph": node.graph,
            "moved": list(node.moved)}


def node_signature(node: Node) -> tuple[Any, ...]:
    """What, when it changes, makes a node travel again."""
    return (node.order, node.scope, node.section, len(node.shapes), len(node.dtypes), len(node.moved),
            len(node.stack), node.pair)


class GraphDelta:
    """Tracks what of a graph was sent; :meth:`take` returns the nodes and edges new or changed since.

    >>> g = Graph(); _ = g.add_node("a", kind="op", op_type="relu")
    >>> d = GraphDelta(); [n["name"] for n in d.take(g)["nodes"]], d.take(g)
    (['a'], {})
    """

    def __init__(self) -> None:
        self._nodes: dict[str, tuple[Any, ...]] = {}
        self._edges: dict[tuple[str, str], int] = {}

    def take(self, graph: Graph) -> dict[str, Any]:
        nodes = []
        for node in list(graph.nodes.values()):
            sig = node_signature(node)
            if self._nodes.get(node.name) != sig:
                self._nodes[node.name] = sig
                nodes.append(node_record(node))
        edges = []
        for key, slots in list(graph.edges.items()):
            seen = self._edges.get(key, 0)
            if len(slots) > seen:
                edges.extend([key[0], key[1], a, b] for a, b in slots[seen:])
                self._edges[key] = len(slots)
        out: dict[str, Any] = {}
        if nodes:
            out["nodes"] = nodes
        if edges:
            out["edges"] = edges
        return out


def apply_graph(graph: Graph, delta: Mapping[str, Any], pool: Any = None) -> int:
    """Apply a :class:`GraphDelta` to a mirrored graph; returns how many nodes were added or changed.

    ``pool`` (a mapping, e.g. a ``WeakValueDictionary`` the listener keeps): nodes are shared between the graphs
    given the same pool — a node record seen before (the same name, kind, order, shapes, stack...: the ranks of
    one job mostly send the same graph) gives the node already made, so 1,000 ranks hold one copy of it. A
    pooled node is never changed in place: a changed record gives the graph another node object."""
    for rec in delta.get("nodes", ()):
        if pool is not None:
            _apply_pooled(graph, rec, pool)
            continue
        node = graph.nodes.get(rec["name"])
        if node is None:
            node = graph.add_node(str(rec["name"]), kind=str(rec["kind"]), op_type=str(rec["op_type"]),
                                  scope=str(rec.get("scope", "")), section=str(rec.get("section", "forward")))
        elif node.scope != rec.get("scope", "") or node.section != rec.get("section", "forward"):
            node.scope, node.section = str(rec.get("scope", "")), str(rec.get("section", "forward"))
            graph.version += 1
        _fill_node(node, rec)
    for src, dst, a, b in delta.get("edges", ()):
        graph.add_edge(str(src), str(dst), str(a), str(b))
    return len(delta.get("nodes", ()))


def _fill_node(node: Any, rec: Mapping[str, Any]) -> None:
    """A node record's fields beyond name, kind, op type, scope and section, onto ``node``."""
    node.order = int(rec.get("order", -1))
    node.shapes = {str(k): tuple(int(x) for x in v) for k, v in (rec.get("shapes") or {}).items()}
    node.dtypes = {str(k): str(v) for k, v in (rec.get("dtypes") or {}).items()}
    node.stack = [str(s) for s in rec.get("stack") or ()]
    node.pair = rec.get("pair")
    node.graph = rec.get("graph")
    node.moved = [int(s) for s in rec.get("moved") or ()]


def _apply_pooled(graph: Graph, rec: Mapping[str, Any], pool: Any) -> None:
    key = json.dumps(rec, sort_keys=True, separators=(",", ":"))
    node = pool.get(key)
    if node is None:
        scratch = Graph()  # add_node checks kind and section
        node = scratch.add_node(str(rec["name"]), kind=str(rec["kind"]), op_type=str(rec["op_type"]),
                                scope=str(rec.get("scope", "")), section=str(rec.get("section", "forward")))
        _fill_node(node, rec)
        pool[key] = node
    old = graph.nodes.get(node.name)
    if old is node:
        return
    graph.nodes[node.name] = node
    if old is None or old.scope != node.scope or old.section != node.section:
        graph.version += 1


# -- watchpoints and hits --------------------------------------------------------------------------

def target_record(target: Target | None) -> dict[str, Any] | None:
    if target is None:
        return None
    return {"category": target.category, "op_kinds": sorted(target.op_kinds), "min_ndim": target.min_ndim}


def read_target(rec: Any) -> Target | None:
    if rec is None:
        return None
    if not isinstance(rec, dict):
        raise ProtocolError(f"bad watchpoint target {rec!r}")
    return Target(str(rec["category"]), frozenset(str(k) for k in rec.get("op_kinds", ())),
                  int(rec.get("min_ndim", 0)))


def watchpoint_record(wp: Watchpoint) -> dict[str, Any]:
    return {"id": wp.id, "condition": wp.condition, "params": dict(wp.params), "nodes": wp.nodes,
            "target": target_record(wp.target), "added": sorted(wp.added), "removed": sorted(wp.removed),
            "enabled": wp.enabled, "version": wp.version}


def read_watchpoint(rec: Mapping[str, Any]) -> Watchpoint:
    nodes = rec.get("nodes")
    return Watchpoint(int(rec["id"]), str(rec["condition"]), dict(rec.get("params") or {}),
                      None if nodes is None else [str(n) for n in nodes], read_target(rec.get("target")),
                      {str(n) for n in rec.get("added", ())}, {str(n) for n in rec.get("removed", ())},
                      bool(rec.get("enabled", True)), int(rec.get("version", 0)))


def hit_record(h: HitRecord) -> dict[str, Any]:
    return {"watchpoint": h.watchpoint, "condition": h.condition, "node": h.node, "slot": h.slot, "step": h.step,
            "order": h.order, "hits": [[x.param, x.threshold, x.actual] for x in h.hits], "error": h.error,
            "unchecked": list(h.unchecked), "advice": h.advice, "origin": h.origin}


def read_hit(rec: Mapping[str, Any]) -> HitRecord:
    return HitRecord(int(rec["watchpoint"]), str(rec["condition"]), str(rec["node"]), str(rec["slot"]),
                     int(rec["step"]), int(rec["order"]),
                     tuple(Hit(str(p), float(t), float(a)) for p, t, a in rec.get("hits", ())),
                     rec.get("error"), tuple(str(u) for u in rec.get("unchecked", ())), str(rec.get("advice", "")),
                     bool(rec.get("origin", False)))


# -- errors ----------------------------------------------------------------------------------------

def error_record(exc: BaseException) -> dict[str, str]:
    name = type(exc).__name__
    text = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
    return {"type": name if name in ERRORS else "RemoteError", "message": f"{text}" if name in ERRORS
            else f"{name}: {text}"}


def raise_error(rec: Mapping[str, Any]) -> None:
    """Raise the local counterpart of an error reply."""
    from ..session.session import StatsNotRetainedError
    from ..session.store import NotRetainedError

    kinds: dict[str, type[BaseException]] = {
        "KeyError": KeyError, "ValueError": ValueError, "TypeError": TypeError, "RuntimeError": RuntimeError,
        "LookupError": LookupError, "NotRetainedError": NotRetainedError, "IndexError": IndexError,
        "StatsNotRetainedError": StatsNotRetainedError}
    kind = kinds.get(str(rec.get("type")), RemoteError)
    raise kind(str(rec.get("message", "")))
