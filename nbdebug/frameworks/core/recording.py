"""Slot recording: one tensor of one node — statistics row, retention, producer and edge.

This is the per-tensor hot path of both frameworks. A tensor already measured this step (the previous
op's output is this op's input) reuses its row; otherwise the framework's
:class:`~nbdebug.frameworks.core.tensor_ops.TensorOps` measures it. A tensor nobody produced this step
gets an origin node: a parameter, a buffer (``Constant.*``), an argument of the outermost call
(``Input.N``) — or, when it was computed inside a module call that records no ops at this level, that
call (slot ``internal``): an ``Input`` node there would claim the model's data as the origin of a value
the module computed. At L1, where module calls are no nodes, such a value is an ``Input.N`` in the
scope of the module that made it. The optimizer's own state (moments, step counts) has no origin node.

Retention: values are offered to the session's store as the framework's references (copies for
parameters); the ops of the optimizer section keep statistics only, unless a value watchpoint pins
their node (a reference to each moment the next op overwrites would need a copy per op and parameter).

>>> from nbdebug.frameworks.core.records import Seen
>>> Seen(None, 0, 3, "float32", None).row
3
"""

from __future__ import annotations

import weakref
from typing import Any

from . import native
from .records import Seen, Size

INTERNAL = "internal"  # producer slot of a value computed inside a module call without recorded ops


class Recording:
    """Mixin of :class:`~nbdebug.frameworks.core.capture.Capture`: the per-tensor part."""

    def slot(self, node: Any, slot: str, t: Any, *, as_input: bool, copy: bool = False,
             origin: bool = True, keep: bool = True) -> Seen:
        """Record one tensor of ``node``: stats row (deduplicated), shape, retention, edge.

        ``origin``: an input nobody produced gets an origin node (forward only); ``keep``: offer the
        value for retention; ``copy``: retain a private copy (parameters)."""
        tid = id(t)
        ver = self.version(t)
        seen = self._seen.get(tid)
        if seen is None or seen.version != ver or seen.ref() is not t:
            old = seen if seen is not None and seen.ref() is t else None
            seen = self.measure(self.buf, t, ver)
            if old is not None:  # modified in place by something not captured: same producer
                seen.producer = old.producer
            self._seen[tid] = seen
        return self._record(seen, node, slot, t, as_input, copy, origin, keep)

    def _record(self, seen: Seen, node: Any, slot: str, t: Any, as_input: bool, copy: bool, origin: bool,
                keep: bool) -> Seen:
        """:meth:`slot` once the tensor's record ``seen`` is settled (the native ``slot`` hands the cases it
        does not handle itself here)."""
        tid = id(t)
        name = node.name
        key = (name, slot)
        session = self.session
        dtype = seen.dtype
        if dtype is None:  # metadata settled at the next flush (resolve)
            i = session.recorder.add(key, seen.row, "", (), 0)
            self._unresolved.append((i, node, slot, seen.row))
            node.shapes.setdefault(slot, ())
        else:
            i = session.recorder.add(key, seen.row, dtype, seen.shape, seen.count)
            node.shapes[slot] = seen.shape
            node.dtypes[slot] = dtype
        why = seen.why
        if why is not None:
            if dtype is not None:
                session.recorder.unsupported[i] = why
            keep = False
        if self.tap is not None:
            self._tapped.setdefault(name, []).append((slot, t))
        if keep:
            pinned = session.pinned
            pinned = bool(pinned) and name in pinned
            # retention (inline: the hot path); the optimizer's ops keep statistics only unless watched
            if pinned or (self.retain and node.section != "optimizer"):
                store = session.store
                handle = seen.handle
                if handle is None:
                    nbytes = seen.nbytes
                    if nbytes is not None and not pinned and store.used + nbytes > store.budget:
                        store.offer(key, Size(nbytes))
                    else:
                        handle = seen.handle = self.ops.reference(t, seen, copy or self.retain_copy)
                elif copy and not handle.copied:  # first kept by reference (an op's input): a parameter
                    handle.snapshot()             # keeps the value the model used, whatever runs next
                if handle is None:
                    pass
                elif dtype is None:  # the size is known at the flush: offered then
                    self._offers.append((key, handle, seen.row))
                elif pinned:
                    store.offer(key, handle, force=True, inputs_too=name in session.kept)
                else:
                    store.offer(key, handle)
        if as_input:
            producer = seen.producer
            if producer is None and origin:
                producer = seen.producer = self.origin(t)
            if producer is not None:
                session.graph.add_edge(producer[0], name, producer[1], slot)
            if self._also:  # the other data inputs of the unrecorded call that made ``t``
                extra = self._also.get(tid)
                if extra is not None and extra[0]() is t:
                    for p in extra[1]:
                        session.graph.add_edge(p[0], name, p[1], slot)
        return seen

    if native.fastats is not None and hasattr(native.fastats, "slot"):
        #: the same method in C (``_recorder.c``): no Python frame for the common case; ``slot_py`` is the reference
        slot_py, slot = slot, native.fastats.slot

    def resolve(self, meta: dict[int, tuple]) -> None:
        """Fill in deferred metadata (``meta[row] = (dtype, shape, count, why, nbytes)``) and offer the
        values waiting for their size; rows not measured yet stay pending."""
        rec = self.session.recorder
        unresolved, self._unresolved = self._unresolved, []
        offers, self._offers = self._offers, []
        for item in unresolved:
            i, node, slot, row = item
            if row not in meta:  # queued by the training thread after this flush started
                self._unresolved.append(item)
                continue
            dtype, shape, count, why, _ = meta[row]
            node.shapes[slot] = shape
            node.dtypes[slot] = dtype
            if i < len(rec.rows) and rec.rows[i] == row:
                rec.dtypes[i], rec.shapes[i], rec.counts[i] = dtype, shape, count
                if why is not None:
                    rec.unsupported[i] = why
        store = self.session.store
        for item in offers:
            key, handle, row = item
            if row not in meta:
                self._offers.append(item)
                continue
            if not handle.nbytes:
                handle.nbytes = meta[row][4]
            store.offer(key, handle)

    def alias(self, new: Any, old: Any) -> None:
        """``new`` (an identity or view of ``old`` inserted by the capture) carries ``old``'s record, and
        its origin is ``old``'s."""
        seen = self._seen.get(id(old))
        if seen is not None and seen.ref() is old:
            self._seen[id(new)] = seen.alias(weakref.ref(new), self.version(new))
        self._alias[id(new)] = (weakref.ref(new), weakref.ref(old))

    def derived(self, new: Any, old: Any, also: Any = ()) -> None:
        """``new`` is the result of an unrecorded call on ``old`` (a ``contiguous()`` copy, a view): its
        origin is ``old``'s. When ``old``'s producer is known now, it is kept with the link: ``old`` is
        often a temporary gone before ``new`` is used (``x.transpose(1, 2).contiguous()``). ``also``: the
        call's other data tensors (``grouped_mm``'s weight): each consumer of ``new`` gets an edge from
        their producers too, so their data flow does not end at the unrecorded call."""
        producer = None
        seen = self._seen.get(id(old))
        if seen is not None and seen.ref() is old:
            producer = seen.producer
        else:
            link = self._alias.get(id(old))
            if link is not None and link[0]() is old and len(link) > 2:
                producer = link[2]
        ref = weakref.ref(new)
        self._alias[id(new)] = (ref, weakref.ref(old)) if producer is None else (ref, weakref.ref(old), producer)
        extra = self._also.get(id(old)) if self._also else None
        extra = list(extra[1]) if extra is not None and extra[0]() is old else []
        for t in also:
            p = self._known_producer(t)
            if p is not None and p not in extra:
                extra.append(p)
            more = self._also.get(id(t))
            if more is not None and more[0]() is t:
                extra.extend(q for q in more[1] if q not in extra)
        if extra:
            self._also[id(new)] = (ref, extra)

    def _known_producer(self, t: Any) -> tuple[str, str] | None:
        seen = self._seen.get(id(t))
        if seen is not None and seen.ref() is t and seen.producer is not None:
            return seen.producer
        return self.made_from(t)

    def made_from(self, t: Any) -> tuple[str, str] | None:
        """The producer of the tensor ``t`` is an unrecorded view or copy of (see :meth:`derived`), if known."""
        alias = self._alias.get(id(t))
        if alias is None or alias[0]() is not t:
            return None
        if len(alias) > 2:
            return alias[2]
        base = alias[1]()
        seen = self._seen.get(id(base)) if base is not None else None
        return seen.producer if seen is not None and seen.ref() is base else None

    def origin(self, t: Any) -> tuple[str, str] | None:
        """The producer of a tensor nobody produced this step (see the module docstring); None for the
        optimizer's state."""
        alias = self._alias.get(id(t))
        base = alias[1]() if alias is not None and alias[0]() is t else None
        if alias is not None and alias[0]() is t and len(alias) > 2:  # its producer, known when it was made
            return alias[2]
        if base is not None:  # an alias of a tensor / an unrecorded call's result: that tensor's origin
            seen = self._seen.get(id(base))
            seen = seen if seen is not None and seen.ref() is base else None
            if seen is not None and seen.producer is not None:
                return seen.producer
            producer = self.origin(base)
            seen = self._seen.get(id(base))  # made just now when ``base`` got an origin node
            if seen is not None and seen.ref() is base and seen.producer is None:
                seen.producer = producer
            return producer
        info = self._param_info.get(id(t))
        if info is not None and info[0]() is t:
            return self.param_node(t, info), "output.0"
        binfo = self._buffer_info.get(id(t))
        s = self.session
        if binfo is not None and binfo[0]() is t:
            name = f"Constant.{binfo[1]}"
            node = s.node(name, kind="constant", op_type="buffer", scope=self.scope_str())
        else:
            inner = self.open_call()
            if inner is not None and id(t) not in self._root_args:
                return inner, INTERNAL
            if self.section == "optimizer":  # the optimizer's own state (moments, step counts): no origin
                return None
            name = f"Input.{self._inputs}"
            self._inputs += 1
            # a model input sits at the top; a value made inside a module without recorded ops (at L1,
            # where module calls are no nodes) sits in that module's scope, where the panel groups it
            scope = "" if id(t) in self._root_args else self.scope_str()
            node = s.node(name, kind="input", op_type="input", scope=scope)
        self.slot(node, "output.0", t, as_input=False)
        return name, "output.0"

    def param_node(self, p: Any, info: tuple) -> str:
        """The ``Parameter.{qual}`` node, recorded at its first use in the step."""
        qual, path = info[1], info[2]
        name = f"Parameter.{qual}"
        if id(p) not in self._param_seen:
            self._param_seen.add(id(p))
            node = self.session.node(name, kind="parameter", op_type="Parameter", scope=path.replace(".", "/"))
            seen = self.slot(node, "output.0", p, as_input=False, copy=True)
            seen.producer = (name, "output.0")
        return name

    def emit_node(self, node: Any, call: tuple | None = None) -> None:
        """``node`` finished executing: its execution order is its completion order. ``call``:
        ``(args, kwargs, output)`` of a forward call, for the tap (dump writers)."""
        if self.tap is not None:
            self.tap(node, self._tapped.pop(node.name, []), call)
        done = self._done
        if node.name in done:  # a node with several gradient slots completes once
            return
        done.add(node.name)
        announce(self, node)


#: a call's output in the ``(args, kwargs, output)`` a tap is given when the call raised before it made one (a
#: checkpoint's early stop inside the op): its entry has inputs and no output, as msProbe's
NO_OUTPUT = type("NoOutput", (), {"__repr__": lambda self: "NO_OUTPUT"})()


def announce(owner: Any, node: Any) -> None:
    """``node`` finished executing: its execution order is its completion order; the session's ``node``
    listeners hear of it (``owner.busy`` set meanwhile, so a pause there does not capture itself)."""
    s = owner.session
    node.order = s.order
    s.order += 1
    if s.has_listeners("node"):
        owner.busy = True
        try:
            s.emit("node", node)
        finally:
            owner.busy = False
