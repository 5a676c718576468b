"""While a Debugger is attached the collector's young threshold is raised (fewer collections of the
capture's short-lived records); the user's thresholds come back when the last Debugger goes."""

from __future__ import annotations

import gc

import pytest
import torch

import nbdebug
from nbdebug.frameworks.core.gc_tuning import YOUNG


@pytest.fixture(autouse=True)
def default_thresholds(monkeypatch):
    monkeypatch.delenv("NBDEBUG_GC_TUNE", raising=False)
    before = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    yield
    gc.set_threshold(*before)


def _model():
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))


def test_raised_while_attached_and_restored_after_the_last_close():
    m1, m2 = _model(), _model()
    a = nbdebug.Debugger(m1)
    assert gc.get_threshold() == (YOUNG, 10, 10)
    b = nbdebug.Debugger(m2, level="mix")
    a.close()
    assert gc.get_threshold() == (YOUNG, 10, 10)  # b still captures
    m2(torch.ones(2, 3)).sum().backward()
    b.close()
    b.close()  # a second close changes nothing
    assert gc.get_threshold() == (700, 10, 10)


def test_a_debugger_collected_without_close_lets_go():
    m = _model()
    dbg = nbdebug.Debugger(m)
    assert gc.get_threshold()[0] == YOUNG
    dbg._adapter.close()  # what the model's own finalizer would do; the Debugger object then goes away
    del dbg
    gc.collect()
    assert gc.get_threshold() == (700, 10, 10)


def test_thresholds_the_user_set_meanwhile_are_kept():
    m = _model()
    dbg = nbdebug.Debugger(m)
    gc.set_threshold(1234, 5, 5)
    dbg.close()
    assert gc.get_threshold() == (1234, 5, 5)


def test_disabled_collection_and_opt_out_are_left_alone(monkeypatch):
    gc.set_threshold(0, 10, 10)  # automatic collection off: not turned back on
    dbg = nbdebug.Debugger(_model())
    assert gc.get_threshold() == (0, 10, 10)
    dbg.close()
    gc.set_threshold(700, 10, 10)
    monkeypatch.setenv("NBDEBUG_GC_TUNE", "0")
    dbg = nbdebug.Debugger(_model())
    assert gc.get_threshold() == (700, 10, 10)
    dbg.close()
