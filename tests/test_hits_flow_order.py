"""A step's hit list leads with where the NaN was born: hits are in data-flow order, the origin's first and
marked (``HitRecord.origin``), although the origin — a module computing the NaN itself before calling a
child — completes after that child (execution order would list the child first)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import nbdebug


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wo = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.wo(torch.log(x - 10.0))  # NaN made here, by an op L0 does not record


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = Attention()
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.attn(x))


@pytest.mark.parametrize("level", ["L0", "mix"])
def test_torch_hits_lead_with_the_origin(level):
    torch.manual_seed(0)
    model = Block()
    with nbdebug.Debugger(model, level=level) as dbg:
        dbg.watch("TO")
        model(torch.rand(3, 4)).sum().backward()
        dbg.step()
        origin = dbg.first_nonfinite(0)
        hits = [h for h in dbg.hits if h.hits]
        expected = "Module.attn.Attention.forward.0" if level == "L0" else "Torch.log.0.forward"
        assert origin is not None and origin[0] == expected
        assert hits[0].node == origin[0] and hits[0].origin
        assert not any(h.origin for h in hits if h.node != origin[0])
        # the one the panel pauses on / selects: the lowest order of the step
        assert min(hits, key=lambda h: h.order).node == origin[0]
        # the rest follow the data flow: a node's hits come after those of every hit node upstream of it
        import networkx as nx

        g = dbg.graph.to_networkx()
        pos = {h.node: i for i, h in reversed(list(enumerate(hits)))}
        for a in pos:
            for b in pos:
                if a != b and nx.has_path(g, a, b) and not nx.has_path(g, b, a):
                    assert pos[a] < pos[b], (a, b)


def test_in_flow_order_without_an_origin_keeps_data_flow():
    from nbdebug.session.graph import Graph
    from nbdebug.watch.flow import in_flow_order
    from nbdebug.watch.watchpoints import HitRecord

    g = Graph()
    for i, n in enumerate(("child", "parent", "next")):
        g.add_node(n, kind="op", op_type=n).order = i
    g.add_edge("parent", "child")
    g.add_edge("child", "next")
    recs = [HitRecord(1, "TL", n, "output.0", 0, g.nodes[n].order, (), None, (), "") for n in ("child", "parent")]
    out = in_flow_order(g, recs, None)
    assert [r.node for r in out] == ["parent", "child"] and [r.order for r in out] == [0, 1]
    assert not any(r.origin for r in out)


def test_mindspore_pynative_l0_hits_lead_with_the_origin():
    ms_fixtures = pytest.importorskip("ms_fixtures")
    ms, mnn, ops = ms_fixtures.ms, ms_fixtures.nn, ms_fixtures.ops
    ms.set_context(mode=ms.PYNATIVE_MODE)

    class MsAttention(mnn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.wo = mnn.Dense(4, 4)

        def construct(self, x):
            return self.wo(ops.log(x - 10.0))

    class MsBlock(mnn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.attn = MsAttention()
            self.head = mnn.Dense(4, 2)

        def construct(self, x):
            return self.head(self.attn(x))

    ms.set_seed(0)
    net = MsBlock()
    dbg = nbdebug.Debugger(net, level="L0")
    try:
        dbg.watch("TO")
        x = ms.Tensor(ms_fixtures.np.random.default_rng(0).random((3, 4)).astype("float32"))
        net(x)
        dbg.step()
        origin = dbg.first_nonfinite(0)
        hits = [h for h in dbg.hits if h.hits]
        assert origin is not None and origin[0] == "Cell.attn.MsAttention.forward.0"
        assert hits[0].node == origin[0] and hits[0].origin
        assert hits[1].node == "Cell.attn.wo.Dense.forward.0"
    finally:
        dbg.close()
