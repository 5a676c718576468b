"""``nbdebug.seed_all``: msProbe's ``seed_all(seed=1234, mode=False, rm_dropout=False)``."""

from __future__ import annotations

import os
import random
import subprocess
import sys

import mindspore as ms
import numpy as np
import pytest
import torch

import nbdebug

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_python_numpy_torch_streams_repeat():
    nbdebug.seed_all(42, frameworks=("torch",))
    first = (random.random(), np.random.rand(), torch.rand(3))
    nbdebug.seed_all(42, frameworks=("torch",))
    again = (random.random(), np.random.rand(), torch.rand(3))
    assert first[0] == again[0] and first[1] == again[1] and torch.equal(first[2], again[2])
    assert os.environ["PYTHONHASHSEED"] == "42"
    nbdebug.seed_all(43, frameworks=("torch",))
    assert not torch.equal(torch.rand(3), first[2])


def test_torch_mode_and_rm_dropout(monkeypatch):
    F = torch.nn.functional
    for name in ("dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout"):
        monkeypatch.setattr(F, name, getattr(F, name))  # put torch's own back after the test
    try:
        nbdebug.seed_all(1, mode=True, rm_dropout=True, frameworks=("torch",))
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
        x = torch.ones(1000)
        assert torch.equal(torch.nn.Dropout(0.9)(x), x)  # train mode, p=0.9: nothing dropped
        assert torch.equal(F.dropout2d(torch.ones(2, 3, 4, 4), 0.5), torch.ones(2, 3, 4, 4))
        with pytest.raises(ValueError, match="between 0 and 1"):
            torch.nn.functional.dropout(x, p=1.5)
    finally:
        torch.use_deterministic_algorithms(False)
        torch.backends.cudnn.deterministic = False


def test_mindspore_seed_and_rm_dropout(monkeypatch):
    for owner, name in ((ms.ops, "Dropout"), (ms.ops.operations, "Dropout"), (ms.ops, "Dropout2D"),
                        (ms.ops.operations, "Dropout2D"), (ms.ops, "Dropout3D"), (ms.ops.operations, "Dropout3D"),
                        (ms.nn, "Dropout"), (ms.mint.nn, "Dropout"), (ms.mint.nn.functional, "dropout")):
        monkeypatch.setattr(owner, name, getattr(owner, name))  # MindSpore's own back after the test
    nbdebug.seed_all(7, frameworks=("mindspore",))
    a = ms.ops.uniform((4,), ms.Tensor(0.0), ms.Tensor(1.0)).asnumpy()
    nbdebug.seed_all(7, rm_dropout=True, frameworks=("mindspore",))
    b = ms.ops.uniform((4,), ms.Tensor(0.0), ms.Tensor(1.0)).asnumpy()
    assert np.array_equal(a, b)
    drop = ms.nn.Dropout(p=0.9)
    drop.set_train(True)
    x = ms.Tensor(np.ones((50,), np.float32))
    assert np.array_equal(drop(x).asnumpy(), x.asnumpy())
    assert np.array_equal(ms.mint.nn.functional.dropout(x, p=0.9).asnumpy(), x.asnumpy())


def test_default_call_seeds_both_frameworks_in_a_fresh_process():
    """``seed_all()`` with msProbe's defaults imports each installed framework and seeds it."""
    code = ("import nbdebug, sys, torch, mindspore as ms\n"
            "nbdebug.seed_all(mode=True)\n"
            "a = torch.rand(2); u = ms.ops.uniform((2,), ms.Tensor(0.0), ms.Tensor(1.0)).asnumpy()\n"
            "nbdebug.seed_all()\n"
            "assert torch.equal(a, torch.rand(2))\n"
            "assert (u == ms.ops.uniform((2,), ms.Tensor(0.0), ms.Tensor(1.0)).asnumpy()).all()\n"
            "print('MS', ms.get_context('deterministic'), 'TORCH', torch.are_deterministic_algorithms_enabled())\n")
    r = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=REPO), capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "MS ON" in r.stdout and "TORCH False" in r.stdout


@pytest.mark.parametrize("kwargs, word", [
    ({"seed": -1}, "seed"), ({"seed": 2**40}, "seed"), ({"seed": 1.5}, "seed"), ({"seed": True}, "seed"),
    ({"mode": 1}, "mode"), ({"rm_dropout": "yes"}, "rm_dropout"), ({"frameworks": ("jax",)}, "jax"),
])
def test_bad_arguments(kwargs, word):
    with pytest.raises(ValueError, match=word):
        nbdebug.seed_all(**kwargs)
