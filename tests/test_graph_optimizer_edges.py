"""No node of a training step floats apart at L1/mix: the optimizer's step counters and index tensors have edges.

HF GPT-2 for sequence classification (its head picks each row's last token with
``logits[torch.arange(batch), last_non_pad_token]``), trained with real optimizers, on
``dbg.graph.to_networkx()``:

* AdamW's ``state['step'] += 1`` (``Tensor.__iadd__.N``) reads only the optimizer's own state, and its value
  reaches the update as a Python number (``step_t.item()``): no recorded op reads it. It is the tensor the
  optimizer step node shows as slot ``step.{parameter}``, so it has an edge to that slot
  (``Optimizer.AdamW.step.0``), as every state tensor has from the op of the step that wrote it last. Its own
  input (the previous step's count) gets no edge: that would be an edge from the node to itself, and a step's
  graph stays acyclic.
* ``torch.arange`` used as an index of an unrecorded ``__getitem__`` picks the values the loss reads: the
  loss gets an edge from it, as from the indexed logits.
* ``Adam(amsgrad=True)`` runs ``torch.maximum(..., out=t)``: a tensor ``out=`` is recorded (it used to raise
  "Boolean value of Tensor ... is ambiguous" inside the capture).
"""

from __future__ import annotations

import networkx as nx
import pytest
import torch
import transformers  # noqa: E402 - the numpy-2 run leaves this module out (tests/torch_only.py)

import nbdebug

OPTIMIZERS = {
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-3),
    "adamw_foreach": lambda p: torch.optim.AdamW(p, lr=1e-3, foreach=True),
    "adam_amsgrad": lambda p: torch.optim.Adam(p, lr=1e-3, amsgrad=True),
    "sgd_momentum": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
}


def _train(level: str, optimizer: str) -> nx.DiGraph:
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=16, pad_token_id=0,
                                  num_labels=3)
    model = transformers.GPT2ForSequenceClassification(cfg)
    opt = OPTIMIZERS[optimizer](model.parameters())
    ids = torch.randint(1, 100, (2, 8))
    labels = torch.tensor([0, 2])
    with nbdebug.Debugger(model, level=level) as dbg:
        for _ in range(2):
            model(input_ids=ids, labels=labels).loss.backward()
            opt.step()
            opt.zero_grad()
        return dbg.graph.to_networkx()


@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
@pytest.mark.parametrize("level", ["L1", "mix"])
def test_every_node_is_connected_to_the_step(level, optimizer):
    g = _train(level, optimizer)
    assert [n for n in g if g.degree(n) == 0] == []
    parts = sorted(nx.weakly_connected_components(g), key=len)
    assert len(parts) == 1, f"{len(parts)} components; apart from the main one: {parts[:-1]}"
    assert nx.is_directed_acyclic_graph(g)


@pytest.mark.parametrize("level", ["L1", "mix"])
def test_step_counters_feed_the_optimizer_step_slot_they_are(level):
    g = _train(level, "adamw")
    step = "Optimizer.AdamW.step.0"
    counters = [n for n, d in g.nodes(data=True) if d["section"] == "optimizer" and d["op_type"] == "__iadd__"]
    assert len(counters) == len([s for s in g.nodes[step]["shapes"] if s.startswith("parameters.")]) > 0
    for n in counters:
        (slots,) = [g.edges[n, m]["slots"] for m in g.successors(n)]
        assert list(g.successors(n)) == [step] and len(slots) == 1 and slots[0][0] == "output.0"
        assert slots[0][1].startswith("step.")
        assert g.in_degree(n) == 0  # the previous step's count: no edge to itself
    # the moments too: exp_avg's slot comes from the op that updated it last (a lerp_ each)
    moments = {d for s, _ in g.in_edges(step) for _, d in g.edges[s, step]["slots"] if d.startswith("exp_avg.")}
    assert moments == {s for s in g.nodes[step]["shapes"] if s.startswith("exp_avg.")}


@pytest.mark.parametrize("level", ["L1", "mix"])
def test_an_index_arange_reaches_the_loss(level):
    g = _train(level, "adamw")
    aranges = [n for n in g if n.startswith("Torch.arange.")]
    assert aranges and all(g.out_degree(n) > 0 for n in aranges)
    picked = [n for n in aranges if "Functional.cross_entropy.0.forward" in g.successors(n)]
    assert len(picked) == 1  # logits[torch.arange(batch), last_non_pad_token] -> the loss
