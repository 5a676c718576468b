"""Summary mode (issue 20 item 4): with more ranks than ``SUMMARY_ABOVE`` each process streams its monitor rows and
a per-step :class:`~nbdebug.job.summary.StepSummary` instead of its full statistics table; a full table comes on
request (``job.rank(r)``) and equals the rank's own. A real Debugger in this process, served by a real
:class:`~nbdebug.remote.agent.Agent` to a real listener over loopback; the process says it is rank 3 of 20."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import zmq  # noqa: F401 - the listener needs ZeroMQ
from remote_procs import until

import nbdebug
from nbdebug.remote import agent as agent_mod
from nbdebug.remote import hub as hub_mod


def _train(dbg, model, opt, steps: int, nan_at: int | None = None) -> None:
    for i in range(steps):
        x = torch.randn(8, 4)
        if i == nan_at:
            x[0, 0] = float("nan")
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        dbg.record_loss(loss)
        loss.backward()
        opt.step()


@pytest.fixture()
def served(monkeypatch, request):
    """``(listener, dbg, model, opt, agent)``: rank 3 of a 20-rank job, attached to a listener whose
    ``summary_above`` is the test's parameter (default: the constant)."""
    def info():
        return {"host": "h", "pid": 4242, "rank": 3, "world_size": 20, "local_rank": 3, "argv": []}

    monkeypatch.setattr(agent_mod, "process_info", info)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    listener = nbdebug.listen(quiet=True)
    listener.summary_above = getattr(request, "param", hub_mod.SUMMARY_ABOVE)
    dbg = nbdebug.Debugger(model, "L0")
    agent = agent_mod.Agent(dbg, listener.address, listener.token, foreground=False)
    dbg.adopt()
    try:
        assert agent.first_contact(10)
        yield listener, dbg, model, opt, agent
    finally:
        agent.close()
        dbg.close()
        listener.close()


def test_full_tables_on_request_equal_the_rank_own(served):
    listener, dbg, model, opt, agent = served
    src = listener.wait_for(1, 10)[3]
    assert src.detail == "summary" and agent.summary_mode
    _train(dbg, model, opt, 4, nan_at=2)
    until(lambda: src.step_summary(3) is not None, 10, "step 3's summary")
    # summaries and monitor rows only: no statistics table crossed the wire
    assert src.session.steps == {} and src.summary_steps() == [0, 1, 2, 3]
    assert src.session.monitor.value(1, "Run", "loss") == pytest.approx(dbg.session.monitor.value(1, "Run", "loss"))
    s1, s2 = src.step_summary(1), src.step_summary(2)
    assert s1.rank == 3 and s1.tensors == len(dbg.session.steps[1]) and s1.nonfinite_tensors == 0
    assert s1.loss == pytest.approx(dbg.session.monitor.value(1, "Run", "loss"))
    assert s1.grad_norm_total == pytest.approx(dbg.session.monitor.value(1, "Run", "grad_norm_total"))
    assert s1.step_time is not None and s1.step_time > 0 and s1.origin is None
    node, slot, _step = dbg.first_nonfinite(2)
    assert s2.nonfinite_tensors > 0 and s2.origin[:2] == (node, slot)
    assert s2.origin[2] == dbg.session.steps[2].index[(node, slot)]
    job = listener.job
    assert job.steps == [0, 1, 2, 3] and job.first_nonfinite().rank == 3 and job.first_nonfinite().step == 2
    # the full tables on request: the window the rank holds, equal to its own, then every new step's
    assert job.rank(3) is src and src.full
    assert sorted(src.session.steps) == sorted(dbg.session.steps)
    for step, own in dbg.session.steps.items():
        got = src.session.table(step)
        assert got.keys == own.keys and got.dtypes == own.dtypes and got.shapes == own.shapes
        np.testing.assert_array_equal(got.values, own.values)
    _train(dbg, model, opt, 1)
    until(lambda: 4 in src.session.steps, 10, "step 4's table")
    np.testing.assert_array_equal(src.session.table(4).values, dbg.session.steps[4].values)
    assert src.step_summary(4) is not None
    # and off again: summaries alone
    src.full_tables(False)
    assert not src.full
    _train(dbg, model, opt, 1)
    until(lambda: src.step_summary(5) is not None, 10, "step 5's summary")
    assert 5 not in src.session.steps


@pytest.mark.parametrize("served", [hub_mod.SUMMARY_ABOVE, 20], indirect=True)
def test_summary_mode_switches_on_above_the_threshold_only(served):
    listener, dbg, model, opt, agent = served
    src = listener.wait_for(1, 10)[3]
    above = 20 > listener.summary_above
    assert hub_mod.SUMMARY_ABOVE == 8
    assert (src.detail == "summary") == above and agent.summary_mode == above
    _train(dbg, model, opt, 3)
    until(lambda: src.step_index == 3 and src.session.monitor.last_step == 2, 10, "step 2")
    if above:  # summaries, no table
        assert src.session.steps == {} and src.summary_steps() == [0, 1, 2]
    else:  # tables, no summary: the job summarises them as before
        assert sorted(src.session.steps) == [0, 1, 2] and src.summary_steps() == [] and src.step_summary(2) is None
        assert listener.job.summary(3, 2).tensors == len(dbg.session.steps[2])
        assert listener.job.rank(3) is src and not src.full  # nothing to ask for
