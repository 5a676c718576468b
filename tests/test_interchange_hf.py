"""Where nbdebug's dump and msProbe's differ on HF models (issue 26): T5's shared ``position_bias`` and GPT-2 with
gradient checkpointing, each on a tiny model built from a config, under real msProbe's ``PrecisionDebugger``
and under ``nbdebug.Debugger`` (and, for T5, with no tool), each in its own subprocess.

* T5: the first block's attention makes ``position_bias``, adds it to its scores and returns it; the second
  block takes it in, adds it to its own scores and returns it unchanged. A module backward's ``input.k`` is
  the gradient of output ``k`` *from outside the call* (a full backward hook's ``grad_output``): for the first
  block, the second block's use only (not the tensor's gradient, which also holds the first block's own use);
  for the second, ``None`` (nothing after it uses ``position_bias``). Its ``output.1`` is its own share.
* Gradient checkpointing: backward runs each checkpointed block's forward again; those are ops the model
  ran, and msProbe records them as forward entries, counters continuing. So do we. Without the checkpoint's
  early stop the two dumps have the same entries in the same order. With it (torch's default), the
  recomputation is stopped by an exception inside the first op whose saved tensors no backward needs: both
  write that call with its inputs and no output, but msProbe records no forward API after it for the rest of
  the step (the next blocks' recomputations and the optimizer's updates, which did run).
"""

from __future__ import annotations

import json
import math
import os

import pytest
from interchange_runs import WRITE_CONFIG, run_scripts, step_data

pytestmark = pytest.mark.slow  # its set-up: seven training runs of HF models in subprocesses (~75 s on 2 cores)

SCRIPT = r'''
import json, os, sys
import torch
import torch.utils.checkpoint as cp

tool, case, level, out = sys.argv[1:5]
torch.manual_seed(0)
torch.set_num_threads(1)
if case == "t5":
    from transformers import T5Config, T5ForConditionalGeneration
    model = T5ForConditionalGeneration(T5Config(num_layers=2, num_decoder_layers=2, d_model=16, d_ff=32, num_heads=2,
                                                d_kv=8, vocab_size=32, dropout_rate=0, decoder_start_token_id=0,
                                                pad_token_id=0))
    batches = [(torch.randint(0, 32, (2, 8)), torch.randint(0, 32, (2, 4))) for _ in range(2)]

    def loss_of(b):
        return model(input_ids=b[0], labels=b[1]).loss
else:  # gpt2_ckpt, gpt2_ckpt_full (no early stop)
    from transformers import GPT2Config, GPT2LMHeadModel
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=32, n_positions=16, resid_pdrop=0,
                                       embd_pdrop=0, attn_pdrop=0, bos_token_id=0, eos_token_id=0))
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    batches = [torch.randint(0, 32, (2, 8)) for _ in range(2)]

    def loss_of(b):
        return model(input_ids=b, labels=b).loss
model.train()
''' + WRITE_CONFIG + r'''opt = torch.optim.SGD(model.parameters(), lr=0.1)
if tool == "msprobe":
    from msprobe.pytorch import PrecisionDebugger
    dbg = PrecisionDebugger(config_path=cfg)
elif tool == "nbdebug":
    import nbdebug
    dbg = nbdebug.Debugger(model, level, dump_dir=os.path.join(out, "dump"), task="statistics", config=cfg)
else:  # plain: the total gradient of the encoder's position_bias tensor
    kept = []

    def keep(m, a, o):
        o[1].retain_grad()
        kept.append(o[1])

    model.encoder.block[0].register_forward_hook(keep)
norms = []
for b in batches:
    if tool == "msprobe":
        dbg.start(model)
    opt.zero_grad()
    with cp.set_checkpoint_early_stop(case != "gpt2_ckpt_full"):  # read when the forward runs
        loss_of(b).backward()
    if tool == "plain":
        norms.append(float(kept[-1].grad.norm()))
    opt.step()
    if tool == "msprobe":
        dbg.stop()
        dbg.step()
if tool == "nbdebug":
    dbg.close()
with open(os.path.join(out, "norms.json"), "w") as f:
    json.dump(norms, f)
'''

RUNS = [("msprobe", "t5", "L0"), ("nbdebug", "t5", "L0"), ("plain", "t5", "L0"),
        ("msprobe", "gpt2_ckpt", "L1"), ("nbdebug", "gpt2_ckpt", "L1"),
        ("msprobe", "gpt2_ckpt_full", "L1"), ("nbdebug", "gpt2_ckpt_full", "L1")]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return run_scripts(tmp_path_factory.mktemp("interchange_hf"), SCRIPT, RUNS,
                       imports=("transformers.models.t5.modeling_t5", "transformers.models.gpt2.modeling_gpt2"))


def _norm(entry: dict, side: str, i: int) -> float | None:
    t = entry[side][i] if i < len(entry[side]) else None
    return None if t is None else t["Norm"]


@pytest.mark.parametrize("step", [0, 1])
def test_t5_position_bias_gradient_from_outside_the_call(runs, step):
    ours, theirs = step_data(runs[("nbdebug", "t5", "L0")], step), step_data(runs[("msprobe", "t5", "L0")], step)
    with open(os.path.join(runs[("plain", "t5", "L0")], "norms.json")) as f:
        total = json.load(f)[step]  # the position_bias tensor's gradient: both blocks' uses
    assert list(ours) == list(theirs)
    for stack in ("encoder", "decoder"):
        first, second = f"Module.{stack}.block.0", f"Module.{stack}.block.1"
        for inner in ("T5Block", "layer.0.T5LayerSelfAttention", "layer.0.SelfAttention.T5Attention"):
            name = f"{second}.{inner}.backward.0"
            # nothing after the second block uses the position_bias it returns: no gradient comes in
            assert len(ours[name]["input"]) == len(theirs[name]["input"]) == 2, name
            assert ours[name]["input"][1] is None and theirs[name]["input"][1] is None, name
        out_first, in_second = f"{first}.T5Block.backward.0", f"{second}.T5Block.backward.0"
        # what reaches the first block's position_bias from outside is the second block's share of it
        assert ours[out_first]["input"][1] == ours[in_second]["output"][1]
        for name, side in ((out_first, "input"), (in_second, "output")):
            assert math.isclose(_norm(ours[name], side, 1), _norm(theirs[name], side, 1), rel_tol=1e-4), name
    # ... which is not the tensor's gradient: that also holds the first block's own use
    share = _norm(ours["Module.encoder.block.0.T5Block.backward.0"], "input", 1)
    assert not math.isclose(share, total, rel_tol=0.05)
    attn = _norm(ours["Module.encoder.block.0.layer.0.SelfAttention.T5Attention.backward.0"], "input", 1)
    assert attn == share  # the same tensor leaves the attention, its layer and the block


@pytest.mark.parametrize("step", [0, 1])
def test_checkpoint_recomputation_recorded_as_msprobe_records_it(runs, step):
    ours = step_data(runs[("nbdebug", "gpt2_ckpt_full", "L1")], step)
    theirs = step_data(runs[("msprobe", "gpt2_ckpt_full", "L1")], step)
    assert list(ours) == list(theirs)
    # the recomputed forward comes after backward began, counters continuing: block 1's first layer_norm
    # (layer_norm.2) again as layer_norm.5, block 0's (layer_norm.0) as layer_norm.7; same values, bitwise
    names = list(ours)
    assert names.index("Functional.layer_norm.5.forward") > names.index("Functional.cross_entropy.0.backward")
    for again, first in (("5", "2"), ("7", "0")):
        assert ours[f"Functional.layer_norm.{again}.forward"] == ours[f"Functional.layer_norm.{first}.forward"]
        assert ours[f"Functional.layer_norm.{again}.forward"] == theirs[f"Functional.layer_norm.{again}.forward"]
    assert not [n for n in names if n.startswith("Functional.layer_norm.") and n.endswith((".5.backward",
                                                                                           ".7.backward"))]


@pytest.mark.parametrize("step", [0, 1])
def test_checkpoint_early_stop_msprobe_records_no_forward_after_it(runs, step):
    ours = step_data(runs[("nbdebug", "gpt2_ckpt", "L1")], step)
    theirs = step_data(runs[("msprobe", "gpt2_ckpt", "L1")], step)
    full = step_data(runs[("msprobe", "gpt2_ckpt_full", "L1")], step)
    assert [k for k in ours if k in theirs] == list(theirs)  # all of msProbe's entries, in its order
    only_ours = [k for k in ours if k not in theirs]
    # the op inside which the early stop was raised: its inputs, no output, in both
    stopped = "Torch.addmm.11.forward"
    assert ours[stopped] == theirs[stopped] and "output" not in ours[stopped]  # its kwargs too (``beta``...)
    names = list(ours)
    assert only_ours and all(n.endswith(".forward") and names.index(n) > names.index(stopped) for n in only_ours)
    # among them block 0's recomputation and the optimizer's updates (SGD: one add_ per parameter), which
    # msProbe records when nothing stops a recomputation
    updates = [k for k in only_ours if k.startswith("Tensor.add_.")]
    assert len(updates) == 28 and all(k in full for k in updates)
    assert "Functional.layer_norm.7.forward" in only_ours


@pytest.mark.parametrize("reentrant", [False, True], ids=["non_reentrant", "reentrant"])
def test_checkpoint_recomputation_recorded_and_training_bitwise(reentrant):
    """Both checkpoint implementations: the recomputed forward is recorded (after the backward began, counters
    continuing), and the training is bitwise the plain one."""
    import torch
    import torch.utils.checkpoint as cp

    import nbdebug

    def run(level):
        torch.manual_seed(0)
        block = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 8))
        head = torch.nn.Linear(8, 2)
        model = torch.nn.ModuleDict({"block": block, "head": head})
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x, y = torch.randn(4, 8, requires_grad=True), torch.randn(4, 2)
        d = nbdebug.Debugger(model, level) if level else None
        names = []
        try:
            for _ in range(2):
                opt.zero_grad()
                h = cp.checkpoint(block, x, use_reentrant=reentrant)
                torch.nn.functional.mse_loss(head(h), y).backward()
                opt.step()
            if d is not None:
                names = list(d.session.graph.nodes)
        finally:
            if d is not None:
                d.close()
        return {k: v.detach().clone() for k, v in model.state_dict().items()}, names

    plain, _ = run(None)
    ours, names = run("L1")
    assert all(torch.equal(plain[k], ours[k]) for k in plain)
    linear = [n for n in names if n.startswith("Functional.linear.") and n.endswith(".forward")]
    # the block's two linears, the head's, then the block's two again, recomputed inside the backward
    assert linear == [f"Functional.linear.{i}.forward" for i in range(5)], linear
    assert names.index("Functional.linear.3.forward") > names.index("Functional.linear.2.backward")
