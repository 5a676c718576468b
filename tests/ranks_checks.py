"""Checks shared by the real multi-rank tests (``torchrun`` with PyTorch DDP, ``msrun`` with MindSpore): the
loaded dump of a data-parallel job where one rank produced NaN at ``NAN_STEP`` is one ``Job`` that says so.

What data parallelism guarantees, asserted on the dumps: identical parameters on every rank, different
activations (each rank its own data), each rank's update being lr x the *average* of the ranks' gradients,
and the NaN of one rank reaching every rank's parameters through the gradient allreduce one step later.
"""

from __future__ import annotations

import os
import socket

import numpy as np

import nbdebug

NAN_STEP, STEPS, LR = 3, 6, 0.05


def free_port() -> int:
    """A TCP port free on loopback now (for the launcher's rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_job(dump: str, nproc: int, nan_rank: int, results: list[dict], cell: str, dense: str) -> None:
    """Assert the job of ``dump`` (``cell``/``dense``: the framework's prefix and dense layer class, e.g.
    ``Module``/``Linear`` or ``Cell``/``Dense``); ``results``: what each rank printed at its end."""
    fault = f"{cell}.fault.Fault.forward.0"
    assert sorted(r["rank"] for r in results) == list(range(nproc))
    assert all(r["world"] == nproc for r in results)
    for step in range(STEPS):  # msProbe's layout, one folder per rank
        assert sorted(os.listdir(os.path.join(dump, f"step{step}"))) == [f"rank{r}" for r in range(nproc)]

    off = nbdebug.load(dump)
    assert off.ranks == list(range(nproc)) and off.meta["rank"] == "rank0"  # still rank 0's session
    job = off.job
    assert job.ranks == list(range(nproc)) and job.source(0) is off
    assert job.steps == list(range(STEPS))

    # which rank went non-finite first: the faulty rank, at its fault module, in step 3
    first = job.first_nonfinite()
    assert (first.rank, first.node, first.slot, first.step) == (nan_rank, fault, "output.0", NAN_STEP)
    assert str(first) == f"rank {nan_rank}, node {fault}, step {NAN_STEP}"
    for step in range(NAN_STEP):
        assert all(job.summary(r, step).nonfinite_tensors == 0 for r in job.ranks)
    # one step later the allreduced NaN gradient has reached every rank's parameters
    after = job.origins(NAN_STEP + 1)
    for r in job.ranks:
        assert after[r] is not None and after[r].node.startswith("Parameter."), (r, after[r])
        assert job.summary(r, NAN_STEP + 1).nonfinite_tensors > 0

    # per-rank hits of one watchpoint on every rank
    for r in job.ranks:
        job.source(r).watch("TO")
    hits = job.hits
    counts = job.hit_counts()
    assert set(hits) == set(job.ranks) and all(counts[r] > 0 for r in job.ranks)
    assert min(h.step for h in hits[nan_rank]) == NAN_STEP
    assert any(h.step == NAN_STEP and h.node == fault for h in hits[nan_rank])
    for r in job.ranks:
        if r != nan_rank:
            assert min(h.step for h in hits[r]) > NAN_STEP - 1
            assert not any(h.node == fault and h.step == NAN_STEP for h in hits[r])
    assert job.summary(nan_rank, NAN_STEP).hits == sum(1 for h in hits[nan_rank] if h.step == NAN_STEP and h.hits)

    # clean pairs of ranks: any two before the fault; with 4 ranks also two clean ones in the fault's step
    clean = [r for r in job.ranks if r != nan_rank]
    pairs = [(0, 1, NAN_STEP - 1)] + ([(clean[0], clean[1], NAN_STEP)] if len(clean) > 1 else [])
    for a, b, step in pairs:
        res = job.compare_ranks(a, b, step)
        assert (res.target_step, res.golden_step) == (step, step) and not res.unmatched_target
        params = [row for row in res.rows if row.target and row.target.startswith("Parameter.")]
        assert len(params) == 4
        assert all(row.status == "pass" and row.mode == "tensor" and row.max_abs_err == 0 for row in params)
        fwd_in = res.row(f"{cell}.fc1.{dense}.forward.0", "input.0")
        assert fwd_in.mode == "tensor" and fwd_in.max_abs_err > 0.1  # each rank trains on its own shard
    step = NAN_STEP - 1
    # data parallel's update: every rank's parameter moves by lr x (the mean over ranks of their local gradients)
    for mod, pname in (("fc1", "weight"), ("fc2", "bias")):
        grads = [np.asarray(job.source(r).tensor(f"{cell}.{mod}.{dense}.parameters_grad.0", pname, step))
                 for r in job.ranks]
        before = np.asarray(off.tensor(f"Parameter.{mod}.{pname}", "output.0", step))
        after_p = np.asarray(off.tensor(f"Parameter.{mod}.{pname}", "output.0", step + 1))
        np.testing.assert_allclose(after_p, before - LR * np.mean(grads, axis=0), rtol=1e-5, atol=1e-6)
        # the dump's parameters_grad is each rank's own backward result (before the allreduce averages it):
        # it differs between ranks, and the update uses the average
        assert not np.allclose(grads[0], grads[1])

    # the NaN of one rank ends every rank's training with NaN parameters
    assert all(np.isnan(r["param_sum"]) for r in results)
