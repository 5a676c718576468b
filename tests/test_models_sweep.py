"""Architectures from ``bench/sweep.py`` (random weights, tiny configs, nothing downloaded) under a Debugger.

The regressions the sweep found, each on the smallest model that shows it, and the sweep's checks on a
handful of its most different workloads at L0, L1 and mix: training bitwise unchanged (losses, and
parameters and buffers after ``close()``), the same (node, slot) set every step, every retained value
described by its statistics, no non-finite value on a clean run, and the run's dump loading back.
"""

from __future__ import annotations

import copy
import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn
import transformers  # noqa: F401  (the sweep builds HF models from configs)

import nbdebug

BENCH = Path(__file__).resolve().parent.parent / "bench" / "sweep.py"


@pytest.fixture(scope="module")
def sweep():
    spec = importlib.util.spec_from_file_location("nbdebug_bench_sweep", BENCH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    try:
        spec.loader.exec_module(mod)
        yield mod
    finally:
        sys.modules.pop(spec.name, None)


# -- regressions ----------------------------------------------------------------------------------
class RMSNorm(nn.Module):
    """Reads its input twice (as Llama/Mistral's RMSNorm does)."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, h):
        return self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6))


class NormResidual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.norm = RMSNorm(16)
        self.head = nn.Linear(16, 16)

    def forward(self, x):
        h = self.fc(x)
        return self.head(self.norm(h)) + h


def _grads_after_one_backward(model, level, x):
    plain = copy.deepcopy(model)
    plain(x).pow(2).sum().backward()
    with nbdebug.Debugger(model, level=level) as dbg:
        model(x).pow(2).sum().backward()
        dbg.step()
        yield dbg
    for (n, a), (_, b) in zip(plain.named_parameters(), model.named_parameters(), strict=True):
        assert torch.equal(a.grad, b.grad), f"{n}: the debugger changed the gradient"


@pytest.mark.parametrize("level", ["L0", "mix"])
def test_module_input_gradient_share_leaves_autograd_sums_alone(level):
    """A module's share of its input's gradient was isolated by giving it a view of the input: autograd
    then summed the module's two contributions before the residual's, and float addition is not
    associative, so every gradient upstream changed (Mistral, Qwen2, BART, DistilBERT, RoBERTa). The
    share must still be the full backward hook's ``grad_input``."""
    torch.manual_seed(0)
    model = NormResidual()
    x = torch.randn(64, 16)
    want = {}
    probe = copy.deepcopy(model)
    probe.norm.register_full_backward_hook(lambda m, gi, go: want.update(gi=gi[0].clone(), go=go[0].clone()))
    probe(x).pow(2).sum().backward()
    for dbg in _grads_after_one_backward(model, level, x):
        got = dbg.tensor("Module.norm.RMSNorm.backward.0", "output.0")
        np.testing.assert_allclose(got, want["gi"].numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(dbg.tensor("Module.norm.RMSNorm.backward.0", "input.0"), want["go"].numpy(),
                                   rtol=1e-6, atol=1e-7)
        total = dbg.tensor("Module.fc.Linear.backward.0", "input.0")  # the residual's share besides
        assert not np.allclose(total, got)


@pytest.mark.parametrize("level", ["L0", "mix"])
def test_multihead_attention_still_sees_query_is_key(level):
    """``nn.MultiheadAttention(x, x, x)`` takes its packed self-attention path only when ``query is key``:
    an alias per argument sent it down the separate-projection path (other gradients)."""
    torch.manual_seed(0)
    model = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    x = torch.randn(2, 5, 16, requires_grad=True)
    for dbg in _grads_after_one_backward(model, level, x):
        st = dbg.stats("Module.self_attn.MultiheadAttention.backward.0", "output.0")
        assert st["shape"] == (2, 5, 16) and st["norm"] > 0  # the share of the input (x passed 3 times)


@pytest.mark.parametrize("task", ["statistics", "tensor"])
def test_sparse_gradient_dumps(task, tmp_path):
    """``nn.Embedding(sparse=True)`` gives a sparse gradient: the dump writer asked for its storage and
    crashed the step. Its statistics are unsupported (as the session says); the rest is dumped."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(20, 4, sparse=True), nn.Linear(4, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with nbdebug.Debugger(model, level="L0", dump_dir=str(tmp_path), task=task) as dbg:
        for _ in range(2):
            opt.zero_grad()
            model(torch.tensor([[1, 2, 3]])).sum().backward()
            opt.step()
        assert "sparse" in dbg.stats("Module.0.Embedding.parameters_grad.0", "weight", step=1)["unsupported"]
    off = nbdebug.load(str(tmp_path), warn=False)
    assert off.steps == [0, 1] and not off.problems
    assert off.stats("Module.1.Linear.forward.0", "output.0", step=1)["max"] == \
        dbg.stats("Module.1.Linear.forward.0", "output.0", step=1)["max"]


# -- the sweep's checks on a handful of architectures ------------------------------------------------
# GPT-NeoX (partial rotary, parallel residual), ALBERT (one layer called 3 times, tied decoder),
# ConvNeXt (LayerNorm over permuted channels, depthwise convs), LSTM LM, nn.TransformerEncoder (MHA),
# re-entrant gradient checkpointing
MODELS = ("gpt_neox", "albert", "convnext", "lstm", "encoder", "ckpt_reentrant")


@pytest.mark.parametrize("level", ["L0", "L1", "mix"])
@pytest.mark.parametrize("name", MODELS)
def test_sweep_workload(sweep, name, level):
    res = sweep.check(name, level)
    # a dump cannot say which parameters are tied: its Parameter nodes are named after each owner,
    # the live session's after the first (reported by the sweep, not a value difference)
    dump = res["dump"]
    if dump.startswith("1: dumped nodes the live session lacks: ['Parameter."):
        assert "Parameter." in dump and "', '" not in dump.replace("', 'Parameter.", "")
        res["dump"] = "ok"
    assert res == dict.fromkeys(sweep.CHECKS, "ok"), res


class HalveInPlace(nn.Module):
    """Writes into its input with plain ops (no ``inplace=True`` attribute to tell)."""

    def forward(self, h):
        h.mul_(0.5)
        h[:, 0] = 0.0
        return h


@pytest.mark.parametrize("level", ["L0", "mix"])
def test_dump_entry_of_a_module_that_overwrites_its_input(level, tmp_path):
    """The dump described such a module's input after the module had overwritten it (the live session
    showed the value given): its entry must hold the input as the module received it."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), HalveInPlace(), nn.Linear(4, 2))
    x = torch.randn(3, 4)
    given = model[0](x).detach()
    with nbdebug.Debugger(model, level=level, dump_dir=str(tmp_path)) as dbg:
        model(x).sum().backward()
        dbg.step()
        live = dbg.stats("Module.1.HalveInPlace.forward.0", "input.0", step=0)
    off = nbdebug.load(str(tmp_path), warn=False)
    dumped = off.stats("Module.1.HalveInPlace.forward.0", "input.0", step=0)
    for f in ("max", "min"):
        assert dumped[f] == pytest.approx(float(getattr(given, f)())) == live[f]


def test_compiled_model_runs_the_module_hooks_eagerly():
    """``model.compile()``: dynamo traced nbdebug's module hooks, guarding on every tensor's id, and
    recompiled them to its limit (26 graphs for three Linear/GELU modules, a warning per hook, 10× the
    first steps' time). The hooks now run eagerly between the compiled pieces: one graph per module."""
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 2))
    model.compile(backend="aot_eager")  # no C++ build: inductor takes minutes on a loaded 2-core CPU
    x = torch.randn(3, 4)
    counters.clear()
    torch._dynamo.reset()
    try:
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with nbdebug.Debugger(model, level="L0") as dbg:
            for _ in range(3):
                opt.zero_grad()
                out = model(x)
                out.sum().backward()
                opt.step()
            np.testing.assert_array_equal(dbg.tensor("Module.2.Linear.forward.0", "output.0", step=2),
                                          out.detach().numpy())
        assert counters["stats"]["unique_graphs"] <= 3, dict(counters["stats"])
    finally:
        torch._dynamo.reset()
