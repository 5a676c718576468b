"""The node details' producers and consumers are the graph view's edges, on a whole real model at ``mix``.

A module call (``Module.transformer.h.0.mlp.c_fc.Conv1D.forward.0``) is drawn as its scope's box, and the
graph draws the edges that leave the box from it; its outputs' consumers are recorded as consumers of the
ops inside, so the details used to say "Consumers: none" under a box with an edge out of it.
"""

from __future__ import annotations

import re
from collections import defaultdict

import ipywidgets as w
import pytest
import torch

import nbdebug
from nbdebug.ui.details import MAX_LINKS
from nbdebug.ui.graph_data import ScopeIndex
from nbdebug.ui.panel import Panel

transformers = pytest.importorskip("transformers")

MLP = "Module.transformer.h.0.mlp"


@pytest.fixture(scope="module")
def gpt2_panel():
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=50, n_positions=16,
                                     bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(config)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 50, (2, 8))
    dbg = nbdebug.Debugger(model, level="mix")
    opt.zero_grad()
    model(ids, labels=ids).loss.backward()
    opt.step()
    dbg.step()
    panel = Panel(dbg, recommend=False)
    yield dbg, panel
    panel.close()
    dbg.close()


def _inside(key: str, scope: str) -> bool:
    return key == scope or key.startswith(scope + "/")


def test_details_list_the_edges_the_graph_view_is_sent_for_every_node(gpt2_panel):
    dbg, panel = gpt2_panel
    msg = panel.graph_view.feed.full(dbg.graph)
    names = [row[0] for row in msg["nodes"]]
    out, into = defaultdict(set), defaultdict(set)
    for a, b in zip(msg["edges"][::2], msg["edges"][1::2], strict=True):
        out[names[a]].add(names[b])
        into[names[b]].add(names[a])
    d = panel.details
    assert len(names) > 300
    for name in names:
        d.show(name)
        assert set(d.consumer_names) == out[name], name
        assert set(d.producer_names) == into[name], name
        shown = [b.description for b in d.consumers.children if isinstance(b, w.Button)]
        assert shown == d.consumer_names[:MAX_LINKS], name


def test_a_module_call_consumes_what_leaves_its_box(gpt2_panel):
    """Every module call drawn as its box lists as consumers the nodes at the far end of the edges leaving the
    box (same section), computed here from the recorded edges and the scope keys; GPT-2 calls each module
    once per step, so the call is the box."""
    dbg, panel = gpt2_panel
    g = dbg.graph
    idx = ScopeIndex(g)
    assert idx.calls and all(len(c) == 1 for c in idx.calls.values())
    d = panel.details
    checked = 0
    for key, (call,) in idx.calls.items():
        section = key.split(":", 1)[0]
        leaving = {v for (u, v) in g.edges if u != call and _inside(idx.key_of[u], key)
                   and not _inside(idx.key_of[v], key) and idx.key_of[v].split(":", 1)[0] == section}
        d.show(call)
        assert leaving <= set(d.consumer_names), (call, leaving - set(d.consumer_names))
        assert set(d.consumer_names) == leaving | g.successors(call), call
        checked += bool(leaving)
    assert checked > 20
    d.show(f"{MLP}.c_fc.Conv1D.forward.0")  # the panel's screenshot case: c_fc feeds the activation
    assert f"{MLP}.act.NewGELUActivation.forward.0" in d.consumer_names
    assert not any(isinstance(c, w.HTML) and "none" in c.value for c in d.consumers.children)
    assert re.search(r"class='nbdebug-details-flow'[^>]*>to \S+ input\.0", d.table.value)  # output.0's flow
    d.show(f"{MLP}.GPT2MLP.forward.0")  # the MLP's output goes into the block's residual add
    assert d.consumer_names and all(not n.startswith(f"{MLP}.") for n in d.consumer_names), d.consumer_names
