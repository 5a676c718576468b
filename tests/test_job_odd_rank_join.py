"""ODD_RANK follows the job's ranks (issue 20 item 4): a rank that joins after ``job.watch("ODD_RANK")`` is compared
and named like the others (it got the watchpoint on joining, and the job's ODD_RANK finds it there), and
``job.unwatch()`` ends ODD_RANK as it ends the ranks' own watchpoints. Four tiny live ranks (Debuggers), rank 3
joins after the watch and its data is scaled ×1e3 from step K."""

from __future__ import annotations

import torch

import nbdebug
from nbdebug.job import Job

K, ODD = 5, 3


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 8)
        self.fc2 = torch.nn.Linear(8, 1)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


def _train(models, opts, gens, steps):
    for _ in range(steps):
        for r, (m, opt) in enumerate(zip(models, opts, strict=True)):
            step = len(m.seen)
            x = torch.randn(16, 4, generator=gens[r]) * (1e3 if r == ODD and step >= K else 1.0)
            m.seen.append(step)
            opt.zero_grad()
            m(x).pow(2).mean().backward()
            opt.step()


def _odd_hits(job):
    return [(r, h) for r, hs in job.hits.items() for h in hs if h.condition == "ODD_RANK"]


def test_a_rank_joining_after_the_watch_is_covered_and_unwatch_ends_odd_rank():
    torch.manual_seed(0)
    models = [Net() for _ in range(4)]
    for m in models:
        m.load_state_dict(models[0].state_dict())
        m.seen = []
    dbgs = [nbdebug.Debugger(m, level="L0") for m in models]
    try:
        job = Job({r: dbgs[r] for r in range(3)})
        made = job.watch("ODD_RANK", field="output_norm", z=6)
        assert sorted(made) == [0, 1, 2]
        job.add(ODD, dbgs[ODD])  # joins after the watch: gets it on joining
        own = [w for w in dbgs[ODD].watchpoints.watchpoints.values() if w.condition == "ODD_RANK"]
        assert len(own) == 1
        opts = [torch.optim.SGD(m.parameters(), lr=0.01) for m in models]
        gens = [torch.Generator().manual_seed(100 + r) for r in range(4)]
        _train(models, opts, gens, K + 2)
        assert job.odd_rank.watches[0][ODD] is own[0]  # found among the joined rank's own watchpoints
        found = _odd_hits(job)
        assert found, "the rank that joined after the watch was never named"
        assert min(h.step for _r, h in found) == K, [(r, h.describe()) for r, h in found]
        assert {r for r, h in found if h.step == K} == {ODD}
        assert all(h.watchpoint == own[0].id for r, h in found if r == ODD)

        job.unwatch()
        assert job.odd_rank.watches == [] and job.watches == []
        assert all(not d.watchpoints.watchpoints for d in dbgs)
        before = len(_odd_hits(job))
        _train(models, opts, gens, 3)  # rank 3 stays odd: nothing watches it any more
        assert len(_odd_hits(job)) == before
        job.watch("ODD_RANK", field="output_norm", z=6)  # a new watch works again, on all four ranks
        assert sorted(job.odd_rank.watches[0]) == [0, 1, 2, 3]
    finally:
        for d in dbgs:
            d.close()
