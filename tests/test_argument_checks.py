"""Argument checks found in held-out trials (issue #22 item 19): each mistake gets a message that names it."""

import warnings

import pytest
import torch

import nbdebug
from nbdebug import NotRetainedError

NODE = "Module.0.Linear.forward.0"


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))


def _train(model, steps):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(3, 4)).sum().backward()
        opt.step()


def test_fractional_memory_budget_is_refused_whole_float_is_taken():
    model = _model()
    with pytest.raises(ValueError, match="memory_budget must be a whole number of bytes.*got 1.5"):
        nbdebug.Debugger(model, memory_budget=1.5)
    with nbdebug.Debugger(model, memory_budget=5e5) as dbg:  # a whole number written as a float
        assert dbg.session.store.budget == 500_000


def test_watch_matching_no_node_warns_at_once_after_a_step():
    model = _model()
    with nbdebug.Debugger(model) as dbg:
        _train(model, 1)
        with pytest.warns(UserWarning, match=r"nodes='NoSuchModule\.\*' matches no node yet"):
            dbg.watch("TO", nodes="NoSuchModule.*")


def test_watch_matching_no_node_before_training_warns_once_the_first_step_ran():
    model = _model()
    with nbdebug.Debugger(model) as dbg:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # nothing captured yet: no way to tell, so no warning yet
            bad = dbg.watch("TO", nodes="NoSuchModule.*")
            dbg.watch("TO", nodes="Module.*")
        with pytest.warns(UserWarning, match=rf"watchpoint #{bad.id} .*'NoSuchModule\.\*' matches no node yet"):
            _train(model, 1)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            _train(model, 1)  # said once


def test_update_watch_names_the_argument_that_is_wrong():
    model = _model()
    with nbdebug.Debugger(model) as dbg:
        _train(model, 1)
        wp = dbg.watch("TO")
        with pytest.raises(TypeError, match="^add must be a node name.*got the int 5"):
            dbg.update_watch(wp, add=5)
        with pytest.raises(TypeError, match="^remove must be names or glob patterns.*got the int 3"):
            dbg.update_watch(wp, remove=["a", 3])
        with pytest.raises(ValueError, match="^add holds an empty name"):
            dbg.update_watch(wp, add="")
        assert not wp.added and not wp.removed


def test_tensor_of_a_step_that_never_ran_says_so():
    model = _model()
    with nbdebug.Debugger(model) as dbg:
        _train(model, 3)
        with pytest.raises(NotRetainedError, match="step 1000000 has not run yet; steps with statistics: 0..2"):
            dbg.tensor(NODE, "output.0", step=10**6)
        # a step that ran but whose value is gone still says that
        with pytest.raises(NotRetainedError, match="step 0 has statistics but no retained value"):
            dbg.tensor(NODE, "output.0", step=0)
        assert dbg.tensor(NODE, "output.0", step=2).shape == (3, 4)
