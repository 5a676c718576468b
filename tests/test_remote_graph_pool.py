"""The listener's mirrors share the graph nodes the ranks of a job have in common (issue 20 item 4: hub memory at
1,000 ranks was mostly 1,000 copies of one graph): the same node record gives the same node object in every
mirror, a rank whose node changes gets a node of its own without touching the others', and a mirror reads the
same graph as without sharing."""

from __future__ import annotations

import gc
import json
import weakref

import pytest

from nbdebug.remote import protocol as P
from nbdebug.session.graph import Graph


def _graph(first=0, extra=False):
    g = Graph()
    a = g.add_node("Module.fc1.Linear.forward.0", kind="module", op_type="Linear", scope="fc1",
                   stack=["train.py:10 step", "model.py:4 forward"])
    a.shapes, a.dtypes, a.order = {"output.0": (32, 64)}, {"output.0": "float32"}, first
    b = g.add_node("Functional.relu.0.forward", kind="op", op_type="relu", scope="fc1")
    b.order = 1
    if extra:
        g.add_node("Functional.dropout.0.forward", kind="op", op_type="dropout").order = 2
    g.add_edge(a.name, b.name, "output.0", "input.0")
    return g


def _wire(delta):
    return json.loads(json.dumps(delta))  # as a process's message arrives: decoded JSON


def _same_graph(a, b):
    assert list(a.nodes) == list(b.nodes) and a.edges == b.edges
    for name, node in a.nodes.items():
        other = b.nodes[name]
        assert (node.kind, node.op_type, node.scope, node.section, node.order, node.shapes, node.dtypes,
                node.stack, node.pair, node.moved) == (other.kind, other.op_type, other.scope, other.section,
                                                      other.order, other.shapes, other.dtypes, other.stack,
                                                      other.pair, other.moved)


def test_identical_ranks_share_their_nodes_and_read_as_without_sharing():
    pool = weakref.WeakValueDictionary()
    delta = P.GraphDelta().take(_graph())
    plain, mirrors = Graph(), [Graph() for _ in range(4)]
    assert P.apply_graph(plain, _wire(delta)) == 2
    for m in mirrors:
        assert P.apply_graph(m, _wire(delta), pool) == 2
        _same_graph(m, plain)
        assert m.version > 0
    first = mirrors[0].nodes
    assert all(m.nodes[n] is first[n] for m in mirrors for n in first)  # one copy for the four ranks
    assert len(pool) == 2


def test_a_rank_whose_node_changes_gets_its_own_and_the_others_keep_theirs():
    pool = weakref.WeakValueDictionary()
    sent = [P.GraphDelta() for _ in range(3)]
    mirrors = [Graph() for _ in range(3)]
    for d, m in zip(sent, mirrors, strict=True):
        P.apply_graph(m, _wire(d.take(_graph())), pool)
    shared = mirrors[0].nodes["Module.fc1.Linear.forward.0"]
    version = mirrors[1].version
    P.apply_graph(mirrors[1], _wire(sent[1].take(_graph(first=5, extra=True))), pool)  # rank 1 only
    mine = mirrors[1].nodes["Module.fc1.Linear.forward.0"]
    assert mine is not shared and mine.order == 5
    assert shared.order == 0 and mirrors[2].nodes[shared.name] is shared
    assert "Functional.dropout.0.forward" in mirrors[1].nodes and "Functional.dropout.0.forward" not in mirrors[2]
    assert mirrors[1].version > version  # a node added: views relayout
    plain = Graph()
    P.apply_graph(plain, _wire(P.GraphDelta().take(_graph(first=5, extra=True))))
    _same_graph(mirrors[1], plain)


def test_pooled_nodes_go_with_the_last_graph_that_holds_them():
    pool = weakref.WeakValueDictionary()
    mirrors = [Graph() for _ in range(2)]
    for i in range(2):
        P.apply_graph(mirrors[i], _wire(P.GraphDelta().take(_graph())), pool)
    del mirrors[0]
    gc.collect()
    assert len(pool) == 2  # rank 1 still holds them
    mirrors.clear()
    gc.collect()
    assert len(pool) == 0


def test_a_bad_node_record_is_refused_with_a_pool_too():
    rec = {"name": "x", "kind": "nonsense", "op_type": "relu"}
    with pytest.raises(ValueError, match="kind must be one of"):
        P.apply_graph(Graph(), {"nodes": [rec]}, weakref.WeakValueDictionary())
