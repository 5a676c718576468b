"""Reliability (issue #12): no silent loss, nothing unpickled or executed, bounded memory, clear messages."""

from __future__ import annotations

import json
import os
import pickle
import warnings

import pytest
import torch

import nbdebug


# -- security ---------------------------------------------------------------------------------------------


class _Payload:
    """Unpickling this creates a file: proof that code from the file ran."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _evil_pth(tmp_path) -> tuple[str, str]:
    marker = str(tmp_path / "PWNED")
    path = str(tmp_path / "evil.pth")
    with open(path, "wb") as f:
        pickle.dump({"fc.weight": _Payload(marker)}, f)
    return path, marker


def test_compare_weights_never_unpickles_by_default(tmp_path):
    import mindspore as ms

    path, marker = _evil_pth(tmp_path)
    ckpt = str(tmp_path / "m.ckpt")
    ms.save_checkpoint([{"name": "fc.weight", "data": ms.Tensor([1.0])}], ckpt)
    with pytest.raises(ValueError, match="trust_pickle=True") as e:
        nbdebug.compare_weights(path, ckpt)
    assert "evil.pth" in str(e.value)
    assert not os.path.exists(marker), "the pickle payload ran"
    # the explicit opt-in is the only way to the full unpickler (and it does run the file's code)
    with pytest.raises(ValueError):
        nbdebug.compare_weights(path, ckpt, trust_pickle=True)
    assert os.path.exists(marker)


def test_pickled_module_needs_the_opt_in(tmp_path):
    import mindspore as ms

    model = torch.nn.Linear(2, 1)
    torch.save(model, tmp_path / "whole.pth")
    ckpt = str(tmp_path / "m.ckpt")
    ms.save_checkpoint([{"name": "weight", "data": ms.Tensor(model.weight.detach().numpy())},
                        {"name": "bias", "data": ms.Tensor(model.bias.detach().numpy())}], ckpt)
    with pytest.raises(ValueError, match="trust_pickle"):
        nbdebug.compare_weights(tmp_path / "whole.pth", ckpt)
    res = nbdebug.compare_weights(tmp_path / "whole.pth", ckpt, trust_pickle=True)
    assert res.all_close and res.pth_counts.tensors == 2
