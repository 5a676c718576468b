"""One reading surface (``nbdebug.watch.reader.Reader``) for a live Debugger, the same run loaded back from
its dump, and the panel's source over a bare session: same statistics, hits and overflow origin."""

from __future__ import annotations

import math

import torch

import nbdebug
from nbdebug.ui.source import SessionSource, SourceView
from nbdebug.watch.reader import Reader


class LogNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(4, 6), torch.nn.Linear(6, 2)

    def forward(self, x):
        return self.fc2(torch.log(self.fc1(x)))  # NaN where fc1's output is negative


def test_live_loaded_and_bare_sessions_read_alike(tmp_path):
    torch.manual_seed(0)
    model = LogNet()
    dbg = nbdebug.Debugger(model, level="L1", dump_dir=str(tmp_path), task="tensor")
    model(torch.randn(3, 4)).sum().backward()
    dbg.step()
    dbg.dump.close()
    off = nbdebug.load(str(tmp_path / "step0"))
    bare = SessionSource(off.session)
    try:
        readers = (dbg, off, bare)
        assert all(isinstance(r, Reader) for r in readers)
        assert [r.current_step for r in readers] == [0, 0, 0]
        origins = [r.first_nonfinite() for r in readers]
        assert origins[0][:2] == ("Torch.log.0.forward", "output.0")
        assert origins[1] == origins[0] and origins[2] == origins[0]
        for r in readers:
            s = r.stats("Torch.log.0.forward", "output.0", fields=["max", "nan_count", "nonfinite_count"])
            assert s["nan_count"] > 0 and s["nonfinite_count"] >= s["nan_count"] and math.isnan(s["max"])
        found = []
        for r in readers:
            r.watch("TO", nodes="Torch.log.*")
            if r is not off:  # an offline session evaluates watchpoints as they are made
                r.recheck()
            found.append({(h.node, h.slot, h.step) for h in r.hits if h.hits})
        assert found[0] == found[1] == found[2] and ("Torch.log.0.forward", "output.0", 0) in found[0]
        assert SourceView(off).hits == off.hits and SourceView(bare).watch_recommended()
    finally:
        dbg.close()
        off.close()
