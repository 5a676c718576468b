"""Forward → loss → backward → optimizer is one flow in the captured graph (HF GPT-2 computing its own loss).

The invariant, at L0, L1 and mix, on ``dbg.graph.to_networkx()`` after training steps:

1. every node lies in ONE weakly connected component (the optimizer's state slots, AdamW's step counters
   included, have an edge from the op of the step that wrote them last);
2. there is a directed path model input → loss → the loss's backward → a ``parameters_grad`` → the
   optimizer step (at L0 the loss is computed by functions inside the unnamed root module: the path runs
   through ``lm_head``'s forward and backward instead);
3. every backward node has an edge in;
4. the labels are ONE top-level ``Input`` node (the root's argument), the one the loss reads (through
   HF's ``pad``): no second Input appears for them, and ``pad``'s output reaches the loss.
"""

from __future__ import annotations

import networkx as nx
import pytest
import torch
import transformers  # noqa: E402 - the numpy-2 run leaves this module out (tests/torch_only.py)

import nbdebug


def _train(level: str, same_tensor: bool) -> nx.DiGraph:
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=16)
    model = transformers.GPT2LMHeadModel(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 100, (2, 8))
    labels = ids if same_tensor else torch.randint(0, 100, (2, 8))
    with nbdebug.Debugger(model, level=level) as dbg:
        for _ in range(2):
            model(input_ids=ids, labels=labels).loss.backward()
            opt.step()
            opt.zero_grad()
        return dbg.graph.to_networkx()


@pytest.mark.parametrize("level", ["L0", "L1", "mix"])
def test_forward_loss_backward_optimizer_is_one_flow(level):
    g = _train(level, same_tensor=False)
    parts = sorted(nx.weakly_connected_components(g), key=len)
    assert len(parts) == 1, f"{len(parts)} components; apart from the main one: {parts[:-1]}"

    unfed = [n for n, d in g.nodes(data=True) if d["section"] == "backward" and g.in_degree(n) == 0]
    assert unfed == []

    loss = "Module.lm_head.Linear.forward.0" if level == "L0" else "Functional.cross_entropy.0.forward"
    loss_bwd = "Module.lm_head.Linear.backward.0" if level == "L0" else "Functional.cross_entropy.0.backward"
    opt = next(n for n in g if n.startswith("Optimizer.AdamW.step."))
    pgrad = "Module.transformer.wpe.Embedding.parameters_grad.0"
    assert nx.has_path(g, "Input.0", loss)
    assert g.has_edge(loss, loss_bwd) or nx.has_path(g, loss, loss_bwd)
    assert nx.has_path(g, loss_bwd, pgrad)
    assert nx.has_path(g, pgrad, opt)
    # the whole chain: input → loss → backward → the gradient of the first layer → the optimizer
    assert nx.has_path(g, "Input.0", opt)


@pytest.mark.parametrize("level", ["L1", "mix"])
@pytest.mark.parametrize("same_tensor", [False, True])
def test_labels_are_the_input_the_loss_reads(level, same_tensor):
    g = _train(level, same_tensor)
    top_inputs = sorted(n for n, d in g.nodes(data=True) if d["kind"] == "input" and d["scope"] == "")
    assert len(top_inputs) == (1 if same_tensor else 2) and "Input.0" in top_inputs  # numbered by first use
    labels = next((n for n in top_inputs if n != "Input.0"), "Input.0")
    loss = "Functional.cross_entropy.0.forward"
    assert "Functional.pad.0.forward" in g.successors(labels)
    assert nx.has_path(g, "Functional.pad.0.forward", loss)
    # the loss's inputs come from the logits and the labels, nothing made up on the way
    assert {n for n in nx.ancestors(g, loss) if g.nodes[n]["kind"] == "input" and g.nodes[n]["scope"] == ""} \
        == set(top_inputs)


@pytest.mark.parametrize("level", ["L1", "mix"])
def test_the_torch_statistics_fallback_draws_the_same_graph(level, monkeypatch):
    """Without the native kernel (a machine with no compiler) the statistics are torch ops; at L1/mix an
    op mode is on, and those ops must not be recorded: the graph is node for node and edge for edge the one
    the native kernel gives (it had ~600 extra ``Input`` nodes feeding the statistics' own ``stack``)."""
    import nbdebug.frameworks.torch.stats as stats

    native = _train(level, same_tensor=False)
    monkeypatch.setattr(stats, "_fastats", None)
    fallback = _train(level, same_tensor=False)
    assert sorted(fallback.nodes) == sorted(native.nodes)
    assert sorted(fallback.edges) == sorted(native.edges)
