"""The zoo's ``llama_amp`` at level mix (issue 26): the ``msprobe compare`` rows of our dump against msProbe's that
do not pass are bf16 amplifying msProbe's own deviation from the plain run; ours is the plain run, bitwise.

``bench/interchange.py``'s workload (HF Llama from the zoo's small config, bf16 autocast + GradScaler, AdamW,
2 steps, seed 0, the zoo's batches) runs three times, each in its own subprocess: with no tool, under
msProbe's ``PrecisionDebugger`` and under ``nbdebug.Debugger`` (the same ``config.json``):

* ours: every parameter's gradient and value after each step is bitwise the plain run's, and every statistic
  of our dump checked against the plain run's tensors equals theirs exactly;
* msProbe's full backward hooks wrap each module's inputs in a ``BackwardHookFunction``; the last decoder
  layer's residual stream after attention feeds three ops (the post-attention RMSNorm's ``pow`` and ``mul``,
  and the next residual add); under msProbe the norm's two take it through the hook's node, whose gradient
  (their two shares, summed) reaches the stream as one share: autograd sums the three in another order, and
  msProbe's run is not bitwise the plain run from that backward on (the last float bits; the forward of step 0
  and everything before it in the backward agree bitwise between the two dumps);
* downstream of it the gradients pass through bf16 (autocast's linears), where a last-bit difference now and
  then flips a bf16 rounding: a relative difference ~1e-7 becomes ~1e-3 in some outputs, and ``msprobe compare``
  warns "the norm relative error of output is 10 times that of input". Every such row is downstream of
  msProbe's first deviation: later in the same step's backward, or in step 1, which starts from parameters that
  step 0's update already made different in msProbe's run.
"""

from __future__ import annotations

import importlib.util
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from interchange_runs import WRITE_CONFIG, run_scripts, step_data

BENCH = Path(__file__).resolve().parent.parent / "bench"

SCRIPT = r'''
import json, os, sys
import torch

tool, level, out = sys.argv[1:4]
torch.set_num_threads(1)
sys.path.insert(0, os.path.join(os.environ["PYTHONPATH"].split(os.pathsep)[0], "bench"))
from zoo import make_zoo_workload

wl = make_zoo_workload("llama_amp")  # bench/interchange.py's llama_amp: its model, batches, AdamW, GradScaler
opt = wl.reset()
scaler, model = wl._scaler, wl.model
''' + WRITE_CONFIG + r'''kept = []
if tool == "msprobe":
    from msprobe.pytorch import PrecisionDebugger
    dbg = PrecisionDebugger(config_path=cfg)
elif tool == "nbdebug":
    import nbdebug
    dbg = nbdebug.Debugger(model, level, dump_dir=os.path.join(out, "dump"), task="statistics", config=cfg)
else:  # plain: the gradient of the last layer's residual stream after attention (the post-attention norm's
    # input), read by a tensor hook: it sees the gradient autograd summed, and adds no node to the graph

    def keep(module, args):
        args[0].register_hook(lambda g: kept.append(g.clone()))

    model.model.layers[-1].post_attention_layernorm.register_forward_pre_hook(keep)
steps = []
for batch in wl.batches[:2]:  # wl.step's ops, the gradients read before GradScaler unscales them in place
    if tool == "msprobe":
        dbg.start(model)
    opt.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = wl.loss(model, batch)
    scaler.scale(loss).backward()
    grads = {k: p.grad.clone() for k, p in model.named_parameters()}
    scaler.step(opt)
    scaler.update()
    steps.append({"grads": grads, "params": {k: p.detach().clone() for k, p in model.named_parameters()}})
    if tool == "msprobe":
        dbg.stop()
        dbg.step()
if tool == "nbdebug":
    dbg.close()
torch.save({"steps": steps, "kept": kept}, os.path.join(out, "record.pt"))
'''

TOOLS = ("plain", "msprobe", "nbdebug")
STATS = ("Max", "Min", "Mean", "Norm")


@pytest.fixture(scope="module")
def interchange():
    """bench/interchange.py: the ``msprobe compare`` run and its not-pass rows, as the bench reads them."""
    spec = importlib.util.spec_from_file_location("nbdebug_bench_interchange", BENCH / "interchange.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    outs = run_scripts(tmp_path_factory.mktemp("interchange_amp"), SCRIPT, [(t, "mix") for t in TOOLS])
    return {t: outs[(t, "mix")] for t in TOOLS}


@pytest.fixture(scope="module")
def records(runs):
    return {t: torch.load(os.path.join(runs[t], "record.pt")) for t in TOOLS}


@pytest.fixture(scope="module")
def dumps(runs):
    return {t: [step_data(runs[t], s) for s in range(2)] for t in ("msprobe", "nbdebug")}


@pytest.fixture(scope="module")
def not_pass(runs, interchange, tmp_path_factory):
    """Per step, the rows of ``msprobe compare -tp ours -gp msProbe's`` that do not pass."""
    root = tmp_path_factory.mktemp("interchange_amp_cmp")

    def rows(step):
        return interchange.msprobe_compare(os.path.join(runs["nbdebug"], "dump", f"step{step}"),
                                           os.path.join(runs["msprobe"], "dump", f"step{step}"),
                                           str(root / f"step{step}"))

    with ThreadPoolExecutor(2) as pool:
        per_step = list(pool.map(rows, range(2)))
    assert all(len(r) > 2000 for r in per_step)  # the whole dump compared, every row matched:
    assert not [r for rs in per_step for r in interchange.unmatched(rs)]
    return [interchange.not_pass(rs) for rs in per_step]


def _stats(t: torch.Tensor) -> list[float]:
    """A dump entry's statistics of ``t`` (msProbe's: torch's max, min, mean and 2-norm, as Python floats),
    computed on one thread as the runs were (a reduction's order, hence its last bit, depends on the threads)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return [float(t.max()), float(t.min()), float(t.mean()), float(t.norm())]
    finally:
        torch.set_num_threads(threads)


def _of(entry: dict) -> list[float]:
    return [entry[k] for k in STATS]


def _first_deviation(dumps: dict) -> tuple[int, str]:
    """(step, entry) of the first entry, in execution order, whose record differs between the two dumps."""
    for step in range(2):
        ours, theirs = dumps["nbdebug"][step], dumps["msprobe"][step]
        assert list(ours) == list(theirs)  # the same entries, in the same order
        for name in ours:
            if ours[name] != theirs[name]:
                return step, name
    raise AssertionError("the two dumps are identical")


def _param_grads(data: dict) -> dict[str, dict]:
    """``{parameter name: its gradient's record}`` from the ``Module.<path>.<Class>.parameters_grad.0`` entries."""
    out = {}
    for name, entry in data.items():
        if name.endswith(".parameters_grad.0"):
            path = name[len("Module."):].rsplit(".", 3)[0]
            out.update({f"{path}.{p}": records[0] for p, records in entry.items()})
    return out


def test_amp_llama_ours_is_the_plain_run_bitwise_msprobe_is_not(records, dumps):
    plain, ours, theirs = (records[t]["steps"] for t in TOOLS[:1] + ("nbdebug", "msprobe"))
    for s in range(2):
        for part in ("grads", "params"):
            assert all(torch.equal(ours[s][part][k], plain[s][part][k]) for k in plain[s][part]), (s, part)
    differ = [k for k in plain[0]["grads"] if not torch.equal(theirs[0]["grads"][k], plain[0]["grads"][k])]
    assert "model.embed_tokens.weight" in differ
    for s in range(2):  # each dump records its own run: ours the plain run's gradients, msProbe's its own
        recorded = {t: _param_grads(dumps[t][s]) for t in ("nbdebug", "msprobe")}
        assert len(recorded["nbdebug"]) == len(plain[s]["grads"])
        for k, g in plain[s]["grads"].items():
            assert _of(recorded["nbdebug"][k]) == _stats(g), (s, k)
            assert _of(recorded["msprobe"][k]) == _stats(theirs[s]["grads"][k]), (s, k)
        assert [k for k in recorded["msprobe"] if _of(recorded["msprobe"][k]) != _stats(plain[s]["grads"][k])]


def test_amp_llama_msprobe_deviates_first_in_a_backward_by_the_last_bits(records, dumps):
    step, first = _first_deviation(dumps)
    ours, theirs = dumps["nbdebug"][0], dumps["msprobe"][0]
    names = list(ours)
    assert step == 0 and first.endswith(".backward")
    # the whole forward (the loss included) and the backward up to it agree bitwise
    backward = next(i for i, n in enumerate(names) if ".backward" in n)
    assert 0 < backward < names.index(first)
    # where: the backward of the residual add whose output is the last layer's post-attention norm's input,
    # right after that norm's module backward (msProbe's hook on it)
    assert names[names.index(first) - 1] == "Module.model.layers.3.post_attention_layernorm.LlamaRMSNorm.backward.0"
    assert first.startswith("Tensor.__add__.")
    (grad,) = records["plain"]["kept"][:1]
    assert _of(ours[first]["input"][0]) == _stats(grad)  # ours: the gradient the plain run summed
    mine, other = _of(ours[first]["input"][0]), _of(theirs[first]["input"][0])
    assert mine != other
    assert all(abs(a - b) <= 1e-6 * abs(a) for a, b in zip(mine, other, strict=True))  # in the last bits


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(a), abs(b), 1e-30)


def test_amp_llama_not_pass_rows_are_downstream_of_msprobe_deviation(runs, records, dumps, not_pass, interchange):
    step, first = _first_deviation(dumps)
    assert not_pass[1], "no row of the last step (the bench's llama_amp mix row) fails to pass any more"
    # the bench finds the same deviation (and calls the rows after it explained)
    dump = {t: os.path.join(runs[t], "dump") for t in ("nbdebug", "msprobe")}
    assert interchange.first_deviation(dump["nbdebug"], dump["msprobe"]) == (step, first)
    assert all(interchange.downstream(r["NPU Name"], (step, first), 1, dumps["nbdebug"][1]) for r in not_pass[1])
    order = list(dumps["nbdebug"][0])
    for s, rows in enumerate(not_pass):
        for row in rows:
            entry = interchange._entry_of(row["NPU Name"], dumps["nbdebug"][s])
            assert entry in dumps["nbdebug"][s], row["NPU Name"]
            # later in the step of the deviation, or in a later step
            assert s > step or order.index(entry) > order.index(first), (s, row["NPU Name"], first)
    # step 1 starts from parameters that step 0's update made different in msProbe's run (ours: the plain's)
    plain, theirs = records["plain"]["steps"][0]["params"], records["msprobe"]["steps"][0]["params"]
    assert [k for k in plain if not torch.equal(plain[k], theirs[k])]
    # bf16 amplifies it: the deviation is in the last float32 bits, the rows that do not pass differ by far more
    deviation = max(_rel(a, b) for a, b in zip(_of(dumps["nbdebug"][0][first]["input"][0]),
                                                _of(dumps["msprobe"][0][first]["input"][0]), strict=True))
    worst = max(float(r["NormRelativeErr"].rstrip("%")) / 100 for r in not_pass[1])
    assert deviation < 1e-6 and worst > 100 * deviation, (deviation, worst)
