"""``dbg.save_repro(path, step, node=None)`` and ``nbdebug.load_repro(path)``: a step (or one op of it) as a
folder that recomputes it in a fresh process, for a bug report or a colleague.

The folder holds ``manifest.json`` (versions, the step, how to rebuild the model and optimizers, the
arguments' structure, RNG states as JSON), the tensors (``tensors.safetensors``, or ``tensors/*.npy`` with
the index in the manifest), ``stats.json`` (the replayed step's graph and statistics at ``mix``) and a
generated ``repro.py``. ``python repro.py`` rebuilds the step and checks its loss and the parameters it
left (the live run's: a bitwise replay's, or the live model's after its last step) — or, with ``node=``,
calls that op on its saved inputs and checks its output — bit for bit (exit status 0 when identical).
:func:`load_repro` reads the JSON and arrays only: nothing in the folder is imported, executed or
unpickled.

>>> import os, tempfile
>>> load_repro(tempfile.mkdtemp())
Traceback (most recent call last):
...
FileNotFoundError: ... is not a reproduction folder (no manifest.json): write one with dbg.save_repro(path, step)
"""

from __future__ import annotations

import json
import os
import platform
import shutil
from typing import Any

import numpy as np

from ..frameworks.registry import backend_named
from ..offline import OfflineSession
from ..session.dump_session import DumpSession
from .replayer import replay

MANIFEST = "manifest.json"
STATS = "stats.json"


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("nbdebug")
    except Exception:  # noqa: BLE001 - not installed as a distribution
        return "unknown"


def _stats_json(replayed: Any) -> dict[str, Any]:
    """The replayed step's graph and statistics table as JSON."""
    g = replayed.session.graph
    table = replayed.session.steps[replayed.step]
    return {"step": replayed.step, "level": replayed.level,
            "nodes": [[n.name, n.kind, n.op_type, n.scope, n.section] for n in g.in_order()],
            "edges": [[s, d, a, b] for (s, d), slots in g.edges.items() for a, b in slots],
            "keys": [list(k) for k in table.keys], "dtypes": list(table.dtypes),
            "shapes": [list(s) for s in table.shapes], "values": table.values.tolist()}


def _in_place(node: str) -> bool:
    """Whether the op a node name calls writes its first argument (``Tensor.add_``, ``Tensor.__iadd__``)."""
    api = node.split(".")[1] if node.count(".") else node
    return (api.endswith("_") and not api.endswith("__")) or (api.startswith("__i") and api.endswith("__")) \
        or api == "__setitem__"


def written_slots(node: str, call: tuple) -> set[str]:
    """The input slots of ``call`` (``(args, kwargs, out)``, seen after the op ran) that the op wrote: its
    first argument for an in-place op, any argument that is its output, ``out=``."""
    args, kwargs, out = call[0], call[1] or {}, call[2]
    outs = out if isinstance(out, (tuple, list)) else (out,)
    slots = {f"input.{i}" for i, a in enumerate(args) if a is not None and any(a is o for o in outs)}
    slots |= {f"input.{k}" for k, v in kwargs.items() if k == "out" or (v is not None and any(v is o for o in outs))}
    if _in_place(node) and args:
        slots.add("input.0")
    return slots


def as_called(replayed: Any, node: str, call: dict[str, Any], rs: Any) -> tuple[tuple, dict]:
    """The op's arguments as it received them: an argument the op wrote in place (kept after the op ran)
    is replaced by the value the replay's capture retained for that input slot before the op; a
    ``NotRetainedError``-like refusal (``ValueError``) when that value was not retained."""
    session = replayed.session
    which = "current" if replayed.step == session.store_step else "previous"
    retained = getattr(session.store, which)
    args, kwargs = list(call["args"]), dict(call["kwargs"])
    for slot in sorted(call.get("written", ())):
        where = slot.split(".", 1)[1]
        if where.isdigit() and int(where) >= len(args) or not where.isdigit() and where not in kwargs:
            continue
        if where == "out":
            continue  # what the op writes into: its value before the op is not read
        handle = retained.get((node, slot))
        try:
            if handle is None or getattr(handle, "tensor", None) is None:
                raise LookupError(store_reason(session, node, slot, which))
            handle.numpy()  # raises when the retained reference was overwritten without a copy
        except LookupError as e:
            raise ValueError(f"{node} writes its {slot} in place, and the replay did not retain that input's "
                             f"value before the op ({e}): the saved argument would be the op's result, not its "
                             f"input") from None
        value = rs.keep_args((handle.tensor,), {})[0][0]  # a copy of the value before the op
        if where.isdigit():
            args[int(where)] = value
        else:
            kwargs[where] = value
    return tuple(args), kwargs


def store_reason(session: Any, node: str, slot: str, which: str) -> str:
    return session.store.reason((node, slot), which) or f"no value retained for {node} {slot}"


def live_after(dbg: Any, kept: Any, replayed: Any, left: dict[str, Any], model: Any,
               after_step: Any) -> tuple[dict[str, Any] | None, str]:
    """The parameters the live run had after step ``kept.step``, and how they were obtained: the replay's
    when it was bitwise (its post-step parameters are the live ones), else the live model's when the step is
    the last one and no step started since; else None and why not."""
    if replayed.bitwise and left:
        return left, "from the bitwise replay"
    keeper = dbg._replay
    last = kept.step == max(keeper.kept) and not keeper.in_step and dbg.session.step_index == kept.step + 1
    if last:
        return after_step(kept.state, model), "from the live model after its last step"
    why = "its replay failed" if replayed.error else "its replay was not bitwise"
    return None, (f"step {kept.step}'s replay cannot stand for the live run ({why}) and later steps have "
                  f"changed the live parameters: re-save right after the step to check them")


def save_repro(dbg: Any, path: Any, step: Any = "last", node: str | None = None, *,
               model_factory: str | None = None) -> str:
    """Write the reproduction folder of ``step`` (``node``: of that op only); returns its path."""
    folder = os.fspath(path)
    if os.path.exists(folder) and os.listdir(folder):
        raise FileExistsError(f"{folder} exists and is not empty: save_repro writes a new folder")
    kept = dbg._replay.get(step) if dbg._replay is not None else dbg.replay(step)  # the latter raises
    rs = dbg.backend.replay_state()
    fw = dbg.backend.repro()
    if hasattr(fw, "check"):  # what the framework's script cannot rebuild, refused before the replay
        fw.check(node, model_factory)
    call: dict[str, Any] = {}

    def tap(n: Any, _tensors: Any, c: Any) -> None:
        if n.name == node and c is not None and "args" not in call:
            a, k, _ = rs.keep_args(c[0], c[1] or {})
            call["args"], call["kwargs"] = a, k
            context = getattr(rs, "op_context", None)  # the framework's context of the op (torch: autocast)
            if context is not None:
                call["context"] = context()
            call["out"] = rs.keep_args((c[2],), {})[0][0]
            call["written"] = written_slots(node, c)

    left: dict[str, Any] = {}  # the values the step left, where the framework's script checks them
    after_step = getattr(fw, "after_step", None) if node is None else None
    model = dbg._adapter.model_ref()
    read = lambda: left.update(after_step(kept.state, model))  # noqa: E731 - at the replay's end
    replayed = replay(dbg, kept, "mix", tap=tap if node is not None else None,
                      after=read if after_step is not None else None, keep=(node,) if node is not None else ())
    version, _device = dbg.backend.info(model)
    header = (f"Reproduction of step {kept.step}" + (f", op {node}" if node else "") +
              f", written by nbdebug {_version()} ({dbg.backend.name} {version}, Python {platform.python_version()})."
              f"\n\nRun: python repro.py  (exit status 0: bitwise identical to the original)")
    if node is not None:
        if node not in replayed.graph.nodes:
            raise KeyError(f"no node {node!r} in step {kept.step} at mix")
        if "args" not in call:
            raise ValueError(f"{node} is not an op call whose arguments can be saved (a module or backward node): "
                             f"name a Functional/Torch/Tensor op of the step")
        args, kwargs = as_called(replayed, node, call, rs)
    made = not os.path.exists(folder)
    os.makedirs(folder, exist_ok=True)
    try:
        if node is not None:
            more = {"context": call["context"]} if "context" in call else {}
            out = fw.save_op(folder, node, (args, kwargs), call["out"], header, **more)
        else:
            expected = kept.outputs[0] if kept.outputs else None
            more = {}
            if after_step is not None:
                more["after"], more["after_note"] = live_after(dbg, kept, replayed, left, model, after_step)
            out = fw.save_step(folder, model, kept.state, kept.fn, kept.objects, expected, model_factory, header,
                               **more)
    except BaseException:  # refused (a name the script cannot rebuild…): nothing left behind
        if made:
            shutil.rmtree(folder, ignore_errors=True)
        raise
    manifest = dict(out["manifest"], step=kept.step, framework=dbg.backend.name, framework_version=version,
                    nbdebug=_version(), python=platform.python_version(), numpy=np.__version__,
                    bitwise_replay=replayed.bitwise)
    with open(os.path.join(folder, MANIFEST), "w") as f:
        json.dump(manifest, f)
    with open(os.path.join(folder, STATS), "w") as f:
        json.dump(_stats_json(replayed), f)
    with open(os.path.join(folder, "repro.py"), "w") as f:
        f.write(out["script"])
    return folder


def load_repro(path: Any) -> OfflineSession:
    """A reproduction folder opened for reading (``panel()``, ``stats``, ``first_nonfinite``), from its JSON and
    arrays only — no code from the folder runs. ``.meta`` is the manifest; ``.meta["arrays"]`` the saved
    tensors as NumPy arrays (the op's arguments and output for a ``node=`` folder)."""
    folder = os.fspath(path)
    mpath = os.path.join(folder, MANIFEST)
    if not os.path.isfile(mpath):
        raise FileNotFoundError(f"{folder} is not a reproduction folder (no {MANIFEST}): write one with "
                                f"dbg.save_repro(path, step)")
    with open(mpath) as f:
        manifest = json.load(f)
    with open(os.path.join(folder, STATS)) as f:
        stats = json.load(f)
    session = DumpSession(framework=manifest["framework"])
    for order, (name, kind, op_type, scope, section) in enumerate(stats["nodes"]):
        session.graph.add_node(name, kind=kind, op_type=op_type, scope=scope, section=section).order = order
    for src, dst, a, b in stats["edges"]:
        session.graph.add_edge(src, dst, a, b)
    keys = [tuple(k) for k in stats["keys"]]
    for (name, slot), shape, dtype in zip(keys, stats["shapes"], stats["dtypes"], strict=True):
        session.graph.nodes[name].shapes[slot] = tuple(shape)
        session.graph.nodes[name].dtypes[slot] = dtype
    session.add_step(stats["step"], keys, stats["dtypes"], [tuple(s) for s in stats["shapes"]],
                     np.asarray(stats["values"], dtype=np.float64))
    manifest["arrays"] = backend_named(manifest["framework"]).repro().read_arrays(folder, manifest["tensors"])
    return OfflineSession(session, path=folder, layout="repro", meta=manifest)
