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


def load_state(path: Any, *, trust_pickle: bool = False) -> tuple[dict[str, np.ndarray], set[str] | None, set[str]]:
    """Parameters and buffers of a ``.pth`` checkpoint.

    Returns ``(values, trainable, buffers)``: ``values`` maps names to arrays; ``trainable`` is the set of
    names of parameters that require grad when the file holds a whole ``nn.Module`` (None for a plain
    state dict, where that is not recorded); ``buffers`` names the entries known to be buffers.
    Accepts ``torch.save(model.state_dict())``, ``torch.save(model)`` and the common wrappers
    ``{"state_dict": ...}`` / ``{"model": ...}``, or an ``nn.Module`` itself.

    Files are read with ``torch.load(weights_only=True)``: nothing in them is executed. A file that needs
    the full unpickler (a pickled ``nn.Module``, custom classes) is refused with a ``ValueError`` unless
    ``trust_pickle=True`` — unpickling runs code chosen by whoever wrote the file.
    """
    import torch

    try:
        obj = path if isinstance(path, torch.nn.Module) else torch.load(path, map_location="cpu", weights_only=True)
    except Exception as first:
        if not trust_pickle:
            raise ValueError(
                f"{path}: cannot be read safely (torch.load(weights_only=True) refused it: "
                f"{type(first).__name__}: {str(first).splitlines()[0] if str(first) else ''}). It may need the full "
                f"unpickler, which runs code from the file; pass trust_pickle=True only for a file you trust, "
                f"or save a state dict instead (torch.save(model.state_dict(), path))") from None
        try:  # the caller trusts this file (trust_pickle=True): a pickled nn.Module needs the full unpickler
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
