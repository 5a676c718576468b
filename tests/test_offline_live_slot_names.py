"""A notebook written against a live Debugger reads the dump of that run with the same (node, slot) names.

The dump keeps msProbe's layout — ``F.layer_norm``'s weight is ``input.2`` (the caller passed it by position;
PyTorch hands it to ``__torch_function__`` by keyword, so live it is ``input.weight``), a dict output is
``output.0.last_hidden_state`` (live ``output.last_hidden_state``) — and the offline session accepts the live
name as an alias of the dumped slot: ``stats``, ``tensor``, ``timeline``, compare rows, and the slots of hits
and ``first_nonfinite`` (dump names) read back either way. Real HF GPT-2 from a config, 2 layers, d=32,
AdamW, dumped by the Debugger at L1 and mix.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers  # noqa: E402 - the numpy-2 run leaves this module out (tests/torch_only.py)

import nbdebug
from nbdebug.session.dump_session import slot_aliases

STEPS = 2
LN = "Functional.layer_norm.0.forward"
TOP = "Module.transformer.GPT2Model.forward.0"
WATCHED = [TOP, "Functional.layer_norm.*"]


def _run(level: str, dump_dir: str, nan_last: bool = False):
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=16)
    model = transformers.GPT2LMHeadModel(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 100, (2, 8))
    dbg = nbdebug.Debugger(model, level=level, dump_dir=dump_dir, task="tensor")
    dbg.watch("TL", nodes=WATCHED, max_gt=0.0)
    for i in range(STEPS):
        if nan_last and i == STEPS - 1:
            with torch.no_grad():
                model.transformer.ln_f.weight[0] = float("nan")
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
    return dbg


def _close(a, b) -> bool:
    return a is None or b is None or bool(np.isclose(a, b, rtol=1e-4, atol=1e-6, equal_nan=True))


@pytest.fixture(scope="module", params=["L1", "mix"])
def run(request, tmp_path_factory):
    d = str(tmp_path_factory.mktemp(f"dump_{request.param}"))
    dbg = _run(request.param, d)
    off = nbdebug.load(d, warn=False)
    yield request.param, dbg, off
    dbg.close()


def test_every_live_slot_with_a_dump_entry_reads_back_by_its_live_name(run):
    level, dbg, off = run
    last = STEPS - 1
    dumped = {n for n, _ in off.session.table(last).keys}
    live = [(n, s) for n, s in dbg.session.table(last).keys if n in dumped]
    renamed = [(n, s) for n, s in live if (n, s) not in off.session.table(last).index]
    # the two kinds of difference are there (else this test would prove nothing)
    assert (LN, "input.weight") in renamed and (LN, "input.bias") in renamed
    if level == "mix":
        assert (TOP, "output.last_hidden_state") in renamed
    bad = []
    for n, s in live:
        want, got = dbg.stats(n, s, last), off.stats(n, s, last)
        if tuple(got["shape"]) != tuple(want["shape"]) or got["count"] != want["count"] or \
                not all(_close(got[f], want[f]) for f in ("max", "min", "mean", "norm")):
            bad.append((n, s, want, got))
    assert not bad, bad[:2]
    # the live name and the dump's are one slot: the same row, the same value
    assert off.slot_names(LN, "input.weight") == off.slot_names(LN, "input.2") == ("input.2", "input.weight")
    assert off.stats(LN, "input.weight", last) == off.stats(LN, "input.2", last)
    w = off.tensor(LN, "input.weight", last)
    assert np.array_equal(w, off.tensor(LN, "input.2", last)) and w.shape == (32,)
    assert float(w.max()) == pytest.approx(dbg.stats(LN, "input.weight", last)["max"])
    assert off.session.timeline(LN, "input.bias", "norm") == off.session.timeline(LN, "input.3", "norm")
    if level == "mix":
        h = off.tensor(TOP, "output.last_hidden_state", last)
        assert h.shape == (2, 8, 32) and np.array_equal(h, off.tensor(TOP, "output.0.last_hidden_state", last))


def test_the_live_debugger_answers_to_the_dumps_slot_names(run):
    """The other way round: a notebook written against a dump (``input.2``, ``output.0.last_hidden_state``)
    reads the same tensors from a live Debugger, whose names for them are ``input.weight`` and
    ``output.last_hidden_state``; a name that is neither still raises KeyError naming the node's slots."""
    level, dbg, off = run
    last = STEPS - 1
    assert (LN, "input.2") not in dbg.session.table(last).index  # the live session has another name for it
    assert dbg.stats(LN, "input.2", last) == dbg.stats(LN, "input.weight", last)
    assert dbg.session.timeline(LN, "input.3", "norm") == dbg.session.timeline(LN, "input.bias", "norm")
    assert off.stats(LN, "input.2", last)["max"] == pytest.approx(dbg.stats(LN, "input.2", "current")["max"])
    w = dbg.tensor(LN, "input.2")
    assert w.shape == (32,) and np.array_equal(w, dbg.tensor(LN, "input.weight"))
    if level == "mix":
        h = dbg.tensor(TOP, "output.0.last_hidden_state")
        assert h.shape == (2, 8, 32) and np.array_equal(h, dbg.tensor(TOP, "output.last_hidden_state"))
    with pytest.raises(KeyError, match="has no slot 'input.9'"):
        dbg.stats(LN, "input.9", last)


def test_hits_and_compare_rows_read_back_by_either_name(run):
    level, dbg, off = run
    last = STEPS - 1
    off.watch("TL", nodes=WATCHED, max_gt=0.0)
    live = {(h.node, h.slot) for h in dbg.hits if h.step == last}
    offline = {(h.node, h.slot) for h in off.hits if h.step == last}
    assert offline and {(n, off.session.slot_of(n, s)) for n, s in live if n in off.graph} == offline
    named = {(node, a) for node, slot in offline for a in off.slot_names(node, slot)}
    assert len(live & named) == len(live)  # every live hit, by its live name
    for n, s in live:
        assert off.stats(n, s, last)["max"] == pytest.approx(dbg.stats(n, s, last)["max"], rel=1e-5)
    res = nbdebug.compare(off.path, off.path, step=last)
    assert res.row(LN, "input.weight") is res.row(LN, "input.2")
    if level == "mix":
        assert res.row(TOP, "output.last_hidden_state") is res.row(TOP, "output.0.last_hidden_state")
    # the live run against its own dump, both ways: the renamed slots pair, and agree
    for target, golden in ((dbg, off), (off, dbg)):
        res = nbdebug.compare(target, golden, step=last)
        row = res.row(LN, "input.weight")
        assert {row.slot, row.golden_slot} == {"input.weight", "input.2"} and row.status == "pass"
        if level == "mix":
            row = res.row(TOP, "output.last_hidden_state")
            assert row.status == "pass" and {row.slot, row.golden_slot} == {"output.0.last_hidden_state",
                                                                             "output.last_hidden_state"}
        half = [(r.target, r.golden, r.slot) for r in res.rows if r.status == "unmatched" and r.matched_by]
        assert half == []  # every slot of a paired node has its counterpart


def test_a_nan_weight_reads_back_offline_by_the_live_names(tmp_path):
    """A NaN put into the final LayerNorm's weight (mix): the dump's first non-finite origin is the live one,
    and the NaN shows offline under the live names of the slots it reaches (the weight argument of
    ``F.layer_norm``, the dict output of the model body)."""
    dbg = _run("mix", str(tmp_path), nan_last=True)
    off = nbdebug.load(str(tmp_path), warn=False)
    step = STEPS - 1
    assert off.first_nonfinite() == dbg.first_nonfinite() == ("Parameter.transformer.ln_f.weight", "output.0", step)
    ln_f = [n for n, s in dbg.session.table(step).keys if n.startswith("Functional.layer_norm.") and
            s == "input.weight" and np.isnan(dbg.stats(n, s, step)["max"])]
    assert len(ln_f) == 1
    for node, slot in ((ln_f[0], "input.weight"), (TOP, "output.last_hidden_state")):
        assert dbg.stats(node, slot, step)["nan_count"] > 0 and off.stats(node, slot, step)["nan_count"] > 0
        assert np.isnan(off.tensor(node, slot, step)).any()
    dbg.close()


def test_slot_aliases_resolve_one_way_each():
    """Each name has at most one alias; a name the dump has is itself; a name neither the dump nor an alias
    has is refused with the node's slots."""
    ps = ("input", "normalized_shape", "weight", "bias", "eps")
    assert slot_aliases("input.weight", ps) == ["input.2"] and slot_aliases("input.9", ps) == []
    assert slot_aliases("input.weight") == [] and slot_aliases("output.1") == [] and slot_aliases("output.0.0") == []
    s = nbdebug.offline.DumpSession(framework="pytorch")
    s.api_parameters = lambda node: ps if node == LN else None
    s.graph.add_node(TOP, kind="module", op_type="GPT2Model").shapes.update({"output.0.a": (1,), "output.1": (1,)})
    s.graph.add_node(LN, kind="op", op_type="layer_norm").shapes.update({"input.0": (1,), "input.2": (1,),
                                                                          "input.bias": (1,)})
    assert [s.slot_of(TOP, x) for x in ("output.a", "output.0.a", "output.1")] == ["output.0.a", "output.0.a",
                                                                                   "output.1"]
    assert [s.slot_of(LN, x) for x in ("input.weight", "input.3", "input.bias", "input.input")] == \
        ["input.2", "input.bias", "input.bias", "input.0"]
    assert s.slot_names(LN, "input.3") == ("input.bias", "input.3")
    with pytest.raises(KeyError, match="has no slot 'output.b'"):
        s.slot_names(TOP, "output.b")
