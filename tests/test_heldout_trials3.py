"""The "whole run" features tried as an outside user would, on set-ups nbdebug was not built against (round 3).

Monitor level left on, watchpoints over time, the timeline, ``dbg.replay`` and ``save_repro`` on tiny
``transformers`` models built from configs (GPT-J, Qwen2, Mistral, Mixtral, Falcon, DeBERTa-v2, Funnel, XLNet,
Whisper, CLIP, Swin, ConvNeXt) and unusual loops (gradient accumulation over 4 micro-batches with clipping, a
scheduler and ``zero_grad(set_to_none=False)``; bf16 autocast with a ``GradScaler`` skipping a step; a NaN at
step k). Each defect they showed is tested on the smallest set-up that shows it:

- at ``L0``/``mix`` the monitor series of a module read off the statistics table looked for the slot
  ``output.0`` only: a module returning a ``ModelOutput`` (HF's ``Qwen2Model``, a CLIP tower, Whisper's
  encoder and decoder) records ``output.last_hidden_state`` and had no ``output_norm``/``output_max_abs``,
  where level ``monitor`` has them (README: L0, L1 and mix record the same series). Its first output slot
  gives them now;
- a NaN the model computed (a NaN loss, the NaN gradient norm of a step a ``GradScaler`` skips) was taken by
  SPIKE and DRIFT for an absent value and fired nothing, where an Inf fired both. It fires them now (and ends
  a STALL); absent values are still skipped;
- a step naming a part of the model (``emb = model.get_input_embeddings()``) was refused by ``save_repro``;
  the script reaches it through the model it rebuilds now;
- a ``torch.Generator`` of the step's own (input noise, dropout with ``generator=``) was outside the kept
  state, so the replay was not bitwise, and it drew from the live generator, so the live run after a replay
  differed from one without. Its state when the step started is kept now (the replay is bitwise and puts the
  live state back after), and ``save_repro`` hands it over;
- ``save_repro`` took ``nn.Sequential`` for a class its script builds with no argument: the script built an
  empty one and died on a ``KeyError``. It asks for a factory now, and a script whose rebuilt model lacks the
  saved parameters says so.

What held (no test of its own here): replay from L0 at L0 and mix bitwise on the twelve models above with
dropout on (the same keys at the same level), the live run bitwise unchanged by replays; from monitor at
monitor, mix and L1; monitor series equal to values recomputed by hooks of our own under accumulation over
4 micro-batches, clipping, a scheduler and ``zero_grad(set_to_none=False)``; ``save_repro`` bitwise in a fresh
process on GPT-J, Mixtral, Whisper, CLIP, XLNet, Funnel and Swin (clipping and a scheduler) and on a
GradScaler step; a temporal hit replayed by ``on_hit="replay"``; the timeline's columns exact over the
full-resolution steps, a folded spike kept in its block.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import nbdebug
from nbdebug.frameworks.torch.repro import ReproUnsupported
from nbdebug.replay.replayer import MEASURED

VOCAB = 64


def _qwen2():
    import transformers

    torch.manual_seed(0)
    cfg = transformers.Qwen2Config(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=64, intermediate_size=64)
    return transformers.Qwen2ForCausalLM(cfg).train()


def _batches(n, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (2, 8), generator=g) for _ in range(n)]


def _monitor_rows(level, steps=2):
    model = _qwen2()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    with nbdebug.Debugger(model, level=level) as dbg:
        for ids in _batches(steps):
            opt.zero_grad()
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()
        return [dbg.session.monitor.row(s) for s in range(steps)]


@pytest.mark.parametrize("level", ["L0", "mix"])
def test_a_module_returning_a_model_output_has_its_norm_series_at_every_level(level):
    """``Qwen2Model`` returns a ``BaseModelOutputWithPast``: its output norms at L0/mix (read off the
    statistics of ``output.last_hidden_state``) are the monitor level's, and so is every other series."""
    want, got = _monitor_rows("monitor"), _monitor_rows(level)
    for a, b in zip(want, got, strict=True):
        assert set(a) == set(b), sorted(set(a) ^ set(b))[:4]
        assert ("Module.model.Qwen2Model", "output_norm") in b
        bad = [k for k in a if not np.isclose(a[k], b[k], rtol=1e-4, atol=1e-7)]
        assert not bad, [(k, a[k], b[k]) for k in bad[:3]]


def _amp_run(level, poison, steps=14, k=12):
    """bf16 autocast with a GradScaler; at step ``k`` the loss is multiplied by ``poison`` (NaN/Inf): the
    scaler finds non-finite gradients and skips the optimizer's step."""
    model = _qwen2()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
    dbg = nbdebug.Debugger(model, level=level, replay_window=2)
    dbg.track_loss_scale(scaler)
    dbg.watch("SPIKE", "Run", field="loss", window=10)
    dbg.watch("DRIFT", "Run", field="loss", window=10)
    dbg.watch("SPIKE", "Run", field="grad_norm_total", window=10)
    dbg.watch("STALL", "Run", field="loss", below=1e9, steps=2)  # fires from step 1 until a NaN ends the run

    @dbg.step_fn
    def train_step(ids, scale):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss * scale
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return loss.detach()

    for s, ids in enumerate(_batches(steps)):
        train_step(ids, poison if s == k else 1.0)
    return dbg


@pytest.mark.parametrize("poison", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_a_nonfinite_loss_fires_spike_and_drift_and_the_skipped_step_replays(poison):
    """The NaN loss of step 12 fired nothing over time (an Inf fired SPIKE and DRIFT): both do now, on the loss
    and on the gradient norm (NaN in both cases: the scaler unscales Inf gradients); STALL's run of steps
    ends at the NaN. The steps around it replay bitwise, the skipped one included (loss scale halved after)."""
    dbg = _amp_run("monitor", poison)
    try:
        mon = dbg.session.monitor
        assert np.isnan(mon.value(12, "Run", "grad_norm_total"))
        assert mon.value(12, "Run", "loss_scale") == 1024.0 and mon.value(13, "Run", "loss_scale") == 512.0
        temporal = {(h.condition, h.slot) for h in dbg.hits if h.step == 12 and h.condition != "STALL"}
        assert temporal == {("SPIKE", "loss"), ("DRIFT", "loss"), ("SPIKE", "grad_norm_total")}
        assert not [h for h in dbg.hits if h.condition in ("SPIKE", "DRIFT") and h.step != 12]
        stall = sorted(h.step for h in dbg.hits if h.condition == "STALL")
        assert stall == [s for s in range(1, 14) if s not in (12, 13)]  # the run starts again at 12 (2 steps)
        wp = next(h for h in dbg.hits if h.condition == "SPIKE" and h.slot == "loss").watchpoint
        band = dbg.watchpoints.temporal.bands[(wp, "Run", "loss", 12)]
        assert band.since == 12 and band.n == 10 and np.isfinite(band.median)
        # recheck() evaluates them again over the kept history (earlier rows of the monitor, not the last)
        again = {(h.condition, h.slot, h.step) for h in dbg.recheck() if h.condition in ("SPIKE", "DRIFT")}
        assert again == {(c, f, 12) for c, f in temporal}
        assert dbg.replay_steps == [12, 13]
        for step, level in ((12, "monitor"), (12, "mix"), (13, "mix")):
            r = dbg.replay(step, level=level)
            # from monitor to mix only the series both measure alike are compared (replayer.MEASURED): at the
            # skipped step no update or moment norms, so the gradient norms, the loss and the loss scale
            row = mon.row(step)
            want = len(row) if level == "monitor" else sum(f in MEASURED for _, f in row)
            assert r.bitwise and r.compared == want and want > 15, (step, level, r.mismatches[:3], r.error)
    finally:
        dbg.close()


def test_an_absent_value_is_still_skipped_over_time():
    """A series missing at a step (no value recorded) fires nothing: only a NaN the model computed does."""
    from nbdebug.session.monitor import Monitor
    from nbdebug.session.session import Session
    from nbdebug.watch.watchpoints import WatchManager

    s = Session(framework="none")
    s.monitor = Monitor()
    wm = WatchManager(s)
    wm.watch("SPIKE", "Run", field="loss", window=10)
    keys = [("Run", "loss"), ("Run", "grad_norm_total")]
    hits = []
    for step in range(20):
        present = np.array([step != 14, True])
        loss = np.nan if step in (14, 17) else 5.0 + step % 3
        s.monitor.record(step, keys, np.array([loss, 1.0]), present)
        hits += wm.temporal.check(wm.watchpoints.values(), step)
    assert [(h.step, h.slot) for h in hits] == [(17, "loss")]


def _run_script(folder):
    """``repro.py`` run in this process as ``python repro.py`` would (exit status, printed lines, its globals)."""
    import contextlib
    import io
    import os

    path = os.path.join(folder, "repro.py")
    with open(path) as f:
        code = compile(f.read(), path, "exec")
    g: dict = {"__file__": path, "__name__": "__main__"}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            exec(code, g)
            status = 0
        except SystemExit as e:
            status = e.code
    return status, out.getvalue(), g


def test_save_repro_binds_a_submodule_and_a_parameter_the_step_names(tmp_path):
    """A step naming a part of the model (``emb = model.get_input_embeddings()``, ``w = model.lm_head.weight``)
    was refused by save_repro ("a Embedding the script cannot rebuild"); the script reaches them through the
    model it rebuilds (``model.get_submodule``/``get_parameter``) and recomputes the step bitwise — loss and
    the weights the step left."""
    model = _qwen2()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    emb, w = model.get_input_embeddings(), model.lm_head.weight
    dbg = nbdebug.Debugger(model, level="L0")

    @dbg.step_fn
    def train_step(ids):
        opt.zero_grad()
        loss = model(inputs_embeds=emb(ids), labels=ids).loss + 1e-3 * w.pow(2).sum()
        loss.backward()
        opt.step()
        return loss

    try:
        for ids in _batches(2):
            train_step(ids)
        folder = dbg.save_repro(tmp_path / "r", 1)
        script = (tmp_path / "r" / "repro.py").read_text()
        assert "emb = model.get_submodule('model.embed_tokens')" in script
        assert "w = model.get_parameter('lm_head.weight')" in script
        status, printed, g = _run_script(folder)
        assert status == 0 and "bitwise identical" in printed, printed
        after = g["model"].state_dict()
        assert all(torch.equal(v, after[k]) for k, v in model.state_dict().items())
    finally:
        dbg.close()


class SmallNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(4, 8), torch.nn.Linear(8, 1)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


def _noisy_run(replay_at=None, tmp_path=None):
    """A step drawing input noise from a ``torch.Generator`` of its own (``generator=``); with ``replay_at``,
    that step is replayed (at mix and L0) after it ran, and handed over by save_repro."""
    torch.manual_seed(0)
    model = SmallNet()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(3)
    dbg = nbdebug.Debugger(model, level="L0")

    @dbg.step_fn
    def train_step(x):
        opt.zero_grad()
        loss = model(x + 0.1 * torch.randn(x.shape, generator=gen)).pow(2).mean()
        loss.backward()
        opt.step()
        return loss

    losses, replays, folder = [], [], None
    try:
        for s in range(4):
            losses.append(train_step(torch.ones(5, 4)).detach())
            if s == replay_at:
                state = gen.get_state()
                replays += [dbg.replay(s, level=lv) for lv in ("mix", "L0")]
                assert torch.equal(gen.get_state(), state)  # the live generator is where the live step left it
                if tmp_path is not None:
                    folder = dbg.save_repro(tmp_path / "r", s)
    finally:
        dbg.close()
    return losses, replays, model, folder


def test_a_step_drawing_from_its_own_generator_replays_bitwise_and_leaves_it_where_it_was(tmp_path):
    """A ``torch.Generator`` of the step's own (reached through its closure) was outside the kept state: the
    replay drew other noise (not bitwise) and left the live generator advanced, so the live run after a replay
    differed from one without. Its state when the step started is kept with the step now: the replay is
    bitwise, the live generator is put back, and save_repro's script rebuilds it (the loss bitwise)."""
    want, _, plain, _ = _noisy_run()
    got, replays, model, folder = _noisy_run(replay_at=1, tmp_path=tmp_path)
    assert [r.bitwise for r in replays] == [True, True], [r.reason for r in replays]
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), plain.state_dict().values(),
                                                     strict=True))
    status, printed, g = _run_script(folder)
    assert status == 0 and "bitwise identical" in printed, printed
    assert torch.equal(g["loss"].detach(), want[1])


def test_save_repro_refuses_a_sequential_it_would_rebuild_empty(tmp_path):
    """``nn.Sequential()`` takes no required argument, so save_repro took it for a class the script builds by
    itself: the script built an empty Sequential and failed with a ``KeyError``. It asks for a factory now,
    and a script whose rebuilt model lacks the saved parameters says so."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    dbg = nbdebug.Debugger(model, level="L0")

    @dbg.step_fn
    def train_step(x):
        opt.zero_grad()
        loss = model(x).sum()
        loss.backward()
        opt.step()
        return loss

    try:
        train_step(torch.ones(2, 4))
        with pytest.raises(ReproUnsupported, match="cannot build a Sequential by itself"):
            dbg.save_repro(tmp_path / "seq", 0)
        assert not (tmp_path / "seq").exists()  # a refusal leaves no folder behind (a retry is not refused)
        folder = dbg.save_repro(tmp_path / "small", 0, model_factory=f"{__name__}:SmallNet")  # the wrong model
        status, _printed, _g = _run_script(folder)
        assert "the rebuilt model's parameters are not the saved ones" in str(status) and "'0.weight'" in str(status)
    finally:
        dbg.close()


class WithUnused(torch.nn.Module):
    """A parameter the forward does not use (XLNet's ``seg_embed`` without token types): it gets no gradient,
    and the optimizer leaves it as it is."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 2)
        self.spare = torch.nn.Parameter(torch.ones(3))

    def forward(self, x):
        return self.fc(x)


@pytest.mark.parametrize("level", ["L0", "L1", "mix"])
def test_a_parameter_the_step_does_not_use_has_its_weight_norm_at_every_level(level):
    """At L0/L1/mix ``weight_norm`` came from the ``Parameter`` node only, which a parameter the forward does
    not use has none of: no ``weight_norm`` and no ``update_ratio`` (0: the optimizer skips it) for it, where
    the monitor level has both — and STALL on ``update_ratio`` (the recommended set) is there to find such a
    parameter."""
    rows = {}
    for lv in ("monitor", level):
        torch.manual_seed(0)
        model = WithUnused()
        opt = torch.optim.AdamW(model.parameters(), lr=0.1, weight_decay=0.5)
        with nbdebug.Debugger(model, level=lv) as dbg:
            for _ in range(2):
                opt.zero_grad()
                model(torch.ones(3, 4)).sum().backward()
                opt.step()
            rows[lv] = dbg.session.monitor.row(1)
    want, got = rows["monitor"], rows[level]
    assert set(want) == set(got), sorted(set(want) ^ set(got))
    for f in ("weight_norm", "update_ratio"):
        assert np.isclose(got[("Parameter.spare", f)], want[("Parameter.spare", f)], rtol=1e-6)
    assert want[("Parameter.spare", "update_ratio")] == 0.0 and want[("Parameter.spare", "weight_norm")] > 1


class Unpermute(torch.nn.Module):
    """The inverse of a permutation written into ``torch.empty_like`` (HF's grouped-MoE experts:
    ``inv_perm = torch.empty_like(perm); inv_perm[perm] = torch.arange(n)``)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        perm = torch.argsort(x[:, 0])
        inv = torch.empty_like(perm)
        inv[perm] = torch.arange(perm.numel())
        return self.fc(x[perm][inv])


class NoisyBuffer(torch.nn.Module):
    """A float buffer made by ``torch.empty`` and then filled in place (``normal_``), as init and noise code does:
    its bytes before the fill are whatever the allocator left there (a NaN of an earlier tensor, say)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        noise = torch.empty(x.shape).normal_(0.0, 1e-3, generator=torch.Generator().manual_seed(0))
        return self.fc(x + noise)


@pytest.mark.parametrize("level", ["L1", "mix"])
def test_an_uninitialized_write_target_has_no_statistics_and_the_step_replays_bitwise(level, tmp_path):
    """At L1/mix the target of an in-place write made by ``torch.empty_like`` (HF's grouped MoE: Mixtral's
    ``inv_perm``) was measured as ``Tensor.__setitem__``'s ``input.0``: uninitialized memory, different in every
    run, so a replay of the step was reported not bitwise (and a NaN left in reused memory could fire TO).
    Memory nobody wrote has no statistics, saying why; what the write leaves is measured as usual."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(Unpermute(), NoisyBuffer())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    dbg = nbdebug.Debugger(model, level=level, dump_dir=str(tmp_path), task="statistics")
    dbg.watch("TO")

    @dbg.step_fn
    def train_step(x):
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        return loss

    try:
        for _ in range(2):
            train_step(torch.randn(64, 4))
        (dump,) = [json.loads(p.read_text()) for p in tmp_path.glob("step1/**/dump.json")]
        for node in ("Tensor.__setitem__.0.forward", "Tensor.normal_.0.forward"):
            entry = dump["data"][node]["input_args"][0]  # the dump says what the statistics say: none
            assert entry["Max"] is None and entry["Norm"] is None, entry
            st = dbg.stats(node, "input.0")
            assert "uninitialized memory" in str(st.get("unsupported")), (node, st)
            assert st["nan_count"] == 0 and st["max"] is None
            with pytest.raises(nbdebug.NotRetainedError):
                dbg.tensor(node, "input.0")
        out = dbg.stats("Tensor.normal_.0.forward", "output.0")  # the fill: measured
        assert out.get("unsupported") is None and 0 < out["max"] < 1e-2 and out["nan_count"] == 0
        assert not dbg.hits
        replayed = dbg.replay(1, level=level)
        assert replayed.bitwise, replayed
    finally:
        dbg.close()


def test_save_repro_of_an_op_under_autocast_runs_it_under_autocast(tmp_path):
    """An op of a bf16-autocast step (``F.linear`` of fp32 weights, computed in bf16) was called by its script
    outside autocast: fp32 output (DIFFERS), or a dtype error where one argument was already bf16. The script
    enters the autocast regions the op ran in (the manifest's ``autocast``)."""
    torch.manual_seed(0)
    model = SmallNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    dbg = nbdebug.Debugger(model, level="L0")

    @dbg.step_fn
    def train_step(x):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        return loss

    try:
        train_step(torch.randn(3, 4))
        for i, node in enumerate(("Functional.linear.0.forward", "Functional.linear.1.forward")):
            folder = dbg.save_repro(tmp_path / f"op{i}", 0, node=node)
            status, printed, g = _run_script(folder)
            assert status == 0 and "output bitwise identical" in printed, printed
            assert g["M"]["autocast"] == [["cpu", "bfloat16"]] and g["out"].dtype == torch.bfloat16
    finally:
        dbg.close()


def test_the_timeline_of_a_statistic_reads_a_model_outputs_first_field():
    """The timeline's per-tensor fields (``norm`` …) read each forward module's ``output.0``: an HF model whose
    ``Qwen2Model`` returns a ``ModelOutput`` (``output.last_hidden_state``) made the whole timeline raise a
    ``KeyError`` when ``norm`` was picked. Its row is that slot's statistics now."""
    from nbdebug.ui.timeline import RunSeries, Timeline

    model = _qwen2()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    with nbdebug.Debugger(model, level="L0") as dbg:
        for ids in _batches(3):
            opt.zero_grad()
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()
        tl = Timeline(dbg.session)
        tl.set_field("norm")
        msg, _bufs = tl.message()
        assert msg["shape"] == [len(msg["rows"]), 3] and "empty" not in msg
        node = "Module.model.Qwen2Model.forward.0"
        steps, vmax, _vmin = RunSeries(dbg.session).series(node, "norm")
        assert steps.tolist() == [0, 1, 2]
        assert vmax.tolist() == [dbg.stats(node, "output.last_hidden_state", step=s)["norm"] for s in range(3)]


def test_a_nan_weight_is_caught_over_time_on_a_statistic_and_replayed_to_its_origin():
    """DRIFT on a module's output ``norm`` (the statistics table's series, at L0) with a threshold no clean step
    reaches: a NaN written into the first layer's weight before step 6 makes the norm NaN, which fired nothing.
    It fires at step 6 now; ``on_hit="replay"`` replays the step at mix and names the NaN weight."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    dbg = nbdebug.Debugger(model, level="L0", on_hit="replay")
    dbg.watch("DRIFT", "Module.2.*", field="norm", window=5, z=1e3)

    @dbg.step_fn
    def train_step(x):
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        return loss

    def loop():
        g = torch.Generator().manual_seed(1)
        for s in range(9):
            if s == 6:
                with torch.no_grad():
                    model[0].weight[0, 0] = float("nan")
            train_step(torch.randn(5, 4, generator=g))

    try:
        dbg.run(loop)
        assert dbg.wait(60).value == "paused" and dbg.step_index == 7
        on_output = {(h.condition, h.node, h.step) for h in dbg.hits if h.node.startswith("Module.2.Linear.forward")}
        assert on_output == {("DRIFT", "Module.2.Linear.forward.0", 6)}
        assert min(h.step for h in dbg.hits) == 6
        r = dbg.replayed
        assert r.step == 6 and r.bitwise and r.first_nonfinite() == ("Parameter.0.weight", "output.0", 6)
    finally:
        dbg.terminate()
        dbg.close()
