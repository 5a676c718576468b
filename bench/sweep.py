"""Try nbdebug as an outside user would: many architectures nobody tuned it for, every level, every check.

Each workload is a small model with random weights — built from a ``transformers`` config (nothing is
downloaded) or from ``torch.nn`` — trained for 3 steps under ``nbdebug.Debugger(model, level=...)`` at
``L0``, ``L1`` and ``mix``, against a plain run from the same initial weights. The checks:

===========  =========================================================================================
``run``      no exception while training, closing, dumping or loading
``loss``     losses bitwise equal to the plain run's
``names``    every step records the same (node, slot) set
``close``    after ``dbg.close()`` parameters and buffers are bitwise the plain run's
``values``   last two steps: for every (node, slot), ``stats()`` is the statistics of ``tensor()``, or
             ``tensor()`` raises ``NotRetainedError`` with a reason
``finite``   ``first_nonfinite()`` is None on every (clean) step
``dump``     the run's msProbe dump (``dump_dir=``) loads back with ``nbdebug.load``, three steps, no
             problem, the same nodes as the live session's last step, the same max/min per slot
===========  =========================================================================================

Usage::

    python bench/sweep.py                       # every workload, every level: one table
    python bench/sweep.py --models albert,lstm --levels mix -v   # failures in full

``torch.compile`` is tried with the ``aot_eager`` backend (no C++ build; a few seconds on CPU).
``tests/test_models_sweep.py`` runs a handful of these workloads as a test.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint as ckpt

LEVELS = ("L0", "L1", "mix")
CHECKS = ("run", "loss", "names", "close", "values", "finite", "dump")
STEPS = 3
VOCAB = 96


@dataclass
class Workload:
    """A model, its batches and how one step runs on them."""

    model: nn.Module
    batches: list[Any]
    loss: Callable[[nn.Module, Any], torch.Tensor]
    optim: str = "adamw"  # or "sgd"
    grad: bool = True  # False: eval() under no_grad, no optimizer (steps end at dbg.step())
    amp: bool = False  # bf16 autocast on CPU around the forward pass


# -- torch.nn models ---------------------------------------------------------------------------------
class RNNLM(nn.Module):
    def __init__(self, cell: type[nn.Module]) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 16)
        self.rnn = cell(16, 32, num_layers=2, batch_first=True)
        self.head = nn.Linear(32, VOCAB)

    def forward(self, ids):
        out, _state = self.rnn(self.emb(ids))
        return self.head(out)


class EncoderClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 32)
        layer = nn.TransformerEncoderLayer(32, 2, 64, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(32, 3)

    def forward(self, ids):
        pad = ids == 0
        return self.head(self.enc(self.emb(ids), src_key_padding_mask=pad).mean(1))


class Block(nn.Module):
    def __init__(self, d: int = 32) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d, 2 * d)
        self.fc2 = nn.Linear(2 * d, d)
        self.ln = nn.LayerNorm(d)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.ln(x))))


class Checkpointed(nn.Module):
    def __init__(self, reentrant: bool) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 32)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.out = nn.Linear(32, 4)
        self.reentrant = reentrant

    def forward(self, x):
        h = self.inp(x)
        for b in self.blocks:
            h = ckpt.checkpoint(b, h, use_reentrant=self.reentrant)
        return self.out(h)


class SharedTwice(nn.Module):
    """One block applied twice per step (weight sharing, same module object)."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 32)
        self.block = Block()
        self.out = nn.Linear(32, 4)

    def forward(self, x):
        return self.out(self.block(self.block(self.inp(x))))


class Heads(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(32, 4)
        self.b = nn.Linear(32, 4)

    def forward(self, h):
        return {"a": self.a(h), "b": (self.b(h), None), "none": None}


class Structured(nn.Module):
    """Submodules returning a dict, a tuple with a None, and None itself."""

    def __init__(self) -> None:
        super().__init__()
        self.trunk = nn.Linear(8, 32)
        self.heads = Heads()
        self.side = nn.Identity()
        self.log = NoneModule()

    def forward(self, x):
        h = torch.tanh(self.trunk(x))
        self.log(h)
        out = self.heads(h)
        return out["a"], self.side(out["b"][0]), None


class NoneModule(nn.Module):
    def forward(self, h):
        return None


class InplaceOnInput(nn.Module):
    """Modules that write into their input: ``x.mul_``, ``x += ...``, ``x[...] = ...`` ."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 16)
        self.scale = Scale()
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x):
        h = self.fc(x)
        h = self.scale(h)
        return self.fc2(h)


class Scale(nn.Module):
    def forward(self, h):
        h.mul_(0.5)
        h += 1.0
        h[:, 0] = 0.0
        return F.relu(h, inplace=True)


class SparseEmb(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 16, sparse=True)
        self.head = nn.Linear(16, 3)

    def forward(self, ids):
        return self.head(self.emb(ids).mean(1))


class SmallConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.c2 = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.fc = nn.Linear(8, 5)

    def forward(self, x):
        h = F.relu(self.bn(self.c1(x)))
        h = F.silu(self.c2(h))
        return self.fc(h.mean((2, 3)))


# -- batches -----------------------------------------------------------------------------------------
def _ids(g, n: int = STEPS, b: int = 2, t: int = 8, vocab: int = VOCAB):
    return [torch.randint(1, vocab, (b, t), generator=g) for _ in range(n)]


def _xy(g, shape, classes: int):
    return [(torch.randn(*shape, generator=g), torch.randint(0, classes, (shape[0],), generator=g))
            for _ in range(STEPS)]


def _ce(m, b):
    return F.cross_entropy(m(b[0]), b[1])


def _lm(m, ids):
    return m(input_ids=ids, labels=ids).loss


def _tok_ce(m, ids):
    return F.cross_entropy(m(ids).flatten(0, 1), ids.flatten())


def _hf(name: str) -> Any:
    import transformers

    return getattr(transformers, name)


_TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
             vocab_size=VOCAB, max_position_embeddings=64)
_NODROP = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def _causal(cfg_name: str, model_name: str, **kw):
    def build(g):
        cfg = _hf(cfg_name)(**{**_TINY, **kw})
        return Workload(_hf(model_name)(cfg), _ids(g), _lm)
    return build


def _masked(cfg_name: str, model_name: str, **kw):
    def build(g):
        cfg = _hf(cfg_name)(**kw)
        return Workload(_hf(model_name)(cfg), _ids(g), _lm)
    return build


def _qwen2_ckpt(g):
    w = _causal("Qwen2Config", "Qwen2ForCausalLM", num_key_value_heads=2)(g)
    w.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    return w


def _bart(g):
    cfg = _hf("BartConfig")(vocab_size=VOCAB, d_model=32, encoder_layers=1, decoder_layers=1,
                            encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
                            decoder_ffn_dim=64, max_position_embeddings=64, dropout=0.0, attention_dropout=0.0,
                            pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=2)
    return Workload(_hf("BartForConditionalGeneration")(cfg), _ids(g), _lm)


def _whisper(g):
    cfg = _hf("WhisperConfig")(vocab_size=VOCAB, num_mel_bins=8, d_model=32, encoder_layers=1, decoder_layers=1,
                               encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
                               decoder_ffn_dim=64, max_source_positions=16, max_target_positions=16,
                               pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1,
                               suppress_tokens=None, begin_suppress_tokens=None, dropout=0.0)
    model = _hf("WhisperForConditionalGeneration")(cfg)
    batches = [(torch.randn(2, 8, 32, generator=g), torch.randint(3, VOCAB, (2, 6), generator=g))
               for _ in range(STEPS)]
    return Workload(model, batches, lambda m, b: m(input_features=b[0], labels=b[1]).loss)


def _wav2vec2(g):
    cfg = _hf("Wav2Vec2Config")(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                intermediate_size=64, conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3),
                                num_conv_pos_embeddings=8, num_conv_pos_embedding_groups=4, hidden_dropout=0.0,
                                activation_dropout=0.0, attention_dropout=0.0, feat_proj_dropout=0.0,
                                layerdrop=0.0, mask_time_prob=0.0, ctc_loss_reduction="mean", pad_token_id=0,
                                do_stable_layer_norm=False, feat_extract_norm="group")
    model = _hf("Wav2Vec2ForCTC")(cfg)
    batches = [(torch.randn(2, 400, generator=g), torch.randint(1, VOCAB, (2, 5), generator=g))
               for _ in range(STEPS)]
    return Workload(model, batches, lambda m, b: m(input_values=b[0], labels=b[1]).loss)


def _clip(g):
    text = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                intermediate_size=64, max_position_embeddings=16)
    vision = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                  image_size=16, patch_size=8)
    cfg = _hf("CLIPConfig")(text_config=text, vision_config=vision, projection_dim=16)
    model = _hf("CLIPModel")(cfg)
    batches = [(torch.randint(1, VOCAB, (3, 8), generator=g), torch.randn(3, 3, 16, 16, generator=g))
               for _ in range(STEPS)]
    return Workload(model, batches, lambda m, b: m(input_ids=b[0], pixel_values=b[1], return_loss=True).loss)


def _vision(cfg_name: str, model_name: str, size: int, **kw):
    def build(g):
        cfg = _hf(cfg_name)(num_labels=5, **kw)
        model = _hf(model_name)(cfg)
        batches = [(torch.randn(2, 3, size, size, generator=g), torch.randint(0, 5, (2,), generator=g))
                   for _ in range(STEPS)]
        return Workload(model, batches, lambda m, b: m(pixel_values=b[0], labels=b[1]).loss)
    return build


def _lstm(g):
    return Workload(RNNLM(nn.LSTM), _ids(g), _tok_ce)


def _gru(g):
    return Workload(RNNLM(nn.GRU), _ids(g), _tok_ce)


def _encoder(g):
    return Workload(EncoderClassifier(), [(ids, ids[:, 0] % 3) for ids in _ids(g)], _ce)


def _encoder_eval(g):
    ids = _ids(g)
    ids[0][1, 5:] = 0  # padding: the fast path's nested tensors
    # the loss is the encoder's whole output: the fused fast path and the unfused one differ in low bits
    return Workload(EncoderClassifier(), [(x, x[:, 0] % 3) for x in ids],
                    lambda m, b: m.enc(m.emb(b[0]), src_key_padding_mask=b[0] == 0).pow(2).sum(), grad=False)


def _checkpoint(reentrant: bool):
    def build(g):
        return Workload(Checkpointed(reentrant), _xy(g, (4, 8), 4), _ce)
    return build


def _compiled(g):
    model = SharedTwice()
    model.compile(backend="aot_eager")
    return Workload(model, _xy(g, (4, 8), 4), _ce)


def _structured(g):
    def loss(m, b):
        a, b2, none = m(b[0])
        assert none is None
        return F.cross_entropy(a + b2, b[1])
    return Workload(Structured(), _xy(g, (4, 8), 4), loss)


def _autocast(g):
    return Workload(SharedTwice(), _xy(g, (4, 8), 4), _ce, amp=True)


def _channels_last(g):
    model = SmallConvNet().to(memory_format=torch.channels_last)
    batches = [(x.contiguous(memory_format=torch.channels_last), y) for x, y in _xy(g, (2, 3, 8, 8), 5)]
    return Workload(model, batches, _ce)


WORKLOADS: dict[str, Callable[[torch.Generator], Workload]] = {
    "mistral": _causal("MistralConfig", "MistralForCausalLM", num_key_value_heads=2, sliding_window=4),
    "qwen2": _causal("Qwen2Config", "Qwen2ForCausalLM", num_key_value_heads=2, tie_word_embeddings=True),
    "qwen2_ckpt": _qwen2_ckpt,  # HF gradient checkpointing, re-entrant: module hooks run again in backward
    "gpt_neox": _causal("GPTNeoXConfig", "GPTNeoXForCausalLM", rotary_pct=0.5, hidden_dropout=0.0,
                        attention_dropout=0.0),
    "opt": _masked("OPTConfig", "OPTForCausalLM", hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                   ffn_dim=64, vocab_size=VOCAB, max_position_embeddings=64, word_embed_proj_dim=32,
                   dropout=0.0, attention_dropout=0.0),
    "bart": _bart,
    "distilbert": _masked("DistilBertConfig", "DistilBertForMaskedLM", vocab_size=VOCAB, dim=32, n_layers=2,
                          n_heads=4, hidden_dim=64, max_position_embeddings=64, dropout=0.0,
                          attention_dropout=0.0),
    "roberta": _masked("RobertaConfig", "RobertaForMaskedLM", **_TINY, **_NODROP, pad_token_id=0),
    "albert": _masked("AlbertConfig", "AlbertForMaskedLM", vocab_size=VOCAB, embedding_size=16, hidden_size=32,
                      num_hidden_layers=3, num_attention_heads=4, intermediate_size=64,
                      max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                      classifier_dropout_prob=0.0),
    "whisper": _whisper,
    "wav2vec2": _wav2vec2,
    "clip": _clip,
    "swin": _vision("SwinConfig", "SwinForImageClassification", 16, image_size=16, patch_size=2, embed_dim=16,
                    depths=[1, 1], num_heads=[2, 2], window_size=4, drop_path_rate=0.0,
                    hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
    "convnext": _vision("ConvNextConfig", "ConvNextForImageClassification", 16, hidden_sizes=[8, 16],
                        depths=[1, 1], num_stages=2, patch_size=2, drop_path_rate=0.0),
    "deit": _vision("DeiTConfig", "DeiTForImageClassification", 16, image_size=16, patch_size=4, hidden_size=32,
                    num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, **_NODROP),
    "hf_resnet": _vision("ResNetConfig", "ResNetForImageClassification", 16, embedding_size=8,
                         hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic"),
    "mobilevit": _vision("MobileViTConfig", "MobileViTForImageClassification", 32, image_size=32, patch_size=2,
                         hidden_sizes=[16, 16, 16], neck_hidden_sizes=[8, 8, 16, 16, 16, 16, 32],
                         num_attention_heads=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                         classifier_dropout_prob=0.0),
    "lstm": _lstm,
    "gru": _gru,
    "encoder": _encoder,
    "encoder_eval": _encoder_eval,
    "ckpt_reentrant": _checkpoint(True),
    "ckpt_nonreentrant": _checkpoint(False),
    "compiled": _compiled,
    "shared_twice": lambda g: Workload(SharedTwice(), _xy(g, (4, 8), 4), _ce),
    "structured": _structured,
    "inplace_input": lambda g: Workload(InplaceOnInput(), _xy(g, (4, 8), 4), _ce),
    "autocast_bf16": _autocast,
    "sparse_emb": lambda g: Workload(SparseEmb(), [(ids, ids[:, 0] % 3) for ids in _ids(g)], _ce, optim="sgd"),
    "channels_last": _channels_last,
}


def build(name: str, seed: int = 0) -> Workload:
    """Workload ``name`` with its initial weights and batches fixed by ``seed``."""
    torch.manual_seed(seed)
    w = WORKLOADS[name](torch.Generator().manual_seed(seed + 1))
    w.model.train(w.grad)
    return w


# -- running -----------------------------------------------------------------------------------------
def train(w: Workload, model: nn.Module, after_step: Callable[[int], None] | None = None,
          step_end: Callable[[], None] | None = None) -> list[torch.Tensor]:
    """3 steps of ``w`` on ``model``; ``step_end`` marks a step without an optimizer (the no-grad runs)."""
    torch.manual_seed(1234)  # models that draw random numbers (wav2vec2's masks) draw the same ones
    opt = (torch.optim.SGD(model.parameters(), lr=0.1) if w.optim == "sgd" else
           torch.optim.AdamW(model.parameters(), lr=1e-2)) if w.grad else None
    losses = []
    for i, b in enumerate(w.batches):
        amp = torch.autocast("cpu", dtype=torch.bfloat16) if w.amp else contextlib.nullcontext()
        if opt is None:
            with torch.no_grad(), amp:
                loss = w.loss(model, b)
            if step_end is not None:
                step_end()
        else:
            opt.zero_grad()
            with amp:
                loss = w.loss(model, b)
            loss.backward()
            opt.step()
        losses.append(loss.detach().clone())
        if after_step is not None:
            after_step(i)
    return losses


def value_mismatches(dbg: Any, step: int) -> tuple[list[str], int]:
    """(slots of ``step`` whose ``tensor()`` is not the value ``stats()`` describes, how many were read)."""
    from nbdebug import NotRetainedError
    from nbdebug.frameworks.torch.stats import fields_of
    from nbdebug.session.stats import FIELDS

    table = dbg.session.table(step)
    bad, read = [], 0
    for i, (node, slot) in enumerate(table.keys):
        st = dbg.stats(node, slot, step=step)
        try:
            arr = dbg.tensor(node, slot, step=step)
        except NotRetainedError as e:
            if not str(e).strip():
                bad.append(f"{node} {slot}: NotRetainedError without a reason")
            continue
        read += 1
        if tuple(arr.shape) != tuple(st["shape"]):
            bad.append(f"{node} {slot}: shape {arr.shape} vs stats {st['shape']}")
            continue
        if st.get("unsupported"):
            continue
        want, got = table.values[i], fields_of(arr)
        if not np.allclose(got, want, rtol=1e-5, atol=1e-6, equal_nan=True):
            diff = {f: (float(a), float(b)) for f, a, b in zip(FIELDS, want, got, strict=True)
                    if not np.isclose(a, b, rtol=1e-5, atol=1e-6, equal_nan=True)}
            bad.append(f"{node} {slot}: stats vs tensor {diff}")
    return bad, read


def dump_mismatches(dbg: Any, path: str) -> list[str]:
    """What differs between the dump under ``path`` and the live session's last step."""
    import nbdebug

    off = nbdebug.load(path, warn=False)
    bad = [f"problem: {p}" for p in off.problems[:5]]
    if off.steps != list(range(STEPS)):
        bad.append(f"steps {off.steps}")
        return bad
    last = STEPS - 1
    live = dbg.session.table(last)
    dumped = off.session.table(last)
    live_nodes = {n for n, _ in live.keys}
    missing = sorted({n for n, _ in dumped.keys} - live_nodes)
    if missing:
        bad.append(f"dumped nodes the live session lacks: {missing[:5]}")
    for node, slot in dumped.keys:
        if (node, slot) not in live:
            continue
        a, b = off.stats(node, slot, step=last), dbg.stats(node, slot, step=last)
        for f in ("max", "min"):
            if a[f] is not None and not np.isclose(a[f], b[f], rtol=1e-5, equal_nan=True):
                bad.append(f"{node} {slot} {f}: dump {a[f]} live {b[f]}")
    return bad


def check(name: str, level: str, verbose: bool = False) -> dict[str, str]:
    """Run workload ``name`` plain and under a Debugger at ``level``: {check: "ok" or what failed}."""
    import nbdebug

    out = dict.fromkeys(CHECKS, "-")
    w = build(name)
    plain = copy.deepcopy(w.model)
    model = w.model
    want = train(w, plain)
    names: list[set] = []
    values: list[str] = []
    finite: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        try:
            dbg = nbdebug.Debugger(model, level=level, dump_dir=tmp)
            try:
                def after(i):
                    names.append(set(dbg.session.table(i).keys))
                    nf = dbg.first_nonfinite(i)
                    if nf is not None:
                        finite.append(f"step {i}: {nf}")
                    if i >= STEPS - 2:
                        bad, _read = value_mismatches(dbg, i)
                        values.extend(f"step {i}: {b}" for b in bad)

                got = train(w, model, after, step_end=dbg.step)
                if STEPS > 1:  # the previous step once more, after one more step
                    bad, _ = value_mismatches(dbg, STEPS - 2)
                    values.extend(f"step {STEPS - 2} (later): {b}" for b in bad)
            finally:
                dbg.close()
            out["run"] = "ok"
            out["loss"] = "ok" if all(torch.equal(a, b) for a, b in zip(got, want, strict=True)) else \
                f"losses {[float(x) for x in got]} vs plain {[float(x) for x in want]}"
            diffs = [f"step {i}: +{sorted(names[i] - names[0])[:3]} -{sorted(names[0] - names[i])[:3]}"
                     for i in range(1, len(names)) if names[i] != names[0]]
            out["names"] = "ok" if not diffs else "; ".join(diffs)
            changed = [k for (k, a), (_, b) in zip(model.state_dict().items(), plain.state_dict().items(),
                                                     strict=True) if not torch.equal(a, b)]
            out["close"] = "ok" if not changed else f"differs: {changed[:5]}"
            out["values"] = "ok" if not values else f"{len(values)} slots: " + " | ".join(values[:4])
            out["finite"] = "ok" if not finite else "; ".join(finite)
            dump_bad = dump_mismatches(dbg, tmp)
            out["dump"] = "ok" if not dump_bad else f"{len(dump_bad)}: " + " | ".join(dump_bad[:4])
        except Exception as e:
            where = next(k for k in CHECKS if out[k] == "-")
            out[where] = f"{type(e).__name__}: {e}"
            if verbose:
                traceback.print_exc()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(WORKLOADS), help="comma-separated workload names")
    p.add_argument("--levels", default=",".join(LEVELS))
    p.add_argument("-v", "--verbose", action="store_true", help="print every failure in full")
    args = p.parse_args(argv)
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    failed = 0
    print(f"{'model':<18} {'level':<4} " + " ".join(f"{c:<6}" for c in CHECKS) + "  seconds")
    for name in args.models.split(","):
        for level in args.levels.split(","):
            t0 = time.perf_counter()
            res = check(name, level, args.verbose)
            bad = {k: v for k, v in res.items() if v != "ok"}
            failed += bool(bad)
            marks = " ".join(f"{'ok' if res[c] == 'ok' else 'FAIL' if res[c] != '-' else '-':<6}" for c in CHECKS)
            print(f"{name:<18} {level:<4} {marks}  {time.perf_counter() - t0:5.1f}", flush=True)
            for k, v in bad.items():
                if v != "-":
                    print(f"    {k}: {v if args.verbose else v[:400]}", flush=True)
    print(f"{failed} failing model × level runs" if failed else "all passed")
    return int(bool(failed))


if __name__ == "__main__":
    sys.exit(main())
