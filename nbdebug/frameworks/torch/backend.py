"""The PyTorch :class:`~nbdebug.frameworks.registry.Backend`: imports torch only when a method needs it.

>>> from nbdebug.frameworks.registry import backend_named
>>> b = backend_named("pytorch")
>>> b.levels, b.supports_risk_level
(('L0', 'L1', 'mix', 'monitor'), True)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..registry import Backend


class TorchBackend(Backend):
    name = "pytorch"
    aliases = ("torch", "pt")
    model_classes = ("torch.nn.modules.module.Module",)
    packages = ("torch",)
    model_kind = "torch.nn.Module"
    supports_risk_level = True
    module_prefix = "Module"
    tensor_file_suffixes = (".pt", ".pth")
    adapter_module = ".adapter"
    io_module = ".io"
    io_class = "TorchIO"
    replay_module = ".replay_state"
    repro_module = ".repro"

    def info(self, model: Any) -> tuple[str, str]:
        import torch

        device = next((str(p.device) for p in model.parameters()), "cpu")
        return torch.__version__, device

    def adapter(self, model: Any, level: str, session: Any, *, retain: bool = True,
                retain_copy: bool = False, graph_every: int = 1) -> Any:
        from .adapter import TorchAdapter

        if graph_every != 1:
            raise ValueError("graph_every samples MindSpore's GRAPH-mode kernel dump; PyTorch captures every step")

        return TorchAdapter(model, level, session, retain=retain, retain_copy=retain_copy)

    def loss_scale_probe(self, scaler: Any, tracker: Any, step: Callable[[], int],
                         on_update: Callable[[Any], Any]) -> Any:
        from .loss_scale import GradScalerProbe

        return GradScalerProbe(scaler, tracker, step=step, on_update=on_update)

    def has_parameters(self, model: Any) -> bool:
        return next(iter(model.parameters()), None) is not None

    def model_list(self, models: list[Any]) -> Any:
        import torch

        return torch.nn.ModuleList(list(models))

    def read_tensor_file(self, path: str) -> Any:
        from .io_load import load_pt

        return load_pt(path)

    def api_parameters(self, node: str) -> tuple[str, ...] | None:
        from .io import api_parameters

        return api_parameters(node)

    def load_weights(self, source: Any, *, trust_pickle: bool = False) -> tuple[dict[str, Any], Any, set[str]]:
        from .io_load import load_state

        return load_state(source, trust_pickle=trust_pickle)
