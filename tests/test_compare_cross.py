"""A PyTorch model and its MindSpore port with identical weights and inputs, dumped by the real msProbe
(PyTorch and MindSpore PrecisionDebuggers): compare finds no error; with one layer changed in the port,
first_divergence names that layer."""

import os

from msprobe_runs import mindspore_dump, torch_dump

import nbdebug


def _dump(root: str) -> str:
    return os.path.join(root, "dump")


def test_identical_port_has_no_error_and_no_divergence():
    res = nbdebug.compare(_dump(mindspore_dump("tensor", "L0", "port")), _dump(torch_dump("tensor", "L0", "port", 1)))
    assert res.target_framework == "mindspore" and res.golden_framework == "pytorch"
    assert res.errors == [] and res.warnings == []
    assert res.first_divergence is None
    assert res.unmatched_target == [] and res.unmatched_golden == []
    assert len(res.matched) >= 20 and all(r.mode == "tensor" for r in res.matched)
    # names were mapped across frameworks: Cell.*.Dense ↔ Module.*.Linear
    r = res.row("Cell.fc1.Dense.forward.0", "output.0")
    assert r.golden == "Module.fc1.Linear.forward.0" and r.cosine > 0.999999 and r.max_abs_err < 1e-5
    g = res.row("Cell.fc1.Dense.parameters_grad.0", "weight")
    assert g.golden == "Module.fc1.Linear.parameters_grad.0" and g.status == "pass"


def test_changed_layer_in_the_port_is_the_first_divergence():
    res = nbdebug.compare(_dump(mindspore_dump("tensor", "L0", "port_changed")),
                          _dump(torch_dump("tensor", "L0", "port", 1)))
    fd = res.first_divergence
    assert fd is not None
    assert fd.node == "Cell.act.LeakyReLU.forward.0" and fd.golden == "Module.act.ReLU.forward.0"
    assert fd.layer == "act" and fd.slots == ("output.0",)
    # before the changed layer everything agrees; its input agrees too
    assert res.row("Cell.fc1.Dense.forward.0", "output.0").status == "pass"
    assert res.row("Cell.act.LeakyReLU.forward.0", "input.0").status == "pass"
    assert res.row("Cell.act.LeakyReLU.forward.0", "output.0").status == "error"
    assert res.row("Cell.fc2.Dense.forward.0", "output.0").diverged  # downstream differs as a consequence
    # statistics alone (what a statistics dump has) point at the same layer
    stats = nbdebug.compare(_dump(mindspore_dump("tensor", "L0", "port_changed")),
                            _dump(torch_dump("tensor", "L0", "port", 1)), mode="statistics")
    assert {r.mode for r in stats.matched} == {"statistics"}
    assert stats.first_divergence.node == "Cell.act.LeakyReLU.forward.0"


def test_the_other_direction_pytorch_target_mindspore_golden():
    res = nbdebug.compare(_dump(torch_dump("tensor", "L0", "port_changed", 1)),
                          _dump(mindspore_dump("tensor", "L0", "port")))
    assert res.first_divergence.node == "Module.act.LeakyReLU.forward.0"
    assert res.first_divergence.golden == "Cell.act.ReLU.forward.0"


def test_a_faithful_conv_port_has_no_divergence_at_mix():
    """msProbe's own mix dumps of a biased conv (MindSpore: Conv2D then BiasAdd) and a relu whose counters
    differ (an nn.ReLU cell, then ops.relu; PyTorch: nn.ReLU, then F.relu)."""
    res = nbdebug.compare(_dump(mindspore_dump("tensor", "mix", "lenet")),
                          _dump(torch_dump("tensor", "mix", "lenet", 1)))
    assert res.errors == [] and res.warnings == [] and res.first_divergence is None
    pairs = {t: g for t, g, _how in res.pairs}
    assert pairs["Primitive.conv2d.Conv2D.0.forward"] == "Functional.conv2d.0.forward"
    conv = res.row("Primitive.conv2d.Conv2D.0.forward", "output.0")
    assert conv.status == "pass" and conv.cosine > 0.999999  # taken after MindSpore's BiasAdd
    assert res.row("Primitive.conv2d.Conv2D.0.forward", "input.2").status == "pass"  # the bias
    # each relu with its own block's: the conv block's cell relu, the fc block's functional relu
    assert pairs["Primitive.relu.ReLU.0.forward"] == "Functional.relu.0.forward"
    assert pairs["Functional.relu.0.forward"] == "Functional.relu.1.forward"
    assert pairs["Primitive.matmul.MatMul.0.forward"] == "Functional.linear.0.forward"


def test_a_changed_layer_of_the_conv_port_is_the_first_divergence_at_mix():
    res = nbdebug.compare(_dump(mindspore_dump("tensor", "mix", "lenet_changed")),
                          _dump(torch_dump("tensor", "mix", "lenet", 1)))
    fd = res.first_divergence
    assert fd.node == "Cell.pool.AvgPool2d.forward.0" and fd.golden == "Module.pool.MaxPool2d.forward.0"
    assert fd.layer == "pool"
    assert res.row("Primitive.conv2d.Conv2D.0.forward", "output.0").status == "pass"
