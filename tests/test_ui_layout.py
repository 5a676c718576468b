"""Pure parts of the panel: the graph view's data (scope keys, counts, deltas) and the tensor view's numbers."""

import random

import numpy as np
import pytest

from nbdebug.session.graph import Graph, Node
from nbdebug.ui.graph_data import GraphFeed, ScopeIndex, key_chain, scope_counts
from nbdebug.ui.layout import node_class, short_label
from nbdebug.ui.tensor_math import compare, default_selection, parse_selection, select, tensor_stats


def random_graph(seed, n=300, graph=None, start=0):
    rng = random.Random(seed)
    g = graph if graph is not None else Graph()
    scopes = [""]
    for _ in range(25):
        parent = rng.choice(scopes)
        scopes.append(f"{parent}/s{len(scopes)}" if parent else f"s{len(scopes)}")
    names = list(g.nodes)
    for i in range(start, start + n):
        section = "forward" if i < n * 0.5 else ("backward" if i < n * 0.9 else "optimizer")
        kind = rng.choice(["op", "op", "module", "parameter", "input"])
        name = f"N{i}"
        g.add_node(name, kind=kind, op_type=rng.choice(["linear", "relu", "add"]), scope=rng.choice(scopes),
                   section=section).order = i if rng.random() > 0.02 else -1
        names.append(name)
    for i in range(max(1, len(names) - n), len(names)):
        g.add_edge(names[rng.randrange(i)], names[i])
        g.add_edge(names[i - 1], names[i])
    return g


def apply_delta(msg, delta):
    """What a browser does with a delta: append nodes, replace changed rows and scope rows, append edges."""
    assert delta["base"] == msg["rev"]
    nodes = list(msg["nodes"]) + delta["nodes"]
    for i, row in delta["changed"]:
        nodes[i] = row
    scopes = {r[0]: r for r in msg["scopes"]}
    scopes.update({r[0]: r for r in delta["scopes"]})
    return {"type": "graph", "rev": delta["rev"], "nodes": nodes, "scopes": list(scopes.values()),
            "edges": msg["edges"] + delta["edges"]}


def as_sets(msg):
    """A graph message up to node ids: rows, scope rows (module node by name), edges by name."""
    names = [r[0] for r in msg["nodes"]]
    scopes = {r[0]: (r[1], r[2], r[3], names[r[4]] if r[4] >= 0 else None, r[5]) for r in msg["scopes"]}
    e = msg["edges"]
    return ({tuple(r) for r in msg["nodes"]}, scopes, {(names[e[i]], names[e[i + 1]]) for i in range(0, len(e), 2)})


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_scope_rows_count_every_node_once_per_enclosing_scope(seed):
    g = random_graph(seed)
    msg = GraphFeed().full(g)
    keys = [r[0] for r in msg["scopes"]]
    assert keys[:3] == ["forward:", "backward:", "optimizer:"] and len(set(keys)) == len(keys)
    seen = set()
    for key, parent, _label, section, _mod, count in msg["scopes"]:
        assert parent is None or parent in seen  # parents first
        seen.add(key)
        under = [r for r in msg["nodes"] if key in key_chain(r[3])]
        assert count == len(under) and key.startswith(section + ":")
    assert sum(r[5] for r in msg["scopes"] if r[1] is None) == len(g)
    assert sorted(r[0] for r in msg["nodes"]) == sorted(g.nodes)
    assert {r[3] for r in msg["nodes"]} <= seen
    names = [r[0] for r in msg["nodes"]]
    e = msg["edges"]
    assert {(names[e[i]], names[e[i + 1]]) for i in range(0, len(e), 2)} == set(g.edges)


@pytest.mark.parametrize("seed", [3, 4])
def test_delta_applied_to_the_last_graph_equals_a_fresh_graph(seed):
    g = random_graph(seed, n=120)
    feed = GraphFeed()
    base = feed.full(g)
    assert feed.update(g) is None
    random_graph(seed + 10, n=60, graph=g, start=120)  # more nodes and edges
    g.nodes["N5"].shapes["output.0"] = (2, 3)          # a row that changed
    delta = feed.update(g)
    assert delta["type"] == "delta" and delta["base"] == base["rev"] and delta["rev"] == base["rev"] + 1
    assert [r[0] for r in delta["nodes"]] == [f"N{i}" for i in range(120, 180) if g.nodes[f"N{i}"].order >= 0] + [
        f"N{i}" for i in range(120, 180) if g.nodes[f"N{i}"].order < 0]
    assert [i for i, _ in delta["changed"]] == [base["nodes"].index(next(r for r in base["nodes"] if r[0] == "N5"))]
    got = apply_delta(base, delta)
    assert as_sets(got) == as_sets(GraphFeed().full(g)) and got == feed.message()
    # a different graph: a whole new graph message
    assert feed.update(random_graph(seed, n=10))["type"] == "graph"


def test_sections_are_separate_scopes_and_counts_are_shared():
    g = Graph()
    for i, (sec, scope) in enumerate([("forward", "fc1"), ("forward", "fc1"), ("backward", "fc1")]):
        g.add_node(f"n{i}", kind="op", op_type="linear", scope=scope, section=sec).order = i
    idx = ScopeIndex(g)
    assert idx.counts == {"forward:": 2, "forward:fc1": 2, "backward:": 1, "backward:fc1": 1, "optimizer:": 0}
    assert scope_counts(idx.key_of.values()) == {k: v for k, v in idx.counts.items() if v}


def test_node_class_and_labels():
    assert node_class(Node("a", "parameter", "Parameter")) == "parameter"
    assert node_class(Node("a", "op", "add_", section="optimizer")) == "optimizer"
    assert node_class(Node("a", "module", "Linear", section="backward")) == "gradient"
    assert node_class(Node("a", "constant", "c")) == "input"
    assert short_label(Node("Module.block.lin.Linear.forward.1", "module", "Linear")) == "lin.Linear"
    assert short_label(Node("Module.fc2.Linear.parameters_grad.0", "parameter", "x")) == "fc2.Linear grad"
    assert short_label(Node("Functional.relu.0.forward", "op", "relu")) == "relu"


# -- tensor view numbers ---------------------------------------------------------------------------

def test_selection_parsing_and_slicing():
    x = np.arange(2 * 3 * 4 * 5).reshape(2, 3, 4, 5)
    assert default_selection(x.shape) == ["0", "0", ":", ":"]
    sel = parse_selection(["-1", "1:3", "2", "::2"], x.shape)
    assert np.array_equal(select(x, sel), x[-1, 1:3, 2, ::2])
    assert select(x, parse_selection(["1", "2", "3", "4"], x.shape)).shape == (1, 1)
    assert np.array_equal(select(x, parse_selection(["1", "2", "3", ":"], x.shape)), x[1, 2, 3][None, :])
    with pytest.raises(ValueError, match="at most 2"):
        parse_selection([":", ":", ":", "0"], x.shape)
    with pytest.raises(ValueError, match=r"axis 1 \(size 3\): index 3 is out of range"):
        parse_selection(["0", "3", ":", ":"], x.shape)
    with pytest.raises(ValueError, match="neither an index nor a slice"):
        parse_selection(["0", "a", ":", ":"], x.shape)
    with pytest.raises(ValueError, match="step"):
        parse_selection(["0", "0", "::0", ":"], x.shape)
    with pytest.raises(ValueError, match="selects nothing"):
        parse_selection(["0", "0", "3:3", ":"], x.shape)
    with pytest.raises(ValueError, match="4 dimensions"):
        parse_selection(["0"], x.shape)


def test_comparison_tolerance_rule():
    rng = np.random.default_rng(0)
    cur = rng.normal(size=(6, 7)).astype(np.float32)
    prev = rng.normal(size=(6, 7)).astype(np.float32)
    diff = cur.astype(np.float32) - prev
    assert np.array_equal(compare(cur, prev, 0.0), diff)
    for t in (0.1, 0.5, 0.9):
        bound = t * max(abs(diff.min()), abs(diff.max()))
        expect = np.where(np.abs(diff) <= bound, 0, diff)
        got = compare(cur, prev, t)
        assert np.array_equal(got, expect)
        assert 0 < np.count_nonzero(got) < diff.size
    assert not compare(cur, prev, 1.0).any()
    with pytest.raises(ValueError, match="tolerance"):
        compare(cur, prev, 1.5)
    with pytest.raises(ValueError, match="cannot compare shapes"):
        compare(cur, prev[:2], 0)
    # infinities do not set the bound; they stay
    c = np.array([np.inf, 1.0, 0.2])
    assert compare(c, np.zeros(3), 0.5).tolist() == [np.inf, 1.0, 0.0]


def test_tensor_statistics_fields():
    x = np.array([0.0, -0.0, -0.0, 2.0, -4.0, np.nan, np.inf, -np.inf], dtype=np.float32)
    s = tensor_stats(x)
    assert s == {"max": 2.0, "min": -4.0, "mean": -0.4, "count": 8, "nan_count": 1, "neg_inf_count": 1,
                 "pos_inf_count": 1, "zero_count": 3, "negative_zero_count": 2, "positive_zero_count": 1}
    assert tensor_stats(np.array([True, False, True])) == {"count": 3, "true_count": 2, "false_count": 1}
    s = tensor_stats(np.array([0, 3, -1], dtype=np.int64))
    assert (s["max"], s["min"], s["zero_count"], s["nan_count"]) == (3.0, -1.0, 1, 0)
    assert tensor_stats(np.array([np.nan]))["max"] is None
