"""Retained values: current/previous/initial, the memory budget, clear reasons when absent."""

import numpy as np
import pytest
import torch
import torch.nn as nn
from conftest import train_steps

import nbdebug
from nbdebug import NotRetainedError


def test_current_previous_and_initial_values(net):
    w0 = net.fc1.weight.detach().clone().numpy()
    with nbdebug.Debugger(net, level="L0") as dbg:
        train_steps(net, steps=1)
        w_step0 = net.fc1.weight.detach().clone().numpy()  # after step 0's update
        train_steps(net, steps=1, seed=1)
        np.testing.assert_array_equal(dbg.tensor("Parameter.fc1.weight", "output.0", step="previous"), w0)
        np.testing.assert_array_equal(dbg.tensor("Parameter.fc1.weight", "output.0", step="current"), w_step0)
        np.testing.assert_array_equal(dbg.tensor("Parameter.fc1.weight", "output.0", step="initial"), w0)
        np.testing.assert_array_equal(dbg.tensor("Module.fc1.Linear.forward.0", "parameters.weight", step=1),
                                      w_step0)
        out = dbg.tensor("Module.fc2.Linear.forward.0", "output.0")
        st = dbg.stats("Module.fc2.Linear.forward.0", "output.0")
        assert out.shape == st["shape"] == (5, 4)
        np.testing.assert_allclose(out.max(), st["max"], rtol=1e-6)
        dbg.tensor("Module.fc2.Linear.forward.0", "output.0", step=0)  # step 0 is "previous"
        train_steps(net, steps=1, seed=2)
        with pytest.raises(NotRetainedError, match="current .* and previous step only"):
            dbg.tensor("Module.fc2.Linear.forward.0", "output.0", step=0)  # now too old
        # statistics of every step are kept
        assert dbg.stats("Module.fc2.Linear.forward.0", "output.0", step=0)["shape"] == (5, 4)


def test_budget_respected_and_reason_given():
    model = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64))
    budget = 70_000  # initial params take 2 * 16.6 KB; a few activations fit, not everything
    with nbdebug.Debugger(model, level="L0", memory_budget=budget) as dbg:
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            opt.zero_grad()
            model(torch.randn(32, 64)).sum().backward()
            opt.step()
            assert dbg.session.store.used <= budget
        missing = 0
        for n in dbg.graph:
            for slot in n.shapes:
                try:
                    dbg.tensor(n.name, slot, step="previous")
                except NotRetainedError as e:
                    missing += 1
                    assert "memory budget" in str(e) or "no value retained" in str(e) or "statistics only" in str(e)
        assert missing > 0


def test_value_modified_in_place_after_capture_is_reported():
    model = nn.Sequential(nn.Linear(4, 4))
    with nbdebug.Debugger(model, level="L0") as dbg:
        y = model(torch.randn(2, 4))
        y.mul_(0)  # the user edits the module output afterwards; L0 cannot see it
        with pytest.raises(NotRetainedError, match="modified in place"):
            dbg.tensor("Module.0.Linear.forward.0", "output.0")


def test_inplace_op_at_L1_keeps_the_value_seen(net):
    with nbdebug.Debugger(net, level="L1") as dbg:
        train_steps(net, steps=1)
        before = dbg.tensor("Functional.linear.0.forward", "output.0", step="current")
        after = dbg.tensor("Tensor.add_.0.forward", "output.0", step="current")
        np.testing.assert_allclose(after, before + 1.0, rtol=1e-6)


def test_unknown_node_or_slot_is_a_clear_error(net):
    with nbdebug.Debugger(net, level="L0") as dbg:
        train_steps(net, steps=1)
        with pytest.raises(KeyError, match="no node named"):
            dbg.stats("Module.nope.forward.0", "output.0")
        with pytest.raises(KeyError, match="has no slot 'output.7'"):
            dbg.stats("Module.fc1.Linear.forward.0", "output.7")
        with pytest.raises(ValueError, match="step must be"):
            dbg.stats("Module.fc1.Linear.forward.0", "output.0", step="later")


def test_stats_mapping_keys(net):
    with nbdebug.Debugger(net, level="L0") as dbg:
        train_steps(net, steps=1)
        st = dbg.stats("Module.act.ReLU.forward.0", "output.0", step=0)
    assert list(st) == ["dtype", "shape", "count", "max", "min", "mean", "abs_mean", "norm", "zero_count",
                        "nan_count", "pos_inf_count", "neg_inf_count"]
    assert st["dtype"] == "float32" and st["count"] == 80 and st["min"] >= 0.0


def test_current_step_in_progress_is_readable_mid_step(net):
    with nbdebug.Debugger(net, level="L0") as dbg:
        y = net(torch.randn(5, 8))
        assert dbg.step_index == 0
        st = dbg.stats("Module.fc2.Linear.forward.0", "output.0")
        np.testing.assert_allclose(st["max"], y.max().item(), rtol=1e-6)


class _HalvingSGD(torch.optim.Optimizer):
    """Plain SGD that halves each gradient in place first (an optimizer overwriting a captured value)."""

    def __init__(self, params, lr: float = 0.1) -> None:
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                p.grad.mul_(0.5)
                p.add_(p.grad, alpha=-group["lr"])


def _one_step(model, opt, seed=0):
    opt.zero_grad()
    model(torch.randn(5, 8, generator=torch.Generator().manual_seed(seed))).sum().backward()
    opt.step()


def test_optimizer_ops_keep_statistics_only_unless_watched():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    with nbdebug.Debugger(model, level="L1") as dbg:
        _one_step(model, opt)
        op = next(n.name for n in dbg.graph if n.section == "optimizer" and n.op_type == "lerp_")
        st = dbg.stats(op, "output.0")  # exp_avg after the update: statistics are kept
        assert st["count"] == 32 and st["norm"] > 0
        with pytest.raises(NotRetainedError, match="optimizer's ops keep statistics only"):
            dbg.tensor(op, "output.0")
        dbg.watch("TR", nodes=op, range_start_inclusive=-1.0, range_end_inclusive=1.0, range_percentage_lt=0.0)
        _one_step(model, opt, seed=1)
        exp_avg = opt.state[model[0].weight]["exp_avg"]
        value = dbg.tensor(op, "output.0")  # watched: kept, and the value its statistics describe
        np.testing.assert_allclose(value.max(), dbg.stats(op, "output.0")["max"], rtol=1e-6)
        np.testing.assert_array_equal(value, exp_avg.numpy())


def test_parameter_value_survives_the_optimizer_at_L1():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 4))
    w = model[0].weight.detach().clone().numpy()
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    with nbdebug.Debugger(model, level="L1") as dbg:
        _one_step(model, opt)  # F.linear takes the weight by reference first; the Parameter node copies it
        assert not np.array_equal(model[0].weight.detach().numpy(), w)
        np.testing.assert_array_equal(dbg.tensor("Parameter.0.weight", "output.0"), w)
        np.testing.assert_array_equal(dbg.tensor("Functional.linear.0.forward", "input.1"), w)


def test_value_overwritten_by_the_optimizer_names_the_op():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 4))
    opt = _HalvingSGD(model.parameters())
    with nbdebug.Debugger(model, level="L1") as dbg:
        _one_step(model, opt)
        node = "Module.0.Linear.parameters_grad.0"
        assert dbg.stats(node, "weight")["count"] == 32  # the gradient backward produced, exact
        with pytest.raises(NotRetainedError, match=r"modified in place by Tensor\.mul_\.\d+\.forward"):
            dbg.tensor(node, "weight")
