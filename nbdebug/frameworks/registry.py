"""Which framework a model, a value or a name belongs to, and the :class:`Backend` that serves it.

Code outside ``nbdebug/frameworks/`` never branches on ``framework == "pytorch"`` and never imports
torch or mindspore: it asks this registry for a :class:`Backend` and calls it. Detection looks at class
names only (``type(obj).__mro__``), so asking about a model never imports a framework that is not
already in use; a backend imports its framework the first time one of its methods needs it.

>>> backend_named("torch").name
'pytorch'
>>> import sys; "mindspore" in sys.modules or backend_named("mindspore").name == "mindspore"
True
>>> backend_for_value([1, 2]) is None
True
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

#: registered backends, by canonical name, in detection order
_BACKENDS: dict[str, Backend] = {}
#: :func:`module_prefixes` (None: to compute, after a registration)
_MODULE_PREFIXES: tuple[str, ...] | None = None


class Backend:
    """What nbdebug needs from one framework. Subclasses live in ``frameworks/<name>/backend.py``.

    Class attributes describe the framework without importing it; methods import it lazily.
    """

    #: canonical name (``Session.framework``, dump.json's ``framework``)
    name = ""
    #: other spellings accepted by :func:`backend_named`
    aliases: tuple[str, ...] = ()
    #: ``module.QualName`` prefixes of the model base class (``torch.nn.modules.module.Module``)
    model_classes: tuple[str, ...] = ()
    #: top-level package names of the framework's objects
    packages: tuple[str, ...] = ()
    #: what the Debugger attaches to, for error messages
    model_kind = ""
    #: msProbe's ``risk_level`` filter applies to this framework's L1/mix dumps
    supports_risk_level = False
    #: first name components only this framework's dumps use (``Cell.``, ``Mint.``)
    name_prefixes: frozenset[str] = frozenset()
    #: first name component of this framework's module (cell) call nodes: ``Module`` (``Module.fc.Linear.
    #: forward.0``), ``Cell``; code outside ``frameworks/`` asks :func:`module_prefixes`
    module_prefix = ""
    #: API names, call prefixes and parameter names in PyTorch's spelling (compare's common spelling);
    #: empty for PyTorch itself
    api_to_torch: Mapping[str, str] = {}
    prefix_to_torch: Mapping[str, tuple[str, ...]] = {}
    param_to_torch: Mapping[str, str] = {}
    #: module / op class names (lower case) in PyTorch's spelling, for compare's structural matching
    class_to_torch: Mapping[str, str] = {}
    #: ops whose bias this framework adds in a separate op (API -> PyTorch's API of the op with bias), and
    #: the APIs of that separate op: compare pairs the two ops with PyTorch's one call
    bias_split: Mapping[str, str] = {}
    bias_add_apis: frozenset[str] = frozenset()
    #: extensions of tensor files :meth:`read_tensor_file` reads (beside ``.npy``)
    tensor_file_suffixes: tuple[str, ...] = ()

    # -- detection (no import) --------------------------------------------------------------------
    def owns_model(self, model: Any) -> bool:
        """Whether ``model`` is an instance of the framework's model class (by class name)."""
        for klass in type(model).__mro__:
            qual = f"{klass.__module__}.{klass.__qualname__}"
            if qual.startswith(self.model_classes):
                return True
        return False

    def owns_value(self, value: Any) -> bool:
        """Whether ``value`` (a tensor, module, function, module object) comes from the framework."""
        mods = [getattr(value, "__name__", "") if type(value).__name__ == "module" else ""]
        mods += [k.__module__ or "" for k in type(value).__mro__]
        return any(m.split(".", 1)[0] in self.packages for m in mods)

    def imported(self) -> bool:
        """Whether the framework is imported in this process already."""
        return any(p in sys.modules for p in self.packages)

    def model_class(self) -> type:
        """The framework's model base class (imports the framework): the first of :attr:`model_classes`."""
        module, _, qualname = self.model_classes[0].rpartition(".")
        return getattr(importlib.import_module(module), qualname)

    def has_parameters(self, model: Any) -> bool:
        """Whether ``model`` (an instance of :meth:`model_class`) holds at least one parameter."""
        raise NotImplementedError

    # -- capture ----------------------------------------------------------------------------------
    #: the module of the capture adapter, relative to the backend's own; it defines ``LEVELS``
    adapter_module = ""

    def _module(self, relative: str) -> Any:
        return importlib.import_module(relative, type(self).__module__.rpartition(".")[0])

    @property
    def levels(self) -> tuple[str, ...]:
        """The capture levels (``L0``, ``L1``, ``mix``)."""
        return tuple(self._module(self.adapter_module).LEVELS)

    def info(self, model: Any) -> tuple[str, str]:
        """``(framework version, device)`` of ``model``."""
        raise NotImplementedError

    def adapter(self, model: Any, level: str, session: Any, *, retain: bool = True,
                retain_copy: bool = False) -> Any:
        """The capture adapter feeding ``session`` from ``model``."""
        raise NotImplementedError

    def seed(self, seed: int, mode: bool, rm_dropout: bool) -> None:
        """Seed the framework (``mode``: deterministic algorithms; ``rm_dropout``: dropout off), as
        :func:`~nbdebug.frameworks.seed.seed_all` describes."""
        from . import seed as seeding

        getattr(seeding, f"_seed_{self.packages[0]}")(importlib.import_module(self.packages[0]), seed, mode,
                                                     rm_dropout)

    def loss_scale_probe(self, scaler: Any, tracker: Any, step: Callable[[], int],
                         on_update: Callable[[Any], Any]) -> Any:
        raise TypeError(f"{self.name} has no loss-scaler probe; track_loss_scale needs a torch.amp.GradScaler")

    def train_callback(self, debugger: Any) -> Any:
        """The framework trainer's callback that ends a debugger step at each training step
        (``Debugger.callback()``); frameworks whose optimizer step ends a step need none."""
        raise TypeError(f"{self.name} needs no training callback: the optimizer's step ends each debugger step "
                        f"(dbg.step() marks one by hand); Debugger.callback() is for MindSpore's Model.train")

    # -- step replay (nbdebug/replay/) ------------------------------------------------------------
    #: the module keeping and swapping a step's pre-step state (``.replay_state``), relative to the
    #: backend's own; "" when the framework cannot replay a step
    replay_module = ""
    #: the module writing a reproduction folder's framework side (``.repro``)
    repro_module = ""

    def replay_state(self) -> Any:
        """The module of pre-step state: ``find_objects``, ``keep``, ``keep_args``, ``planned_bytes``,
        ``output_ref``, ``same_bits``, ``describe`` (see ``frameworks/torch/replay_state.py``)."""
        if not self.replay_module:
            raise NotImplementedError(f"{self.name}: replaying a step is not supported for this framework")
        return self._module(self.replay_module)

    def repro(self) -> Any:
        """The module writing and reading a reproduction folder (``save``, ``load_arrays``)."""
        if not self.repro_module:
            raise NotImplementedError(f"{self.name}: save_repro is not supported for this framework")
        return self._module(self.repro_module)

    # -- dumps ------------------------------------------------------------------------------------
    #: the module of the msProbe-format dump I/O, relative to the backend's own (``.io``): its class
    #: :attr:`io_class`, ``custom_api_wrapper`` and ``stand_in_model``
    io_module = ""
    io_class = ""

    def _io(self) -> Any:
        return self._module(self.io_module)

    def dump_io(self, adapter: Any) -> Any:
        """The msProbe-format dump I/O bound to ``adapter`` (None: no live capture, e.g. ``save()`` only)."""
        return getattr(self._io(), self.io_class)(adapter)

    def custom_api_wrapper(self, get_adapter: Callable[[], Any], func: Callable, prefix: str, api: str) -> Callable:
        """``func`` recorded as one API node ``{prefix}.{api}.{n}`` while the adapter captures at L1/mix."""
        return self._io().custom_api_wrapper(get_adapter, func, prefix, api)

    def stand_in_model(self) -> Any:
        """An empty root model (an L1 dump started without a model)."""
        return self._io().stand_in_model()

    def model_list(self, models: list[Any]) -> Any:
        """Several models as one container model (``Module.{i}.…`` / ``Cell.{i}.…``)."""
        raise NotImplementedError

    #: dump layouts of this framework's own (``"kernel"``: MindSpore's graph-mode kernel dump) that
    #: :meth:`load_dump` opens; :func:`backend_for_layout` finds the backend of one
    dump_layouts: tuple[str, ...] = ()

    def load_dump(self, layout: str, path: str, rank: int | None = None) -> Any:
        """A dump of one of :attr:`dump_layouts` as an :class:`~nbdebug.offline.OfflineSession`."""
        raise NotImplementedError(f"{self.name} reads no {layout!r} dump")

    def read_tensor_file(self, path: str) -> Any:
        """A tensor file of this framework's format as a numpy array (``ValueError`` naming the file)."""
        raise ValueError(f"{path}: {self.name} has no tensor file format of its own")

    def api_parameters(self, node: str) -> tuple[str, ...] | None:
        """The parameter names, in order, of the API an op node called (``Functional.layer_norm.0.forward``:
        ``input, normalized_shape, weight, bias, eps``) where the live capture and the dump may name its
        arguments differently (by keyword live, by position in the dump); None elsewhere."""
        return None

    def load_weights(self, source: Any, *, trust_pickle: bool = False) -> tuple[dict[str, Any], Any, set[str]]:
        """A checkpoint file (or a live model) as ``(name -> numpy array, trainable names or None, names
        that are not trainable weights)``; nothing is unpickled unless ``trust_pickle``."""
        raise NotImplementedError

    # -- compare ----------------------------------------------------------------------------------
    def torch_param(self, name: str) -> str:
        """A parameter name in PyTorch's spelling (``gamma`` → ``weight``)."""
        return self.param_to_torch.get(name, name)

    def params_from_torch(self, name: str) -> tuple[str, ...]:
        """This framework's spellings of a parameter name spelled as PyTorch does (``weight`` → ``gamma``,
        ``embedding_table``); empty when none differs."""
        return tuple(k for k, v in self.param_to_torch.items() if v == name and k != name)

    def __repr__(self) -> str:
        return f"<nbdebug backend {self.name}>"


def register(backend: Backend) -> Backend:
    """Add ``backend`` to the registry (later registrations of one name replace earlier ones)."""
    global _MODULE_PREFIXES
    _BACKENDS[backend.name] = backend
    _MODULE_PREFIXES = None
    return backend


def backends() -> list[Backend]:
    """Every registered backend, in detection order."""
    _ensure_builtin()
    return list(_BACKENDS.values())


def backend_named(name: str) -> Backend:
    """The backend called ``name`` (or one of its aliases); ``ValueError`` listing the known ones."""
    key = str(name or "").lower()
    for b in backends():
        if key == b.name or key in b.aliases:
            return b
    raise ValueError(f"unknown framework {name!r}; known: {', '.join(b.name for b in backends())}")


def find_backend(name: str) -> Backend | None:
    """Like :func:`backend_named`, None for an unknown name (``"numpy"``, ``""``)."""
    try:
        return backend_named(name)
    except ValueError:
        return None


def backend_for_model(model: Any) -> Backend:
    """The backend whose model class ``model`` is; ``TypeError`` saying what nbdebug attaches to."""
    for b in backends():
        if b.owns_model(model):
            return b
    kinds = " or a ".join(b.model_kind for b in backends())
    raise TypeError(f"nbdebug.Debugger attaches to a {kinds}, got {type(model).__name__} "
                    f"(from module {type(model).__module__ or '?'})")


def backend_for_value(value: Any) -> Backend | None:
    """The backend of a tensor, model, or the first such item in a dict/list/tuple; None if none."""
    stack = [value]
    while stack:
        v = stack.pop()
        for b in backends():
            if b.owns_value(v):
                return b
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
    return None


def backend_for_names(names: Any) -> Backend:
    """The backend whose dumps use these node names (``Cell.…`` is MindSpore); PyTorch by default."""
    for n in names:
        first = n.split(".", 1)[0]
        for b in backends():
            if first in b.name_prefixes or first == b.module_prefix:
                return b
    return backend_named("pytorch")


def module_prefixes() -> tuple[str, ...]:
    """First name components of module (cell) call nodes, over every backend: ``("Module", "Cell")``.

    >>> module_prefixes()
    ('Module', 'Cell')
    """
    global _MODULE_PREFIXES
    if _MODULE_PREFIXES is None:
        bs = backends()
        _MODULE_PREFIXES = tuple(dict.fromkeys(b.module_prefix for b in bs if b.module_prefix))
    return _MODULE_PREFIXES


def is_module_name(name: str) -> bool:
    """Whether ``name`` is a module (cell) call node or series of some framework (``Module.fc.Linear.
    forward.0``, ``Cell.fc.Dense``).

    >>> is_module_name("Cell.fc.Dense.forward.0"), is_module_name("Functional.linear.0.forward")
    (True, False)
    """
    return name.partition(".")[0] in module_prefixes()


def backend_for_layout(layout: str) -> Backend | None:
    """The backend whose :meth:`Backend.load_dump` opens dumps of ``layout`` (``"kernel"``); None if none."""
    return next((b for b in backends() if layout in b.dump_layouts), None)


def default_backend() -> Backend:
    """The framework in use when nothing says which: the imported one (PyTorch when both or neither are)."""
    bs = backends()
    return next((b for b in bs if b.imported()), bs[0])


def _ensure_builtin() -> None:
    if not _BACKENDS:
        from .mindspore.backend import MindSporeBackend
        from .torch.backend import TorchBackend

        register(TorchBackend())
        register(MindSporeBackend())
