"""Graph view and node list: clicks as the browser sends them, filters, search, reveal, export."""

import re

import pytest
import torch
from conftest import Net, train_steps

import nbdebug
from nbdebug.ui.graph_view import T_CLASS0, T_HEADERS, T_SELECTED, simulate_click
from nbdebug.ui.layout import NODE_CLASSES
from nbdebug.ui.panel import Panel


@pytest.fixture(scope="module")
def trained():
    torch.manual_seed(0)
    model = Net()
    dbg = nbdebug.Debugger(model, level="mix")
    train_steps(model, 2)
    yield dbg
    dbg.close()


@pytest.fixture
def panel(trained):
    p = Panel(trained, recommend=False)
    yield p
    p.close()


def point_of(gv, key):
    """(trace index, point index) of a visible item, as the browser would report a click on it."""
    i = gv.layout.index[key]
    k = NODE_CLASSES.index(gv.layout.items[i].cls)
    return T_CLASS0 + k, gv._class_items[k].index(i)


def test_clicks_expand_collapse_and_select(panel, trained):
    gv = panel.graph_view
    assert gv.expanded == set() and "forward:block" in gv.visible_keys()
    n_collapsed = len(gv.visible_keys())
    # the figure holds exactly the visible items, each in the trace of its class, at its layout position
    xs = sum(len(gv.fig.data[T_CLASS0 + k].x) for k in range(len(NODE_CLASSES)))
    assert xs == n_collapsed
    simulate_click(gv.fig, *point_of(gv, "forward:block"))
    assert gv.expanded == {"forward:block"}
    assert "forward:block/lin" in gv.visible_keys() and "Tensor.__add__.0.forward" in gv.visible_keys()
    assert len(gv.fig.data[T_HEADERS].x) == 1 and gv.fig.data[T_HEADERS].text == ("block",)
    simulate_click(gv.fig, *point_of(gv, "forward:block/lin"))
    assert "Functional.linear.1.forward" in gv.visible_keys()
    # clicking a node selects it in the whole panel
    simulate_click(gv.fig, *point_of(gv, "Functional.linear.1.forward"))
    assert panel.selected == "Functional.linear.1.forward"
    assert "Functional.linear.1.forward" in panel.details.title.value
    assert panel.node_list.rows.value == "n:Functional.linear.1.forward"
    item = gv.layout.items[gv.layout.index["Functional.linear.1.forward"]]
    assert (gv.fig.data[T_SELECTED].x, gv.fig.data[T_SELECTED].y) == ((item.x,), (item.y,))
    # the "▾ block" header collapses the scope and everything opened inside it
    simulate_click(gv.fig, T_HEADERS, [b.key for b in gv.layout.boxes].index("forward:block"))
    assert gv.expanded == set() and len(gv.visible_keys()) == n_collapsed
    # the selected node is now hidden: its collapsed scope carries the selection mark
    box = gv.layout.items[gv.layout.index["forward:block"]]
    assert (gv.fig.data[T_SELECTED].x, gv.fig.data[T_SELECTED].y) == ((box.x,), (box.y,))
    assert panel.errors == []


def test_node_list_tree_filters_search_and_reveal(panel, trained):
    nl = panel.node_list
    g = trained.graph
    assert f"{len(g)} nodes" in nl.message.value
    assert "s:block" in nl.row_values and "n:Functional.linear.1.forward" not in nl.row_values
    nl.choose("s:block")
    assert "s:block/lin" in nl.row_values and "block" in nl.expanded
    nl.choose("s:block/lin")
    assert "n:Functional.linear.1.forward" in nl.row_values
    nl.choose("s:block")  # closes block and what was open inside it
    assert "s:block/lin" not in nl.row_values and nl.expanded == set()

    # filters: section and type
    nl.section.value = "backward"
    back = {n.name for n in g if n.section == "backward"}
    assert f"{len(back)} nodes" in nl.message.value
    nl.node_type.value = "op:linear"
    expect = {n.name for n in g if n.section == "backward" and n.op_type == "linear"}
    assert f"{len(expect)} nodes" in nl.message.value
    # search: substring, then regex (within the filters)
    nl.search.value = "linear.2"
    assert nl.row_values == ["n:Functional.linear.2.backward"]
    nl.node_type.value = "all"
    nl.section.value = "all"
    nl.regex.value = True
    nl.search.value = r"^Functional\.linear\.\d+\.backward$"
    want = sorted((n for n in g if re.match(r"^Functional\.linear\.\d+\.backward$", n.name)), key=lambda n: n.order)
    assert nl.row_values == [f"n:{n.name}" for n in want] and len(want) == 4
    before = nl.row_values
    nl.search.value = "(["
    assert "invalid regex" in nl.message.value and nl.row_values == before
    nl.search.value = "relu"
    assert nl.row_values == ["n:Functional.relu.0.forward", "n:Module.act.ReLU.forward.0",
                             "n:Module.act.ReLU.backward.0", "n:Functional.relu.0.backward"]
    # choosing a node in the list selects it and reveals it in the graph
    nl.choose("n:Functional.relu.0.backward")
    gv = panel.graph_view
    assert panel.selected == "Functional.relu.0.backward"
    assert "backward:act" in gv.expanded and "Functional.relu.0.backward" in gv.visible_keys()
    assert "Functional.relu.0.backward" in panel.details.title.value
    assert panel.errors == []


def test_node_list_graph_attribute_filter(trained):
    """MindSpore sessions tag nodes with the graph file they come from; the section filter offers them."""
    from nbdebug.session.session import Session

    s = Session(framework="mindspore", framework_version="2", live=False)
    for i, (name, graph) in enumerate([("a", "kernel_graph_0"), ("b", "kernel_graph_0"), ("c", "kernel_graph_1")]):
        node = s.graph.add_node(name, kind="op", op_type="MatMul", scope="Default/net")
        node.order = i
        node.graph = graph
    p = Panel(s)
    nl = p.node_list
    opts = [v for _, v in nl.section.options]
    assert "graph:kernel_graph_0" in opts and "graph:kernel_graph_1" in opts
    nl.section.value = "graph:kernel_graph_1"
    nl.search.value = "c"
    assert nl.row_values == ["n:c"]
    nl.search.value = ""
    assert "1 node" in nl.message.value
    p.close()


def test_details_links_and_stack(panel, trained):
    panel.select("Functional.linear.3.forward")
    d = panel.details
    producers = [b.description for b in d.producers.children if hasattr(b, "on_click")]
    consumers = [b.description for b in d.consumers.children if hasattr(b, "on_click")]
    g = trained.graph
    assert set(producers) == g.predecessors("Functional.linear.3.forward")
    assert set(consumers) == g.successors("Functional.linear.3.forward")
    assert "Parameter.fc2.weight" in producers
    assert "conftest.py" in d.stack.value  # where the node was called
    assert "input.1" in d.table.value and "from Parameter.fc2.weight output.0" in d.table.value
    link = next(b for b in d.producers.children if getattr(b, "description", "") == "Parameter.fc2.weight")
    link.click()
    assert panel.selected == "Parameter.fc2.weight" and "Parameter.fc2.weight" in d.title.value
    view = next(b for b in d.views.children if b.description == "View output.0")
    view.click()
    assert panel.tensor_view.visible
    assert panel.tensor_view.shown.shape == tuple(trained.tensor("Parameter.fc2.weight", "output.0").shape)


def test_export_through_plotly(panel, tmp_path, monkeypatch):
    gv = panel.graph_view
    gv.expand("forward:block")
    html = gv.export(tmp_path / "graph.html")
    assert "plotly" in html.read_text()[:5000].lower()
    with pytest.raises(ValueError, match="unknown format"):
        gv.export(tmp_path / "graph.bmp")
    svg = gv.export(tmp_path / "graph.svg").read_text()  # plotly + kaleido (a dev dependency) + Chromium
    assert svg.startswith("<svg") and ">block<" in svg and "fc2.Linear" in svg
    # without kaleido the error says what to install and what works meanwhile
    monkeypatch.setitem(__import__("sys").modules, "kaleido", None)
    with pytest.raises(RuntimeError, match="pip install kaleido"):
        gv.export(tmp_path / "graph.png")
