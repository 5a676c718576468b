"""The MindSpore side of a reproduction folder: tensors to files, and the generated ``repro.py``.

Tensors go to ``tensors.safetensors`` (``safetensors.numpy``) when ``safetensors`` is installed, else to
``tensors/<n>.npy`` with the index in the manifest — never a pickle; a bfloat16 tensor is stored as
float32 (exact) and cast back. :func:`save_step` writes the state the step started from (the model's
Parameters, every Parameter the optimizers hold besides the model's, the Cells' train flags, RNG states,
the batch), the loss the step returned and every such Parameter as the step left it, and a script that
builds the model, the step and its optimizers with ``model_factory`` (``"module:function"``, returning
``{"model": net, "step": train_step, "optimizers": [opt]}``; ``optimizers`` may be left out when the step
is a ``TrainOneStepCell`` or a ``mindspore.train.Model``, whose train network is the step), writes the
saved values into their Parameters (``Assign``), restores the RNG states, runs the step on the saved batch
in PyNative mode and checks the loss and every Parameter the step updated bit for bit. A MindSpore step
function closes over objects the script cannot rebuild from their state (``value_and_grad``'s function,
loss Cells, optimizers' constructor arguments): the factory builds them, the folder holds their values.
:func:`save_op` writes one op's arguments (as it received them: an argument it wrote in place is the value
before the op) and output, and a script calling ``mindspore.ops`` / ``mindspore.mint`` /
``mint.nn.functional`` functions and ``Tensor`` methods by name (a Primitive held by a Cell is refused: its
attributes are not in the folder).

>>> import tempfile, numpy as np
>>> d = tempfile.mkdtemp()
>>> index = write_tensors(d, {"a": np.ones(2, np.float32)}, {"a": "float32"})
>>> read_arrays(d, index)["a"].tolist()
[1.0, 1.0]
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import mindspore as ms
import numpy as np
from mindspore import nn

from .ops import TensorBase

_SAFETENSORS = importlib.util.find_spec("safetensors") is not None


class ReproUnsupported(ValueError):
    """What the generated script cannot rebuild (the reason says what to pass instead)."""


# -- tensor files ---------------------------------------------------------------------------------------
def _plain(arr: np.ndarray) -> np.ndarray:
    """``arr`` in a dtype NumPy and safetensors write (bfloat16 as float32: exact)."""
    arr = np.array(arr, order="C")  # not ascontiguousarray: it makes a 0-d array 1-d
    return arr.astype(np.float32) if arr.dtype.kind == "V" or "bfloat16" in str(arr.dtype) else arr


def write_tensors(folder: str, arrays: dict[str, np.ndarray], dtypes: dict[str, str]) -> dict[str, Any]:
    """Write ``arrays`` (``dtypes``: their MindSpore dtype names); returns the index."""
    plain = {k: _plain(np.asarray(v)) for k, v in arrays.items()}
    meta = {k: {"dtype": dtypes[k], "shape": list(v.shape)} for k, v in plain.items()}
    if _SAFETENSORS:
        from safetensors.numpy import save_file

        save_file(plain, os.path.join(folder, "tensors.safetensors"))
        return {"format": "safetensors", "file": "tensors.safetensors", "tensors": meta}
    os.makedirs(os.path.join(folder, "tensors"), exist_ok=True)
    for i, (k, v) in enumerate(plain.items()):
        meta[k]["file"] = f"tensors/{i}.npy"
        np.save(os.path.join(folder, meta[k]["file"]), v, allow_pickle=False)
    return {"format": "npy", "tensors": meta}


def read_arrays(folder: str, index: dict[str, Any]) -> dict[str, np.ndarray]:
    """The tensors of a folder as NumPy arrays; no pickle, no code run."""
    if index["format"] == "safetensors":
        from safetensors.numpy import load_file

        return dict(load_file(os.path.join(folder, index["file"])))
    return {k: np.load(os.path.join(folder, m["file"]), allow_pickle=False) for k, m in index["tensors"].items()}


def _dtype_name(dtype: Any) -> str:
    return str(dtype).lower()


# -- values as JSON -------------------------------------------------------------------------------------
def encode(value: Any, arrays: dict[str, np.ndarray], dtypes: dict[str, str], key: str) -> Any:
    """``value`` as JSON, its Tensors moved to ``arrays`` under ``key``-derived names."""
    if isinstance(value, TensorBase):
        arrays[key], dtypes[key] = value.asnumpy(), _dtype_name(value.dtype)
        return {"tensor": key}
    if isinstance(value, np.ndarray):
        arrays[key], dtypes[key] = value, str(value.dtype)
        return {"array": key}
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return {"float": value.hex()}
    if type(value) in (list, tuple):
        return {type(value).__name__: [encode(v, arrays, dtypes, f"{key}.{i}") for i, v in enumerate(value)]}
    if type(value) is dict and all(isinstance(k, str) for k in value):
        return {"dict": {k: encode(v, arrays, dtypes, f"{key}.{k}") for k, v in value.items()}}
    if isinstance(value, ms.dtype.Type):
        return {"msdtype": _dtype_name(value)}
    raise ReproUnsupported(f"{key} is a {type(value).__name__}: a reproduction folder holds Tensors, numbers, "
                           f"strings and lists/tuples/dicts of them")


def check(node: str | None, factory: str | None) -> None:
    """Refuse, before any work, what :func:`save_op` / :func:`save_step` cannot write."""
    if node is not None:
        op_function(node)
    else:
        _factory(factory)
    if ms.get_context("mode") != ms.PYNATIVE_MODE:
        raise ReproUnsupported("save_repro is built for MindSpore's PyNative mode only: in GRAPH mode the step is "
                               "a compiled graph; dbg.replay(step) recomputes it with the kernel dump armed")


# -- the op form ----------------------------------------------------------------------------------------
#: where the function a node's name calls lives, by the node's prefix
OP_MODULES = {"Functional": "mindspore.ops", "Mint": "mindspore.mint", "MintFunctional": "mindspore.mint.nn.functional",
              "Tensor": "mindspore.Tensor"}


def op_function(node: str) -> str:
    """The Python expression of the MindSpore function a node name calls (``Mint.mul.0.forward`` ->
    ``mindspore.mint.mul``); a Primitive, Cell or backward node is refused with the reason."""
    prefix, _, rest = node.partition(".")
    where = OP_MODULES.get(prefix)
    if where is None or not rest or node.endswith(".backward"):
        raise ReproUnsupported(
            f"{node}: only the forward calls of mindspore.ops / mindspore.mint / mint.nn.functional functions and "
            f"Tensor methods can be called on their own (a Primitive held by a Cell carries attributes of its "
            f"own the folder does not rebuild; a Cell or backward node is not one call)")
    return f"{where}.{rest.split('.')[0]}"


def save_op(folder: str, node: str, call: tuple, out: Any, header: str) -> dict[str, Any]:
    """One op: its arguments and output to tensor files, and ``repro.py`` calling it and checking the
    output bit for bit. ``call`` is ``(args, kwargs)`` as the op received them."""
    func = op_function(node)
    arrays: dict[str, np.ndarray] = {}
    dtypes: dict[str, str] = {}
    manifest = {"kind": "op", "node": node, "function": func, "args": encode(tuple(call[0]), arrays, dtypes, "args"),
                "kwargs": encode(dict(call[1]), arrays, dtypes, "kwargs"),
                "expected": encode(out, arrays, dtypes, "expected")}
    manifest["tensors"] = write_tensors(folder, arrays, dtypes)
    return {"manifest": manifest, "script": f'"""{header}"""\n' + _PROLOGUE + f'''
import mindspore  # noqa: E402 - the op's namespace, by its full name
import mindspore.mint.nn.functional  # noqa: E402

args, kwargs = decode(M["args"]), decode(M["kwargs"])
out = {func}(*args, **kwargs)
expected = decode(M["expected"])
flat = out if isinstance(out, (tuple, list)) else (out,)
want = expected if isinstance(expected, (tuple, list)) else (expected,)
ok = len(flat) == len(want) and all(same_bits(host(a), host(b)) for a, b in zip(flat, want))
print("{node}:", "output bitwise identical" if ok else "output DIFFERS",
      "| non-finite:", any(not np.isfinite(host(a).astype(np.float64)).all() for a in flat))
sys.exit(0 if ok else 1)
'''}


# -- the step form --------------------------------------------------------------------------------------
def after_step(state: Any, model: Any = None) -> dict[str, np.ndarray]:
    """Every kept Parameter's value as the step left it (read at the end of a bitwise replay, before the live
    values go back; or from the live Parameters right after the last step). ``model``: unused (the kept
    state names the Parameters), as PyTorch's takes it."""
    return {key: np.asarray(p.asnumpy()).copy() for key, p in state.params.items()}


def _factory(factory: str | None) -> list[str]:
    if factory is None:
        raise ReproUnsupported(
            "a MindSpore step closes over objects the script cannot rebuild from their state (value_and_grad's "
            "function, loss Cells, optimizers' constructor arguments): pass save_repro(..., model_factory="
            "'module:function') naming an importable function that returns {'model': net, 'step': train_step, "
            "'optimizers': [opt]} built afresh (the folder's values are written into their Parameters)")
    mod, _, name = factory.partition(":")
    if not mod or not name:
        raise ValueError(f"model_factory must be 'module:function', got {factory!r}")
    return [mod, name]


def _state_json(state: Any, after: dict[str, np.ndarray] | None, arrays: dict, dtypes: dict) -> dict[str, Any]:
    """The kept pre-step state as JSON (its arrays into ``arrays``)."""
    for key, arr in state.tensors.items():
        arrays[f"state/{key}"] = arr
        dtypes[f"state/{key}"] = _dtype_name(state.params[key].dtype)
    for key, arr in (after or {}).items():
        arrays[f"after/{key}"] = arr
        dtypes[f"after/{key}"] = _dtype_name(state.params[key].dtype)
    rng = state.rng
    arrays["rng/mindspore"], dtypes["rng/mindspore"] = np.asarray(rng["mindspore"].asnumpy()), "uint8"
    arrays["rng/numpy"], dtypes["rng/numpy"] = rng["numpy"][1].astype(np.uint32), "uint32"
    return {"params": list(state.tensors), "after": None if after is None else list(after),
            "training": list(state.training),
            "rng": {"python": [rng["python"][0], list(rng["python"][1]), rng["python"][2]],
                    "numpy": [rng["numpy"][0], int(rng["numpy"][2]), int(rng["numpy"][3]),
                              float(rng["numpy"][4])]}}


def save_step(folder: str, model: Any, state: Any, fn: Any, objects: dict[str, list[Any]], expected: Any,
              factory: str | None, header: str, after: dict[str, np.ndarray] | None = None,
              after_note: str = "") -> dict[str, Any]:
    """The step's pre-step state, batch, expected loss and post-step Parameters (``after``; None: not known,
    ``after_note`` says why — the script prints it) to tensor files, and ``repro.py`` running the step the
    factory builds."""
    recipe = _factory(factory)
    if ms.get_context("mode") != ms.PYNATIVE_MODE:
        raise ReproUnsupported("save_repro is built for MindSpore's PyNative mode only")
    arrays: dict[str, np.ndarray] = {}
    dtypes: dict[str, str] = {}
    manifest: dict[str, Any] = {
        "kind": "step", "factory": recipe, "mode": "pynative",
        "step_is_cell": isinstance(getattr(fn, "__wrapped__", fn), nn.Cell),
        "optimizers": [type(o).__name__ for o in objects.get("optimizers", [])],
        "state": _state_json(state, after, arrays, dtypes), "after_note": after_note,
        "args": encode(tuple(state.args), arrays, dtypes, "args"),
        "kwargs": encode(dict(state.kwargs), arrays, dtypes, "kwargs"),
        "expected": encode(expected, arrays, dtypes, "expected") if expected is not None else None}
    manifest["tensors"] = write_tensors(folder, arrays, dtypes)
    return {"manifest": manifest, "script": f'"""{header}"""\n' + _PROLOGUE + _STEP}


_PROLOGUE = '''import importlib
import json
import os
import random
import sys

import mindspore as ms
import numpy as np
from mindspore import nn, ops

sys.path.insert(0, os.getcwd())
ms.set_context(mode=ms.PYNATIVE_MODE)
HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(HERE, "manifest.json")) as f:
    M = json.load(f)
INDEX = M["tensors"]
if INDEX["format"] == "safetensors":
    from safetensors.numpy import load_file
    A = load_file(os.path.join(HERE, INDEX["file"]))
else:
    A = {k: np.load(os.path.join(HERE, m["file"]), allow_pickle=False) for k, m in INDEX["tensors"].items()}


def tensor(key):
    return ms.Tensor(A[key].copy(), dtype=getattr(ms, INDEX["tensors"][key]["dtype"]))


def decode(v):
    if isinstance(v, dict):
        if "tensor" in v:
            return tensor(v["tensor"])
        if "array" in v:
            return A[v["array"]].copy()
        if "float" in v:
            return float.fromhex(v["float"])
        if "list" in v:
            return [decode(x) for x in v["list"]]
        if "tuple" in v:
            return tuple(decode(x) for x in v["tuple"])
        if "dict" in v:
            return {k: decode(x) for k, x in v["dict"].items()}
        if "msdtype" in v:
            return getattr(ms, v["msdtype"])
    return v


def host(t):
    if isinstance(t, np.ndarray):
        return t
    if t.dtype == ms.bfloat16:
        t = t.astype(ms.float32)
    return np.array(t.asnumpy(), order="C")


def same_bits(a, b):
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()
'''

_STEP = '''

# the model, the step and its optimizers, built afresh by the factory
built = getattr(importlib.import_module(M["factory"][0]), M["factory"][1])()
model, step = built["model"], built["step"]
if not isinstance(step, nn.Cell) and getattr(step, "train_network", None) is not None:
    step = step.train_network  # a mindspore.train.Model: its step is its train network
optimizers = list(built.get("optimizers") or ([step.optimizer] if isinstance(step, nn.Cell) else []))
cells = [step] if isinstance(step, nn.Cell) else []
S = M["state"]
params = {"param:" + n: p for n, p in model.parameters_and_names()}
seen = {id(p) for p in params.values()}
for i, opt in enumerate(optimizers):
    for n, p in opt.parameters_and_names():
        if id(p) not in seen:
            seen.add(id(p))
            params["opt{}:{}".format(i, n)] = p
for i, cell in enumerate(cells):
    for n, p in cell.parameters_and_names():
        if id(p) not in seen:
            seen.add(id(p))
            params["cell{}:{}".format(i, n)] = p
if sorted(params) != sorted(S["params"]):
    print("the factory's model and optimizers do not hold the saved Parameters: missing",
          sorted(set(S["params"]) - set(params))[:5], "unexpected", sorted(set(params) - set(S["params"]))[:5])
    sys.exit(2)

# the state the step started from
assign = ops.Assign()
for key in S["params"]:
    assign(params[key], tensor("state/" + key))
for (_, cell), flag in zip(model.cells_and_names(), S["training"]):
    cell.training = flag
py = S["rng"]["python"]
random.setstate((py[0], tuple(py[1]), py[2]))
npr = S["rng"]["numpy"]
np.random.set_state((npr[0], A["rng/numpy"].astype(np.uint32), npr[1], npr[2], npr[3]))
ms.set_rng_state(ms.Tensor(A["rng/mindspore"].copy()))

# the step, on the saved batch
args, kwargs = decode(M["args"]), decode(M["kwargs"])
out = step(*args, **kwargs)
loss = out[0] if isinstance(out, (tuple, list)) else out
expected = decode(M["expected"]) if M["expected"] is not None else None
ok = expected is None or same_bits(host(loss), expected)
value = host(loss)
print("step {}: loss".format(M.get("step")), value.item() if value.size == 1 else value.shape,
      "bitwise identical" if ok else "DIFFERS from {}".format(expected),
      "| non-finite:", not bool(np.isfinite(value.astype(np.float64)).all()))
differ = []
if S["after"] is None:
    print("Parameters after the step: NOT CHECKED,", M.get("after_note") or "the live values were not saved")
else:
    differ = [key for key in S["after"] if not same_bits(host(params[key]), A["after/" + key])]
    print("Parameters after the step:", "{} bitwise identical".format(len(S["after"])) if not differ else
          "{} of {} DIFFER, first {}".format(len(differ), len(S["after"]), differ[0]))
sys.exit(0 if ok and not differ else 1)
'''
