"""nbdebug.load on a MindSpore GRAPH-mode kernel dump: the layout is recognised and the kernel-dump reader
(nbdebug.frameworks.mindspore.graph) builds the session; panels' protocol, watchpoints and first_nonfinite
work on it."""

import shutil

import pytest
from ms_fixtures import LeNet, batches, graph_trainer, ms

import nbdebug
from nbdebug.dump.load import detect_layout
from nbdebug.offline import OfflineSession

pytestmark = pytest.mark.timeout(240)


def test_kernel_dump_loads_as_an_offline_session(tmp_path):
    mode = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        ms.set_seed(3)
        net = LeNet(fault="nan")
        dbg = nbdebug.Debugger(net)
        train = graph_trainer(net)
        for x, y in batches(2):
            train(x, y)
        shutil.copytree(dbg._adapter.dump_dir, tmp_path / "dump")
        dbg.close()
    finally:
        ms.set_context(mode=mode)
    assert detect_layout(str(tmp_path / "dump")) == "kernel"
    off = nbdebug.load(tmp_path / "dump")
    assert isinstance(off, OfflineSession) and off.layout == "kernel" and off.session.live is False
    assert len(off.steps) >= 1 and len(off.graph) > 10
    origin = off.first_nonfinite(None)
    assert origin is not None and "Log" in origin[0]  # never a BatchNorm output the CPU kernel left unwritten
    table = off.session.table(off.steps[-1])
    refused = {table.keys[i][1] for i, why in table.unsupported.items()
               if table.keys[i][0].endswith("/BatchNorm-op0") and "does not write this output" in why}
    assert refused == {"output.1", "output.2", "output.3", "output.4"}  # the dump says device_target CPU
    off.watch("TO")
    assert any(h.node == origin[0] for h in off.hits)
