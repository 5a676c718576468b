"""The highlighted NaN path follows the data the NaN poisoned: from a NaN weight through the forward ops,
the loss and the backward ops to its gradient and the optimizer — not the shortcut weight → gradient."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import nbdebug
from nbdebug.ui.graph_view import GraphView


@pytest.mark.parametrize("level", ["L1", "mix"])
def test_a_nan_weight_path_runs_through_the_forward_pass(level):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with nbdebug.Debugger(model, level=level) as dbg:
        dbg.watch("TO")
        with torch.no_grad():
            model[2].weight[0, 0] = float("nan")
        model(torch.randn(3, 4)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        origin = dbg.first_nonfinite(0)
        assert origin is not None and origin[0] == "Parameter.2.weight"
        gv = GraphView(dbg)
        ids = gv.feed.ids
        names = {i: n for n, i in ids.items()}
        m = next(msg for msg in gv.widget.recorded() if msg["type"] == "marks")
        path = [names[i] for i in m["path"]]
        assert path[0] == origin[0]
        g = dbg.graph
        for a, b in zip(path, path[1:], strict=False):  # an edge, or a forward op to its own backward
            assert b in g.successors(a) or (g.nodes[a].pair == b and g.nodes[a].section == "forward"), (a, b)
        sections = [g.nodes[n].section for n in path[1:]]
        # weight → forward ops it poisoned → (loss) → backward → … → optimizer, in that order
        assert sections[0] == "forward", path
        assert "backward" in sections and sections[-1] == "optimizer", path
        assert sections.index("backward") > sections.index("forward")
        assert path[-1] in {h.node for h in dbg.hits if h.hits}  # the latest hit the NaN reaches

