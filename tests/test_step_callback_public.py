"""MindSpore's ``Model.train`` callback is public (issue #22 item 22): ``nbdebug.StepCallback`` and
``dbg.callback()``; the old path ``nbdebug.frameworks.mindspore.adapter.StepCallback`` still works."""

import subprocess
import sys

import pytest
from ms_fixtures import LeNet, batches, loss_fn, ms, nn, pynative_mode  # noqa: F401 - the fixture

import nbdebug

pytestmark = [pytest.mark.timeout(120)]


@pytest.mark.subprocess
def test_step_callback_is_public_and_import_nbdebug_stays_framework_free():
    code = ("import sys, nbdebug; assert 'mindspore' not in sys.modules, 'import nbdebug imported mindspore'; "
            "from nbdebug.frameworks.mindspore.adapter import StepCallback as Old; "
            "assert nbdebug.StepCallback is Old; from nbdebug import StepCallback; assert StepCallback is Old; "
            "print('ok')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


@pytest.mark.usefixtures("pynative_mode")
def test_dbg_callback_drives_model_train():
    ms.set_seed(6)
    net = LeNet()
    with nbdebug.Debugger(net, level="L0") as dbg:
        cb = dbg.callback()
        assert isinstance(cb, nbdebug.StepCallback) and cb.debugger is dbg
        data = batches(3)
        ds = ms.dataset.GeneratorDataset([(x.asnumpy()[0], y.asnumpy()[0]) for x, y in data], ["x", "y"]).batch(1)
        model = ms.train.Model(net, loss_fn(), nn.SGD(net.trainable_params(), 0.05))
        model.train(1, ds, callbacks=[cb], dataset_sink_mode=False)
        assert dbg.step_index == 3
        assert "Cell.fc1.Dense.backward.0" in dbg.graph.nodes


def test_dbg_callback_on_a_pytorch_model_says_none_is_needed():
    import torch

    with nbdebug.Debugger(torch.nn.Linear(2, 2)) as dbg:
        with pytest.raises(TypeError, match="needs no training callback: the optimizer's step ends"):
            dbg.callback()
