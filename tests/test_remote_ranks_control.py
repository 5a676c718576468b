"""Group control of a live ``torchrun`` job (2 ranks, gloo, CPU, ``tests/remote_scripts/ddp_nan.py``) driven from
a listener here, as a notebook would, in the README's order:

* hit → unwatch → continue: after the ranks were lined up at one step boundary, ``job.cont()`` runs every
  rank to the end (no rank left with a stale pause boundary while the other waits in the allreduce);
* ``job.watch`` / ``job.wait`` before any rank connected: the watchpoint reaches the ranks as they join and
  ``wait`` waits for them (the world size the first rank announces) and for their line-up;
* DDP gradients: the allreduce's result is a node of its own (``…parameters_grad_reduced``), so a GE
  watchpoint on the clean rank sees the NaN that reached it through the allreduce, in the same step.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch  # noqa: F401 - the job runs torch.distributed in its processes (tests/torch_only.py reads this)
import zmq  # noqa: F401 - the listener needs ZeroMQ
from remote_procs import ddp_nan_job, until

import nbdebug

NAN_RANK, NAN_STEP = 1, 2


@pytest.fixture
def listener():
    with nbdebug.listen(quiet=True) as L:
        yield L


def ddp_job(listener, tmp_path, gate, steps=12, env=None):
    """The 2-rank DDP job attached to ``listener`` (rank NAN_RANK makes a NaN at NAN_STEP)."""
    return ddp_nan_job({**listener.env, **(env or {})}, tmp_path, gate, steps, NAN_RANK, NAN_STEP)


def _states(listener):
    return {k: (str(s.state), s.step_index, s.pause_reason) for k, s in listener.sources.items()}


def _lined_up(listener):
    srcs = list(listener.sources.values())
    return (len(srcs) == 2 and all(str(s.state) == "paused" and s.current_node is None for s in srcs)
            and len({s.step_index for s in srcs}) == 1)


def test_hit_unwatch_continue_runs_every_rank_to_the_end(listener, tmp_path):
    gate = tmp_path / "go"
    with ddp_job(listener, tmp_path, gate) as (proc, log):
        until(lambda: listener.live_count() == 2 or proc.poll() is not None, 120, "both ranks")
        assert listener.live_count() == 2, log.read_text()[-3000:]
        job = listener.job
        job.watch("TO")
        gate.write_text("go")
        # rank 1's NaN at step 2 reaches rank 0's weights through the allreduce: from then on both ranks hit
        # in every step, at nearly the same moment (the line-up then asks a rank that has just paused itself)
        assert job.wait(60) == {0: "paused", 1: "paused"}, log.read_text()[-3000:]
        until(lambda: _lined_up(listener), 30, "both ranks at one step boundary")
        for s in listener.sources.values():
            s.unwatch()
        job.cont()
        until(lambda: proc.poll() is not None, 60, f"the job's end; {_states(listener)}")
        assert proc.returncode == 0, log.read_text()[-3000:]
        until(lambda: all(str(s.state) == "finished" for s in listener.sources.values()), 20, "finished")


def test_a_boundary_asked_of_a_rank_paused_there_by_a_hit_is_not_left_pending():
    """The race under the deadlock, made deterministic: the line-up's ``pause_at_step S`` reaches a rank that
    has just paused after step S on a hit of its own. It has done what was asked; nothing stays armed, so the
    next continue runs it on (before: it paused again one step later, alone, its peer in the allreduce)."""
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    dbg = nbdebug.Debugger(model)

    def train():
        for step in range(6):
            x = torch.ones(2, 3) * (float("nan") if step == 2 else 1.0)
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
            dbg.step()

    dbg.watch("TO")
    dbg.run(train)
    assert str(dbg.wait(30)) == "paused" and dbg.step_index == 3 and "hit" in dbg.pause_reason
    dbg.unwatch()
    dbg.pause_after(2)  # what the line-up asks: pause after step 2 — where it already stands
    dbg.cont()
    assert str(dbg.wait(30)) == "finished", (dbg.step_index, dbg.pause_reason)
    dbg.close()


def test_job_watch_and_wait_before_the_ranks_connect(listener, tmp_path):
    gate = tmp_path / "go"
    gate.write_text("go")  # the ranks do not wait: the watchpoint must reach them as they join
    job = listener.job
    assert job.watch("TO") == {}  # no rank yet: remembered for the ranks that join
    with ddp_job(listener, tmp_path, gate) as (proc, log):
        states = job.wait(120)  # waits for both ranks (the world size rank 0 announces), then their hit
        assert states == {0: "paused", 1: "paused"}, (states, log.read_text()[-3000:])
        srcs = [job.source(r) for r in (0, 1)]
        assert all([w.condition for w in s.watchpoints.watchpoints.values()] == ["TO"] for s in srcs)
        assert any(h.step == NAN_STEP and h.condition == "TO" for h in job.hits[NAN_RANK])
        until(lambda: _lined_up(listener), 30, f"both ranks at one step boundary; {_states(listener)}")
        job.unwatch()
        assert all(not s.watchpoints.watchpoints for s in srcs)
        job.cont()
        until(lambda: proc.poll() is not None, 60, f"the job's end; {_states(listener)}")
        assert proc.returncode == 0, log.read_text()[-3000:]


def test_ddp_reduced_gradient_is_its_own_node_and_ge_sees_the_nan_it_brings(listener, tmp_path):
    gate = tmp_path / "go"
    gate.write_text("go")
    job = listener.job
    job.watch("GE")  # gradients only: rank 0's own gradients are finite; its reduced ones are not
    with ddp_job(listener, tmp_path, gate) as (proc, log):
        assert job.wait(120) == {0: "paused", 1: "paused"}, log.read_text()[-3000:]
        clean = [h for h in job.hits[0] if h.condition == "GE"]
        assert clean and min(h.step for h in clean) == NAN_STEP, job.hits[0]
        first = [h for h in clean if h.step == NAN_STEP]
        assert all(".parameters_grad_reduced." in h.node for h in first), [h.node for h in first]
        src = job.source(0)
        until(lambda: _lined_up(listener), 30, f"both ranks at one step boundary; {_states(listener)}")
        at = src.step_index - 1  # the step both ranks finished last
        pre = "Module.module.fc2.Linear.parameters_grad.0"
        reduced = "Module.module.fc2.Linear.parameters_grad_reduced.0"
        assert reduced in src.graph.nodes and src.graph.nodes[reduced].section == "backward"
        assert (pre, reduced) in {(e[0], e[1]) for e in src.graph.edges}  # local gradient -> allreduce -> optimizer
        value = src.tensor(reduced, "weight", at)
        assert value.shape == (1, 16) and np.isnan(value).any()  # the value rank 0's optimizer stepped with
        with pytest.raises(nbdebug.NotRetainedError, match="allreduce"):
            src.tensor(pre, "weight", at)  # its local gradient, overwritten by the allreduce: said so
        job.terminate()
        assert proc.wait(60) == 0, log.read_text()[-3000:]
