"""The PyTorch side of a reproduction folder: tensors to files, and the generated ``repro.py``.

Tensors go to ``tensors.safetensors`` when ``safetensors`` is installed, else to ``tensors/<n>.npy`` (a
bfloat16 tensor as its raw 16-bit words) — never a pickle. :func:`save_step` writes the state the step
started from (parameters, buffers, gradients, optimizer state, scaler, RNG states, the batch) and a
script that rebuilds the model (``model_factory="module:function"``; a HuggingFace model from its class
and ``config.to_dict()``; else a class importable with no constructor argument), the optimizers (class
and hyper-parameters), runs the step function's own source with its names bound to those objects, and
checks the loss and every parameter after the step (``after/<name>``, the live run's values) bit for bit.
:func:`save_op` writes one op's arguments and output and a script calling it.

>>> import torch, tempfile, os
>>> d = tempfile.mkdtemp()
>>> index = write_tensors(d, {"a": torch.ones(2, dtype=torch.bfloat16)})
>>> read_arrays(d, index)["a"].tolist()
[1.0, 1.0]
"""

from __future__ import annotations

import builtins
import dis
import importlib
import importlib.util
import inspect
import json
import os
import textwrap
import types
from typing import Any

import numpy as np
import torch

from .replay_state import REACHED

_SAFETENSORS = importlib.util.find_spec("safetensors") is not None


class ReproUnsupported(ValueError):
    """What the generated script cannot rebuild (the reason says what to pass instead)."""


# -- tensor files ---------------------------------------------------------------------------------------
def write_tensors(folder: str, tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    """Write ``tensors``; returns the index (format, and per name its dtype, shape and file)."""
    with torch._C.DisableTorchFunction():
        plain = {k: v.detach().cpu().contiguous().clone() for k, v in tensors.items()}
    meta = {k: {"dtype": str(v.dtype).removeprefix("torch."), "shape": list(v.shape)} for k, v in plain.items()}
    if _SAFETENSORS:
        from safetensors.torch import save_file

        save_file(plain, os.path.join(folder, "tensors.safetensors"))
        return {"format": "safetensors", "file": "tensors.safetensors", "tensors": meta}
    os.makedirs(os.path.join(folder, "tensors"), exist_ok=True)
    for i, (k, v) in enumerate(plain.items()):
        arr = v.view(torch.int16).numpy() if v.dtype == torch.bfloat16 else v.numpy()
        meta[k]["file"] = f"tensors/{i}.npy"
        np.save(os.path.join(folder, meta[k]["file"]), arr, allow_pickle=False)
    return {"format": "npy", "tensors": meta}


def read_arrays(folder: str, index: dict[str, Any]) -> dict[str, np.ndarray]:
    """The tensors of a folder as NumPy arrays (bfloat16 as float32); no pickle, no code run."""
    out = {}
    if index["format"] == "safetensors":
        from safetensors.torch import load_file

        for k, v in load_file(os.path.join(folder, index["file"])).items():
            out[k] = (v.float() if v.dtype == torch.bfloat16 else v).numpy()
        return out
    for k, m in index["tensors"].items():
        arr = np.load(os.path.join(folder, m["file"]), allow_pickle=False)
        if m["dtype"] == "bfloat16":
            arr = torch.from_numpy(arr).view(torch.bfloat16).float().numpy()
        out[k] = arr
    return out


# -- values as JSON -------------------------------------------------------------------------------------
def encode(value: Any, tensors: dict[str, torch.Tensor], key: str) -> Any:
    """``value`` as JSON, its tensors moved to ``tensors`` under ``key``-derived names."""
    if isinstance(value, torch.Tensor):
        tensors[key] = value
        return {"tensor": key, "requires_grad": bool(value.requires_grad)}
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return {"float": value.hex()}
    if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
        return {type(value).__name__: [encode(v, tensors, f"{key}.{i}") for i, v in enumerate(value)]}
    if type(value) is dict and all(isinstance(k, str) for k in value):
        return {"dict": {k: encode(v, tensors, f"{key}.{k}") for k, v in value.items()}}
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):  # HF BatchEncoding: a plain dict
        return {"dict": {k: encode(v, tensors, f"{key}.{k}") for k, v in value.items()}}
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).removeprefix("torch.")}
    raise ReproUnsupported(f"{key} is a {type(value).__name__}: a reproduction folder holds tensors, numbers, "
                           f"strings and lists/tuples/dicts of them")


_DECODE = '''
def decode(v):
    if isinstance(v, dict):
        if "tensor" in v:
            t = T[v["tensor"]].clone()
            return t.requires_grad_(True) if v["requires_grad"] else t
        if "float" in v:
            return float.fromhex(v["float"])
        if "list" in v:
            return [decode(x) for x in v["list"]]
        if "tuple" in v:
            return tuple(decode(x) for x in v["tuple"])
        if "dict" in v:
            return {k: decode(x) for k, x in v["dict"].items()}
        if "dtype" in v:
            return getattr(torch, v["dtype"])
    return v
'''

_LOAD = '''
HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(HERE, "manifest.json")) as f:
    M = json.load(f)


def load_tensors():
    index = M["tensors"]
    if index["format"] == "safetensors":
        from safetensors.torch import load_file
        return load_file(os.path.join(HERE, index["file"]))
    out = {}
    for k, m in index["tensors"].items():
        arr = np.load(os.path.join(HERE, m["file"]), allow_pickle=False)
        t = torch.from_numpy(arr)
        out[k] = t.view(torch.bfloat16) if m["dtype"] == "bfloat16" else t
    return out


T = load_tensors()
'''

_CHECK = '''

def same_bits(a, b):
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    size = a.element_size()
    if size not in ints:
        return bool(torch.equal(a, b))
    return bool(torch.equal(a.contiguous().view(ints[size]), b.contiguous().view(ints[size])))
'''


# -- the op form ----------------------------------------------------------------------------------------
def op_function(node: str) -> str:
    """The Python expression of the torch function a node name calls (``Functional.linear.0.forward`` ->
    ``torch.nn.functional.linear``)."""
    prefix, api = node.split(".")[:2]
    where = {"Functional": "torch.nn.functional", "Torch": "torch", "Tensor": "torch.Tensor", "VF": "torch._VF",
             "NPU": None, "Distributed": None, "Aten": None}.get(prefix)
    if where is None:
        raise ReproUnsupported(f"{node}: only Functional, Torch, Tensor and VF ops can be called on their own")
    return f"{where}.{api}"


def save_op(folder: str, node: str, call: tuple, out: Any, header: str,
            context: dict[str, Any] | None = None) -> dict[str, Any]:
    """One op: its arguments and output to tensor files, and ``repro.py`` calling it and checking the
    output bit for bit. ``call`` is ``(args, kwargs)`` as the op received them; ``context`` what it ran under
    (``replay_state.op_context``: the autocast regions, which the script enters around the call)."""
    func = op_function(node)
    tensors: dict[str, torch.Tensor] = {}
    args = encode(tuple(call[0]), tensors, "args")
    kwargs = encode(dict(call[1]), tensors, "kwargs")
    expected = encode(out, tensors, "expected")
    index = write_tensors(folder, tensors)
    manifest = {"kind": "op", "node": node, "function": func, "args": args, "kwargs": kwargs, "expected": expected,
                "tensors": index, "autocast": (context or {}).get("autocast", [])}
    script = (f'"""{header}"""\nimport contextlib\nimport json\nimport os\nimport sys\n\nimport numpy as np\n'
              'import torch\n' + _LOAD +
              _DECODE + _CHECK + f'''

args, kwargs = decode(M["args"]), decode(M["kwargs"])
regions = contextlib.ExitStack()  # the autocast regions the op ran in
for device, dtype in M.get("autocast", []):
    regions.enter_context(torch.autocast(device, dtype=getattr(torch, dtype)))
with torch.no_grad(), regions:
    out = {func}(*args, **kwargs)
expected = decode(M["expected"])
flat = out if isinstance(out, (tuple, list)) else (out,)
want = expected if isinstance(expected, (tuple, list)) else (expected,)
ok = all(same_bits(a, b) for a, b in zip(flat, want)) and len(flat) == len(want)
print("{node}:", "output bitwise identical" if ok else "output DIFFERS",
      "| non-finite:", any(not bool(torch.isfinite(a).all()) for a in flat if a.is_floating_point()))
sys.exit(0 if ok else 1)
''')
    return {"manifest": manifest, "script": script}


# -- the step form --------------------------------------------------------------------------------------
def model_recipe(model: Any, factory: str | None) -> dict[str, Any]:
    """How the script builds the model: a factory, a HuggingFace config, or a no-argument class."""
    if factory is not None:
        mod, _, name = factory.partition(":")
        if not mod or not name:
            raise ValueError(f"model_factory must be 'module:function', got {factory!r}")
        return {"factory": [mod, name]}
    cls = type(model)
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "to_dict") and hasattr(cls, "config_class"):
        return {"hf": [cls.__module__, cls.__qualname__], "config": json.loads(config.to_json_string())}
    # torch's containers (Sequential, ModuleList, ModuleDict…) take their contents as arguments: built with none
    # they are empty
    if cls.__module__ not in ("__main__", "torch.nn.modules.container") and "<locals>" not in cls.__qualname__:
        params = list(inspect.signature(cls.__init__).parameters.values())[1:]
        if all(p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
            return {"class": [cls.__module__, cls.__qualname__]}
    raise ReproUnsupported(
        f"the script cannot build a {cls.__name__} by itself: pass save_repro(..., model_factory='module:function') "
        f"naming an importable function that returns the model (its weights are loaded from the folder)")


def bindings(fn: Any, model: Any, objects: dict[str, list[Any]]) -> list[str]:
    """Lines binding the names the step function uses (closure and globals) in the script."""
    code = fn.__code__
    values = dict(zip(code.co_freevars, [c.cell_contents for c in fn.__closure__ or ()], strict=False))
    values.update({n: fn.__globals__[n] for n in global_names(code) if n in fn.__globals__ and n not in values})
    lines = []
    for name, v in values.items():
        if v is model:
            lines.append(f"{name} = model")
            continue
        found = next((f"{kind}[{i}]" for kind, objs in objects.items() if kind != REACHED
                      for i, o in enumerate(objs) if o is v),
                     None)  # the object itself first: a scheduler's .optimizer is an optimizer too
        found = found or next((f"optimizers[{i}]" for i, o in enumerate(objects.get("optimizers", []))
                               if getattr(v, "optimizer", None) is o and _kind_of(v) == "optimizers"), None)
        if found is not None:
            lines.append(f"{name} = {found}")
        elif isinstance(v, types.ModuleType):
            lines.append(f"import {v.__name__} as {name}" if v.__name__ != name else f"import {name}")
        elif isinstance(v, (types.FunctionType, type)) and v.__module__ not in ("__main__", None) \
                and "<locals>" not in v.__qualname__:
            lines.append(f"from {v.__module__} import {v.__qualname__} as {name}")
        elif v is None or isinstance(v, (bool, int, str)) or isinstance(v, float) and np.isfinite(v):
            lines.append(f"{name} = {v!r}")
        elif (part := _part_of(model, v)) is not None:
            lines.append(f"{name} = {part}")
        elif not hasattr(builtins, name) and not isinstance(v, types.BuiltinFunctionType):
            raise ReproUnsupported(f"the step function uses {name!r}, a {type(v).__name__} the script cannot "
                                   f"rebuild: pass it as an argument of the step, or make it a module-level name")
    return lines


def global_names(code: Any) -> list[str]:
    """The global names ``code`` reads, its nested code's (a comprehension's) included, in order — not its
    attribute names (``opt.step()`` names no global ``step``: the step function itself may be one).

    >>> def step(x):
    ...     opt.step(); return [math.sqrt(v) for v in x]
    >>> global_names(step.__code__)
    ['opt', 'math']
    """
    found: dict[str, None] = {}
    for ins in dis.get_instructions(code):
        if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
            found[ins.argval] = None
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            found.update(dict.fromkeys(global_names(const)))
    return list(found)


def _part_of(model: Any, v: Any) -> str | None:
    """How the script reaches ``v`` when it is a submodule or a parameter of the model (a step that uses
    ``emb = model.get_input_embeddings()`` or ``head = model.lm_head``), or a list or tuple of its parameters
    (``params = [p for p in model.parameters() if p.requires_grad]`` clipped in the step), else None."""
    if isinstance(v, (list, tuple)) and v and all(isinstance(x, torch.nn.Parameter) for x in v):
        parts = [_part_of(model, x) for x in v]
        if all(parts):
            return f"[{', '.join(parts)}]" if isinstance(v, list) else f"({', '.join(parts)},)"
        return None
    if isinstance(v, torch.nn.Parameter):
        found = next((n for n, p in model.named_parameters() if p is v), None)
        return None if found is None else f"model.get_parameter({found!r})"
    if isinstance(v, torch.nn.Module):
        found = next((n for n, m in model.named_modules() if m is v and n), None)
        return None if found is None else f"model.get_submodule({found!r})"
    return None


def _kind_of(v: Any) -> str | None:
    from .replay_state import _kind

    return _kind(v)


def step_source(fn: Any) -> str:
    """The step function's own source, dedented, without decorators."""
    try:
        src = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError) as e:
        raise ReproUnsupported(f"the step function's source is not available ({e})") from None
    if fn.__name__ == "<lambda>":
        raise ReproUnsupported("the step function is a lambda: define it with def for save_repro")
    lines = src.splitlines()
    while lines and not lines[0].lstrip().startswith(("def ", "async def ")):
        lines.pop(0)
    return "\n".join(lines) + "\n"


def _state_tensors(model: Any, state: Any, objects: dict[str, list[Any]], tensors: dict) -> dict[str, Any]:
    """The kept pre-step state as JSON (its tensors into ``tensors``)."""
    out: dict[str, Any] = {"training": state.training, "grads": {}, "optimizers": [], "scalers": []}
    for key, t in state.tensors.items():
        if key.startswith(("param:", "buffer:")):
            tensors[key.replace(":", "/", 1)] = t
    for name, (t, _version) in state.frozen.items():
        tensors[f"param/{name}"] = t
    for name, g in state.grads.items():
        if g is not None:
            tensors[f"grad/{name}"] = g[0]
            out["grads"][name] = f"grad/{name}"
    names = {id(p): n for n, p in model.named_parameters()}
    for i, (opt, st, groups) in enumerate(state.optimizers):
        params = [p for g in opt.param_groups for p in g["params"]]
        gs = [{"params": [names[id(p)] for p in g["params"]], "hyper": encode(h, tensors, f"opt{i}/group{j}")}
              for j, (g, h) in enumerate(zip(opt.param_groups, groups, strict=True))]
        cls = type(opt)
        state_json = {names[id(params[k])]: encode(v, tensors, f"opt{i}/state/{names[id(params[k])]}")
                      for k, v in st.items()}
        out["optimizers"].append({"class": [cls.__module__, cls.__qualname__], "groups": gs, "state": state_json})
    for i, (sc, attrs) in enumerate(state.scalers):
        plain = {k: v for k, v in attrs.items() if k != "_per_optimizer_states"}
        out["scalers"].append({"device": getattr(sc, "_device", "cpu"), "attrs": encode(plain, tensors, f"scaler{i}")})
    out["schedulers"] = [_scheduler(i, sched, sd, objects, tensors) for i, (sched, sd) in enumerate(state.schedulers)]
    out["generators"] = []  # the step's own torch.Generators: device and state when the step started
    for i, (gen, st) in enumerate(getattr(state, "generators", ())):
        tensors[f"generator{i}"] = st
        out["generators"].append(str(gen.device))
    rng = state.rng
    tensors["rng/torch"] = rng["torch"]
    tensors["rng/numpy"] = torch.from_numpy(rng["numpy"][1].astype(np.int64))
    out["rng"] = {"python": [rng["python"][0], list(rng["python"][1]), rng["python"][2]],
                  "numpy": [rng["numpy"][0], int(rng["numpy"][2]), int(rng["numpy"][3]), float(rng["numpy"][4])]}
    return out


def _scheduler(i: int, sched: Any, sd: dict, objects: dict[str, list[Any]], tensors: dict) -> dict[str, Any]:
    """An LR scheduler as its class, its optimizer's index and its ``state_dict`` as JSON; one whose state
    holds functions (``LambdaLR``'s lambdas are left out of its state_dict) or other objects is refused."""
    opts = objects.get("optimizers", [])
    k = next((j for j, o in enumerate(opts) if o is getattr(sched, "optimizer", None)), None)
    cls = type(sched)
    if k is None or not cls.__module__.startswith("torch.optim"):
        raise ReproUnsupported(f"the LR scheduler {cls.__name__} is not one of torch.optim.lr_scheduler's over a "
                               f"found optimizer: the script cannot rebuild it")
    if any(callable(v) for v in vars(sched).values()) or hasattr(sched, "lr_lambdas"):
        raise ReproUnsupported(f"the LR scheduler {cls.__name__} computes its rate with Python functions, which "
                               f"its state_dict leaves out and a folder does not hold (code is never saved)")
    try:
        state = encode(dict(sd), tensors, f"sched{i}")
    except ReproUnsupported as e:
        raise ReproUnsupported(f"the LR scheduler {cls.__name__}'s state cannot be saved: {e}") from None
    return {"class": [cls.__module__, cls.__qualname__], "optimizer": k, "state": state}


_BUILD = '''

def build_model():
    r = M["model"]
    if "factory" in r:
        return getattr(importlib.import_module(r["factory"][0]), r["factory"][1])()
    if "hf" in r:
        cls = getattr(importlib.import_module(r["hf"][0]), r["hf"][1])
        return cls(cls.config_class.from_dict(r["config"]))
    return getattr(importlib.import_module(r["class"][0]), r["class"][1])()


model = build_model()
S = M["state"]
named = dict(model.named_parameters())
saved = {k[len("param/"):] for k in T if k.startswith("param/")}
if saved != set(named):
    sys.exit("the rebuilt model's parameters are not the saved ones (missing: {}; not saved: {}): save again with "
             "save_repro(..., model_factory='module:function')".format(sorted(saved - set(named))[:3],
                                                                      sorted(set(named) - saved)[:3]))
with torch.no_grad():
    for n, p in named.items():
        p.data = T["param/" + n].clone()
    for n, b in model.named_buffers():
        b.data = T["buffer/" + n].clone()
for m, flag in zip(model.modules(), S["training"]):
    m.training = flag
for n, key in S["grads"].items():
    named[n].grad = T[key].clone()
optimizers = []
for o in S["optimizers"]:
    cls = getattr(importlib.import_module(o["class"][0]), o["class"][1])
    opt = cls([dict(decode(g["hyper"]), params=[named[n] for n in g["params"]]) for g in o["groups"]])
    for n, st in o["state"].items():
        opt.state[named[n]] = decode(st)
    optimizers.append(opt)
scalers = []
for s in S["scalers"]:
    sc = torch.amp.GradScaler(s["device"])
    for k, v in decode(s["attrs"]).items():
        setattr(sc, k, v)
    scalers.append(sc)
generators = []
for i, device in enumerate(S.get("generators", [])):  # the step's own, in the state the step started from
    generators.append(torch.Generator(device=device))
    generators[-1].set_state(T["generator{}".format(i)])
schedulers = []
for s in S["schedulers"]:  # rebuilt without its constructor (which would step it): its state_dict, loaded
    cls = getattr(importlib.import_module(s["class"][0]), s["class"][1])
    sched = cls.__new__(cls)
    sched.optimizer = optimizers[s["optimizer"]]
    sched.load_state_dict(decode(s["state"]))
    schedulers.append(sched)
py = S["rng"]["python"]
random.setstate((py[0], tuple(py[1]), py[2]))
npr = S["rng"]["numpy"]
np.random.set_state((npr[0], T["rng/numpy"].numpy().astype(np.uint32), npr[1], npr[2], npr[3]))
torch.set_rng_state(T["rng/torch"])
'''


def after_step(state: Any, model: Any) -> dict[str, torch.Tensor]:
    """Every parameter of ``model`` as the step left it (read at the end of a bitwise replay, before the live
    values go back; or from the live model right after its last step)."""
    with torch._C.DisableTorchFunction():
        return {n: p.detach().clone() for n, p in model.named_parameters()}


def save_step(folder: str, model: Any, state: Any, fn: Any, objects: dict[str, list[Any]], expected: Any,
              factory: str | None, header: str, after: dict[str, torch.Tensor] | None = None,
              after_note: str = "") -> dict[str, Any]:
    """The step's pre-step state, batch, expected loss and post-step parameters (``after``; None: not known,
    ``after_note`` says why — the script prints it) to tensor files, and ``repro.py`` running it."""
    tensors: dict[str, torch.Tensor] = {f"after/{n}": t for n, t in (after or {}).items()}
    recipe = model_recipe(model, factory)
    binds = bindings(fn, model, objects)
    source = step_source(fn)
    manifest: dict[str, Any] = {"kind": "step", "model": recipe, "function": fn.__name__,
                                "state": _state_tensors(model, state, objects, tensors),
                                "args": encode(tuple(state.args), tensors, "args"),
                                "kwargs": encode(dict(state.kwargs), tensors, "kwargs"),
                                "expected": encode(expected, tensors, "expected") if expected is not None else None,
                                "after": None if after is None else sorted(after), "after_note": after_note}
    manifest["tensors"] = write_tensors(folder, tensors)
    script = (f'"""{header}"""\nimport importlib\nimport json\nimport os\nimport random\nimport sys\n\n'
              f'import numpy as np\nimport torch\n\nsys.path.insert(0, os.getcwd())\n' + _LOAD + _DECODE + _CHECK +
              _BUILD + "\n# the names the step function uses\n" + "\n".join(binds) +
              "\n\n# the step function, as written\n" + source + f'''

args, kwargs = decode(M["args"]), decode(M["kwargs"])
out = {fn.__name__}(*args, **kwargs)
loss = out if isinstance(out, torch.Tensor) else out["loss"] if isinstance(out, dict) else out[0]
expected = decode(M["expected"]) if M["expected"] is not None else None
ok = expected is None or same_bits(loss.detach(), expected)
print("step {{}}: loss".format(M.get("step")), loss.item() if loss.numel() == 1 else tuple(loss.shape),
      "bitwise identical" if ok else "DIFFERS from {{}}".format(expected))
differ = []
if M.get("after") is None:
    print("Parameters after the step: NOT CHECKED,", M.get("after_note") or "the live values were not saved")
else:
    named = dict(model.named_parameters())
    differ = [n for n in M["after"] if n not in named or not same_bits(named[n].detach(), T["after/" + n])]
    print("Parameters after the step:", "{{}} bitwise identical".format(len(M["after"])) if not differ else
          "{{}} of {{}} DIFFER: {{}}".format(len(differ), len(M["after"]), ", ".join(differ[:5]) +
                                         (", ..." if len(differ) > 5 else "")))
sys.exit(0 if ok and not differ else 1)
''')
    return {"manifest": manifest, "script": script}
