"""Pure parts of the panel: the scope-collapsed graph layout and the tensor view's numbers."""

import random

import numpy as np
import pytest

from nbdebug.session.graph import Graph, Node
from nbdebug.ui.layout import compute_layout, node_class, scope_chain, short_label
from nbdebug.ui.tensor_math import compare, default_selection, parse_selection, select, tensor_stats


def random_graph(seed, n=300):
    rng = random.Random(seed)
    g = Graph()
    scopes = [""]
    for _ in range(25):
        parent = rng.choice(scopes)
        scopes.append(f"{parent}/s{len(scopes)}" if parent else f"s{len(scopes)}")
    names = []
    for i in range(n):
        section = "forward" if i < n * 0.5 else ("backward" if i < n * 0.9 else "optimizer")
        kind = rng.choice(["op", "op", "module", "parameter", "input"])
        name = f"N{i}"
        g.add_node(name, kind=kind, op_type=rng.choice(["linear", "relu", "add"]), scope=rng.choice(scopes),
                   section=section).order = i if rng.random() > 0.02 else -1
        names.append(name)
    for i in range(1, n):
        g.add_edge(names[rng.randrange(i)], names[i])
        g.add_edge(names[i - 1], names[i])
    return g


def all_scopes(g):
    out = set()
    for n in g:
        out.update(scope_chain(n.section, n.scope))
    return out


def test_collapsed_by_default_counts_every_node_once():
    g = random_graph(0)
    lay = compute_layout(g)
    assert sum(it.count for it in lay.items) == len(g)
    for it in lay.items:
        if it.kind == "scope":
            assert "/" not in it.key.split(":", 1)[1]  # only top-level scopes
        else:
            assert g.nodes[it.key].scope == ""
    assert lay.boxes == []
    assert set(lay.of_node) == set(g.nodes)
    for name, i in lay.of_node.items():
        it = lay.items[i]
        node = g.nodes[name]
        assert it.key == name or (it.section == node.section and
                                  node.scope.split("/")[0] == it.key.split(":", 1)[1])


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_expanded_layout_invariants(seed):
    g = random_graph(seed)
    rng = random.Random(seed)
    scopes = sorted(all_scopes(g))
    expanded = set(rng.sample(scopes, len(scopes) // 2))
    lay = compute_layout(g, expanded)
    items = lay.items
    # x is the rank in execution order; no two items share a cell
    by_x = sorted(items, key=lambda it: it.x)
    assert [it.x for it in by_x] == list(range(len(items)))
    orders = [it.order for it in by_x]
    assert orders == sorted(orders)
    assert len({(it.x, it.y) for it in items}) == len(items)
    # a visible scope box is collapsed, its ancestors are expanded
    for it in items:
        if it.kind == "scope":
            assert it.key not in expanded
            assert all(k in expanded for k in scope_chain(*it.key.split(":", 1))[:-1])
    # every box is an expanded scope, contains exactly its visible descendants, and boxes only nest
    assert {b.key for b in lay.boxes} <= expanded
    boxes = {b.key: b for b in lay.boxes}
    for b in lay.boxes:
        inside = [it for it in items if b.x0 <= it.x <= b.x1 and b.y0 < it.y <= b.y1]
        desc = [it for it in items if it.parent is not None and (it.parent == b.key or
                                                                 it.parent.startswith(b.key + "/"))]
        assert {it.key for it in inside} == {it.key for it in desc}
        assert all(it.y != b.y0 for it in items if b.x0 <= it.x <= b.x1)  # header row is free
        for c in lay.boxes:
            if c is b:
                continue
            overlap = not (c.x1 < b.x0 or b.x1 < c.x0 or c.y1 < b.y0 or b.y1 < c.y0)
            nested = c.key.startswith(b.key + "/") or b.key.startswith(c.key + "/")
            assert not overlap or nested, (b, c)
    # parents of items are boxes (or the section root)
    assert all(it.parent is None or it.parent in boxes for it in items)
    # item edges: no self loops, each comes from a graph edge
    for a, b in lay.edges:
        assert a != b
    expect = {(lay.of_node[s], lay.of_node[d]) for s, d in g.edges if lay.of_node[s] != lay.of_node[d]}
    assert set(lay.edges) == expect


def test_sections_are_separate_boxes():
    g = Graph()
    for i, (sec, scope) in enumerate([("forward", "fc1"), ("forward", "fc1"), ("backward", "fc1")]):
        g.add_node(f"n{i}", kind="op", op_type="linear", scope=scope, section=sec).order = i
    lay = compute_layout(g)
    assert [(it.key, it.count) for it in lay.items] == [("forward:fc1", 2), ("backward:fc1", 1)]
    lay = compute_layout(g, {"backward:fc1"})
    assert [it.key for it in lay.items] == ["forward:fc1", "n2"]


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
