"""The MindSpore :class:`~nbdebug.frameworks.registry.Backend`: imports mindspore only when a method needs it.

Its class attributes carry how MindSpore spells what PyTorch calls otherwise (compare's common spelling is
PyTorch's): parameter names (``gamma`` → ``weight``), API names (``Dense`` → ``linear``) and call prefixes
(``Mint`` → ``Torch``/``Tensor``).

>>> b = MindSporeBackend()
>>> b.torch_param("moving_mean"), b.api_to_torch["batchmatmul"], "Cell" in b.name_prefixes
('running_mean', 'bmm', True)
"""

from __future__ import annotations

from typing import Any

from ..registry import Backend

#: MindSpore parameter names → PyTorch's (BatchNorm, LayerNorm, Embedding)
MS_TO_PT_PARAM = {
    "gamma": "weight",
    "beta": "bias",
    "moving_mean": "running_mean",
    "moving_variance": "running_var",
    "embedding_table": "weight",
}

#: MindSpore API names whose PyTorch counterpart is spelled differently (lower case)
MS_TO_PT_API = {
    "dense": "linear",
    "batchmatmul": "bmm",
    "batch_matmul": "bmm",
    "reducemean": "mean",
    "reduce_mean": "mean",
    "reducesum": "sum",
    "reduce_sum": "sum",
    "reducemax": "max",
    "reduce_max": "max",
    "concat": "cat",
    "expanddims": "unsqueeze",
    "expand_dims": "unsqueeze",
    "cast": "to",
    "fastgelu": "gelu",
    "biasadd": "add",
    "bias_add": "add",
    "softmaxcrossentropywithlogits": "cross_entropy",
    "sigmoidcrossentropywithlogits": "binary_cross_entropy_with_logits",
    "onehot": "one_hot",
    "gathernd": "gather",
    "stridedslice": "__getitem__",
    "tensorscatterupdate": "__setitem__",
    "sub": "sub",
    "mul": "mul",
    "div": "div",
    "realdiv": "div",
    "max_pool": "max_pool2d",
    "maxpool": "max_pool2d",
}

#: ops PyTorch runs with their bias in one call, where MindSpore's cells (``Conv2d``, ``Dense``) run the op
#: and then ``BiasAdd``: MindSpore API (lower case) -> the PyTorch API of the op with its bias
MS_BIAS_SPLIT = {
    "conv1d": "conv1d",
    "conv2d": "conv2d",
    "conv3d": "conv3d",
    "matmul": "linear",
}

#: MindSpore cell / op classes (lower case) → PyTorch's (compare's structural matching)
MS_TO_PT_CLASS = {
    "dense": "linear",
    "sequentialcell": "sequential",
    "celllist": "modulelist",
    "celldict": "moduledict",
    "fastgelu": "gelu",
    "softmaxcrossentropywithlogits": "crossentropyloss",
}

#: MindSpore API prefixes → the PyTorch prefixes to try, in order
MS_TO_PT_PREFIX = {
    "Mint": ("Torch", "Tensor"),
    "MintFunctional": ("Functional",),
    "Functional": ("Torch", "Functional", "Tensor"),
    "Primitive": ("Torch", "Functional", "Tensor"),
    "Tensor": ("Tensor", "Torch"),
    "MintDistributed": ("Distributed",),
    "Distributed": ("Distributed",),
    "Jit": ("Torch",),
}


class MindSporeBackend(Backend):
    name = "mindspore"
    aliases = ("ms",)
    model_classes = ("mindspore.nn.cell.Cell",)
    packages = ("mindspore",)
    model_kind = "mindspore.nn.Cell"
    supports_risk_level = False
    name_prefixes = frozenset({"Cell", "Mint", "MintFunctional", "Primitive", "MintDistributed", "Jit"})
    api_to_torch = MS_TO_PT_API
    prefix_to_torch = MS_TO_PT_PREFIX
    param_to_torch = MS_TO_PT_PARAM
    class_to_torch = MS_TO_PT_CLASS
    bias_split = MS_BIAS_SPLIT
    bias_add_apis = frozenset({"bias_add", "biasadd"})
    module_prefix = "Cell"
    dump_layouts = ("kernel",)
    adapter_module = ".adapter"
    io_module = ".io"
    io_class = "MindSporeIO"
    replay_module = ".replay_state"
    repro_module = ".repro"

    def info(self, model: Any) -> tuple[str, str]:
        from .adapter import mindspore_info

        return mindspore_info()

    def adapter(self, model: Any, level: str, session: Any, *, retain: bool = True,
                retain_copy: bool = False, graph_every: int = 1) -> Any:
        from .adapter import MindSporeAdapter

        return MindSporeAdapter(model, level, session, retain=retain, graph_every=graph_every)

    def has_parameters(self, model: Any) -> bool:
        return bool(list(model.get_parameters()))

    def load_dump(self, layout: str, path: str, rank: int | None = None) -> Any:
        """A graph-mode kernel dump (``rank_*/{net}/{graph}/{iteration}/*.npy``, ``layout="kernel"``)."""
        if layout not in self.dump_layouts:
            return super().load_dump(layout, path, rank)
        from .kernel_load import load_kernel_dump

        return load_kernel_dump(path, rank=rank)

    def model_list(self, models: list[Any]) -> Any:
        import mindspore.nn as msnn

        return msnn.CellList(list(models))

    def load_weights(self, source: Any, *, trust_pickle: bool = False) -> tuple[dict[str, Any], Any, set[str]]:
        """A ``.ckpt`` file or a Cell (a checkpoint holds no code: ``trust_pickle`` changes nothing)."""
        from .io_load import load_ckpt

        return load_ckpt(source)

    def train_callback(self, debugger: Any) -> Any:
        """:class:`~nbdebug.frameworks.mindspore.adapter.StepCallback` for ``Model.train``."""
        from .adapter import StepCallback

        return StepCallback(debugger)

    def step_callback(self, debugger: Any) -> Any:
        """msProbe's ``MsprobeStep`` for ``Model.train`` (MindSpore only)."""
        from .io import step_callback

        return step_callback(debugger)
