"""Graph view and node list: the messages the browser gets (PROTOCOL.md), clicks and traits as the browser
changes them, filters, search, reveal, lifecycle, and export to self-contained HTML."""

import json
import re

import pytest
import torch
import torch.nn as nn
from conftest import Net, train_steps

import nbdebug
from nbdebug.ui.graph_data import ScopeIndex, key_chain, optimizer_scope
from nbdebug.ui.graph_edges import output_edges
from nbdebug.ui.graph_view import GraphView
from nbdebug.ui.panel import Panel

PARAMS = ["fc1.weight", "fc1.bias", "block.lin.weight", "block.lin.bias", "fc2.weight", "fc2.bias"]


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


def recorded(gv, ty):
    return next(m for m in gv.widget.recorded() if m["type"] == ty)


class Sent:
    """Every message a graph view posts (what the browser would receive)."""

    def __init__(self, gv):
        self.msgs = []
        post = gv.widget.post

        def spy(content, buffers=None, *, record=True):
            self.msgs.append(content)
            post(content, buffers, record=record)
        gv.widget.post = spy

    def types(self):
        return [m["type"] for m in self.msgs]


def test_graph_message_rows_scopes_and_edges(trained):
    g = trained.graph
    gv = GraphView(trained)
    msg = recorded(gv, "graph")
    rows = {r[0]: r for r in msg["nodes"]}
    ids = {r[0]: i for i, r in enumerate(msg["nodes"])}
    assert set(rows) == set(g.nodes) and len(msg["nodes"]) == len(g)
    assert rows["Functional.linear.0.forward"] == ["Functional.linear.0.forward", "linear", "op", "forward:fc1",
                                                   "linear", g["Functional.linear.0.forward"].order, "5×16", "float32"]
    assert rows["Parameter.fc1.weight"][1:4] == ["weight", "parameter", "forward:fc1"]
    assert rows["Functional.mse_loss.0.forward"][6] == "scalar"
    assert rows["Module.fc1.Linear.parameters_grad.0"][2:4] == ["gradient", "backward:"]  # no output.0: shape ""
    assert rows["Module.fc1.Linear.parameters_grad.0"][6:] == ["", ""]
    # backward nodes keep their module scopes; the module call node is inside its own scope's box (at mix,
    # where the scope holds its ops), not drawn beside it
    assert rows["Functional.linear.2.backward"][3] == "backward:block/lin"
    assert rows["Module.fc1.Linear.forward.0"][3] == "forward:fc1"
    scopes = {r[0]: r for r in msg["scopes"]}
    assert scopes["forward:fc1"] == ["forward:fc1", "forward:", "fc1", "forward", ids["Module.fc1.Linear.forward.0"], 4]
    assert scopes["forward:block/lin"][1] == "forward:block"
    assert scopes["forward:block/lin"][4] == ids["Module.block.lin.Linear.forward.0"]  # the first of its two calls
    assert scopes["backward:fc1"][5] == 2  # the linear op's backward and the module's backward call
    # edges: the graph's, by id, and the module calls' output edges (those leaving a call's box: its outputs
    # are recorded as made by the ops inside it)
    e = msg["edges"]
    names = [r[0] for r in msg["nodes"]]
    extra = set(output_edges(g, ScopeIndex(g)))
    assert {(names[e[i]], names[e[i + 1]]) for i in range(0, len(e), 2)} == set(g.edges) | extra
    assert len(e) == 2 * len(set(g.edges) | extra)
    assert ("Module.fc1.Linear.forward.0", "Tensor.add_.0.forward") in extra  # fc1's output, changed in place
    assert ("Module.block.Block.forward.0", "Functional.linear.3.forward") in extra  # the block's output into fc2
    assert all(a.startswith("Module.") and a.split(".")[-2] in ("forward", "backward") for a, _ in extra)


def test_optimizer_ops_are_grouped_per_parameter(trained):
    g = trained.graph
    gv = GraphView(trained)
    msg = recorded(gv, "graph")
    rows = {r[0]: r for r in msg["nodes"]}
    opt = [n for n in g if n.section == "optimizer"]
    assert len(opt) == 7
    for n in opt:
        if n.name.startswith("Optimizer."):
            assert rows[n.name][3] == "optimizer:"  # the step wrapper updates every parameter
            continue
        (param,) = [p[len("Parameter."):] for p in g.predecessors(n.name) if p.startswith("Parameter.")]
        assert rows[n.name][3] == f"optimizer:{optimizer_scope(param)}"
    # one group per parameter, nested like the model's modules (block.lin.weight under block/)
    scopes = {r[0]: r for r in msg["scopes"]}
    leaves = [f"optimizer:{optimizer_scope(p)}" for p in PARAMS]
    assert "optimizer:block/lin.weight" in leaves and scopes["optimizer:block"][1] == "optimizer:"
    for key in leaves:
        row = scopes[key]
        assert row[5] == 1 and row[2] == key.rsplit("/", 1)[-1].removeprefix("optimizer:")
        assert row[2].endswith((".weight", ".bias")) and "/" not in row[2]
    assert scopes["optimizer:"][5] == 7


def test_scope_counts_are_the_node_lists(panel):
    nl = panel.node_list
    msg = recorded(panel.graph_view, "graph")
    for r in msg["scopes"]:
        if r[5]:
            nl.expanded.update(key_chain(r[0]))
    nl.refresh(force=True)
    shown = {v[2:]: int(re.search(r"\((\d+)\)$", label).group(1)) for label, v in nl._rows if v.startswith("s:")}
    graph_counts = {r[0]: r[5] for r in msg["scopes"] if r[5]}
    assert shown == graph_counts
    assert shown["forward:fc1"] == 4 and shown["backward:fc1"] == 2  # one count per section, as in the graph


def test_clicks_traits_hover_and_hello(panel, trained):
    gv = panel.graph_view
    sent = Sent(gv)
    assert gv.expanded == set() and "forward:block" in gv.visible_keys()
    gv.expand("forward:block/lin")
    assert gv.widget.expanded == ["forward:block", "forward:block/lin"]
    assert "Functional.linear.1.forward" in gv.visible_keys()
    gv.toggle("forward:block")  # closes what is open inside too
    assert gv.widget.expanded == [] and "forward:block" in gv.visible_keys()
    with pytest.raises(KeyError, match="no scope"):
        gv.expand("forward:nope")
    # the browser selects a node (trait) -> the whole panel selects it
    gv.widget.selected = "Functional.linear.1.forward"
    assert panel.selected == "Functional.linear.1.forward"
    assert "Functional.linear.1.forward" in panel.details.title.value
    assert panel.node_list.rows.value == "n:Functional.linear.1.forward"
    # a click message does the same
    gv.widget.receive({"type": "click", "name": "Parameter.fc2.weight"})
    assert panel.selected == "Parameter.fc2.weight" and gv.widget.selected == "Parameter.fc2.weight"
    # the node list reveals in the graph: scopes opened, section shown, a reveal command sent
    gv.widget.sections = ["forward"]
    panel.node_list.search.value = "relu.0.backward"
    panel.node_list.choose("n:Functional.relu.0.backward")
    assert "backward:act" in gv.expanded and "backward" in gv.widget.sections
    assert gv.widget.selected == "Functional.relu.0.backward"
    assert {"type": "command", "action": "reveal", "name": "Functional.relu.0.backward"} in sent.msgs
    # hover -> card; hello -> the whole graph and the marks
    n = len(sent.msgs)
    gv.widget.receive({"type": "hover", "name": "Functional.linear.3.forward"})
    (c,) = sent.msgs[n:]
    assert c["type"] == "card" and c["name"] == "Functional.linear.3.forward"
    gv.widget.receive({"type": "hello", "rev": 0})
    assert sent.types()[n + 1:] == ["graph", "marks"] and sent.msgs[-2]["rev"] == gv.feed.rev
    assert panel.errors == []


def test_hover_card_statistics_are_the_debuggers(trained):
    gv = GraphView(trained)
    name = "Functional.linear.0.forward"
    rows = dict(gv.card(name)["rows"])
    st = trained.stats(name, "output.0")
    assert rows["op type"] == "linear" and rows["name"] == name and rows["scope"] == "forward:fc1"
    assert rows["section"] == "forward" and rows["input.1"] == "16×8 float32" and rows["output.0"] == "5×16 float32"
    assert rows["statistics of"] == f"step {trained.step_index}" or rows["statistics of"] == f"step {gv.source.step}"
    assert rows["output.0 max / min / mean"] == f"{st['max']:.6g} / {st['min']:.6g} / {st['mean']:.6g}"
    assert rows["output.0 NaN / +Inf / −Inf"] == "0 / 0 / 0"
    assert "input.0 max / min / mean" not in rows


class Log(nn.Module):
    def forward(self, x):
        return torch.log(x)


def test_hover_card_statistics_are_finite_ones_with_nan_counts():
    model = Log()
    dbg = nbdebug.Debugger(model, level="mix")
    try:
        model(torch.tensor([[1.0, -1.0], [2.0, 3.0]]))
        dbg.step()
        rows = dict(GraphView(dbg).card("Torch.log.0.forward")["rows"])
    finally:
        dbg.close()
    finite = torch.log(torch.tensor([1.0, 2.0, 3.0]))
    assert rows["output.0 max / min / mean"] == f"{finite.max():.6g} / {finite.min():.6g} / {finite.mean():.6g}"
    assert rows["output.0 NaN / +Inf / −Inf"] == "1 / 0 / 0"


class Grows(nn.Module):
    """A net that runs one more op from the third step on (a new node while training)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.extra = False

    def forward(self, x):
        y = self.fc(x)
        return torch.tanh(y) if self.extra else y


def test_refresh_sends_a_delta_for_a_new_op_and_marks_only_when_changed():
    torch.manual_seed(0)
    model = Grows()
    dbg = nbdebug.Debugger(model, level="mix")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step():
        opt.zero_grad()
        model(torch.randn(3, 4)).sum().backward()
        opt.step()
    try:
        step()
        gv = GraphView(dbg)
        base, base_marks = recorded(gv, "graph"), recorded(gv, "marks")
        sent = Sent(gv)
        gv.refresh()
        assert sent.msgs == []  # nothing changed: nothing sent
        model.extra = True
        step()
        gv.refresh()
        assert sent.types() == ["delta", "marks"]  # the graph grew; the marks say the new step
        d, m = sent.msgs
        assert (base_marks["step"], m["step"]) == ("step 0", "step 1")  # the step whose data is shown (header)
        gv.refresh()
        assert len(sent.msgs) == 2
        assert d["base"] == base["rev"] and d["rev"] == base["rev"] + 1
        new = [r[0] for r in d["nodes"]]
        assert "Torch.tanh.0.forward" in new and "Torch.tanh.0.backward" in new
        assert set(new) == set(dbg.graph.nodes) - {r[0] for r in base["nodes"]}
        ids = {r[0]: len(base["nodes"]) + i for i, r in enumerate(d["nodes"])}
        e = d["edges"]
        pairs = {(e[i], e[i + 1]) for i in range(0, len(e), 2)}
        assert (gv.feed.ids["Functional.linear.0.forward"], ids["Torch.tanh.0.forward"]) in pairs
        # a later view starts from the whole current graph
        assert recorded(gv, "graph")["rev"] == d["rev"] and len(recorded(gv, "graph")["nodes"]) == len(dbg.graph)
        # a new watchpoint hit: marks, once
        dbg.watch("TL", "Torch.tanh.0.forward", max_gt=-10)
        dbg.recheck()
        gv.refresh()
        gv.refresh()
        assert sent.types() == ["delta", "marks", "marks"]
        assert sent.msgs[-1]["badges"] == {str(ids["Torch.tanh.0.forward"]): "TL"}
        gv.refresh(force=True)
        assert sent.types()[-2:] == ["graph", "marks"]
    finally:
        dbg.close()
    gv.refresh()
    assert gv.widget.status == "closed"


def test_panel_graph_says_when_the_debugger_is_closed():
    torch.manual_seed(0)
    model = Net()
    dbg = nbdebug.Debugger(model, level="mix")
    train_steps(model, 1)
    p = Panel(dbg, recommend=False)
    assert p.graph_view.widget.status == "live"
    dbg.close()
    p.poll()  # what the kernel's poll does every second
    p.flush()
    assert p.graph_view.widget.status == "closed"
    p.close()


def test_failed_training_marks_the_error_node_and_the_nonfinite_path():
    torch.manual_seed(0)
    model = Net()
    dbg = nbdebug.Debugger(model, level="mix")
    try:
        def bad():
            with torch.no_grad():
                model.fc2.weight.fill_(float("inf"))
            y = model(torch.randn(5, 8))
            y.sum().backward()
            torch.mm(y, torch.ones(3, 3))  # fails: shapes do not match
        dbg.watch("TO")
        dbg.run(bad, block=True)
        assert str(dbg.state.value) == "failed"
        gv = GraphView(dbg)
        m = recorded(gv, "marks")
        ids = gv.feed.ids
        rec = dbg.session.recorder.keys or dbg.session.steps[max(dbg.session.steps)].keys
        last = "Torch.mm.0.forward"  # the failing op: its inputs were recorded before it raised
        assert (last, "input.1") in rec and rec[-1][0] == "Input.1"  # ... the last of them an Input node
        assert m["error"] == ids[last] and gv.widget.status == "live"
        origin = dbg.first_nonfinite()
        assert origin is not None and m["path"][0] == ids[origin[0]]
        # the path runs along the data flow from the origin to the latest TO hit it reaches: data-flow edges, or
        # a forward op to its own backward (which computes with the tensors the forward op saved)
        names = [r[0] for r in gv.feed.rows]
        nodes = dbg.graph.nodes
        assert len(m["path"]) > 1
        for a, b in zip(m["path"], m["path"][1:], strict=False):
            assert names[b] in dbg.graph.successors(names[a]) or nodes[names[a]].pair == names[b]
        assert any(nodes[names[i]].section == "forward" for i in m["path"][1:])  # through the forward ops
        end = names[m["path"][-1]]
        assert "TO" in m["badges"][str(m["path"][-1])]
        import networkx as nx

        flow = dbg.graph.to_networkx()
        flow.add_edges_from((n.name, n.pair) for n in dbg.graph if n.section == "forward" and n.pair in nodes)
        reached = nx.descendants(flow, origin[0])
        assert end == [h.node for h in dbg.hits if h.hits and h.node in reached][-1]
    finally:
        dbg.close()


def test_node_list_tree_filters_search_and_reveal(panel, trained):
    nl = panel.node_list
    g = trained.graph
    assert f"{len(g)} nodes" in nl.message.value
    assert "s:forward:block" in nl.row_values and "n:Functional.linear.1.forward" not in nl.row_values
    nl.choose("s:forward:block")
    assert "s:forward:block/lin" in nl.row_values and "forward:block" in nl.expanded
    nl.choose("s:forward:block/lin")
    assert "n:Functional.linear.1.forward" in nl.row_values
    nl.choose("s:forward:block")  # closes block and what was open inside it
    assert "s:forward:block/lin" not in nl.row_values and "forward:block/lin" not in nl.expanded
    nl.choose("s:optimizer:")
    assert "s:optimizer:fc1.weight" not in nl.row_values
    nl.choose("s:optimizer:")
    assert "s:optimizer:fc1.weight" in nl.row_values

    # filters: section and type
    nl.section.value = "backward"
    back = {n.name for n in g if n.section == "backward"}
    assert f"{len(back)} nodes" in nl.message.value
    assert [v for v in nl.row_values if v in ("s:forward:", "s:backward:", "s:optimizer:")] == ["s:backward:"]
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
    assert p.graph_view.widget.status == "offline"
    p.close()


def test_details_links_and_stack(panel, trained):
    panel.select("Functional.linear.3.forward")
    d = panel.details
    producers = [b.description for b in d.producers.children if hasattr(b, "on_click")]
    consumers = [b.description for b in d.consumers.children if hasattr(b, "on_click")]
    g = trained.graph
    # the recorded edges, and the block's box that fc2's input leaves (its call's output edge)
    assert set(producers) == g.predecessors("Functional.linear.3.forward") | {"Module.block.Block.forward.0"}
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


def test_no_plotly_in_the_graph_view(panel):
    from nbdebug.ui.frontend import FrontendWidget

    assert isinstance(panel.graph_view.widget, FrontendWidget)
    assert "plotly" not in open(__import__("nbdebug.ui.graph_view").ui.graph_view.__file__).read()


def gpt2_debugger():
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.utils import logging

    logging.set_verbosity_error()
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=6, n_embd=64, n_head=4, vocab_size=100, n_positions=32))
    dbg = nbdebug.Debugger(model, level="mix")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    for _ in range(2):
        ids = torch.randint(0, 100, (2, 16), generator=g)
        opt.zero_grad()
        model(ids, labels=ids).loss.backward()
        opt.step()
    return dbg, model


def test_gpt2_graph_message_is_small_and_grouped():
    dbg, model = gpt2_debugger()
    try:
        gv = GraphView(dbg)
        msg = recorded(gv, "graph")
        size = len(json.dumps(msg, separators=(",", ":")))
        print(f"GPT-2 (6 layers) at mix: {len(msg['nodes'])} nodes, {len(msg['scopes'])} scopes, "
              f"{len(msg['edges']) // 2} edges, graph message {size / 1e3:.0f} KB of JSON")
        assert len(msg["nodes"]) == len(dbg.graph) > 1200  # optimizer state (moments, step counters) has no Input node
        assert size < 1_000_000
        params = {f"optimizer:{optimizer_scope(n)}" for n, _ in model.named_parameters()}
        scopes = {r[0]: r for r in msg["scopes"]}
        groups = {k: scopes[k][5] for k in params}
        assert {r[0] for r in msg["scopes"] if r[1] == "optimizer:"} == {"optimizer:transformer"}
        assert scopes["optimizer:transformer/h/0/attn/c_attn.weight"][2] == "c_attn.weight"
        opt_total = next(r[5] for r in msg["scopes"] if r[0] == "optimizer:")
        top = sum(1 for r in msg["nodes"] if r[3] == "optimizer:")
        assert top <= 2 and sum(groups.values()) + top == opt_total > 600  # AdamW's ops, as msProbe names them
        assert max(groups.values()) <= 2 * min(groups.values())  # every parameter gets its share of ops
        assert "forward:transformer/h/0/attn" in {r[0] for r in msg["scopes"]}
        # the node list shows the same counts for every scope
        from nbdebug.ui.node_list import NodeList

        nl = NodeList(gv.source)
        nl.expanded.update(r[0] for r in msg["scopes"] if r[0] not in params)  # every scope row, few node rows
        shown = {}
        for section in ("forward", "backward", "optimizer"):  # one at a time: under the list's 1000 rows
            nl.section.value = section
            assert "rows shown" not in nl.message.value
            shown.update({v[2:]: int(re.search(r"\((\d+)\)$", label).group(1))
                          for label, v in nl._rows if v.startswith("s:")})
        assert shown == {r[0]: r[5] for r in msg["scopes"] if r[5]}
    finally:
        dbg.close()
