"""Whole-model invariant: the value shown is the value used.

Real architectures with random weights (an HF GPT-2 with tied weights built from a config, a residual +
LayerNorm block, a CNN with BatchNorm in train mode and in-place ReLU, a bf16-autocast model trained with
``GradScaler``), 3 AdamW steps at every level. For every (node, slot) of every step, either
``dbg.tensor()`` returns a value whose statistics (the same NaN-aware reduction) are ``dbg.stats()``, or
it raises :class:`NotRetainedError` with a reason. The losses are bitwise those of an undebugged run.
"""

from __future__ import annotations

import copy
import os

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import nbdebug
from nbdebug import NotRetainedError
from nbdebug.frameworks.torch.stats import fields_of
from nbdebug.session.stats import FIELDS

LEVELS = ("L0", "L1", "mix")
STEPS = 3


# -- models ---------------------------------------------------------------------------------------
class ResidualLN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 16)
        self.ln = nn.LayerNorm(16)
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        h = self.fc(x)
        return self.head(self.ln(h) + 0.5 * h)


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.act = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(4, 4, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        h = self.act(self.bn(self.conv(x)))
        h = self.act(self.bn2(F.conv2d(h, self.conv2.weight, self.conv2.bias, padding=1)))
        return self.fc(h.mean((2, 3)))


class AmpMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 32)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(32, 4)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=16, resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(cfg)
    assert model.lm_head.weight is model.transformer.wte.weight  # tied
    return model


def build(kind: str):
    """(model, batches, loss_fn(model, batch) -> loss, uses_scaler)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    if kind == "gpt2":
        model = gpt2()
        batches = [torch.randint(0, 64, (2, 8), generator=g) for _ in range(STEPS)]
        return model, batches, lambda m, b: m(input_ids=b, labels=b).loss, False
    if kind == "residual_ln":
        model = ResidualLN()
        batches = [(torch.randn(4, 8, generator=g), torch.randn(4, 4, generator=g)) for _ in range(STEPS)]
        return model, batches, lambda m, b: F.mse_loss(m(b[0]), b[1]), False
    if kind == "cnn_bn":
        model = SmallCNN().train()
        batches = [(torch.randn(4, 3, 6, 6, generator=g), torch.randint(0, 3, (4,), generator=g))
                   for _ in range(STEPS)]
        return model, batches, lambda m, b: F.cross_entropy(m(b[0]), b[1]), False
    if kind == "amp_scaler":
        model = AmpMLP()
        batches = [(torch.randn(4, 8, generator=g), torch.randn(4, 4, generator=g)) for _ in range(STEPS)]

        def loss_fn(m, b):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = m(b[0])
            return F.mse_loss(out.float(), b[1])

        return model, batches, loss_fn, True
    raise ValueError(kind)


MODELS = ("gpt2", "residual_ln", "cnn_bn", "amp_scaler")


def train(model, batches, loss_fn, scaler: bool, after_step=None) -> list[float]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sc = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10) if scaler else None
    losses = []
    for i, b in enumerate(batches):
        opt.zero_grad()
        loss = loss_fn(model, b)
        if sc is not None:
            sc.scale(loss).backward()
            sc.step(opt)
            sc.update()
        else:
            loss.backward()
            opt.step()
        losses.append(loss.detach().clone())
        if after_step is not None:
            after_step(i)
    return losses


# -- the invariant ----------------------------------------------------------------------------------
reference_stats = fields_of  # our reduction applied to the retained value


def check_step(dbg, step: int) -> tuple[int, int]:
    """Every (node, slot) of ``step``: stats == stats(tensor) or NotRetainedError with a reason."""
    table = dbg.session.table(step)
    retained = refused = 0
    bad = []
    for i, (node, slot) in enumerate(table.keys):
        st = dbg.stats(node, slot, step=step)
        try:
            arr = dbg.tensor(node, slot, step=step)
        except NotRetainedError as e:
            assert str(e).strip(), (node, slot)
            refused += 1
            continue
        retained += 1
        assert tuple(arr.shape) == tuple(st["shape"]), (node, slot)
        if st.get("unsupported"):
            continue
        want = table.values[i]
        got = reference_stats(arr)
        if not np.allclose(got, want, rtol=1e-5, atol=1e-6, equal_nan=True):
            bad.append(f"{node} {slot}: stats {dict(zip(FIELDS, want.round(5), strict=True))} "
                       f"tensor {dict(zip(FIELDS, got.round(5), strict=True))}")
    assert not bad, f"step {step}: {len(bad)} slots whose tensor() is not the value of stats():\n" + \
        "\n".join(bad[:10])
    return retained, refused


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("kind", MODELS)
def test_stats_describe_the_retained_value(kind, level):
    model, batches, loss_fn, scaler = build(kind)
    plain = copy.deepcopy(model)
    want = train(plain, batches, loss_fn, scaler)
    counts = []
    with nbdebug.Debugger(model, level=level) as dbg:
        def after(i):
            counts.append(check_step(dbg, i))
            if i:
                check_step(dbg, i - 1)  # the previous step's values after one more step

        got = train(model, batches, loss_fn, scaler, after)
        g = dbg.graph.to_networkx()
        assert set(g.nodes) == set(dbg.graph.nodes)  # no edge end that is not a node
        assert set(g.edges) == set(dbg.graph.edges)
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b), (got, want)
    assert all(r > 10 for r, _ in counts), counts
    # the model is bitwise the undebugged one
    for (n, a), (_, b) in zip(model.state_dict().items(), plain.state_dict().items(), strict=True):
        assert torch.equal(a, b), n


@pytest.mark.parametrize("level", ["L1", "mix"])
def test_batchnorm_running_stats_are_the_values_used(level):
    """BatchNorm updates its running statistics in place without a version bump: the value the op read
    is copied before the op runs, so it stays readable (and is not the updated one)."""
    model, batches, loss_fn, _ = build("cnn_bn")
    seen = []
    with nbdebug.Debugger(model, level=level) as dbg:
        def after(i):
            seen.append((dbg.tensor("Constant.bn.running_mean", "output.0", step=i),
                         dbg.tensor("Functional.batch_norm.0.forward", "input.2", step=i)))

        before = [model.bn.running_mean.clone()]
        train(model, batches, loss_fn, False, lambda i: (after(i), before.append(model.bn.running_mean.clone())))
    for i, (mean, _var_in) in enumerate(seen):
        np.testing.assert_array_equal(mean, before[i].numpy())
        assert not np.array_equal(mean, model.bn.running_mean.numpy())
    np.testing.assert_array_equal(seen[0][1], np.ones(4, np.float32))  # running_var starts at 1


def test_gradscaler_gradients_at_L0_are_exact_or_refused():
    """``GradScaler.unscale_`` rewrites gradients without a version bump: at L0 the gradient the hook saw
    (scaled) is gone; its statistics stay and ``tensor()`` says why it has no value."""
    model, batches, loss_fn, _ = build("amp_scaler")
    with nbdebug.Debugger(model, level="L0") as dbg:
        errors = []

        def after(i):
            st = dbg.stats("Module.fc1.Linear.parameters_grad.0", "weight", step=i)
            with pytest.raises(NotRetainedError, match="version counter") as e:
                dbg.tensor("Module.fc1.Linear.parameters_grad.0", "weight", step=i)
            errors.append((st["norm"], str(e.value)))

        train(model, batches, loss_fn, True, after)
    # the statistics are of the scaled gradient the hook saw (scale 2**10), not of the unscaled one
    assert all(norm > float(model.fc1.weight.grad.norm()) * 100 for norm, _ in errors), errors


class LNResidual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.ln = nn.LayerNorm(4)
        self.shape_only = ShapeOnly()

    def forward(self, x):
        h = self.fc(x)
        return self.ln(h) + h + self.shape_only(h)


class ShapeOnly(nn.Module):
    """Uses its input for its shape only (like a rotary embedding): no gradient flows through it."""

    def forward(self, x):
        return torch.ones(x.shape[-1])


@pytest.mark.parametrize("level", ["L0", "mix"])
def test_module_backward_is_the_modules_share_of_the_gradient(level):
    torch.manual_seed(0)
    model = LNResidual()
    x = torch.randn(3, 4)
    got = {}
    h = model.ln.register_full_backward_hook(lambda mod, gi, go: got.update(gi=gi[0].clone(), go=go[0].clone()))
    model(x).pow(2).sum().backward()
    h.remove()
    model.zero_grad()
    with nbdebug.Debugger(model, level=level) as dbg:
        model(x).pow(2).sum().backward()
        np.testing.assert_allclose(dbg.tensor("Module.ln.LayerNorm.backward.0", "output.0"), got["gi"].numpy(),
                                   rtol=1e-6, atol=1e-8)
        np.testing.assert_allclose(dbg.tensor("Module.ln.LayerNorm.backward.0", "input.0"), got["go"].numpy(),
                                   rtol=1e-6, atol=1e-8)
        assert "Module.shape_only.ShapeOnly.forward.0" in dbg.graph
        assert "Module.shape_only.ShapeOnly.backward.0" not in dbg.graph  # no gradient path: no node
        # the input's total gradient (residual included) is much larger than the module's share
        total = dbg.tensor("Module.fc.Linear.backward.0", "input.0")
        assert np.abs(total).sum() > 10 * np.abs(got["gi"].numpy()).sum()


@pytest.mark.parametrize("level", ["L0", "mix"])
def test_tied_weights_have_a_gradient_entry_per_owner_and_dict_outputs_a_backward(level):
    model, batches, loss_fn, _ = build("gpt2")
    with nbdebug.Debugger(model, level=level) as dbg:
        train(model, batches[:1], loss_fn, False)
        grad = model.lm_head.weight.grad  # AdamW does not touch .grad
        for owner in ("Module.transformer.wte.Embedding.parameters_grad.0", "Module.lm_head.Linear.parameters_grad.0"):
            assert dbg.stats(owner, "weight", step=0)["shape"] == (64, 32)
            np.testing.assert_array_equal(dbg.tensor(owner, "weight", step=0), grad.numpy())
        # GPT2Model returns a ModelOutput (a dict): its backward node has the gradient of its output
        st = dbg.stats("Module.transformer.GPT2Model.backward.0", "input.0", step=0)
        assert st["shape"] == (2, 8, 32) and st["norm"] > 0


@pytest.mark.parametrize("level", LEVELS)
def test_first_nonfinite_names_the_op_that_ran_even_when_counters_shift(level):
    """An overflow injected in GPT-2's second ``c_fc`` in step 1 only: its two multiplications shift the
    ``Tensor.__mul__`` counters, so their names stood for GELU's multiplications in step 0. The node's
    scope must follow the op that ran (and the move is noted)."""
    model, batches, loss_fn, _ = build("gpt2")
    c_fc = model.transformer.h[1].mlp.c_fc
    orig = c_fc.forward
    blow = [False]

    def forward(x):
        o = orig(x)
        if blow[0]:
            o = o * 1e38
            o = o * 1e38  # float32 overflow here
        return o

    c_fc.forward = forward
    with nbdebug.Debugger(model, level=level) as dbg:
        train(model, batches[:1], loss_fn, False)
        assert dbg.first_nonfinite(0) is None
        blow[0] = True
        train(model, batches[1:2], loss_fn, False)
        name, slot, step = dbg.first_nonfinite(1)
        node = dbg.graph[name]
        if level == "L0":
            assert name == "Module.transformer.h.1.mlp.c_fc.Conv1D.forward.0" and slot == "output.0"
        else:
            assert name.startswith("Tensor.__mul__.") and node.scope == "transformer/h/1/mlp/c_fc", (name, node)
            # the injected multiplications took names that stood for GELU's in step 0: noted as moved
            moved = [n for n in dbg.graph if n.moved == [1] and n.scope == "transformer/h/1/mlp/c_fc"]
            assert moved and all(n.name.startswith("Tensor.__mul__.") for n in moved), moved
            assert any("o = o * 1e38" in line or "test_invariant_models.py" in line for line in node.stack)


@pytest.mark.parametrize("level", LEVELS)
def test_inference_mode_under_a_debugger(level):
    """``torch.inference_mode()`` tensors have no version counter: no crash, values kept as copies."""
    model, batches, loss_fn, _ = build("residual_ln")
    x = batches[0][0]
    with nbdebug.Debugger(model, level=level) as dbg:
        with torch.inference_mode():
            y = model(x)
            used = y.clone()
            y.add_(1.0)  # an in-place edit of an inference tensor after capture
        dbg.step()
        head = "Functional.linear.1.forward" if level == "L1" else "Module.head.Linear.forward.0"
        np.testing.assert_array_equal(dbg.tensor(head, "output.0", step=0),
                                      used.numpy())
        check_step(dbg, 0)


@pytest.mark.parametrize("level", ["L1", "mix"])
def test_dump_entries_describe_the_values_used(level, tmp_path):
    """A dump's BatchNorm entry holds the running statistics the op read (before its in-place update)
    and the retained tensors agree with the dump's statistics."""
    import glob
    import json

    from nbdebug.dump import attach_dump

    model, batches, loss_fn, _ = build("cnn_bn")
    before = model.bn.running_var.clone()
    with nbdebug.Debugger(model, level=level) as dbg:
        writer = attach_dump(dbg, str(tmp_path), config={"task": "tensor", "level": level})
        train(model, batches[:1], loss_fn, False)
        writer.close()
        (path,) = glob.glob(str(tmp_path / "step0" / "*" / "dump.json"))
        with open(path) as f:
            entry = json.load(f)["data"]["Functional.batch_norm.0.forward"]
        var = entry["input_args"][2]
        assert var["Max"] == var["Min"] == float(before.max()) == 1.0  # not the updated running_var
        data = torch.load(os.path.join(os.path.dirname(path), "dump_tensor_data", var["data_name"]),
                          weights_only=True)
        np.testing.assert_array_equal(data.numpy(), before.numpy())
        np.testing.assert_array_equal(dbg.tensor("Functional.batch_norm.0.forward", "input.2", step=0), before)


class NaNInside(nn.Module):
    """Computes a NaN between its two layers with an op no L0 hook sees."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 4)
        self.fc2 = nn.Linear(4, 2)

    def forward(self, x):
        return self.fc2(torch.log(self.fc1(x) - 100.0))


def test_value_computed_inside_a_module_comes_from_that_module_at_L0():
    """At L0 a value a module computes with unrecorded ops is that module call's (slot ``internal``), not an
    ``Input`` node: ``first_nonfinite`` names the module."""
    torch.manual_seed(0)
    model = nn.Sequential(NaNInside())
    with nbdebug.Debugger(model, level="L0") as dbg:
        model(torch.ones(2, 4))
        dbg.step()
        assert dbg.first_nonfinite(0) == ("Module.0.NaNInside.forward.0", "output.0", 0)
        assert [n.name for n in dbg.graph if n.name.startswith("Input.")] == ["Input.0"]
        assert dbg.graph.edges[("Module.0.NaNInside.forward.0", "Module.0.fc2.Linear.forward.0")] == \
            [("internal", "input.0")]


class MakesAConstant(nn.Module):
    """Uses a tensor it holds as a plain attribute (not a buffer): no op produced it this step."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.shift = torch.full((4,), 0.5)

    def forward(self, x):
        return self.fc(x) + self.shift


def test_an_unproduced_value_inside_a_module_sits_in_its_scope_at_L1():
    """At L1 (module calls are no nodes) a value no recorded op produced is an ``Input`` node in the scope
    of the module that used it — grouped there in the panel — while the model's own input stays on top."""
    model = nn.Sequential(nn.Linear(4, 4), MakesAConstant())
    with nbdebug.Debugger(model, level="L1") as dbg:
        model(torch.ones(2, 4)).sum().backward()
        dbg.step()
        inputs = {n.name: n.scope for n in dbg.graph if n.kind == "input"}
        assert sorted(inputs.values()) == ["", "1"], inputs
        inner = next(name for name, scope in inputs.items() if scope == "1")
        assert dbg.graph.edges[(inner, "Tensor.__add__.0.forward")] == [("output.0", "input.1")]
        np.testing.assert_array_equal(dbg.tensor(inner, "output.0"), np.full(4, 0.5, dtype=np.float32))


@pytest.mark.parametrize("level", LEVELS)
def test_recycled_parameter_copies_describe_the_values_used(level):
    """Parameters of 64 KiB and more are copied into recycled buffers from the third step on: the whole
    model's invariant still holds, every step and the one before it."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=128, n_head=2, vocab_size=512, n_positions=16,
                                       resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
    g = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, 512, (2, 8), generator=g) for _ in range(5)]
    plain = copy.deepcopy(model)
    want = train(plain, batches, lambda m, b: m(input_ids=b, labels=b).loss, False)
    with nbdebug.Debugger(model, level=level) as dbg:
        def after(i):
            check_step(dbg, i)
            if i:
                check_step(dbg, i - 1)

        got = train(model, batches, lambda m, b: m(input_ids=b, labels=b).loss, False, after)
        assert dbg._adapter.ops.pool.reused >= 10  # the copies did go into recycled buffers
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
