"""Matching (exact, fuzzy, structural, user mapping, MindSpore → PyTorch names), the REFERENCE §4 flags,
first_divergence semantics and CSV export, on small hand-written statistics dumps."""

import csv
import json
import os

import pytest

import nbdebug
from nbdebug.compare.mapping import canonical_keys, canonical_slot


def T(mx, mn, mean, norm, shape=(2, 3), dtype="torch.float32"):
    return {"type": "torch.Tensor", "dtype": dtype, "shape": list(shape), "Max": mx, "Min": mn, "Mean": mean,
            "Norm": norm, "requires_grad": True}


def fwd(inputs, outputs, params=None):
    e = {"input_args": inputs, "input_kwargs": {}, "output": outputs}
    if params is not None:
        e["parameters"] = params
    return e


def write(root, data, framework="pytorch", step=0, construct=None):
    d = os.path.join(root, f"step{step}", "rank0")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "dump.json"), "w") as f:
        json.dump({"task": "statistics", "level": "L1", "framework": framework, "dump_data_dir": None,
                   "data": data}, f)
    if construct is not None:
        with open(os.path.join(d, "construct.json"), "w") as f:
            json.dump(construct, f)
    return str(root)


X = T(1.0, -1.0, 0.1, 2.0)
H = T(2.0, -0.5, 0.3, 3.0)
Y = T(3.0, 0.0, 1.0, 4.0)


def chain(a, b, c, d=None):
    """linear -> relu -> linear with the given tensors."""
    return {
        "Functional.linear.0.forward": fwd([a], [b]),
        "Functional.relu.0.forward": fwd([b], [c]),
        "Functional.linear.1.forward": fwd([c], [d or Y]),
    }


def test_identical_runs_pass_everywhere(tmp_path):
    a = write(tmp_path / "a", chain(X, H, Y))
    res = nbdebug.compare(a, a)
    assert res.counts() == {"error": 0, "warning": 0, "pass": 6, "unmatched": 0}
    assert res.first_divergence is None


def test_first_divergence_is_flagged_node_with_clean_inputs(tmp_path):
    golden = write(tmp_path / "g", chain(X, H, Y, T(5.0, 1.0, 2.0, 6.0)))
    changed = T(2.5, -0.5, 0.4, 3.5)  # relu output differs, linear.1 downstream differs too
    target = write(tmp_path / "t", chain(X, H, changed, T(7.0, 1.0, 3.0, 9.0)))
    res = nbdebug.compare(target, golden)
    assert res.row("Functional.linear.0.forward", "output.0").status == "pass"
    assert res.row("Functional.relu.0.forward", "input.0").status == "pass"
    assert res.row("Functional.relu.0.forward", "output.0").status in ("warning", "error")
    assert res.row("Functional.linear.1.forward", "input.0").diverged
    assert res.first_divergence.node == "Functional.relu.0.forward"
    assert res.first_divergence.slots == ("output.0",)


def test_error_and_warning_flags(tmp_path):
    golden = write(tmp_path / "g", {
        "Functional.a.0.forward": fwd([X], [H]),
        "Functional.b.0.forward": fwd([X], [H]),
        "Functional.c.0.forward": fwd([X], [H]),
        "Functional.d.0.forward": fwd([X], [H]),
        "Functional.e.0.forward": fwd([X], [T(1.0, -1.0, 0.0, 1.0)]),
    })
    target = write(tmp_path / "t", {
        "Functional.a.0.forward": fwd([X], [T(float("nan"), -0.5, 0.3, 3.0)]),  # NaN max, golden finite
        "Functional.b.0.forward": fwd([X], [T(2.0, -0.5, 0.3, 3.0, dtype="torch.float16")]),  # dtype
        "Functional.c.0.forward": fwd([X], [T(2.0, -0.5, 0.3, 3.0, shape=(3, 2))]),  # shape
        "Functional.d.0.forward": fwd([X], [T(9.0, -0.5, 0.3, 9.0)]),  # inputs equal, norm 3 -> 9: > 50%
        "Functional.e.0.forward": fwd([X], [T(1.0, -1.0, 0.0, 1.2)]),  # norm +20%: 10x the inputs' 0%
    })
    res = nbdebug.compare(target, golden)
    msgs = {r.target: " ".join(r.messages) for r in res.rows if not r.is_input}
    assert res.row("Functional.a.0.forward", "output.0").status == "error" and "NaN/Inf" in msgs[
        "Functional.a.0.forward"]
    assert res.row("Functional.b.0.forward", "output.0").status == "error" and "dtype" in msgs["Functional.b.0.forward"]
    assert res.row("Functional.c.0.forward", "output.0").status == "error" and "shape" in msgs["Functional.c.0.forward"]
    assert res.row("Functional.d.0.forward", "output.0").status == "error" and "> 50%" in msgs[
        "Functional.d.0.forward"]
    e = res.row("Functional.e.0.forward", "output.0")
    assert e.status == "warning" and "over 10x" in msgs["Functional.e.0.forward"]
    assert e.stat_rel_pct[3] == pytest.approx(20.0)


def test_fuzzy_matching_ignores_call_counts(tmp_path):
    golden = write(tmp_path / "g", chain(X, H, Y))
    # the target ran one extra linear first: every count shifts by one
    data = {"Functional.linear.0.forward": fwd([T(1, 0, 0.5, 1, shape=(9,))], [T(1, 0, 0.5, 1, shape=(9,))])}
    data["Functional.linear.1.forward"] = fwd([X], [H])
    data["Functional.relu.0.forward"] = fwd([H], [Y])
    data["Functional.linear.2.forward"] = fwd([Y], [Y])
    target = write(tmp_path / "t", data)
    exact = nbdebug.compare(target, golden)
    # exact pairs linear.0 with linear.0 (wrong: shapes differ) and linear.1 with linear.1
    assert exact.row("Functional.linear.0.forward", "output.0").status == "error"
    assert "Functional.linear.2.forward" in exact.unmatched_target
    fuzzy = nbdebug.compare(target, golden, match="fuzzy")
    # fuzzy pairs the k-th call with the k-th call: the extra first call still pairs with linear.0...
    assert fuzzy.row("Functional.linear.0.forward", "input.0").golden == "Functional.linear.0.forward"
    # ...but with a mapping for the extra call, the rest aligns by order
    mapped = nbdebug.compare(target, golden, match="fuzzy",
                             mapping={"Functional.linear.1.forward": "Functional.linear.0.forward",
                                      "Functional.linear.2.forward": "Functional.linear.1.forward"})
    assert mapped.row("Functional.linear.1.forward", "output.0").status == "pass"
    assert mapped.row("Functional.linear.2.forward", "input.0").matched_by == "mapping"
    assert mapped.unmatched_target == ["Functional.linear.0.forward"]


def test_fuzzy_aligns_by_order_when_counts_differ(tmp_path):
    golden = write(tmp_path / "g", {"Functional.linear.3.forward": fwd([X], [H]),
                                    "Functional.linear.7.forward": fwd([H], [Y])})
    target = write(tmp_path / "t", {"Functional.linear.0.forward": fwd([X], [H]),
                                    "Functional.linear.1.forward": fwd([H], [Y])})
    assert len(nbdebug.compare(target, golden).unmatched_target) == 2
    res = nbdebug.compare(target, golden, match="fuzzy")
    assert res.row("Functional.linear.1.forward", "output.0").golden == "Functional.linear.7.forward"
    assert res.counts()["pass"] == 4


def test_structural_matching_by_position_type_and_shape(tmp_path):
    golden = write(tmp_path / "g", {
        "Module.encoder.Linear.forward.0": fwd([X], [H]),
        "Module.act.ReLU.forward.0": fwd([H], [Y]),
        "Module.head.Linear.forward.0": fwd([Y], [T(1, 0, 0.5, 1, shape=(2, 1))]),
    })
    target = write(tmp_path / "t", {  # renamed modules: names do not line up at all
        "Module.enc.Dense.forward.0": fwd([X], [H]),
        "Module.nonlin.ReLU.forward.0": fwd([H], [Y]),
        "Module.out.Linear.forward.0": fwd([Y], [T(1, 0, 0.5, 1, shape=(2, 1))]),
    })
    assert len(nbdebug.compare(target, golden).unmatched_target) == 3
    res = nbdebug.compare(target, golden, match="structural")
    assert [(t, g) for t, g, _ in res.pairs] == [
        ("Module.enc.Dense.forward.0", "Module.encoder.Linear.forward.0"),
        ("Module.nonlin.ReLU.forward.0", "Module.act.ReLU.forward.0"),
        ("Module.out.Linear.forward.0", "Module.head.Linear.forward.0")]
    assert res.counts()["pass"] == 6


def test_user_mapping_prefix(tmp_path):
    golden = write(tmp_path / "g", {"Module.model.fc.Linear.forward.0": fwd([X], [H])})
    target = write(tmp_path / "t", {"Module.backbone.fc.Linear.forward.0": fwd([X], [H])})
    res = nbdebug.compare(target, golden, mapping={"Module.backbone.*": "Module.model.*"})
    assert res.pairs == [("Module.backbone.fc.Linear.forward.0", "Module.model.fc.Linear.forward.0", "mapping")]
    res = nbdebug.compare(target, golden, mapping=lambda n: n.replace("backbone", "model"))
    assert res.counts()["pass"] == 2


def test_mindspore_to_pytorch_names(tmp_path):
    assert canonical_keys("MintFunctional.relu.0.forward", "mindspore", cross=True) == ["Functional.relu.0.forward"]
    assert "Torch.matmul.2.forward" in canonical_keys("Primitive.matmul.MatMul.2.forward", "mindspore", cross=True)
    assert canonical_keys("Functional.dense.0.forward", "mindspore", cross=True)[0] == "Torch.linear.0.forward"
    assert canonical_slot("parameters.gamma", "mindspore", True) == "parameters.weight"
    assert canonical_slot("moving_variance", "mindspore", True) == "running_var"
    ms = {
        "Cell.bn.BatchNorm2d.forward.0": fwd([X], [H], params={"gamma": T(1, 1, 1, 2, shape=(4,)),
                                                                 "beta": T(0, 0, 0, 0, shape=(4,))}),
        "Mint.add.0.forward": fwd([H, H], [Y]),
        "Cell.bn.BatchNorm2d.parameters_grad.0": {"gamma": [T(0.1, -0.1, 0.0, 0.2, shape=(4,))]},
    }
    pt = {
        "Module.bn.BatchNorm2d.forward.0": fwd([X], [H], params={"weight": T(1, 1, 1, 2, shape=(4,)),
                                                                   "bias": T(0, 0, 0, 0, shape=(4,))}),
        "Torch.add.0.forward": fwd([H, H], [Y]),
        "Module.bn.BatchNorm2d.parameters_grad.0": {"weight": [T(0.1, -0.1, 0.0, 0.2, shape=(4,))]},
    }
    res = nbdebug.compare(write(tmp_path / "ms", ms, "mindspore"), write(tmp_path / "pt", pt))
    assert res.target_framework == "mindspore"
    assert res.unmatched_target == [] and res.unmatched_golden == []
    assert res.row("Cell.bn.BatchNorm2d.forward.0", "parameters.gamma").golden_slot == "parameters.weight"
    assert res.row("Parameter.bn.gamma", "output.0").golden == "Parameter.bn.weight"
    assert res.row("Cell.bn.BatchNorm2d.parameters_grad.0", "gamma").golden_slot == "weight"
    assert res.row("Mint.add.0.forward", "output.0").golden == "Torch.add.0.forward"
    assert res.counts()["unmatched"] == 0 and res.counts()["error"] == 0


def test_unmatched_rows_and_csv(tmp_path):
    golden = write(tmp_path / "g", chain(X, H, Y))
    data = chain(X, H, Y)
    del data["Functional.relu.0.forward"]
    data["Functional.gelu.0.forward"] = fwd([H], [Y])
    target = write(tmp_path / "t", data)
    res = nbdebug.compare(target, golden)
    assert res.unmatched_target == ["Functional.gelu.0.forward"]
    assert res.unmatched_golden == ["Functional.relu.0.forward"]
    assert {r.status for r in res.rows if "gelu" in r.name or "relu" in r.name} == {"unmatched"}
    path = res.to_csv(tmp_path / "out.csv")
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(res.rows)
    first = rows[0]
    assert first["Target Name"] == "Functional.linear.0.forward.input.0" and first["Result"] == "pass"
    assert first["Max diff"] == "0.0" and first["Cosine"] == "N/A"  # statistics mode
    gelu = next(r for r in rows if r["Target Name"].startswith("Functional.gelu"))
    assert gelu["Result"] == "unmatched" and gelu["Golden Name"] == ""
    df = res.to_dataframe()
    assert list(df["Result"]) == [r.status for r in res.rows]


def test_bad_arguments(tmp_path):
    a = write(tmp_path / "a", chain(X, H, Y))
    with pytest.raises(ValueError, match="match must be"):
        nbdebug.compare(a, a, match="nearest")
    with pytest.raises(ValueError, match="mode must be"):
        nbdebug.compare(a, a, mode="values")
    with pytest.raises(ValueError, match="no step 3"):
        nbdebug.compare(a, a, step=3)
    with pytest.raises(TypeError, match="compare\\(\\) takes"):
        nbdebug.compare(42, a)


def test_live_debuggers_compare_with_retained_values():
    from msprobe_runs import torch_setup, torch_train

    def run(variant):
        model, batches = torch_setup(variant)
        dbg = nbdebug.Debugger(model, level="L0")
        torch_train(model, batches, 2, variant, lambda: None, dbg.step)
        return dbg

    a, b = run("perturbed"), run("base")
    try:
        res = nbdebug.compare(a, b, step=1)
        assert res.unmatched_target == [] and res.target_step == 1
        assert any(r.mode == "tensor" for r in res.matched)  # the last steps' retained values
        assert res.row("Module.fc1.Linear.forward.0", "output.0").status == "pass"
        assert res.first_divergence is not None and "fc2" in res.first_divergence.node
    finally:
        a.close()
        b.close()
