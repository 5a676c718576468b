"""Statistics beyond float32's range in the compact history (issue #22 item 18): kept finite, no numpy warning."""

import warnings

import numpy as np
import torch

import nbdebug
from nbdebug.session.history import History
from nbdebug.session.stats import StatsTable


def _table(norm, mx=1.0):
    return StatsTable.from_rows([("n", "output.0")], ["float32"], [(2,)],
                                np.array([[mx, 0, .5, .5, norm, 1, 0, 0, 0, 2]]))


def test_history_keeps_a_norm_beyond_float32_without_a_warning():
    h = History()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a RuntimeWarning (overflow in cast) would fail here
        h.add(0, _table(1.0))
        h.add(1, _table(1e39, mx=-5e38))
        h.add(2, _table(float("inf")))  # a statistic that is inf stays inf
    assert h.get(1, ("n", "output.0"))["norm"] == 1e39
    assert h.get(1, ("n", "output.0"))["max"] == -5e38
    assert h.series(("n", "output.0"), "norm") == ([0, 1, 2], [1.0, 1e39, float("inf")])
    assert h.steps[0][1].dtype == np.float32  # ordinary steps stay compact
    assert h.steps[1][1].dtype == np.float64


def test_timeline_of_a_huge_float32_tensor_is_finite_under_run():
    model = torch.nn.Sequential(torch.nn.Linear(4, 64))
    with torch.no_grad():
        model[0].weight.fill_(1e37)
        model[0].bias.zero_()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)

    def train():
        for _ in range(4):
            opt.zero_grad()
            model(torch.ones(8, 4)).mean().backward()
            opt.step()

    with nbdebug.Debugger(model, stats_window=1) as dbg:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            dbg.run(train, block=True)
        assert dbg.state.value == "finished", dbg.error
        node = "Module.0.Linear.forward.0"
        steps, norms = dbg.timeline(node, "output.0", "norm")
        assert steps == [0, 1, 2, 3]
        want = float(np.linalg.norm(np.full((8, 64), 4e37, dtype=np.float64)))  # 9.1e38 > float32's 3.4e38
        assert all(np.isfinite(norms)) and np.allclose(norms, want, rtol=1e-5)
        assert dbg.stats(node, "output.0", 0, fields=["norm"])["norm"] == norms[0]  # out of the window
