"""Graph structure of known models, stable names, sections, networkx export."""

import networkx as nx
import pytest
import torch
import torch.nn as nn
from conftest import train_steps

import nbdebug


def test_mlp_edges_follow_data_flow_L0():
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    with nbdebug.Debugger(mlp, level="L0") as dbg:
        train_steps_mlp(mlp)
        g = dbg.graph.to_networkx()
    assert g.has_edge("Input.0", "Module.0.Linear.forward.0")
    assert g.has_edge("Module.0.Linear.forward.0", "Module.1.ReLU.forward.0")
    assert g.has_edge("Module.1.ReLU.forward.0", "Module.2.Linear.forward.0")
    assert g.has_edge("Parameter.0.weight", "Module.0.Linear.forward.0")
    assert g.has_edge("Parameter.2.bias", "Module.2.Linear.forward.0")
    assert not g.has_edge("Module.0.Linear.forward.0", "Module.2.Linear.forward.0")
    attrs = g.nodes["Module.1.ReLU.forward.0"]
    assert attrs["op_type"] == "ReLU" and attrs["kind"] == "module" and attrs["section"] == "forward"
    assert attrs["shapes"]["output.0"] == (3, 8)
    assert g.nodes["Parameter.0.weight"]["kind"] == "parameter"
    assert g.nodes["Input.0"]["kind"] == "input"


def train_steps_mlp(mlp, steps=2):
    opt = torch.optim.SGD(mlp.parameters(), lr=0.1)
    for _ in range(steps):
        opt.zero_grad()
        mlp(torch.randn(3, 4)).pow(2).mean().backward()
        opt.step()


def test_mlp_edges_L1():
    mlp = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    with nbdebug.Debugger(mlp, level="L1") as dbg:
        train_steps_mlp(mlp)
        g = dbg.graph.to_networkx()
    assert list(g.successors("Functional.linear.0.forward")) == ["Functional.relu.0.forward"]
    assert g.has_edge("Functional.relu.0.forward", "Functional.linear.1.forward")
    assert g.has_edge("Functional.linear.1.forward", "Tensor.pow.0.forward")
    assert g.nodes["Functional.relu.0.forward"]["scope"] == "1"
    assert g.nodes["Functional.linear.1.forward"]["scope"] == "2"
    assert nx.is_directed_acyclic_graph(g)


def test_residual_skip_edge_reuse_and_inplace_mix(net):
    with nbdebug.Debugger(net, level="mix") as dbg:
        train_steps(net, steps=2)
        g = dbg.graph.to_networkx()
    # the Linear inside the block is called twice: two calls, two names, one parameter node
    assert "Module.block.lin.Linear.forward.0" in g and "Module.block.lin.Linear.forward.1" in g
    assert g.has_edge("Parameter.block.lin.weight", "Functional.linear.1.forward")
    assert g.has_edge("Parameter.block.lin.weight", "Functional.linear.2.forward")
    assert g.has_edge("Functional.linear.1.forward", "Functional.linear.2.forward")
    # residual: the block input (relu output) reaches the add directly — the skip edge
    assert g.has_edge("Functional.relu.0.forward", "Tensor.__add__.0.forward")
    assert g.has_edge("Functional.linear.2.forward", "Tensor.__add__.0.forward")
    # in-place add_ sits between linear and relu
    assert g.has_edge("Functional.linear.0.forward", "Tensor.add_.0.forward")
    assert g.has_edge("Tensor.add_.0.forward", "Functional.relu.0.forward")
    assert g.nodes["Tensor.add_.0.forward"]["op_type"] == "add_"
    assert g.nodes["Functional.linear.1.forward"]["scope"] == "block/lin"


def test_sections_backward_and_optimizer_present(net):
    with nbdebug.Debugger(net, level="mix") as dbg:
        train_steps(net, steps=1)
        sections = {n.section for n in dbg.graph}
        assert sections == {"forward", "backward", "optimizer"}
        assert dbg.graph["Functional.linear.0.backward"].section == "backward"
        assert dbg.graph["Module.fc1.Linear.backward.0"].section == "backward"
        assert dbg.graph["Module.fc1.Linear.parameters_grad.0"].section == "backward"
        assert dbg.graph["Optimizer.SGD.step.0"].section == "optimizer"
        opt_ops = [n.name for n in dbg.graph if n.section == "optimizer" and n.name.startswith("Tensor.")]
        assert len(opt_ops) == 6  # SGD updates each of the 6 parameters in place
        grad = dbg.stats("Module.fc1.Linear.parameters_grad.0", "weight", step=0)
        assert grad["shape"] == (16, 8)
        # backward of an op: input = gradient of its output, output = gradients of its inputs
        gin = dbg.stats("Functional.linear.3.backward", "input.0", step=0)
        assert gin["shape"] == (5, 4)
        order = [n.name for n in dbg.graph.in_order()]
        assert order.index("Functional.linear.0.forward") < order.index("Functional.linear.0.backward") \
            < order.index("Optimizer.SGD.step.0")


@pytest.mark.parametrize("level", ["L0", "L1", "mix"])
def test_names_stable_across_steps(net, level):
    with nbdebug.Debugger(net, level=level) as dbg:
        train_steps(net, steps=3)
        keys = [set(dbg.session.steps[i].keys) for i in range(3)]
    assert keys[0] == keys[1] == keys[2]
    assert len(keys[0]) > 20


def test_module_names_follow_msprobe(net):
    with nbdebug.Debugger(net, level="L0") as dbg:
        train_steps(net, steps=1)
        names = set(dbg.graph.nodes)
    assert {"Module.fc1.Linear.forward.0", "Module.fc1.Linear.backward.0",
            "Module.block.lin.Linear.forward.1", "Module.fc2.Linear.parameters_grad.0"} <= names
    assert dbg.stats("Module.fc1.Linear.forward.0", "parameters.weight", step=0)["shape"] == (16, 8)


def test_op_names_follow_msprobe(net):
    with nbdebug.Debugger(net, level="L1") as dbg:
        train_steps(net, steps=1)
        names = set(dbg.graph.nodes)
    assert {"Functional.linear.3.forward", "Tensor.add_.0.forward", "Functional.mse_loss.0.forward",
            "Functional.mse_loss.0.backward"} <= names
    assert "Torch.zeros.0.forward" not in names  # not in msProbe's support list: it records no torch.zeros


def test_scope_tree_from_module_nesting(net):
    with nbdebug.Debugger(net, level="mix") as dbg:
        train_steps(net, steps=1)
        tree = dbg.graph.scope_tree()
    assert "Functional.linear.1.forward" in tree["block"]["lin"]["__nodes__"]
    assert "Module.block.lin.Linear.forward.0" in tree["block"]["__nodes__"]


def test_stack_recorded_where_called(net):
    with nbdebug.Debugger(net, level="L1") as dbg:
        train_steps(net, steps=1)
        stack = dbg.graph["Tensor.add_.0.forward"].stack
    assert any("conftest.py" in frame and "forward" in frame for frame in stack)
