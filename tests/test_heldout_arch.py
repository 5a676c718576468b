"""HuggingFace architectures outside the zoo nbdebug was built against, tried as an outside user would.

Tiny random-weight models built from ``transformers`` configs (nothing downloaded): MoE routing (Mixtral,
Qwen2-MoE — ``topk``, ``sort``/``histc`` and the grouped expert matmul ``F.grouped_mm`` that nbdebug, like
msProbe, does not record; PhiMoE adds a custom
``torch.autograd.Function`` in its router), DeBERTa-v2 (relative-position attention with ``gather``),
Gemma, Falcon, Whisper (conv1d + encoder/decoder), Wav2Vec2 (conv feature extractor, GroupNorm,
weight-normed positional conv, CTC loss), Swin (``torch.roll``, window partition), ConvNeXt
(channels-first LayerNorm, depthwise conv) and CLIP (two towers and a contrastive loss, a parameter of the
root module). For each, two AdamW steps at L0, L1 and mix:

- training is unchanged: the losses, and the model after training, bitwise those of an undebugged run;
- every (node, slot) of every step: ``tensor()`` has the statistics ``stats()`` shows, or raises
  :class:`NotRetainedError` with a reason (``check_step`` of ``test_invariant_models``);
- the graph exports consistently and no backward node floats apart (each has a predecessor);
- a NaN written into one weight before the second step: ``first_nonfinite`` names that weight's
  ``Parameter`` node, a forward consumer of it computes a NaN, and (where ops are recorded: L1, mix) the
  forward data flow leads from it to the model's head;
- a ``statistics`` dump at mix loads back with the live session's nodes (those msProbe's layout keeps) and
  their statistics.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch
from test_invariant_models import check_step

import nbdebug

LEVELS = ("L0", "L1", "mix")
STEPS = 2
VOCAB = 64


@dataclass
class Case:
    model: torch.nn.Module
    batches: list[Any]
    loss: Any  # (model, batch) -> loss
    nan_param: str  # a weight that gets a NaN in test_a_nan_weight_is_where_the_nonfinite_starts
    head: str  # the module path of the model's head: a NaN anywhere upstream reaches it


def _ids(g: torch.Generator) -> list[torch.Tensor]:
    return [torch.randint(0, VOCAB, (2, 8), generator=g) for _ in range(STEPS)]


def _lm(m, b):
    return m(input_ids=b, labels=b).loss


_DECODER = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=64)


def _mixtral(T, g):
    cfg = T.MixtralConfig(**_DECODER, intermediate_size=32, num_local_experts=2, num_experts_per_tok=1,
                          output_router_logits=True, router_aux_loss_coef=0.02)
    return Case(T.MixtralForCausalLM(cfg), _ids(g), _lm, "model.layers.0.mlp.experts.gate_up_proj", "lm_head")


def _qwen2_moe(T, g):
    cfg = T.Qwen2MoeConfig(**_DECODER, intermediate_size=32, moe_intermediate_size=16,
                           shared_expert_intermediate_size=16, num_experts=2, num_experts_per_tok=1,
                           output_router_logits=True)
    return Case(T.Qwen2MoeForCausalLM(cfg), _ids(g), _lm, "model.layers.0.mlp.experts.down_proj", "lm_head")


def _phimoe(T, g):
    cfg = T.PhimoeConfig(**_DECODER, intermediate_size=32, num_local_experts=2, num_experts_per_tok=2,
                         attention_dropout=0.0, input_jitter_noise=0.0, router_jitter_noise=0.0)
    return Case(T.PhimoeForCausalLM(cfg), _ids(g), _lm, "model.layers.0.self_attn.v_proj.weight", "lm_head")


def _deberta_v2(T, g):
    cfg = T.DebertaV2Config(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                            intermediate_size=64, max_position_embeddings=64, relative_attention=True,
                            pos_att_type=["p2c", "c2p"], position_buckets=8, max_relative_positions=16,
                            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return Case(T.DebertaV2ForMaskedLM(cfg), _ids(g), _lm,
                "deberta.encoder.layer.0.attention.self.value_proj.weight", "cls")


def _gemma(T, g):
    cfg = T.GemmaConfig(**{**_DECODER, "num_attention_heads": 2, "num_key_value_heads": 1}, head_dim=16,
                        intermediate_size=64)
    return Case(T.GemmaForCausalLM(cfg), _ids(g), _lm, "model.layers.0.mlp.up_proj.weight", "lm_head")


def _falcon(T, g):
    cfg = T.FalconConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                         hidden_dropout=0.0, attention_dropout=0.0, max_position_embeddings=64)
    return Case(T.FalconForCausalLM(cfg), _ids(g), _lm,
                "transformer.h.0.mlp.dense_h_to_4h.weight", "lm_head")


def _whisper(T, g):
    cfg = T.WhisperConfig(vocab_size=VOCAB, num_mel_bins=8, d_model=32, encoder_layers=1, decoder_layers=1,
                          encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
                          decoder_ffn_dim=64, max_source_positions=16, max_target_positions=16, pad_token_id=0,
                          bos_token_id=1, eos_token_id=2, decoder_start_token_id=1, suppress_tokens=None,
                          begin_suppress_tokens=None, dropout=0.0)
    batches = [(torch.randn(2, 8, 32, generator=g), torch.randint(3, VOCAB, (2, 6), generator=g))
               for _ in range(STEPS)]
    return Case(T.WhisperForConditionalGeneration(cfg), batches,
                lambda m, b: m(input_features=b[0], labels=b[1]).loss, "model.encoder.conv2.weight", "proj_out")


def _wav2vec2(T, g):
    cfg = T.Wav2Vec2Config(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                           intermediate_size=64, conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3),
                           num_conv_pos_embeddings=8, num_conv_pos_embedding_groups=4, hidden_dropout=0.0,
                           activation_dropout=0.0, attention_dropout=0.0, feat_proj_dropout=0.0, final_dropout=0.0,
                           layerdrop=0.0,
                           mask_time_prob=0.0, ctc_loss_reduction="mean", pad_token_id=0,
                           do_stable_layer_norm=False, feat_extract_norm="group")
    batches = [(torch.randn(2, 400, generator=g), torch.randint(1, VOCAB, (2, 5), generator=g))
               for _ in range(STEPS)]
    return Case(T.Wav2Vec2ForCTC(cfg), batches, lambda m, b: m(input_values=b[0], labels=b[1]).loss,
                "wav2vec2.feature_extractor.conv_layers.1.conv.weight", "lm_head")


def _images(g, classes=5):
    return [(torch.randn(2, 3, 16, 16, generator=g), torch.randint(0, classes, (2,), generator=g))
            for _ in range(STEPS)]


def _classify(m, b):
    return m(pixel_values=b[0], labels=b[1]).loss


def _swin(T, g):
    cfg = T.SwinConfig(num_labels=5, image_size=16, patch_size=2, embed_dim=16, depths=[1, 1], num_heads=[2, 2],
                       window_size=4, drop_path_rate=0.0, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return Case(T.SwinForImageClassification(cfg), _images(g), _classify,
                "swin.encoder.layers.0.blocks.0.attention.relative_position_bias.relative_position_bias_table",
                "classifier")


def _convnext(T, g):
    cfg = T.ConvNextConfig(num_labels=5, hidden_sizes=[8, 16], depths=[1, 1], num_stages=2, patch_size=2,
                           drop_path_rate=0.0)
    return Case(T.ConvNextForImageClassification(cfg), _images(g), _classify,
                "convnext.encoder.stages.0.layers.0.dwconv.weight", "classifier")


def _clip(T, g):
    text = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                max_position_embeddings=16, bos_token_id=0, eos_token_id=2, pad_token_id=1)
    vision = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                  image_size=16, patch_size=8)
    cfg = T.CLIPConfig(text_config=text, vision_config=vision, projection_dim=16)
    batches = [(torch.randint(3, VOCAB, (3, 8), generator=g), torch.randn(3, 3, 16, 16, generator=g))
               for _ in range(STEPS)]
    return Case(T.CLIPModel(cfg), batches,
                lambda m, b: m(input_ids=b[0], pixel_values=b[1], return_loss=True).loss,
                "vision_model.encoder.layers.0.mlp.fc1.weight", "visual_projection")


ARCHS = {"mixtral": _mixtral, "qwen2_moe": _qwen2_moe, "phimoe": _phimoe, "deberta_v2": _deberta_v2,
         "gemma": _gemma, "falcon": _falcon, "whisper": _whisper, "wav2vec2": _wav2vec2, "swin": _swin,
         "convnext": _convnext, "clip": _clip}


def build(kind: str) -> Case:
    import transformers

    torch.manual_seed(0)
    case = ARCHS[kind](transformers, torch.Generator().manual_seed(1))
    case.model.train()
    return case


def train(case: Case, model: torch.nn.Module, after_step=None) -> list[torch.Tensor]:
    torch.manual_seed(1234)  # a model that draws random numbers (PhiMoE's Gumbel noise) draws the same ones
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for i, b in enumerate(case.batches):
        opt.zero_grad()
        loss = case.loss(model, b)
        loss.backward()
        opt.step()
        losses.append(loss.detach().clone())
        if after_step is not None:
            after_step(i)
    return losses


def forward_reach(graph: Any, start: str) -> set[str]:
    """Nodes reachable from ``start`` along data-flow edges between forward-section nodes."""
    seen, todo = {start}, [start]
    while todo:
        for nxt in graph.successors(todo.pop()):
            if nxt not in seen and graph[nxt].section == "forward":
                seen.add(nxt)
                todo.append(nxt)
    return seen


def in_module(node: Any, path: str) -> bool:
    """``node`` is module ``path``'s call or an op inside it."""
    scope = path.replace(".", "/")
    return node.name.startswith(f"Module.{path}.") or node.scope == scope or node.scope.startswith(scope + "/")


# -- the invariant ----------------------------------------------------------------------------------
@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("kind", ARCHS)
def test_training_unchanged_and_values_shown_are_values_used(kind, level):
    case = build(kind)
    plain = copy.deepcopy(case.model)
    want = train(case, plain)
    counts = []
    with nbdebug.Debugger(case.model, level=level) as dbg:
        def after(i):
            counts.append(check_step(dbg, i))
            if i:
                check_step(dbg, i - 1)  # the previous step's values, after one more step

        got = train(case, case.model, after)
        graph = dbg.graph
        g = graph.to_networkx()
        assert set(g.nodes) == set(graph.nodes)
        assert set(g.edges) == set(graph.edges)
        floating = [n.name for n in graph if n.section == "backward" and not graph.predecessors(n.name)]
        assert not floating, f"backward nodes with no edge into them: {floating}"
        assert dbg.first_nonfinite(None) is None
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b), (got, want)
    assert all(r > 10 for r, _ in counts), counts
    for (n, a), (_, b) in zip(case.model.state_dict().items(), plain.state_dict().items(), strict=True):
        assert torch.equal(a, b), n


# -- where a NaN starts -----------------------------------------------------------------------------
@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("kind", ARCHS)
def test_a_nan_weight_is_where_the_nonfinite_starts(kind, level):
    case = build(kind)
    param = dict(case.model.named_parameters())[case.nan_param]
    with nbdebug.Debugger(case.model, level=level) as dbg:
        def after(i):
            if i == 0:
                with torch.no_grad():
                    param.view(-1)[0] = float("nan")

        losses = train(case, case.model, after)
        assert dbg.first_nonfinite(0) is None and torch.isfinite(losses[0])
        assert torch.isnan(losses[1])
        origin = f"Parameter.{case.nan_param}"
        assert dbg.first_nonfinite(1) == (origin, "output.0", 1)
        graph = dbg.graph
        consumers = [n for n in graph.successors(origin) if graph[n].section == "forward"]
        nan_out = [n for n in consumers if any(
            dbg.stats(n, s, step=1)["nan_count"] for _node, s in dbg.session.table(1).keys
            if _node == n and not s.startswith(("input", "parameters")))]
        assert nan_out, f"no forward consumer of {origin} computes a NaN: {consumers}"
        if level == "L0":
            return  # module calls only: a child's output combined by its parent's unrecorded ops ends there
        reached = forward_reach(graph, origin)
        assert any(in_module(graph[n], case.head) for n in reached), \
            f"the data flow from {origin} never reaches {case.head}: {sorted(reached)}"


# -- dumps ------------------------------------------------------------------------------------------
def _by_node(source: Any, table: Any, step: int) -> dict[str, list[tuple]]:
    """node -> its slots' (shape, max, min, mean, norm), sorted: slot names aside (a dump names a keyword
    argument by position, ``input.2`` for ``layer_norm``'s ``weight=``, and a dict output ``output.0.key``)."""
    out: dict[str, list[tuple]] = {}
    for node, slot in table.keys:
        st = source.stats(node, slot, step=step)
        out.setdefault(node, []).append((tuple(st["shape"]),) + tuple(
            np.nan if st[f] is None else round(float(st[f]), 4) for f in ("max", "min", "mean", "norm")))
    return {k: sorted(v) for k, v in out.items()}


@pytest.mark.parametrize("kind", ARCHS)
def test_statistics_dump_loads_back_as_the_live_session(kind, tmp_path):
    """msProbe's layout leaves out nbdebug's own nodes (inputs, constants, the optimizer's step; parameters
    come back from the module entries, named by the module that used them), at its default risk level
    (FOCUS) the APIs that only reshape, cast or create tensors, and a ``p=0`` dropout's backward (msProbe
    records none; every dropout of these configs has p=0); everything else loads back with the statistics
    the live session showed."""
    from nbdebug.dump.entry_parts import DROPOUT
    from nbdebug.dump.filters import risk_keeps

    case = build(kind)
    with nbdebug.Debugger(case.model, dump_dir=str(tmp_path), task="statistics", level="mix") as dbg:
        train(case, case.model)
        live = [_by_node(dbg, dbg.session.table(i), i) for i in range(STEPS)]
    off = nbdebug.load(str(tmp_path), warn=False)
    assert off.problems == [] and off.steps == list(range(STEPS))
    for i in range(STEPS):
        dumped = _by_node(off, off.session.table(i), i)
        dumped = {n: v for n, v in dumped.items() if not n.startswith("Parameter.")}
        want = {n: v for n, v in live[i].items()
                if not n.startswith(("Input.", "Constant.", "Optimizer.", "Parameter.")) and risk_keeps("FOCUS", n)
                and not (n.startswith(DROPOUT) and n.endswith(".backward"))}
        assert set(dumped) == set(want), (sorted(set(dumped) - set(want))[:5], sorted(set(want) - set(dumped))[:5])
        bad = [n for n in want if not _same_rows(dumped[n], want[n])]
        assert not bad, [(n, dumped[n], want[n]) for n in bad[:3]]


def _same_rows(a: list[tuple], b: list[tuple]) -> bool:
    """The same slots' statistics; mean and norm where both sides have finite ones: a dump has none for
    integers, and computes them as msProbe does, in the tensor's dtype (PhiMoE's Gumbel noise starts from
    ``torch.empty_like``: its float32 norm overflows to inf where ours, accumulated in float64, does not)."""
    if len(a) != len(b) or [r[0] for r in a] != [r[0] for r in b]:
        return False
    x, y = np.array([r[1:] for r in a], float), np.array([r[1:] for r in b], float)
    both = np.isfinite(x) & np.isfinite(y)
    both[:, :2] = True  # max and min: always
    return bool(np.allclose(x[both], y[both], rtol=1e-3, atol=1e-4, equal_nan=True))


# -- the defects these architectures showed, each on the smallest model that shows it ------------------
class TransposedWeight(torch.nn.Module):
    """Multiplies by ``self.weight.T`` (Falcon's ``FalconLinear``): a property, not a call."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(3, 4))

    def forward(self, x):
        return x @ self.weight.T


@pytest.mark.parametrize("level", ["L1", "mix"])
def test_a_weight_read_through_a_view_property_is_that_weights_parameter_node(level):
    """``w.T`` reaches the op mode as the property's ``__get__``: its result is a view of the weight, whose
    producer it keeps. It was an ``Input`` node: a NaN weight made ``first_nonfinite`` name that input."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(TransposedWeight())
    with nbdebug.Debugger(model, level=level) as dbg:
        model(torch.ones(2, 4)).sum().backward()
        dbg.step()
        assert [n.name for n in dbg.graph if n.kind == "input"] == ["Input.0"]
        assert dbg.graph.edges[("Parameter.0.weight", "Tensor.__matmul__.0.forward")] == [("output.0", "input.1")]
        with torch.no_grad():
            model[0].weight[0, 0] = float("nan")
        model(torch.ones(2, 4)).sum().backward()
        dbg.step()
        assert dbg.first_nonfinite(1) == ("Parameter.0.weight", "output.0", 1)


class ReturnsAView(torch.nn.Module):
    """Returns an unrecorded copy of its last op's result (DeBERTa's attention: ``permute(...).contiguous()``)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(x).permute(1, 0).contiguous()


def test_a_modules_output_copied_from_its_last_op_comes_from_that_op_at_mix():
    """At mix, a module whose output is an unrecorded copy of an op's result: the consumer's edge comes from
    that op (as at L1). The module took the output as its own and the op's result went nowhere."""
    model = torch.nn.Sequential(ReturnsAView(), torch.nn.Linear(2, 2))
    with nbdebug.Debugger(model, level="mix") as dbg:
        model(torch.ones(2, 4)).sum().backward()
        dbg.step()
        graph = dbg.graph
        assert ("Tensor.permute.0.forward", "Functional.linear.1.forward") in graph.edges
        assert "Functional.linear.1.forward" in forward_reach(graph, "Parameter.0.fc.weight")


class RootScale(torch.nn.Module):
    """A parameter of the root module itself (CLIP's ``logit_scale``)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 2)
        self.scale = torch.nn.Parameter(torch.tensor(2.0))

    def forward(self, x):
        return self.fc(x) * self.scale


@pytest.mark.parametrize("level", LEVELS)
def test_a_root_modules_own_parameter_has_a_node_and_its_gradient_a_source(level):
    """The root module is no node (msProbe names none), but its own parameters are the model's: at L0 they
    had no ``Parameter`` node and their ``parameters_grad`` entry floated apart from the graph."""
    model = RootScale()
    with nbdebug.Debugger(model, level=level) as dbg:
        model(torch.ones(2, 4)).sum().backward()
        dbg.step()
        np.testing.assert_array_equal(dbg.tensor("Parameter.scale", "output.0"), np.float32(2.0))
        if level != "L1":  # at L1 (no module calls) the gradient is recorded under its first owner alike
            assert ("Parameter.scale", "Module.RootScale.parameters_grad.0") in dbg.graph.edges
        floating = [n.name for n in dbg.graph if n.section == "backward" and not dbg.graph.predecessors(n.name)]
        assert not floating


class GroupedExperts(torch.nn.Module):
    """Two experts' weights in one 3-D parameter, applied by ``F.grouped_mm`` (transformers' default MoE
    experts on torch >= 2.10): a call msProbe does not record, whose first argument is the tokens."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(2, 4, 4))

    def forward(self, x):
        offs = torch.tensor([3, 6], dtype=torch.int32)
        return torch.nn.functional.grouped_mm(x * 1.0, self.weight.transpose(-2, -1), offs=offs)


@pytest.mark.parametrize("level", ["L1", "mix"])
def test_an_unrecorded_calls_other_data_inputs_flow_on_to_its_consumers(level):
    """An unrecorded call's result keeps its first argument's producer; its consumers also get edges from
    its other floating-point arguments' producers. The expert weight's flow ended at its ``transpose``."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(GroupedExperts(), torch.nn.Linear(4, 2))
    with nbdebug.Debugger(model, level=level) as dbg:
        model(torch.randn(6, 4)).sum().backward()
        dbg.step()
        graph = dbg.graph
        head = "Functional.linear.0.forward"
        assert graph.edges[("Tensor.transpose.0.forward", head)] == [("output.0", "input.0")]
        assert graph.edges[("Tensor.__mul__.0.forward", head)] == [("output.0", "input.0")]  # the first one
        assert head in forward_reach(graph, "Parameter.0.weight")
        # offs (integers) is no data input; the weight's gradient flows back the same way
        assert graph.predecessors(head) == {"Tensor.__mul__.0.forward", "Tensor.transpose.0.forward",
                                            "Parameter.1.weight", "Parameter.1.bias"}
        assert ("Functional.linear.0.backward", "Tensor.transpose.0.backward") in graph.edges
