"""Reading PyTorch files (``.pt`` tensors, ``.pth`` checkpoints) into numpy, for offline analysis.

Only this module (of the offline tools) imports torch, and only when a ``.pt``/``.pth`` file is read.

>>> import os, tempfile, torch
>>> path = os.path.join(tempfile.mkdtemp(), "x.pt")
>>> torch.save(torch.arange(3, dtype=torch.bfloat16), path)
>>> load_pt(path)
array([0., 1., 2.], dtype=float32)
"""

from __future__ import annotations

from typing import Any

import numpy as np


def _to_numpy(t: Any) -> np.ndarray:
    import torch

    t = t.detach().cpu()
    if t.dtype == torch.bfloat16 or str(t.dtype).startswith("torch.float8"):
        t = t.to(torch.float32)  # numpy has no bfloat16 / float8
    if t.is_complex() or t.is_quantized:
        t = t.dequantize() if t.is_quantized else t
    return t.contiguous().numpy()


def load_pt(path: str) -> np.ndarray:
    """The tensor saved in ``path`` (``torch.save``) as a numpy array (bfloat16/float8 become float32).

    Raises ``ValueError`` naming the file when it does not hold a single tensor.
    """
    import torch

    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # truncated / not a torch file
        raise ValueError(f"{path}: cannot be read by torch.load ({type(e).__name__}: {e})") from None
    if not isinstance(obj, torch.Tensor):
        raise ValueError(f"{path}: holds a {type(obj).__name__}, not a tensor")
    return _to_numpy(obj)


def load_state(path: Any) -> tuple[dict[str, np.ndarray], set[str] | None, set[str]]:
    """Parameters and buffers of a ``.pth`` checkpoint.

    Returns ``(values, trainable, buffers)``: ``values`` maps names to arrays; ``trainable`` is the set of
    names of parameters that require grad when the file holds a whole ``nn.Module`` (None for a plain
    state dict, where that is not recorded); ``buffers`` names the entries known to be buffers.
    Accepts ``torch.save(model.state_dict())``, ``torch.save(model)`` and the common wrappers
    ``{"state_dict": ...}`` / ``{"model": ...}``, or an ``nn.Module`` itself.
    """
    import torch

    try:
        obj = path if isinstance(path, torch.nn.Module) else torch.load(path, map_location="cpu", weights_only=True)
    except Exception:
        try:  # a pickled nn.Module needs the full unpickler; only for files the user chose to open
            obj = torch.load(path, map_location="cpu", weights_only=False)
        except Exception as e:
            raise ValueError(f"{path}: cannot be read by torch.load ({type(e).__name__}: {e})") from None
    if isinstance(obj, torch.nn.Module):
        values = {k: _to_numpy(v) for k, v in obj.state_dict().items()}
        trainable = {k for k, p in obj.named_parameters() if p.requires_grad}
        buffers = {k for k, _ in obj.named_buffers()}
        return values, trainable, buffers
    if isinstance(obj, dict):
        for key in ("state_dict", "model", "model_state_dict", "net"):
            inner = obj.get(key)
            if isinstance(inner, dict) and inner and all(isinstance(v, torch.Tensor) for v in inner.values()):
                obj = inner
                break
        values = {str(k): _to_numpy(v) for k, v in obj.items() if isinstance(v, torch.Tensor)}
        if not values:
            raise ValueError(f"{path}: no tensors found (keys: {list(obj)[:8]})")
        return values, None, set()
    raise ValueError(f"{path}: holds a {type(obj).__name__}, not a state dict or a module")
