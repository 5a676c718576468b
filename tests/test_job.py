"""``nbdebug.job.Job`` over in-process ranks: one ``Debugger`` per "rank" on tiny torch models.

Reading: the first non-finite rank (step first, then position in the step, then rank), per-rank summaries
and hits, rank-vs-rank compare. Control: the ranks meet in a ``threading.Barrier`` inside every step (a
stand-in for DDP's gradient allreduce, which makes a rank paused alone block its peers) — ``cont(steps)``
and ``pause()`` stop every rank after the same step, and nothing waits on the barrier for long.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch

import nbdebug
from nbdebug.job import Job, NonFinite, StepSummary

FAULT = "Module.fault.Fault.forward.0"


class Fault(torch.nn.Module):
    """Identity, or (armed) ``sqrt(x - 10)``: NaN from finite inputs."""

    armed = False

    def forward(self, x):
        return torch.sqrt(x - 10.0) if self.armed else x


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 8)
        self.act = torch.nn.Tanh()
        self.fault = Fault()
        self.fc2 = torch.nn.Linear(8, 1)
        self.late = Fault()  # NaN after fc2: later in the step than ``fault``

    def forward(self, x):
        return self.late(self.fc2(self.fault(self.act(self.fc1(x)))))


def _ranks(n):
    torch.manual_seed(0)
    models = [Net() for _ in range(n)]
    for m in models[1:]:
        m.load_state_dict(models[0].state_dict())
    return models, [nbdebug.Debugger(m, level="L0") for m in models]


def _train(models, steps, faults=(), same_data=False):
    """Train each model ``steps`` steps; ``faults``: ``(rank, step, "fault"|"late")`` arm that module."""
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in models]
    gens = [torch.Generator().manual_seed(0 if same_data else 100 + r) for r in range(len(models))]
    for step in range(steps):
        for r, (m, opt) in enumerate(zip(models, opts, strict=True)):
            m.fault.armed = (r, step, "fault") in faults
            m.late.armed = (r, step, "late") in faults
            opt.zero_grad()
            m(torch.randn(6, 4, generator=gens[r])).pow(2).mean().backward()
            opt.step()


@pytest.fixture
def job3():
    models, dbgs = _ranks(3)
    yield models, dbgs
    for d in dbgs:
        d.close()


def test_first_nonfinite_rank_node_step(job3):
    models, dbgs = job3
    _train(models, 5, faults={(2, 3, "fault")})
    job = Job(dict(enumerate(dbgs)))
    assert job.ranks == [0, 1, 2] and job.steps == [0, 1, 2, 3, 4]
    first = job.first_nonfinite()
    assert isinstance(first, NonFinite)
    assert (first.rank, first.node, first.slot, first.step) == (2, FAULT, "output.0", 3)
    assert str(first) == f"rank 2, node {FAULT}, step 3"
    assert job.first_nonfinite(step=2) is None
    assert job.origins(3) == {0: None, 1: None, 2: first}
    s3 = job.summary(2, 3)
    assert s3.origin == (FAULT, "output.0", first.position) and s3.nonfinite_tensors > 0
    assert job.summary(0, 3).nonfinite_tensors == 0 and job.summary(0, 3).origin is None
    over = job.overview()
    assert sorted(over) == [0, 1, 2, 3, 4] and sorted(over[3]) == [0, 1, 2]
    # a summary travels as plain JSON types and comes back equal
    assert StepSummary.from_dict(s3.to_dict()) == s3
    with pytest.raises(ValueError, match="not a step summary"):
        StepSummary.from_dict({"rank": 1})


def test_first_orders_by_step_then_position_then_rank(job3):
    models, dbgs = job3
    # rank 0: NaN late in step 2; rank 1: NaN early in step 3 -> rank 0 (earlier step)
    _train(models, 4, faults={(0, 2, "late"), (1, 3, "fault")})
    job = Job(dict(enumerate(dbgs)))
    first = job.first_nonfinite()
    assert (first.rank, first.step, first.node) == (0, 2, "Module.late.Fault.forward.0")
    # within step 3 every rank is non-finite (rank 0's NaN parameters since step 2); by position
    assert job.first_nonfinite(step=3).position == min(o.position for o in job.origins(3).values() if o)


def test_same_step_position_then_rank():
    models, dbgs = _ranks(3)
    try:
        _train(models, 2, faults={(2, 1, "fault"), (1, 1, "fault"), (0, 1, "late")})
        job = Job(dict(enumerate(dbgs)))
        origins = job.origins(1)
        assert origins[0].node == "Module.late.Fault.forward.0" and origins[1].node == origins[2].node == FAULT
        assert origins[0].position > origins[1].position == origins[2].position
        assert job.first_nonfinite().rank == 1  # same node and position: the lower rank
    finally:
        for d in dbgs:
            d.close()


def test_hits_per_rank_and_summary_counts(job3):
    models, dbgs = job3
    for d in dbgs:
        d.watch("TO")
    _train(models, 4, faults={(1, 2, "fault")})
    job = Job(dict(enumerate(dbgs)))
    counts = job.hit_counts()
    assert counts[0] == counts[2] == 0 and counts[1] > 0
    assert min(h.step for h in job.hits[1]) == 2
    assert job.summary(1, 2).hits == sum(1 for h in job.hits[1] if h.step == 2 and h.hits)
    assert job.summary(0, 2).hits == 0


def test_compare_ranks(job3):
    models, dbgs = job3
    _train(models, 3, faults={(2, 1, "fault")})
    job = Job(dict(enumerate(dbgs)))
    clean = job.compare_ranks(0, 1, 0)
    assert (clean.target_step, clean.golden_step) == (0, 0) and not clean.unmatched_target
    params = [r for r in clean.rows if r.target.startswith("Parameter.")]
    assert params and all(r.status == "pass" for r in params)  # same initial weights
    assert clean.row("Module.fc1.Linear.forward.0", "input.0").status != "pass"  # different data
    bad = job.compare_ranks(2, 0, 1)
    assert bad.row(FAULT, "output.0").status == "error"
    assert bad.row(FAULT, "input.0").status != "error"
    panel = job.compare_panel(2, 0, 1)
    assert "rank 2" in panel.summary.value and "rank 0" in panel.summary.value


def test_job_rejects_bad_input():
    import nbdebug.offline  # a submodule: imported here, not relied on as a side effect of earlier tests
    import nbdebug.session.session

    with pytest.raises(ValueError, match="non-empty"):
        Job({})
    with pytest.raises(ValueError, match="ranks are ints"):
        Job({"0": nbdebug.offline.OfflineSession(nbdebug.session.session.Session(framework="pytorch"))})
    with pytest.raises(TypeError, match="a panel needs"):
        Job({0: object()})
    job = Job({0: nbdebug.offline.OfflineSession(nbdebug.session.session.Session(framework="pytorch"))})
    with pytest.raises(KeyError, match="no rank 3"):
        job.source(3)


# -- control: every rank at a step boundary ---------------------------------------------------------------
STEPS = 8


def _collective_training(models, barrier, log):
    """Per rank: forward, meet the others (the "allreduce"), backward, optimizer step."""
    def train(r, m):
        opt = torch.optim.SGD(m.parameters(), lr=0.01)
        for step in range(STEPS):
            opt.zero_grad()
            loss = m(torch.ones(2, 4) * (r + 1)).pow(2).mean()
            barrier.wait(timeout=20)  # a broken barrier (a peer paused alone) fails the rank
            loss.backward()
            opt.step()
            log.append((r, step))
    return train


def _wait_all(dbgs, timeout=30):
    return [str(d.wait(timeout)) for d in dbgs]


def test_control_pauses_every_rank_after_the_same_step(job3):
    models, dbgs = job3
    barrier = threading.Barrier(3)
    log = []
    train = _collective_training(models, barrier, log)
    for r, (m, d) in enumerate(zip(models, dbgs, strict=True)):
        d.run(train, r, m, paused=True)
    job = Job(dict(enumerate(dbgs)))
    assert job.live
    with pytest.raises(RuntimeError, match="single-rank job"):
        job.next_node()
    with pytest.raises(RuntimeError, match="single-rank job"):
        job.run_to(FAULT)

    assert job.cont(2) == 1  # steps 0 and 1
    assert _wait_all(dbgs) == ["paused"] * 3
    assert [d.step_index for d in dbgs] == [2, 2, 2]
    assert all("step 1 done" in d.pause_reason for d in dbgs)

    assert job.cont(3) == 4
    assert _wait_all(dbgs) == ["paused"] * 3 and [d.step_index for d in dbgs] == [5, 5, 5]

    job.cont()  # free running, then pause: all at one boundary
    target = job.pause()
    assert target is not None
    states = _wait_all(dbgs)
    if states == ["finished"] * 3:  # the short run ended before the pause landed: nothing to align
        return
    assert states == ["paused"] * 3
    assert len({d.step_index for d in dbgs}) == 1 and dbgs[0].step_index == target + 1
    job.terminate()
    assert _wait_all(dbgs) == ["terminated"] * 3
    assert not any(d.error for d in dbgs)  # no rank waited on the barrier until it broke


def test_single_rank_job_has_node_control():
    models, dbgs = _ranks(1)
    try:
        d = dbgs[0]
        d.run(lambda: _train(models, 2), paused=True)
        job = Job({0: d})
        assert job.cont(1) == 0 and str(d.wait(10)) == "paused" and d.step_index == 1
        job.run_to("Module.fc2.Linear.forward.0")
        assert str(d.wait(10)) == "paused" and d.current_node == "Module.fc2.Linear.forward.0"
        job.next_node()
        assert str(d.wait(10)) == "paused" and d.current_node not in (None, "Module.fc2.Linear.forward.0")
        job.cont()
        assert str(d.wait(20)) == "finished"
    finally:
        dbgs[0].close()


def test_a_rank_pausing_on_a_hit_lines_the_others_up(job3):
    models, dbgs = job3
    barrier = threading.Barrier(3)
    log = []
    train = _collective_training(models, barrier, log)
    dbgs[1].watch("TO")

    def train1(r, m):  # rank 1: NaN in its forward at step 3
        plain = m.fault.forward
        m.fault.forward = lambda x: torch.sqrt(x - 10.0) if sum(e[0] == r for e in log) == 3 else plain(x)
        train(r, m)

    job = Job(dict(enumerate(dbgs)))
    for r, (m, d) in enumerate(zip(models, dbgs, strict=True)):
        d.run(train1 if r == 1 else train, r, m)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not all(str(d.state) == "paused" for d in dbgs):
        time.sleep(0.02)
    assert [str(d.state) for d in dbgs] == ["paused"] * 3
    # one boundary for all: after the hit's step 3, or step 4 when a rank was already inside it
    assert len({d.step_index for d in dbgs}) == 1 and dbgs[0].step_index in (4, 5)
    assert min(h.step for h in dbgs[1].hits) == 3 and not dbgs[0].hits and not dbgs[2].hits
    dbgs[1].unwatch()  # NaN parameters would hit again every step
    job.cont()  # everyone on, to the end, nobody left behind at a collective
    assert _wait_all(dbgs) == ["finished"] * 3
    assert not any(d.error for d in dbgs)
    job.close()


def test_control_handed_to_a_group_controller(job3):
    """Ranks that are already steered together (remote processes behind one listener) get the job's
    commands through that controller, once, instead of rank by rank."""
    _models, dbgs = job3
    calls = []

    class Group:
        def pause_all(self):
            calls.append("pause")
            return 7

        def cont_all(self, steps=None):
            calls.append(("cont", steps))

        def terminate_all(self):
            calls.append("terminate")

    job = Job(dict(enumerate(dbgs)), control=Group())
    assert job.pause() == 7
    job.cont(2)
    job.terminate()
    assert calls == ["pause", ("cont", 2), "terminate"]
    assert all(str(d.state) == "idle" for d in dbgs)  # nothing went to the ranks themselves
    with pytest.raises(TypeError, match="pause_all"):
        Job(dict(enumerate(dbgs)), control=object())


def test_summaries_outlive_the_stats_window():
    """A job that follows live ranks summarises each step as it ends: the first non-finite step is still
    answered after the Debuggers dropped its statistics (``stats_window=2``)."""
    torch.manual_seed(0)
    models = [Net() for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    dbgs = [nbdebug.Debugger(m, level="L0", stats_window=2) for m in models]
    try:
        job = Job(dict(enumerate(dbgs)))
        _train(models, 6, faults={(1, 1, "fault")})
        assert sorted(dbgs[1].session.steps) == [4, 5]  # step 1's statistics are gone
        first = job.first_nonfinite()
        assert (first.rank, first.node, first.step) == (1, FAULT, 1)
        assert job.steps == list(range(6)) and job.summary(0, 0).nonfinite_tensors == 0
        late = Job(dict(enumerate(dbgs)))  # a job made afterwards sees only what the ranks still hold
        assert late.steps == [4, 5] and late.first_nonfinite().step == 4
        job.close()
    finally:
        for d in dbgs:
            d.close()


def test_first_nonfinite_waits_for_a_rank_still_in_the_step():
    """A rank that only received NaN (here: later in the step) often reports before the rank that made it:
    while a rank still runs the earliest non-finite step without having reported it, the job gives no answer
    rather than a wrong one; once it reports, the earlier position wins."""
    models, dbgs = _ranks(2)
    try:
        job = Job(dict(enumerate(dbgs)))
        opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in models]
        gen = torch.Generator().manual_seed(0)

        def step(r, fault=False, late=False):
            models[r].fault.armed, models[r].late.armed = fault, late
            opts[r].zero_grad()
            models[r](torch.randn(6, 4, generator=gen)).pow(2).mean().backward()
            opts[r].step()

        step(0), step(1)
        step(0, late=True)  # rank 0's step 1 is non-finite late in the step; rank 1 has not run step 1
        assert job.origins(1)[0] is not None and job.first_nonfinite() is None
        step(1, fault=True)
        first = job.first_nonfinite()
        assert (first.rank, first.node, first.step) == (1, FAULT, 1)
        dbgs[1].close()  # a rank that ends no longer holds the answer back
        step(0, late=True)
        assert job.first_nonfinite(step=2).rank == 0
    finally:
        for d in dbgs:
            d.close()
