"""What a PyTorch training step needs to be computed again: its pre-step state, swapped in and out.

:func:`keep` copies, at a step's start, the model's parameters and buffers, the gradients it starts from
(held by reference: the step drops or overwrites them, it does not change the old tensor unless it
accumulates into it, which the version counter tells), the optimizers' state and hyper-parameters, the
``GradScaler``'s scale and growth tracker, the LR schedulers' state, the RNG states (Python, NumPy, torch
CPU, CUDA when initialised), the modules' train/eval flags and the step's arguments (tensors cloned;
immutable Python values by reference; anything else makes the step unreplayable, with the reason).
Copies go into the buffers of the state the window drops (``recycle``): no fresh pages per step.
Nothing is pickled.

:meth:`StepState.swap_in` installs a copy of the kept state into the live objects (parameters and buffers
by swapping their ``.data``, so the live storages are never written; optimizer state by swapping the
``state`` mapping) and returns a :class:`Live` that puts the live objects back exactly as they were. Tensors
the step reaches outside the model are kept too and the replay writes into copies of them, the live ones put
back after: the parameters and buffers of another module (an EMA copy updated in the step, an
``AveragedModel``) and parameters in a list (``torch._foreach_lerp_(ema_params, …)``) copied like the model's;
other tensors (data, an accumulator) by reference with their version, one the step changed since it started
noted (the replay starts from its later value).

>>> import torch
>>> model = torch.nn.Linear(2, 1); opt = torch.optim.SGD(model.parameters(), lr=0.1)
>>> def step(x):
...     opt.zero_grad(); model(x).sum().backward(); opt.step()
>>> objects = find_objects(step, model)
>>> [type(o).__name__ for o in objects["optimizers"]]
['SGD']
>>> state = keep(model, objects, (torch.ones(1, 2),), {})
>>> before = model.weight.detach().clone()
>>> step(torch.ones(1, 2))
>>> live = state.swap_in(model); torch.equal(model.weight, before)
True
>>> live.restore(); torch.equal(model.weight, before)
False
"""

from __future__ import annotations

import copy
import enum
import random
import types
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from ..core.reach import reachable_values

_IMMUTABLE = (int, float, complex, bool, str, bytes, type(None), type(Ellipsis), range, slice, torch.dtype,
              torch.device, torch.layout, torch.memory_format, enum.Enum, types.FunctionType,
              types.BuiltinFunctionType)


# -- what the step uses, found from its closure -------------------------------------------------------
def _unwrap_optimizer(opt: Any) -> Any:
    inner = getattr(opt, "optimizer", None)  # accelerate's AcceleratedOptimizer
    return inner if isinstance(inner, torch.optim.Optimizer) else opt


def _kind(value: Any) -> str | None:
    if isinstance(value, (torch.nn.Module, torch.Tensor, type, types.ModuleType)):
        return None
    if isinstance(value, torch.Generator):  # a generator of the user's own (dropout/sampling with generator=)
        return "generators"
    inner = getattr(value, "optimizer", None)
    if isinstance(inner, torch.optim.Optimizer) and hasattr(value, "get_last_lr"):
        return "schedulers"
    if isinstance(value, torch.optim.Optimizer) or isinstance(inner, torch.optim.Optimizer):
        return "optimizers"
    if hasattr(value, "_per_optimizer_states") and hasattr(value, "unscale_"):
        return "scalers"
    return None


def find_objects(fn: Callable, model: Any, **given: Any) -> dict[str, list[Any]]:
    """Optimizers, ``GradScaler`` s and LR schedulers the step function ``fn`` reaches through its closure
    or the globals it names; ``given`` (``optimizers=``, ``scalers=``, ``schedulers=``, one object or a
    list) replaces what is found."""
    found: dict[str, list[Any]] = {"optimizers": [], "scalers": [], "schedulers": [], "generators": []}
    values = reachable_values(fn)
    for v in values:
        kind = _kind(v)
        if kind is not None and not any(v is o for o in found[kind]):
            found[kind].append(v)
    for kind, objs in given.items():
        if kind not in found:
            raise TypeError(f"step_fn: unknown keyword {kind!r}; use optimizers=, scalers=, schedulers= or "
                            f"generators=")
        if objs is not None:
            found[kind] = list(objs) if isinstance(objs, (list, tuple)) else [objs]
    found["optimizers"] = [_unwrap_optimizer(o) for o in found["optimizers"]]
    found[REACHED] = reached_tensors(values, model)
    return found


#: ``find_objects``' key of the tensors the step reaches outside the model (kept with the step's state, not
#: bound by save_repro's script, which refuses a name it cannot rebuild)
REACHED = "reached"


def reached_tensors(values: list[Any], model: Any) -> list[tuple[torch.Tensor, bool]]:
    """``(tensor, copied)`` for the tensors among ``values`` that are not the model's: tensors, those of a list,
    tuple or dict, the parameters and buffers of a module that is not part of the model; ``copied``: state
    to copy at each step's start (a module's, a parameter), else a tensor held by reference."""
    own = {id(t) for t in model.parameters()} | {id(t) for t in model.buffers()} if model is not None else set()
    parts = {id(m) for m in model.modules()} if model is not None else set()
    out: dict[int, torch.Tensor] = {}
    state: set[int] = set()
    for v in values:
        if isinstance(v, torch.nn.Module):
            items = [] if id(v) in parts else list(v.parameters()) + list(v.buffers())
            state.update(id(t) for t in items)
        elif isinstance(v, (list, tuple)):
            items = list(v)
        elif isinstance(v, dict):
            items = list(v.values())
        else:
            items = [v]
        for t in items:
            if isinstance(t, torch.Tensor) and id(t) not in own and not t.is_inference():
                out.setdefault(id(t), t)
    return [(t, id(t) in state or isinstance(t, torch.nn.Parameter)) for t in out.values()]



# -- copies -------------------------------------------------------------------------------------------
class _Copier:
    """Copies into recycled buffers (same name, shape, stride, dtype and device; else a fresh ``empty_like``),
    counting bytes. :meth:`__call__` hands the destination at once; :meth:`flush` fills every destination in
    one ``torch._foreach_copy_`` (one dispatch, no per-tensor Python loop, no fresh pages once recycled)."""

    def __init__(self, recycle: Mapping[str, torch.Tensor] | None) -> None:
        self.recycle = dict(recycle or {})
        self.bytes = 0
        self.dst: list[torch.Tensor] = []
        self.src: list[torch.Tensor] = []

    def __call__(self, key: str, t: torch.Tensor) -> torch.Tensor:
        t = t.detach()
        self.bytes += t.numel() * t.element_size()
        buf = self.recycle.pop(key, None)
        if buf is None or buf.shape != t.shape or buf.dtype != t.dtype or buf.device != t.device \
                or buf.stride() != t.stride():
            buf = torch.empty_like(t)
            if buf.stride() != t.stride():  # a source that is not dense: copy as it is
                return t.clone()
        self.dst.append(buf)
        self.src.append(t)
        return buf

    def flush(self) -> None:
        if self.dst:
            torch._foreach_copy_(self.dst, self.src)
        self.dst, self.src = [], []


def _walk(value: Any, fn: Callable[[str, torch.Tensor], Any], path: str, problems: list[str]) -> Any:
    """``value`` with every tensor replaced by ``fn(path, tensor)``; containers rebuilt; a mutable value
    that is neither is noted in ``problems`` (kept by reference)."""
    if isinstance(value, torch.Tensor):
        return fn(path, value)
    if isinstance(value, _IMMUTABLE):
        return value
    if isinstance(value, torch.nn.Module):  # by reference (a Trainer's training_step(model, inputs)): the model's
        return value  # state is kept and swapped; a module beside the model is used as it is now
    if type(value) in (list, tuple):
        return type(value)(_walk(v, fn, f"{path}[{i}]", problems) for i, v in enumerate(value))
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple
        return type(value)(*(_walk(v, fn, f"{path}.{f}", problems) for f, v in zip(value._fields, value, strict=False)))
    if isinstance(value, (frozenset,)):
        return value
    if type(value) is dict:
        return {k: _walk(v, fn, f"{path}[{k!r}]", problems) for k, v in value.items()}
    if isinstance(value, Mapping) and hasattr(value, "__setitem__"):  # dict subclasses, HF BatchEncoding
        out = copy.copy(value)
        for k in list(value.keys()):
            out[k] = _walk(value[k], fn, f"{path}[{k!r}]", problems)
        return out
    problems.append(f"{path} is a {type(value).__name__}, a mutable value that is not a tensor or a container "
                    f"of tensors: the replay would see its value of now, not the one the step received")
    return value


def clone_tensor(t: torch.Tensor) -> torch.Tensor:
    with torch._C.DisableTorchFunction():
        c = t.detach().clone()
        return c.requires_grad_(True) if t.requires_grad and t.is_leaf else c


def _cloned(state: Any) -> Any:
    """A deep copy of an optimizer/scaler state structure (tensors cloned, containers rebuilt)."""
    if isinstance(state, torch.Tensor):
        return state.detach().clone()
    if isinstance(state, dict):
        out = type(state)() if type(state) is not dict else {}
        if hasattr(state, "default_factory"):
            out = type(state)(state.default_factory)
        for k, v in state.items():
            out[k] = _cloned(v)
        return out
    if isinstance(state, (list, tuple)) and type(state) in (list, tuple):
        return type(state)(_cloned(v) for v in state)
    return copy.deepcopy(state)


# -- RNG ----------------------------------------------------------------------------------------------
def rng_state() -> dict[str, Any]:
    """Every global random state a step draws from (Python, NumPy, torch CPU, CUDA if initialised)."""
    np_state = np.random.get_state()
    out = {"python": random.getstate(), "numpy": (np_state[0], np_state[1].copy()) + tuple(np_state[2:]),
           "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = torch.cuda.get_rng_state_all()
    return out


def set_rng_state(state: Mapping[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])


# -- the kept state -----------------------------------------------------------------------------------
_SCALER_TENSORS = ("_scale", "_growth_tracker")
_SCALER_VALUES = ("_init_scale", "_growth_factor", "_backoff_factor", "_growth_interval", "_enabled",
                  "_init_growth_tracker")


class StepState:
    """The state one step started from (see the module docstring)."""

    def __init__(self) -> None:
        self.tensors: dict[str, torch.Tensor] = {}  # "param:<name>" / "buffer:<name>" / "opt<i>:..." copies
        self.grads: dict[str, tuple[torch.Tensor, int] | None] = {}
        self.frozen: dict[str, tuple[torch.Tensor, int]] = {}  # parameters without grad, by reference
        self.optimizers: list[tuple[Any, dict, list[dict]]] = []  # (optimizer, state by param index, groups)
        self.scalers: list[tuple[Any, dict[str, Any]]] = []
        self.schedulers: list[tuple[Any, dict]] = []
        #: the step function's own ``torch.Generator`` s (``generator=`` noise, sampling) and their states when
        #: the step started: a replay draws the same numbers, and puts their live state back after
        self.generators: list[tuple[Any, torch.Tensor]] = []
        #: tensors the step reaches outside the model: (tensor, its copy) for state (an EMA copy's weights),
        #: (tensor, its version) for one held by reference
        self.reached: list[tuple[torch.Tensor, Any]] = []
        self.training: list[bool] = []
        self.rng: dict[str, Any] = {}
        self.args: tuple = ()
        self.kwargs: dict = {}
        self.problems: list[str] = []  # why this step cannot be replayed (empty: it can)
        self.nbytes = 0  # bytes of copies
        self.held = 0  # bytes kept alive by reference (gradients)
        self.output: Any = None  # what the live call returned (the loss), by reference
        self.problems_at_replay: list[str] = []  # found while swapping in (gradients changed since)

    def keep_copy(self, cp: _Copier, key: str, t: torch.Tensor) -> torch.Tensor:
        """A copy of ``t`` (filled at ``cp.flush()``), kept under ``key`` for the next state to recycle."""
        self.tensors[key] = c = cp(key, t)
        return c

    def recyclable(self) -> dict[str, torch.Tensor]:
        """The copies' buffers, for the next state to copy into (this state is dropped)."""
        out, self.tensors = self.tensors, {}
        return out

    # -- replay -----------------------------------------------------------------------------------
    def call_args(self) -> tuple[tuple, dict]:
        """Fresh copies of the step's arguments (the step may change its inputs in place)."""
        sink: list[str] = []
        return (_walk(self.args, lambda _p, t: clone_tensor(t), "args", sink),
                _walk(self.kwargs, lambda _p, t: clone_tensor(t), "kwargs", sink))

    def swap_in(self, model: Any) -> Live:
        """Install (copies of) this state in the live objects; returns what puts the live ones back."""
        live = Live(model)
        self.problems_at_replay = []
        try:
            self._swap_model(model, live)
            for opt, state, groups in self.optimizers:
                params = [p for g in opt.param_groups for p in g["params"]]
                live.optimizers.append((opt, opt.state, [(g, dict(g)) for g in opt.param_groups]))
                fresh = type(opt.state)(dict) if hasattr(opt.state, "default_factory") else {}
                for i, st in state.items():
                    fresh[params[i]] = _cloned(st)
                opt.state = fresh
                for g, saved in zip(opt.param_groups, groups, strict=False):
                    g.update(copy.deepcopy(saved))
            for sc, attrs in self.scalers:
                live.scalers.append((sc, {k: getattr(sc, k, None) for k in attrs}, sc.__dict__.pop("update", None)))
                for k, v in attrs.items():
                    setattr(sc, k, _cloned(v))
            for sched, sd in self.schedulers:
                live.schedulers.append((sched, _cloned(sched.state_dict())))
                sched.load_state_dict(_cloned(sd))
            live.generators = [(gen, gen.get_state()) for gen, _st in self.generators]
            for gen, st in self.generators:
                gen.set_state(st)
            self._swap_reached(live)
            set_rng_state(self.rng)
        except BaseException:
            live.restore()
            raise
        return live

    def _swap_reached(self, live: Live) -> None:
        """The replay writes into copies of the tensors the step reaches outside the model; the live ones
        come back untouched (the replay of an EMA update changed the live EMA copy)."""
        changed = 0
        for t, kept in self.reached:
            if isinstance(kept, int):  # by reference
                changed += t._version != kept
                kept = t.data
            live.data.append((t, t.data, None))
            t.data = kept.clone()
        if changed:
            self.problems_at_replay.append(
                f"{changed} tensor(s) the step reaches outside the model (an EMA copy, an accumulator) were "
                f"changed in place after the step started: the replay starts from their later values")

    def _swap_model(self, model: Any, live: Live) -> None:
        live.training = [m.training for m in model.modules()]
        for m, flag in zip(model.modules(), self.training, strict=False):
            m.training = flag
        for name, p in model.named_parameters():
            live.data.append((p, p.data, (p.grad,)))
            if name in self.frozen:
                t, version = self.frozen[name]
                if t._version != version:
                    self.problems_at_replay.append(
                        f"the frozen parameter {name} (requires_grad=False, kept by reference) was changed in "
                        f"place after the step started: the replay starts from its later value")
                p.data = t.clone()
            else:
                p.data = self.tensors[f"param:{name}"].clone()
            g = self.grads.get(name)
            if g is None:
                p.grad = None
            else:
                if g[0]._version != g[1]:
                    self.problems_at_replay.append(
                        f"the gradient of {name} the step started from was changed in place after the step "
                        f"started (accumulated into): the replay starts from its later value")
                p.grad = g[0].detach().clone()
        for name, b in model.named_buffers():
            key = f"buffer:{name}"
            if key in self.tensors:
                live.data.append((b, b.data, None))
                b.data = self.tensors[key].clone()



class Live:
    """The live objects' state taken off by :meth:`StepState.swap_in`; :meth:`restore` puts it back."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.rng = rng_state()
        self.training: list[bool] = []
        self.data: list[tuple[torch.Tensor, torch.Tensor, Any]] = []
        self.optimizers: list[tuple[Any, Any, list[tuple[dict, dict]]]] = []
        self.scalers: list[tuple[Any, dict[str, Any], Any]] = []
        self.schedulers: list[tuple[Any, dict]] = []
        self.generators: list[tuple[Any, torch.Tensor]] = []

    def restore(self) -> None:
        """The live state exactly as before (the same storages, state objects and RNG states)."""
        for m, flag in zip(self.model.modules(), self.training, strict=False):
            m.training = flag
        for t, data, grad in self.data:
            t.data = data
            if grad is not None:  # a parameter: (its live gradient,)
                t.grad = grad[0]
        for opt, state, groups in self.optimizers:
            opt.state = state
            for g, items in groups:
                g.clear()
                g.update(items)
        for sc, attrs, update in self.scalers:
            for k, v in attrs.items():
                setattr(sc, k, v)
            if update is not None:
                sc.__dict__["update"] = update
        for sched, sd in self.schedulers:
            sched.load_state_dict(sd)
        for gen, st in self.generators:
            gen.set_state(st)
        set_rng_state(self.rng)
        self.data, self.optimizers, self.scalers, self.schedulers, self.generators = [], [], [], [], []


def planned_bytes(model: Any, objects: Mapping[str, list[Any]]) -> int:
    """Bytes :func:`keep` will copy for ``model`` and ``objects`` (asked before copying)."""
    n = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    n += sum(t.numel() * t.element_size() for t, copied in objects.get(REACHED, ()) if copied)
    n += sum(b.numel() * b.element_size() for b in model.buffers())
    for opt in objects.get("optimizers", ()):
        for st in opt.state.values():
            n += sum(v.numel() * v.element_size() for v in st.values() if isinstance(v, torch.Tensor))
    return n


def keep(model: Any, objects: Mapping[str, list[Any]], args: tuple, kwargs: dict,
         recycle: Mapping[str, torch.Tensor] | None = None) -> StepState:
    """The pre-step state of ``model`` and ``objects`` (:func:`find_objects`) and the step's arguments."""
    s = StepState()
    cp = _Copier(recycle)
    with torch._C.DisableTorchFunction(), torch.no_grad():
        s.training = [m.training for m in model.modules()]
        for name, p in model.named_parameters():
            if p.requires_grad:
                s.keep_copy(cp, f"param:{name}", p)
            else:  # frozen: no step changes it but by hand, which its version counter tells at replay
                s.frozen[name] = (p.detach(), p._version)
                s.held += p.numel() * p.element_size()
            g = p.grad
            s.grads[name] = None if g is None else (g, g._version)
            s.held += 0 if g is None else g.numel() * g.element_size()
        for name, b in model.named_buffers():
            s.keep_copy(cp, f"buffer:{name}", b)
        for i, opt in enumerate(objects.get("optimizers", ())):
            index = {id(p): k for k, p in enumerate(p for g in opt.param_groups for p in g["params"])}
            state = {}
            for p, st in opt.state.items():
                k = index.get(id(p))
                if k is None:
                    continue
                state[k] = {n: s.keep_copy(cp, f"opt{i}:{k}:{n}", v) if isinstance(v, torch.Tensor)
                            else copy.deepcopy(v) for n, v in st.items()}
            groups = [{n: copy.deepcopy(v) for n, v in g.items() if n != "params"} for g in opt.param_groups]
            s.optimizers.append((opt, state, groups))
        for sc in objects.get("scalers", ()):
            attrs = {k: _cloned(getattr(sc, k)) for k in _SCALER_TENSORS + _SCALER_VALUES if hasattr(sc, k)}
            attrs["_per_optimizer_states"] = _cloned(sc._per_optimizer_states)
            s.scalers.append((sc, attrs))
        for sched in objects.get("schedulers", ()):
            s.schedulers.append((sched, _cloned(sched.state_dict())))
        s.generators = [(gen, gen.get_state()) for gen in objects.get("generators", ())]
        s.reached = [(t, s.keep_copy(cp, f"reached{i}", t) if copied else t._version)
                     for i, (t, copied) in enumerate(objects.get(REACHED, ()))]
        cp.flush()
        s.rng = rng_state()
        s.args = _walk(args, lambda p, t: clone_tensor(t), "args", s.problems)
        s.kwargs = _walk(kwargs, lambda p, t: clone_tensor(t), "kwargs", s.problems)
    s.nbytes = cp.bytes
    return s


def output_ref(value: Any) -> Any:
    """The step's returned loss, detached (a reference: a fresh tensor nobody changes), or None."""
    if isinstance(value, torch.Tensor):
        return value.detach()
    if isinstance(value, Mapping) and isinstance(value.get("loss"), torch.Tensor):
        return value["loss"].detach()
    if isinstance(value, (tuple, list)) and value and isinstance(value[0], torch.Tensor):
        return value[0].detach()
    return None


def same_bits(a: Any, b: Any) -> bool:
    """Whether two tensors hold the same bits (NaN payloads included)."""
    if a is None or b is None:
        return a is None and b is None
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    with torch._C.DisableTorchFunction():
        size = a.element_size()
        if a.dtype.is_complex or size not in ints:
            return bool(torch.equal(a, b))
        return bool(torch.equal(a.contiguous().view(ints[size]), b.contiguous().view(ints[size])))


def describe(value: Any) -> str:
    """A short text of a tensor's value (the loss in a mismatch message)."""
    if value is None:
        return "None"
    with torch._C.DisableTorchFunction():
        v = value.detach().float().cpu()
        return repr(v.item()) if v.numel() == 1 else f"tensor of shape {tuple(v.shape)}"


def op_context() -> dict[str, Any]:
    """What an op's result depends on besides its arguments, at the moment it runs: the autocast regions
    around it (``{"autocast": [[device type, dtype name], …]}``; an op under ``torch.autocast`` computes in
    the autocast dtype from arguments of another). ``save_repro(node=…)``'s script runs the op under them.

    >>> with torch.autocast("cpu", dtype=torch.bfloat16):
    ...     op_context()
    {'autocast': [['cpu', 'bfloat16']]}
    >>> op_context()
    {}
    """
    found = [[dev, str(torch.get_autocast_dtype(dev)).replace("torch.", "")] for dev in ("cpu", "cuda")
             if torch.is_autocast_enabled(dev)]
    return {"autocast": found} if found else {}


def keep_args(args: tuple, kwargs: dict) -> tuple[tuple, dict, list[str]]:
    """A later call's arguments within the same step (gradient accumulation): cloned, with problems."""
    problems: list[str] = []
    with torch._C.DisableTorchFunction():
        a = _walk(args, lambda p, t: clone_tensor(t), "args", problems)
        k = _walk(kwargs, lambda p, t: clone_tensor(t), "kwargs", problems)
    return a, k, problems


def fresh_args(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Fresh copies of kept arguments for one run (the step may change its inputs in place)."""
    sink: list[str] = []
    return (_walk(args, lambda _p, t: clone_tensor(t), "args", sink),
            _walk(kwargs, lambda _p, t: clone_tensor(t), "kwargs", sink))
