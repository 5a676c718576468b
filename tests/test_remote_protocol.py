"""The wire schema: what is refused (unknown types, other versions, unknown operations, object arrays,
pickles, wrong tokens) and what round-trips exactly (statistics tables, graph deltas, watchpoints, hits)."""

from __future__ import annotations

import pickle
import time

import numpy as np
import pytest
import zmq

import nbdebug
from nbdebug.remote import protocol as P
from nbdebug.session.graph import Graph
from nbdebug.session.stats import StatsTable
from nbdebug.watch.conditions import Hit
from nbdebug.watch.recommend import Target
from nbdebug.watch.watchpoints import HitRecord, Watchpoint


def test_decode_refuses_what_is_not_the_schema():
    with pytest.raises(P.ProtocolError, match="not JSON"):
        P.decode([pickle.dumps({"type": "hello"})])
    with pytest.raises(P.ProtocolError, match="version"):
        P.decode([b'{"v": 99, "type": "hello"}'])
    with pytest.raises(P.ProtocolError, match="unknown message type"):
        P.decode([b'{"v": 1, "type": "eval"}'])
    with pytest.raises(P.ProtocolError, match="frames"):
        P.decode([b'{"v": 1, "type": "ping"}'] + [b""] * 9)
    with pytest.raises(P.ProtocolError, match="unknown operation"):
        P.check_request({"id": 1, "op": "__import__", "args": {}})
    with pytest.raises(P.ProtocolError, match="subset"):
        P.check_request({"id": 1, "op": "tensor", "args": {"node": "a", "callback": "os.system"}})
    assert P.check_request({"id": 3, "op": "cont", "args": {"steps": 2}}) == (3, "cont", {"steps": 2})


def test_arrays_travel_as_plain_numbers_only():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    back = P.frame_array(P.array_meta(a), bytes(P.array_frame(a)))
    np.testing.assert_array_equal(back, a)
    assert back.dtype == a.dtype
    with pytest.raises(P.ProtocolError, match="refused"):
        P.frame_array({"dtype": "|O", "shape": [1]}, b"\0" * 8)
    with pytest.raises(P.ProtocolError, match="does not hold"):
        P.frame_array({"dtype": "<f4", "shape": [4]}, b"\0" * 8)


def test_tables_graphs_watchpoints_and_hits_round_trip():
    table = StatsTable.from_rows([("a", "output.0"), ("b", "input.0")], ["float32", "int64"], [(2, 3), ()],
                                 np.arange(20, dtype=float).reshape(2, 10))
    table.unsupported = {1: "complex"}
    book, names = P.KeyBook(), {}
    head, frames = P.table_header(table, book)
    back = P.read_table(head, [bytes(f) for f in frames], names)
    assert back.keys == table.keys and back.shapes == table.shapes and back.dtypes == table.dtypes
    np.testing.assert_array_equal(back.values, table.values)
    assert back.unsupported == {1: "complex"}
    head2, _ = P.table_header(table, book)
    assert head2["keys"] == []  # names, dtypes and shapes travel once per connection

    g = Graph()
    g.add_node("Parameter.fc.weight", kind="parameter", op_type="Parameter", scope="fc")
    n = g.add_node("Functional.linear.0.forward", kind="op", op_type="linear", scope="fc", stack=["x.py:1"])
    n.shapes["output.0"] = (2, 3)
    g.add_edge("Parameter.fc.weight", "Functional.linear.0.forward", "output.0", "input.1")
    delta = P.GraphDelta()
    mirror = Graph()
    P.apply_graph(mirror, delta.take(g))
    assert mirror.edges == g.edges and mirror.nodes["Functional.linear.0.forward"].shapes == {"output.0": (2, 3)}
    assert delta.take(g) == {}
    n.order = 5
    assert [r["name"] for r in delta.take(g)["nodes"]] == ["Functional.linear.0.forward"]

    wp = Watchpoint(4, "TO", {}, None, Target("activation", frozenset({"relu"}), 2), {"x"}, {"y"}, False, 3)
    assert P.read_watchpoint(P.watchpoint_record(wp)) == wp
    hit = HitRecord(4, "GL", "n", "output.0", 7, 3, (Hit("max_gt", 1.0, float("inf")),), None, (), "advice")
    assert P.read_hit(P.hit_record(hit)) == hit


def test_listener_refuses_a_wrong_token_and_ignores_the_unauthenticated():
    with nbdebug.listen(quiet=True) as listener:
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.connect(f"tcp://{listener.address}")
        try:
            sock.send(pickle.dumps("x"))  # garbage before any hello: refused, nothing unpickled
            head, _ = P.decode(sock.recv_multipart())
            assert head["type"] == "refused" and "malformed" in head["reason"]
            sock.send_multipart(P.encode({"type": "request", "id": 1, "op": "terminate", "args": {}}))
            sock.send_multipart(P.encode({"type": "hello", "token": "wrong", "pid": 1, "host": "h"}))
            head, _ = P.decode(sock.recv_multipart())
            assert head == {"v": 1, "type": "refused", "reason": "wrong token"}
            sock.send_multipart(P.encode({"type": "hello", "token": listener.token, "pid": 1, "host": "h",
                                          "framework": "pytorch"}))
            head, _ = P.decode(sock.recv_multipart())
            assert head["type"] == "welcome" and list(listener.sources) == ["h:1"]
            time.sleep(0.1)
            assert len(listener.refused) == 2
        finally:
            sock.close(0)
            ctx.term()
