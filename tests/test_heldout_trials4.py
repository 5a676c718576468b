"""PyTorch training patterns nbdebug was not built against, tried as an outside user would (round 4).

``torch.compile`` (a whole model and a compiled submodule), evaluation under ``torch.inference_mode()`` /
``torch.no_grad()`` between training steps, LoRA-style fine-tuning (frozen base, hand-written adapters, param
groups with their own lr and weight decay, ``LambdaLR``, ``clip_grad_norm_(foreach=True)``), an EMA copy
updated each step (``torch._foreach_lerp_``, ``AveragedModel``), SAM (two forward/backward passes per
optimizer step), two optimizers in one step, a channels_last CNN, FNet (FFT), Bloom (ALiBi, ``baddbmm``),
GPT-NeoX (partial rotary) and Longformer (sliding-window attention) from tiny configs. Each defect they showed
is tested on the smallest set-up that shows it:

- an op-level capture (L1/mix) of a ``torch.compile``d model: dynamo traced the capture's own Python (the op
  mode), recompiled on its guards until its limit (warnings naming ``nbdebug/frameworks/core/recording.py``),
  printed ``AttributeError: 'TorchRef' object has no attribute 'pool'`` from objects it made without
  ``__init__``, and ran single ops through compiled kernels: the run was not the undebugged one, and nothing
  said what was captured. Compiled code now runs eagerly while such a capture is attached
  (``torch.compiler.set_stance("force_eager")``, undone at close), with a warning naming the compiled modules;
  L0 and monitor leave the model compiled (their hooks run between the compiled regions) and bitwise; code
  dynamo compiled before the Debugger attached ran on without its module hooks (the capture saw the root
  module only): dynamo's caches are cleared at attach now, saying so. A replay at mix of a step that ran
  compiled says it ran eagerly (it blamed a generator);
- ``dbg.replay`` of a step that updates an EMA copy (a module or a list of parameters the step function
  reaches, not the attached model) ran the update again on the live EMA weights: after a replay the EMA
  differed from an undebugged run's, silently. The replay now writes into copies of such tensors (kept with
  the step's state, so an ``AveragedModel``'s ``n_averaged`` starts where it was and the replay is bitwise)
  and puts the live ones back;
- ``save_repro`` of a step function named ``step`` that calls ``opt.step()``: the attribute's name was taken for
  a global and the wrapped step itself refused ("uses 'step', a function the script cannot rebuild"); a list
  of the model's trainable parameters the step clips was refused too. The script binds the globals the code
  reads (not attribute names) and reaches such a list through the rebuilt model;
- Longformer at mix: ``first_nonfinite`` of a clean step named ``Torch.full_like.0.forward`` — its ``-inf``
  reaches the scores through ``x[...] = …`` (``Tensor.__setitem__``, no output slot), and the softmax reading
  them after has its edge from their producer, so the absorption was not seen. The readers of a write's
  target after it are followed now;
- an eval pass between training steps (``no_grad`` / ``inference_mode``) is recorded into the next step, as its
  modules' first calls: the monitor series of a module (``output_norm``, ``output_max_abs``) came from the eval
  batch and ``grad_input_norm`` was absent after every eval, at every level (SPIKE on an activation norm fired
  on the batch size). They come from the step's first call with gradients now (at L0/mix: its first call with a
  backward).

What held is guarded below: training bitwise unchanged, every (node, slot) of a step showing the value used
(``check_step``), no floating backward node, and the behaviour chosen where it was unspecified (an eval pass
between steps is no step of its own: it is recorded into the step in progress, before its training call).
"""

from __future__ import annotations

import copy
import gc
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from test_invariant_models import check_step

import nbdebug
from nbdebug.frameworks.torch.compiled import stance


def _floating(dbg) -> list[str]:
    graph = dbg.graph
    g = graph.to_networkx()
    assert set(g.nodes) == set(graph.nodes) and set(g.edges) == set(graph.edges)
    return [n.name for n in graph if n.section == "backward" and not graph.predecessors(n.name)]


def _same(a, b) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def _state_equal(m1: nn.Module, m2: nn.Module) -> bool:
    return _same(list(m1.state_dict().values()), list(m2.state_dict().values()))


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 8)
        self.body = MLP()

    def forward(self, x):
        return self.body(torch.relu(self.inp(x)))


def _sgd_loop(model, call=None, after=None, steps=3):
    call = model if call is None else call
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    losses = []
    for i in range(steps):
        x, y = torch.randn(4, 8, generator=g), torch.randn(4, 4, generator=g)
        opt.zero_grad()
        loss = F.mse_loss(call(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.detach().clone())
        if after:
            after(i)
    return losses


def _net() -> Net:
    torch.manual_seed(0)
    return Net()


# -- torch.compile -----------------------------------------------------------------------------------
@pytest.fixture(autouse=True)
def compiler_alone():
    """Each test here starts from the compiler's default stance: Debuggers earlier tests dropped are collected
    (they give their stance back), and L1/mix captures other modules' fixtures keep alive (the suite runs
    modules interleaved by tier) are set aside for the test and put back after it."""
    from nbdebug.frameworks.torch import compiled

    gc.collect()
    held = compiled._held[:]
    if held:
        compiled._held.clear()
        prev = held[0]
        torch.compiler.set_stance(prev.stance, skip_guard_eval_unsafe=prev.skip_guard_eval_unsafe,
                                  force_backend=prev.backend)
    yield
    if held:
        compiled._held[:0] = held
        torch.compiler.set_stance("force_eager")


@pytest.mark.parametrize("level, whole", [("L1", True), ("mix", False)])
def test_a_compiled_model_at_op_level_runs_eagerly_and_says_so(level, whole):
    torch._dynamo.reset()
    plain = _net()
    want = _sgd_loop(plain)  # eager, undebugged
    model = _net()
    if whole:
        attached = call = torch.compile(model)
    else:
        model.body = torch.compile(model.body)
        attached = call = model
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dbg = nbdebug.Debugger(attached, level=level)
    said = [str(w.message) for w in caught if "torch.compile" in str(w.message)]
    assert len(said) == 1 and ("the model" if whole else "'body'") in said[0] and "force_eager" in said[0], said
    try:
        assert stance() == "force_eager"
        counts = []
        got = _sgd_loop(model, call, lambda i: counts.append(check_step(dbg, i)))
        assert "Functional.gelu.0.forward" in dbg.graph.nodes  # an op inside the compiled code is recorded
        assert _floating(dbg) == []
    finally:
        dbg.close()
    assert stance() == "default"  # the user's stance is back
    assert all(r > 10 for r, _ in counts), counts
    assert _same(got, want) and _state_equal(model, plain)  # bitwise the eager run: every op ran as recorded


def test_a_debugger_dropped_unclosed_gives_the_compiler_stance_back_when_collected():
    """An L1 Debugger the user drops without ``close()`` (re-running a notebook cell, a test) holds the
    ``force_eager`` stance only while it lives: once collected, compiled code of the process compiles again."""
    gc.collect()
    model = _net()
    nbdebug.Debugger(model, level="L1")
    assert stance() == "force_eager"
    del model
    gc.collect()
    assert stance() == "default"


@pytest.mark.parametrize("level", ["L0", "monitor"])
def test_a_compiled_model_at_module_level_stays_compiled_and_trains_bitwise(level):
    """Its class's code compiled and ran before the Debugger attached (here through another instance; the
    same holds for the model itself): dynamo does not guard on module hooks, so that code ran on without
    them and the capture saw the root module only (3 nodes at L0, no submodule series at monitor)."""
    torch._dynamo.reset()
    plain = _net()
    want = _sgd_loop(plain, torch.compile(plain))  # compiled, undebugged
    model = _net()
    compiled = torch.compile(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dbg = nbdebug.Debugger(compiled, level=level)
    said = [str(w.message) for w in caught if "torch.compile" in str(w.message)]
    assert len(said) == 1 and "torch.compiler.reset()" in said[0] and caught[0].filename == __file__, said
    with dbg:
        assert stance() == "default"
        counts = []
        got = _sgd_loop(model, compiled, lambda i: counts.append(check_step(dbg, i)))
        if level == "L0":
            assert all(r > 10 for r, _ in counts) and _floating(dbg) == []
        else:
            norms = [dbg.session.monitor.value(i, "Module._orig_mod.body.fc2.Linear", "output_norm") for i in range(3)]
            assert all(v is not None and v > 0 for v in norms), norms
    assert _same(got, want) and _state_equal(model, plain)


def test_a_compiled_models_step_replays_bitwise_at_L0_and_says_why_not_at_mix():
    """The replay's own capture found the live capture's hooks on the model: it cleared dynamo's caches again
    (recompiling the whole process's compiled code at every replay) and warned; at mix, where compiled code
    runs eagerly, the replay was not bitwise and blamed a generator or Python state."""
    torch._dynamo.reset()
    model = _net()
    compiled = torch.compile(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dbg = nbdebug.Debugger(compiled, level="L0")

    @dbg.step_fn
    def step(x, y):
        opt.zero_grad()
        loss = F.mse_loss(compiled(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    with dbg:
        g = torch.Generator().manual_seed(1)
        for _ in range(2):
            step(torch.randn(4, 8, generator=g), torch.randn(4, 4, generator=g))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            same = dbg.replay(1, level="L0")
            eager = dbg.replay(1, level="mix")
        assert same.bitwise and stance() == "default"
        assert not eager.bitwise and "torch.compile: the model ran compiled" in eager.reason, eager.reason
        said = [str(w.message) for w in caught]
        assert not any("torch.compiler.reset()" in m or "force_eager" in m for m in said), said


# -- evaluation between training steps ----------------------------------------------------------------
@pytest.mark.parametrize("level, grad_off", [("mix", torch.inference_mode), ("L0", torch.no_grad)])
def test_an_eval_pass_between_steps_is_recorded_into_the_next_step(level, grad_off):
    """No step of its own: the eval forward after step i is the first call of step i + 1 (``forward.0``, the
    training call ``forward.1``); its values (inference tensors included) are the ones computed."""
    def run(model, dbg=None):
        torch.manual_seed(2)  # dropout
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(1)
        out = []
        for i in range(3):
            model.train()
            x, y = torch.randn(4, 8, generator=g), torch.randn(4, 4, generator=g)
            opt.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            model.eval()
            with grad_off():
                out += [loss.detach(), model(torch.randn(6, 8, generator=g)).clone()]
            if dbg is not None and i:
                check_step(dbg, i)
        return out

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 4))
    plain = copy.deepcopy(model)
    want = run(plain)
    with nbdebug.Debugger(model, level=level) as dbg:
        got = run(model, dbg)
        assert sorted(dbg.session.steps) == [0, 1, 2]  # the optimizer's steps, no more
        assert "Module.3.Linear.forward.1" not in {k[0] for k in dbg.session.table(0).keys}
        evaluated = dbg.tensor("Module.3.Linear.forward.0", "output.0", step=2)  # step 1's eval pass
        trained = dbg.tensor("Module.3.Linear.forward.1", "output.0", step=2)
        assert evaluated.shape == (6, 4) and trained.shape == (4, 4)
        assert torch.equal(torch.from_numpy(evaluated), want[3])
        assert _floating(dbg) == []
    assert _same(got, want) and _state_equal(model, plain)


def _monitored(level: str, evaluate: bool) -> list:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    with nbdebug.Debugger(model, level=level) as dbg:
        for _ in range(3):
            x, y, e = torch.randn(4, 8, generator=g), torch.randn(4, 4, generator=g), torch.randn(6, 8, generator=g)
            opt.zero_grad()
            F.mse_loss(model(x), y).backward()
            opt.step()
            if evaluate:
                with torch.no_grad():
                    model(e)
        dbg.step()  # a step of the last eval pass alone: its calls are all it has, so they give its values
        m = dbg.session.monitor
        return [[m.value(s, f"Module.{i}.{c}", f) for i, c in ((0, "Linear"), (2, "Linear"))
                 for f in ("output_norm", "grad_input_norm")] for s in range(4)]


@pytest.mark.parametrize("level", ["monitor", "L0", "mix"])
def test_an_eval_pass_between_steps_leaves_the_module_series_to_the_training_call(level):
    """The eval pass is the first call of the next step: ``output_norm`` was the eval batch's (another batch
    size, eval mode), and ``grad_input_norm`` was missing from every step after one (no gradient reaches an
    eval call), at every level. The step's first call with gradients (at L0/mix: the first with a backward)
    gives them now; the series are those of the same run without the eval passes."""
    want, got = _monitored(level, False), _monitored(level, True)
    assert got[:3] == want[:3] and all(v is not None for row in got[:3] for v in row), (got, want)
    assert want[3] == [None] * 4 and got[3][0] is not None and got[3][1] is None  # the eval-only step


# -- LoRA-style fine-tuning -----------------------------------------------------------------------------
class LoRALinear(nn.Module):
    def __init__(self, d: int, o: int, r: int = 2) -> None:
        super().__init__()
        self.base = nn.Linear(d, o).requires_grad_(False)
        self.lora_A = nn.Parameter(torch.randn(r, d) * 0.1)
        self.lora_B = nn.Parameter(torch.zeros(o, r))

    def forward(self, x):
        return self.base(x) + F.linear(F.linear(x, self.lora_A), self.lora_B) * 0.5


class LoRANet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb, self.norm = nn.Linear(8, 16).requires_grad_(False), nn.LayerNorm(16).requires_grad_(False)
        self.fc1, self.fc2 = LoRALinear(16, 32), LoRALinear(32, 4)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(self.norm(self.emb(x)))))


def _lora_loop(model, after=None):
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    opt = torch.optim.AdamW([{"params": [p for n, p in named if n.endswith("lora_A")], "weight_decay": 0.1},
                             {"params": [p for n, p in named if n.endswith("lora_B")], "weight_decay": 0.0,
                              "lr": 3e-2}], lr=1e-2, foreach=True)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    g = torch.Generator().manual_seed(1)
    out = []
    for i in range(3):
        x, y = torch.randn(4, 8, generator=g), torch.randn(4, 4, generator=g)
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for _, p in named], 0.1, foreach=True)
        opt.step()
        sched.step()
        out.append(loss.detach().clone())
        if after:
            after(i)
    return out


@pytest.mark.parametrize("level", ["L0", "L1", "mix"])
def test_lora_fine_tuning_with_param_groups_a_scheduler_and_foreach_clipping(level):
    torch.manual_seed(0)
    model = LoRANet()
    plain = copy.deepcopy(model)
    want = _lora_loop(plain)
    counts = []
    with nbdebug.Debugger(model, level=level) as dbg:
        got = _lora_loop(model, lambda i: counts.append(check_step(dbg, i)))
        nodes = set(dbg.graph.nodes)
        assert "Module.fc1.lora_A.parameters_grad.0" not in nodes  # an adapter weight is no module
        grads = {n for n in nodes if ".parameters_grad." in n}
        assert grads == {"Module.fc1.LoRALinear.parameters_grad.0", "Module.fc2.LoRALinear.parameters_grad.0"}
        step = dbg.stats("Optimizer.AdamW.step.0", "parameters.fc1.lora_A", step=2) if level != "L0" else None
        assert step is None or step["shape"] == (2, 16)
        assert _floating(dbg) == []
    assert all(r > 10 for r, _ in counts), counts
    assert _same(got, want) and _state_equal(model, plain)


def test_save_repro_of_a_lora_step_named_step_that_clips_a_list_of_parameters(tmp_path):
    """The step function ``step`` calls ``opt.step()``: save_repro took the attribute name for a global and
    refused "the step function uses 'step', a function the script cannot rebuild"; the list of trainable
    parameters it clips (``params``, a global) was refused as "a list the script cannot rebuild". The script
    binds globals the code reads only, reaches the list through the rebuilt model, and recomputes the step
    (param groups, StepLR, foreach clipping) bit for bit."""
    from test_heldout_trials3 import _run_script

    torch.manual_seed(0)
    model = LoRANet()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW([{"params": params[:2], "weight_decay": 0.1},
                             {"params": params[2:], "weight_decay": 0.0, "lr": 3e-2}], lr=1e-2, foreach=True)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)
    dbg = nbdebug.Debugger(model, level="L0")
    globals().update(model=model, params=params, opt=opt, sched=sched)  # the names a notebook's step uses, as globals
    try:
        step = dbg.step_fn(_lora_step)
        step.__module__ = "__main__"  # a notebook's ``step = dbg.step_fn(step)``: a global named as ``opt.step``
        globals()["step"] = step
        g = torch.Generator().manual_seed(1)
        for _ in range(2):
            step(torch.randn(4, 8, generator=g), torch.randn(4, 4, generator=g))
        folder = dbg.save_repro(tmp_path / "r", "last", model_factory=f"{__name__}:LoRANet")
        script = (tmp_path / "r" / "repro.py").read_text()
        assert "params = [model.get_parameter('fc1.lora_A')" in script
        status, printed, _ = _run_script(folder)
        assert status == 0 and "bitwise identical" in printed and "NOT CHECKED" not in printed, printed
    finally:
        dbg.close()
        for name in ("model", "params", "opt", "sched", "step"):
            globals().pop(name, None)


def _lora_step(x, y):
    opt.zero_grad()  # noqa: F821 - bound by the test (a notebook's globals)
    loss = F.mse_loss(model(x), y)  # noqa: F821
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 0.1, foreach=True)  # noqa: F821
    opt.step()  # noqa: F821
    sched.step()  # noqa: F821
    return loss.detach()


# -- EMA, SAM, two optimizers ----------------------------------------------------------------------------
def _ema_run(kind: str, level: str | None, replay_at: int | None = None):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    if kind == "averaged":
        ema = torch.optim.swa_utils.AveragedModel(model,
                                                  multi_avg_fn=torch.optim.swa_utils.get_ema_multi_avg_fn(0.9))
    else:
        ema = copy.deepcopy(model).requires_grad_(False)
    ema_params = list(ema.parameters())

    def step(x, y):
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        if kind == "averaged":
            ema.update_parameters(model)
        else:
            with torch.no_grad():
                torch._foreach_lerp_(ema_params, list(model.parameters()), 0.1)
        return loss.detach()

    dbg = nbdebug.Debugger(model, level=level) if level else None
    if dbg:
        step = dbg.step_fn(step)
    g = torch.Generator().manual_seed(1)
    out, replays = [], []
    for i in range(3):
        x, y = torch.randn(4, 8, generator=g), torch.randn(4, 4, generator=g)
        out.append(step(x, y).clone())
        if i == replay_at:
            replays.append(dbg.replay(i))
    if dbg:
        dbg.close()
    return out + [t.detach().clone() for t in ema.state_dict().values()], replays


@pytest.mark.parametrize("kind, level", [("foreach_lerp", "L0"), ("averaged", "mix")])
def test_replaying_a_step_that_updates_an_ema_copy_leaves_the_live_ema_alone(kind, level):
    want, _ = _ema_run(kind, None)
    got, (replayed,) = _ema_run(kind, level, replay_at=1)
    assert replayed.bitwise, replayed.mismatches
    assert _same(got, want)  # the EMA weights (and n_averaged) too


def _sam_loop(model, after=None, rho=0.05):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    out = []
    for i in range(2):
        x, y = torch.randn(4, 8, generator=g), torch.randn(4, 4, generator=g)
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        params = [p for p in model.parameters() if p.grad is not None]
        norm = torch.norm(torch.stack([p.grad.norm(2) for p in params]), 2)
        with torch.no_grad():
            eps = [p.grad * (rho / (norm + 1e-12)) for p in params]
            torch._foreach_add_(params, eps)
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        with torch.no_grad():
            torch._foreach_sub_(params, eps)
        opt.step()
        out.append(loss.detach().clone())
        if after:
            after(i)
    return out


def _two_optimizers_loop(model, after=None, dbg=None):
    o1 = torch.optim.AdamW(model.inp.parameters(), lr=1e-2)
    o2 = torch.optim.SGD(model.body.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    out = []
    if dbg is not None:
        dbg.step()  # README: with several optimizers an iteration, call dbg.step() once before the loop too
    for i in range(2):
        x, y = torch.randn(4, 8, generator=g), torch.randn(4, 4, generator=g)
        o1.zero_grad()
        o2.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        o1.step()
        o2.step()
        if dbg is not None:
            dbg.step()
        out.append(loss.detach().clone())
        if after:
            after(i)
    return out


@pytest.mark.parametrize("loop", ["sam", "two_optimizers"])
def test_sam_and_two_optimizers_in_one_step(loop):
    model = _net()
    plain = copy.deepcopy(model)
    counts = []
    with nbdebug.Debugger(model, level="mix") as dbg:
        if loop == "sam":
            want = _sam_loop(plain)
            got = _sam_loop(model, lambda i: counts.append(check_step(dbg, i)))
            # two forward passes in the step: the second is call 1 of each module
            assert {"Module.body.fc1.Linear.forward.1", "Module.body.fc1.Linear.backward.1"} <= set(dbg.graph.nodes)
        else:
            want = _two_optimizers_loop(plain)
            got = _two_optimizers_loop(model, lambda i: counts.append(check_step(dbg, i)), dbg)
            assert sorted(dbg.session.steps) == [0, 1]  # one step an iteration, both optimizers in it
            # the step's optimizer steps are numbered in their order, whatever their class
            assert {"Optimizer.AdamW.step.0", "Optimizer.SGD.step.1"} <= {k[0] for k in dbg.session.table(1).keys}
        assert _floating(dbg) == [] and dbg.first_nonfinite(None) is None
    assert all(r > 10 for r, _ in counts), counts
    assert _same(got, want) and _state_equal(model, plain)


class MaskedScores(nn.Module):
    """Longformer's ``_mask_invalid_locations``: ``x[...] = where(mask, full_like(x, -inf), x)`` before a
    softmax (``fill``: the value written; NaN poisons the softmax)."""

    def __init__(self, fill: float) -> None:
        super().__init__()
        self.fc, self.fill = nn.Linear(4, 4), fill

    def forward(self, x):
        s = self.fc(x)
        s[:, :2] = torch.where(s[:, :2] > 0, torch.full_like(s[:, :2], self.fill), s[:, :2])
        return torch.softmax(s, -1)


@pytest.mark.parametrize("fill, origin", [(-float("inf"), None), (float("nan"), "Torch.full_like.0.forward")])
def test_a_mask_written_in_place_before_a_softmax_is_absorbed(fill, origin):
    """Longformer at mix: ``first_nonfinite`` of a clean step named ``Torch.full_like.0.forward``: its ``-inf``
    goes into the scores through ``Tensor.__setitem__``, which has no output slot, and the softmax reading
    the scores after it has its edge from the scores' producer, so the absorption was not seen. The readers
    of a write's target after it are followed now; a NaN written the same way is still the origin."""
    torch.manual_seed(0)
    model = MaskedScores(fill)
    with nbdebug.Debugger(model, level="L1") as dbg:
        model(torch.randn(3, 4)).sum().backward()
        dbg.step()
        assert dbg.stats("Torch.full_like.0.forward", "output.0", step=0)["nan_count" if origin else "neg_inf_count"]
        got = dbg.first_nonfinite(0)
        assert (got and got[0]) == origin, got


# -- architectures ----------------------------------------------------------------------------------------
VOCAB = 64


def _arch(kind: str):
    import transformers as T

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    if kind == "channels_last_cnn":
        m = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                          nn.Conv2d(8, 8, 3, groups=8, padding=1), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(8, 4)).to(memory_format=torch.channels_last)
        batches = [(torch.randn(2, 3, 8, 8, generator=g).to(memory_format=torch.channels_last),
                    torch.randint(0, 4, (2,), generator=g)) for _ in range(2)]
        return m, batches, lambda m, b: F.cross_entropy(m(b[0]), b[1])
    if kind == "fnet":
        m = T.FNetForMaskedLM(T.FNetConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1,
                                           intermediate_size=64, max_position_embeddings=64,
                                           hidden_dropout_prob=0.0, use_tpu_fourier_optimizations=False))
    elif kind == "longformer":
        m = T.LongformerForMaskedLM(T.LongformerConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1,
                                                       num_attention_heads=2, intermediate_size=64,
                                                       max_position_embeddings=80, attention_window=[4],
                                                       hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                                                       pad_token_id=1))
    elif kind == "bloom":
        m = T.BloomForCausalLM(T.BloomConfig(vocab_size=VOCAB, hidden_size=32, n_layer=1, n_head=4,
                                             hidden_dropout=0.0, attention_dropout=0.0))
    else:
        m = T.GPTNeoXForCausalLM(T.GPTNeoXConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1,
                                                 num_attention_heads=4, intermediate_size=64,
                                                 max_position_embeddings=64, rotary_pct=0.5,
                                                 hidden_dropout=0.0, attention_dropout=0.0))
    return m.train(), [torch.randint(0, VOCAB, (2, 8), generator=g) for _ in range(2)], \
        lambda m, b: m(input_ids=b, labels=b).loss


@pytest.mark.parametrize("kind", ["channels_last_cnn", "fnet", "bloom", "gpt_neox", "longformer"])
def test_architecture_trains_bitwise_and_shows_the_values_used(kind):
    model, batches, loss_fn = _arch(kind)
    plain = copy.deepcopy(model)

    def run(m, after=None):
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
        out = []
        for i, b in enumerate(batches):
            opt.zero_grad()
            loss = loss_fn(m, b)
            loss.backward()
            opt.step()
            out.append(loss.detach().clone())
            if after:
                after(i)
        return out

    want = run(plain)
    counts = []
    with nbdebug.Debugger(model, level="mix") as dbg:
        def after(i):
            counts.append(check_step(dbg, i))
            if i:
                check_step(dbg, i - 1)

        got = run(model, after)
        assert _floating(dbg) == [] and dbg.first_nonfinite(None) is None
    assert all(r > 10 for r, _ in counts), counts
    assert _same(got, want) and _state_equal(model, plain)
