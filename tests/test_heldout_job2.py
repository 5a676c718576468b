"""Held-out trials of multi-rank jobs, round 4: real ``torchrun`` jobs (gloo, CPU, ``-m nbdebug.run``,
``remote_scripts/ddp_variants.py``) attached to a listener here, as a notebook drives them; each rank writes
what it computed (loss, gradient and weight norms of the values it holds) and the job must show the same.

1. DDP with gradient accumulation under ``no_sync()``: the first micro-batch's local gradient and the reduced
   one the optimizer used are each a node of their own, with the rank's values; the step's loss is the last
   micro-batch's. DDP with ``find_unused_parameters=True`` and a branch unused on odd steps: its gradient
   nodes "did not execute" there, the others hold the rank's values.
2. FSDP2 (``fully_shard``): parameters, gradients and optimizer state are DTensors. The ranks died of SIGSEGV
   in their first backward (the native statistics kernel read a DTensor's ``data_ptr()``, an offset from
   address 0: a wrapper subclass has no data of its own), and at the monitor level the optimizer's pre-hook
   raised (``update_norms`` on the same pointer). A DTensor is measured by its local shard — the values the
   rank holds and steps with — without a collective; the tensor view fetched from a paused rank refused it
   (``.numpy() is not supported for tensor subclasses``) and now gives that shard.
3. ``torchrun --max-restarts 1`` where rank 1 crashes in its first attempt: after the restart every rank is a
   new process (new PID, ``job.add`` forgets the old one) and the job's steps are the second attempt's only.
4. Uneven ranks: one leaves normally after half the steps — ``pause_all`` / ``cont_all`` move the others, and
   nothing waits for the one that left; a rank 30× slower under DDP: ``pause_all`` returns at once and every rank
   pauses at one boundary.
5. Four ranks at the monitor level in summary mode; rank 2's batch holds a NaN: ``job.watch("TO")`` hits its
   module outputs on rank 2 only, the job lines up, ``first_nonfinite()`` names rank 2 (it answered None: a
   rank's agent summarised a monitor-level step as an empty table) and the overview marks the step.

And the job's step summary (live in-process Debuggers, no torchrun): at the monitor level it read 0 non-finite
tensors beside a non-finite origin (the overview showed the step clean); its loss was the last scalar of the
forward section, so a gradient norm taken after ``backward`` (``clip_grad_norm_``, logging) was shown as the
step's loss; it is now the last such scalar before the step's last backward node.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from contextlib import contextmanager

import numpy as np
import pytest
import torch
import zmq  # noqa: F401 - the listener needs ZeroMQ
from ranks_checks import free_port
from remote_procs import ROOT, SCRIPTS, kill_tree, until

import nbdebug
from nbdebug.job import Job

pytestmark = [pytest.mark.subprocess, pytest.mark.slow]


@contextmanager
def _job(tmp_path, mode, nproc, steps, arg=-1, level="L1", extra=(), summary_above=None):
    """A listener and ``torchrun ... ddp_variants.py`` attached to it; yields ``(listener, process, out)``
    once every rank joined (the ranks wait for ``out/go`` at step 1)."""
    out = tmp_path / mode
    out.mkdir()
    with nbdebug.listen(quiet=True) as listener:
        if summary_above is not None:
            listener.summary_above = summary_above
        env = dict(os.environ, **listener.env, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), NBDEBUG_LEVEL=level)
        cmd = ["timeout", "200", sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
               *extra, "--master-addr", "127.0.0.1", "--master-port", str(free_port()), "-m", "nbdebug.run",
               str(SCRIPTS / "ddp_variants.py"), str(out / "go"), str(out), mode, str(steps), str(arg)]
        with open(out / "torchrun.log", "w") as log:
            proc = subprocess.Popen(cmd, env=env, cwd=str(ROOT), stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        try:
            until(lambda: listener.live_count() == nproc or proc.poll() is not None, 120, "every rank")
            assert listener.live_count() == nproc, _log(out)
            yield listener, proc, out
        finally:
            kill_tree(proc.pid)
            proc.wait()


def _log(out):
    return (out / "torchrun.log").read_text()[-4000:]


def _record(out, rank):
    return json.loads((out / f"rank{rank}.json").read_text())


def _states(job):
    return [(r, str(job.source(r).state), job.source(r).step_index) for r in job.ranks]


def _grad_norms(src, step, owner, pattern):
    """``{parameter: norm}`` of ``owner``'s gradient node ``pattern`` (``parameters_grad.0`` ...) at ``step``."""
    node = f"{owner}.{pattern}"
    return {local: src.stats(node, local, step, ["norm"])["norm"] for local in ("weight", "bias")}


def _close(a, b):
    return abs(a - b) <= 1e-5 * max(1.0, abs(b))


def test_summary_loss_is_the_loss_backward_started_from():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    dbg = nbdebug.Debugger(model, level="L1")
    losses = []
    try:
        for _ in range(2):
            x = torch.randn(5, 4)
            loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
            opt.zero_grad()
            loss.backward()
            clipped = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)  # a scalar after the backward
            opt.step()
            losses.append((loss.item(), clipped.item()))
        job = Job({0: dbg})
        for step, (value, norm) in enumerate(losses):
            assert value != norm
            assert job.summary(0, step).loss == pytest.approx(value, rel=1e-6), (step, value, norm)
    finally:
        dbg.close()


def test_ddp_no_sync_accumulation_and_find_unused_parameters(tmp_path):
    steps = 4
    with _job(tmp_path, "nosync", 2, steps) as (listener, proc, out):
        (out / "go").write_text("go")
        assert proc.wait(120) == 0, _log(out)
        job = listener.job
        for r in job.ranks:
            src, rec = job.source(r), _record(out, r)
            for step in range(steps):
                for owner in ("Module.module.inp.Linear", "Module.module.head.Linear"):
                    short = owner.split(".")[2]
                    first = _grad_norms(src, step, owner, "parameters_grad.0")  # micro-batch 1, under no_sync
                    used = _grad_norms(src, step, owner, "parameters_grad_reduced.0")  # what SGD stepped with
                    for local in ("weight", "bias"):
                        assert _close(first[local], rec["grads_first"][step][f"{short}.{local}"]), (r, step)
                        assert _close(used[local], rec["grads"][step][f"{short}.{local}"]), (r, step)
                    assert f"{owner}.parameters_grad_reduced.1" not in src.graph.nodes  # no_sync: not reduced
                assert _close(job.summary(r, step).loss, rec["micro"][step][1]), (r, step)  # the last micro-batch
    with _job(tmp_path, "unused", 2, steps) as (listener, proc, out):
        (out / "go").write_text("go")
        assert proc.wait(120) == 0, _log(out)
        job = listener.job
        for r in job.ranks:
            src, rec = job.source(r), _record(out, r)
            for step in range(steps):
                side = "Module.module.side.Linear.parameters_grad_reduced.0"
                if step % 2:
                    with pytest.raises(KeyError, match="did not execute"):
                        src.stats(side, "weight", step)
                    assert "side.weight" not in rec["grads"][step]
                else:
                    assert _close(src.stats(side, "weight", step, ["norm"])["norm"], rec["grads"][step]["side.weight"])
                used = _grad_norms(src, step, "Module.module.head.Linear", "parameters_grad_reduced.0")
                assert _close(used["weight"], rec["grads"][step]["head.weight"]), (r, step)
                assert _close(job.summary(r, step).loss, rec["loss"][step]), (r, step)


@pytest.mark.parametrize("level", ["L1", "monitor"])
def test_fsdp2_job_trains_and_shows_each_rank_its_shard(tmp_path, level):
    steps = 5
    with _job(tmp_path, "fsdp2", 2, steps, level=level) as (listener, proc, out):
        job = listener.job
        fetched = {}
        if level == "L1":  # the tensor view: a rank's values fetched from it while the job is paused
            until(lambda: min(job.source(r).step_index for r in job.ranks) == 1, 30, lambda: _states(job))
            assert listener.pause_all() == 1  # the ranks wait for the gate in step 1: they pause at its end
            (out / "go").write_text("go")
            until(lambda: all(str(job.source(r).state) == "paused" for r in job.ranks), 30, lambda: _states(job))
            for r in job.ranks:
                src = job.source(r)
                for node, slot in (("Module.inp.FSDPLinear.parameters_grad.0", "weight"),
                                   ("Parameter.side.weight", "output.0")):  # .numpy() refused the DTensor
                    fetched[r, node] = (src.tensor(node, slot, 1), src.stats(node, slot, 1, ["norm"])["norm"])
            listener.cont_all()
        (out / "go").write_text("go")
        assert proc.wait(120) == 0, _log(out)  # SIGSEGV in the first backward (L1), ValueError (monitor)
        assert job.steps == list(range(steps))
        for r in job.ranks:
            src, rec = job.source(r), _record(out, r)
            if level == "L1":
                for step in range(steps):
                    for owner in ("inp", "side", "head"):
                        got = _grad_norms(src, step, f"Module.{owner}.FSDPLinear", "parameters_grad.0")
                        for local in ("weight", "bias"):  # the rank's shard of the reduce-scattered gradient
                            assert _close(got[local], rec["grads"][step][f"{owner}.{local}"]), (r, step, owner)
                        if step:  # the weights the step used: the shard as the previous step left it
                            used = src.stats(f"Parameter.{owner}.weight", "output.0", step, ["norm"])["norm"]
                            assert _close(used, rec["norms"][step - 1][f"{owner}.weight"]), (r, step, owner)
                grad, norm = fetched[r, "Module.inp.FSDPLinear.parameters_grad.0"]
                assert grad.shape == (4, 6) and _close(float(np.linalg.norm(grad)), rec["grads"][1]["inp.weight"])
                weight, norm_w = fetched[r, "Parameter.side.weight"]
                assert _close(float(np.linalg.norm(weight)), norm_w) and _close(norm_w, rec["norms"][0]["side.weight"])
            else:
                mon = src.session.monitor
                for name in ("inp.weight", "head.weight", "side.bias"):
                    s, grad = mon.series(f"Parameter.{name}", "grad_norm")
                    assert s.tolist() == list(range(steps))
                    np.testing.assert_allclose(grad, [g[name] for g in rec["grads"]], rtol=1e-5)
                    _s, weight = mon.series(f"Parameter.{name}", "weight_norm")  # before each step: the last's
                    np.testing.assert_allclose(weight[1:], [n[name] for n in rec["norms"][:-1]], rtol=1e-5)


def test_elastic_restart_shows_the_new_attempt_only(tmp_path):
    steps = 6
    with _job(tmp_path, "crash", 2, steps, arg=1, extra=("--max-restarts", "1")) as (listener, proc, out):
        from nbdebug.ui.job_panel import JobPanel

        job = listener.job
        panel = JobPanel(job, loop=None)
        first = {r: job.source(r).remote_info["pid"] for r in job.ranks}
        job.watch("TO")  # the restarted ranks get it in their welcome
        (out / "go").write_text("go")  # rank 1 raises in step 3; torchrun starts both ranks again
        assert proc.wait(150) == 0, _log(out)
        until(lambda: all(str(job.source(r).state) == "finished" for r in job.ranks), 30, lambda: _states(job))
        assert job.ranks == [0, 1]
        assert job.steps == list(range(steps))
        panel.flush()
        for r in job.ranks:
            src, rec = job.source(r), _record(out, r)
            assert rec["attempt"] == 1 and src.remote_info["pid"] == rec["pid"] != first[r]
            table = panel.processes.value
            assert f"<td>{rec['pid']}</td>" in table and f"<td>{first[r]}</td>" not in table
            assert [w.condition for w in src.watchpoints.watchpoints.values()] == ["TO"]
            assert len(rec["loss"]) == steps
            for step in range(steps):  # the second attempt's batches (another seed): no step of the first
                assert _close(job.summary(r, step).loss, rec["loss"][step]), (r, step)
        panel.close()


def test_uneven_ranks_one_leaves_early_and_one_is_slow(tmp_path):
    with _job(tmp_path, "uneven", 3, 24, arg=1) as (listener, proc, out):
        job = listener.job
        (out / "go").write_text("go")
        until(lambda: str(job.source(1).state) == "finished", 60, lambda: _states(job))
        at = listener.pause_all()  # the ranks still training pause; the one that left is not waited for
        until(lambda: all(str(job.source(r).state) == "paused" for r in (0, 2)), 30, lambda: _states(job))
        assert {job.source(r).step_index for r in (0, 2)} == {at + 1}
        listener.cont_all(2)
        until(lambda: all(str(job.source(r).state) == "paused" and job.source(r).step_index == at + 3
                          for r in (0, 2)), 30, lambda: _states(job))
        assert job.wait(5) == {0: "paused", 1: "finished", 2: "paused"}
        listener.cont_all()
        assert proc.wait(120) == 0, _log(out)
        assert job.steps == list(range(24)) and max(job.source(1).session.steps) == 11
    with _job(tmp_path, "slow", 3, 40, arg=1) as (listener, proc, out):
        job = listener.job
        (out / "go").write_text("go")
        until(lambda: min(job.source(r).step_index for r in job.ranks) >= 2, 60, lambda: _states(job))
        at = listener.pause_all()  # returns at once; the slow rank reaches the boundary a step later
        until(lambda: all(str(job.source(r).state) == "paused" for r in job.ranks), 30, lambda: _states(job))
        assert {job.source(r).step_index for r in job.ranks} == {at + 1}, _states(job)
        listener.terminate_all()
        assert proc.wait(60) == 0, _log(out)


def test_monitor_level_step_summary_counts_the_nonfinite_series():
    """A monitor-level rank (a live Debugger here) whose batch holds a NaN in step 2: the step's summary counts
    its non-finite series and the job panel's overview marks the step (it read 0 non-finite tensors, a clean
    cell, beside the step's non-finite origin)."""
    from nbdebug.ui.job_panel import overview_html

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    dbg = nbdebug.Debugger(model, level="monitor")
    try:
        for step in range(4):
            x = torch.randn(5, 4)
            if step == 2:
                x[0, 0] = float("nan")
            loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
            dbg.record_loss(loss)
            opt.zero_grad()
            loss.backward()
            opt.step()
        job = Job({0: dbg})
        clean, bad = job.summary(0, 1), job.summary(0, 2)
        assert clean.tensors > 0 and clean.nonfinite_tensors == 0 and clean.max_abs is not None
        assert clean.loss == dbg.session.monitor.value(1, "Run", "loss") and np.isfinite(clean.grad_norm_total)
        assert bad.tensors == clean.tensors and bad.nonfinite_tensors == len(dbg.session.monitor.nonfinite(2)) - 2
        assert bad.origin[:2] == ("Module.0.Linear", "output_norm") and np.isnan(bad.grad_norm_total)
        first = job.first_nonfinite()
        assert (first.rank, first.node, first.step) == (0, "Module.0.Linear", 2)
        cells = overview_html(job, first).split("<td")[3:]  # rank, hits, then the steps
        assert ["#f4b6b6" in c for c in cells] == [False, False, True, True], cells
    finally:
        dbg.close()


def test_four_ranks_at_the_monitor_level_a_nan_made_by_one(tmp_path):
    """Rank 2's batch holds a NaN in step 4 (``NAN_STEP``); the allreduce brings it to every rank's gradients.
    Summary mode (more ranks than ``summary_above``: each rank sends its step summaries). ``job.watch("TO")``:
    the module-output hits are rank 2's alone, the job pauses at one boundary, the first non-finite is rank 2's
    ``inp`` at step 4, and the step summaries (the panel's overview) show the non-finite series: a rank's agent
    summarised a monitor-level step as an empty table — 0 non-finite tensors and no origin, so
    ``first_nonfinite()`` answered None."""
    from nbdebug.ui.job_panel import OVERVIEW_STEPS, overview_html

    with _job(tmp_path, "nan", 4, 8, arg=2, level="monitor", summary_above=2) as (listener, proc, out):
        job = listener.job
        job.watch("TO")
        (out / "go").write_text("go")
        until(lambda: all(str(job.source(r).state) == "paused" for r in job.ranks)
              and len({job.source(r).step_index for r in job.ranks}) == 1, 60, lambda: _states(job))
        assert [job.source(r).detail for r in job.ranks] == ["summary"] * 4
        outputs = {r: {(h.step, h.node) for h in job.hits[r] if h.slot == "output_norm"} for r in job.ranks}
        assert (4, "Module.module.inp.Linear") in outputs[2]
        assert all(not outputs[r] for r in (0, 1, 3)), outputs
        assert all(min(h.step for h in job.hits[r]) == 4 for r in job.ranks)  # the gradients: every rank
        first = job.first_nonfinite()
        assert (first.rank, first.node, first.step) == (2, "Module.module.inp.Linear", 4), first
        for r in job.ranks:
            before, at = job.summary(r, 3), job.summary(r, 4)
            assert before.nonfinite_tensors == 0 and before.tensors > 0 and before.max_abs is not None
            assert at.nonfinite_tensors > 0 and at.nonfinite_values >= at.nonfinite_tensors
            assert at.origin is not None and np.isnan(at.grad_norm_total)
        assert job.summary(2, 4).origin[:2] == ("Module.module.inp.Linear", "output_norm")
        html = overview_html(job, first)
        row2 = html.split("<tr data-rank='2'>")[1].split("</tr>")[0]
        cell = row2.split("<td")[3 + job.steps[-OVERVIEW_STEPS:].index(4)]  # rank, hits, then the steps
        assert "#f4b6b6" in cell and "border:2px solid" in cell, cell
        job.unwatch()
        job.cont()
        assert proc.wait(120) == 0, _log(out)
