"""Calls: module call and return, backward nodes and gradient slots, parameter gradients, optimizer step.

The framework adapters decide *when* these happen (hooks, wrappers) and what else they do (gradient
probes, dump taps); the names, slots, edges and order are decided here, the same for every framework:

* a module call is ``{prefix}.{path}.{Class}.forward.{n}`` (``Module`` for PyTorch, ``Cell`` for
  MindSpore, as msProbe names them) with its inputs and ``parameters.{local}`` slots; its return records
  the outputs and, for a container that computed its result itself, edges from its inputs;
* a backward node is created once per step and completes once, however many gradient slots it gets;
* ``{prefix}.{path}.{Class}.parameters_grad.{n}`` holds one backward into a parameter (slot ``local``);
* ``Optimizer.{Class}.step.{n}`` holds the updated parameters (statistics only: the updated value is the
  next step's ``Parameter`` node), with edges from each parameter and its last gradient.

>>> module_base("Cell", "fc1", "Dense")
'Cell.fc1.Dense'
"""

from __future__ import annotations

from typing import Any

from .recording import INTERNAL


def module_base(prefix: str, path: str, cls: str) -> str:
    return f"{prefix}.{path}.{cls}" if path else f"{prefix}.{cls}"


def _flip(slot: str) -> str:
    """A forward slot as the backward slot of the same tensor's gradient: ``input.j`` <-> ``output.j``."""
    if slot.startswith("input."):
        return "output." + slot[6:]
    if slot.startswith("output."):
        return "input." + slot[7:]
    return slot


def parent_scope(path: str) -> str:
    return path.rpartition(".")[0].replace(".", "/") if path else ""


class Calls:
    """Mixin of :class:`~nbdebug.frameworks.core.capture.Capture`: the per-call part."""

    # -- module calls -----------------------------------------------------------------------------
    def enter(self, path: str) -> None:
        """A module call begins (every module, named or not): its scope is the innermost now."""
        self._scope.append(path.replace(".", "/"))
        self._open.append(None)

    def leave(self) -> None:
        self._scope.pop()
        self._open.pop()

    def scope_str(self) -> str:
        return self._scope[-1] if self._scope else ""

    def open_call(self) -> str | None:
        """The innermost module call in progress that is a node (None: none, or only the root)."""
        for name in reversed(self._open):
            if name is not None:
                return name
        return None

    def note_root_args(self, args: tuple, kwargs: dict | None) -> None:
        """The outermost call's arguments: the model's inputs (``Input.N`` when nobody produced them)."""
        self._root_args = {id(t) for _, t in self.arguments(args, kwargs)}

    def module_call(self, key: int, path: str, cls: str, leaf: bool, args: tuple, kwargs: dict | None,
                    params: Any, snapshot_inputs: bool = False) -> Any:
        """Record the forward call of a module (inputs, parameters); returns its node.

        ``params``: ``(local name, parameter)`` pairs; ``snapshot_inputs``: the module overwrites its
        input (an in-place activation): copy retained references before it runs."""
        calls = self._module_calls.setdefault(key, [])
        n = len(calls)
        names = self._module_names.get(key)
        if names is None:
            names = self._module_names[key] = (module_base(self.module_prefix, path, cls), parent_scope(path))
        base = names[0]
        name = f"{base}.forward.{n}"
        calls.append(name)
        node = self.session.node(name, kind="module", op_type=cls, scope=names[1], stack=self.stack,
                                 pair=f"{base}.backward.{n}")
        for slot, t in self.arguments(args, kwargs):
            seen = self.slot(node, slot, t, as_input=leaf)
            if snapshot_inputs and seen.handle is not None:
                seen.handle.snapshot()
        graph = self.session.graph
        for local, p in params:
            info = self._param_info.get(id(p))
            if info is None or info[0]() is not p:
                continue
            pname = self.param_node(p, info)
            self.slot(node, f"parameters.{local}", p, as_input=False, copy=True)
            graph.add_edge(pname, name, "output.0", f"parameters.{local}")
        if self._open:  # from now on, values computed without recorded ops are this call's
            self._parents[name] = self.open_call()
            self._open[-1] = name
        return node

    def module_return(self, node: Any, leaf: bool, args: tuple, kwargs: dict | None, output: Any) -> None:
        """Record a module call's outputs; a container computing its own result gets edges from its inputs."""
        name = node.name
        produced = False
        for slot, t in self.outputs(output):
            seen = self.slot(node, slot, t, as_input=False)
            p = seen.producer
            if p is None:  # an unrecorded view or copy of an op's result inside the call (mix): that op's
                p = seen.producer = self.made_from(t)
            if p is None or p[0].startswith("Input.") or (p[0] == name and p[1] == INTERNAL):
                seen.producer = (name, slot)
                produced = True
        if not leaf and (produced or not self.session.graph.predecessors(name)):
            # a container that computed its result, or whose result its children computed (the data
            # flows into it all the same: without an edge it would float apart from the flow)
            graph = self.session.graph
            for slot, t in self.arguments(args, kwargs):
                s = self._seen.get(id(t))
                if s is not None and s.producer is not None and s.producer[0] != name:
                    graph.add_edge(s.producer[0], name, s.producer[1], slot)

    def last_call(self, key: int) -> Any:
        """The node of a module's call in progress (None when it was not recorded)."""
        calls = self._module_calls.get(key)
        return self.session.graph.nodes[calls[-1]] if calls else None

    # -- backward ---------------------------------------------------------------------------------
    def backward_node(self, name: str, scope: str, pair: str | None, kind: str) -> Any:
        """The backward node ``name`` of this step (created at its first gradient)."""
        if name in self._bwd_started:
            return self.session.graph.nodes[name]
        self._bwd_started.add(name)
        nodes = self.session.graph.nodes
        if kind == "module":
            op_type = name.split(".")[-3]
        elif kind == "parameter":
            op_type = "parameters_grad"
        else:
            op_type = nodes[pair].op_type if pair in nodes else name
        node = self.session.node(name, kind=kind, op_type=op_type, scope=scope, section="backward", pair=pair)
        if pair is not None:
            self.mirror_edges(name, pair)
        return node

    def mirror_edges(self, name: str, fwd: str, slot: str | None = None) -> None:
        """Edges of backward node ``name`` (the backward of forward node ``fwd``) that mirror the forward
        data flow, whatever tensors autograd passes: for each forward edge ``fwd`` → C whose backward ran
        this step, C's backward sends ``name`` the gradient (C's ``output.j`` for its ``input.j``, into
        ``name``'s ``input.k`` for ``fwd``'s ``output.k``; ``slot`` overrides the latter); for each forward
        edge P → ``fwd`` whose backward ran already (two forward nodes sharing one autograd node),
        ``name`` sends P's backward its gradient."""
        graph = self.session.graph
        nodes = graph.nodes
        started = self._bwd_started
        for c in graph.successors(fwd):
            cn = nodes.get(c)
            if cn is not None and cn.section == "forward" and cn.pair in started and cn.pair != name:
                for out_slot, in_slot in graph.edges[(fwd, c)]:
                    graph.add_edge(cn.pair, name, _flip(in_slot), slot or _flip(out_slot))
        if slot is not None:
            return
        for p in graph.predecessors(fwd):
            pn = nodes.get(p)
            if pn is not None and pn.section == "forward" and pn.pair in started and pn.pair != name:
                for out_slot, in_slot in graph.edges[(p, fwd)]:
                    graph.add_edge(name, pn.pair, _flip(in_slot), _flip(out_slot))

    def link_backward(self) -> None:
        """At the step end, a backward node of this step that nothing feeds gets its gradient from the
        backward of the module call it ran inside (a module's input gradient, at L0, where the ops between
        are not recorded), else from its own forward node: the loss, where the backward pass starts."""
        graph = self.session.graph
        nodes = graph.nodes
        for name in self._bwd_started:
            node = nodes.get(name)
            if node is None or node.pair is None or graph.predecessors(name):
                continue
            parent = self._parents.get(node.pair)
            parent_bwd = nodes[parent].pair if parent in nodes else None
            if parent_bwd in self._bwd_started and parent_bwd != name:
                graph.add_edge(parent_bwd, name, INTERNAL, "input.0")
            elif node.pair in nodes:
                graph.add_edge(node.pair, name, "output.0", "input.0")

    def gradient(self, name: str, scope: str, pair: str | None, kind: str, slot: str, grad: Any,
                 is_input: bool) -> Any:
        """One gradient of backward node ``name``: ``input.*`` the gradient of an output coming in,
        ``output.*`` a gradient the node produces. Returns the node (to emit)."""
        node = self.backward_node(name, scope, pair, kind)
        seen = self.slot(node, slot, grad, as_input=is_input, origin=False)
        if not is_input:
            seen.producer = (name, slot)
        return node

    def parameter_gradient(self, qual: str, base: str, scope: str, local: str, grad: Any) -> Any:
        """One backward into parameter ``qual`` under its owner ``base`` (``….parameters_grad``)."""
        n = self._pgrad_calls.get((base, local), 0)
        self._pgrad_calls[(base, local)] = n + 1
        name = f"{base}.{n}"
        self._pgrad_last[qual] = (name, local)
        node = self.backward_node(name, scope, None, "parameter")
        seen = self.slot(node, local, grad, as_input=False)
        if seen.producer is None:
            seen.producer = (name, local)
        graph = self.session.graph
        if f"Parameter.{qual}" in graph.nodes:
            graph.add_edge(f"Parameter.{qual}", name, "output.0", local)
            self.mirror_edges(name, f"Parameter.{qual}", local)  # the backward of each use of the parameter
        return node

    # -- optimizer --------------------------------------------------------------------------------
    def optimizer_done(self, cls: str, params: list[tuple[str, Any]], state: Any = ()) -> None:
        """The model's optimizer ran: its node (none at the monitor level), then the step end unless the user
        marks steps. ``state``: ``(qual, key, tensor)`` of the optimizer's per-parameter state after the step
        (see :meth:`optimizer_step`)."""
        if self.capturing and self.level.records_tensors:
            self.busy = True
            try:
                with self.ops.quiet():
                    node = self.optimizer_step(cls, params, state)
            finally:
                self.busy = False
            self.emit_node(node)
        self.section = "forward"
        if self.auto_step and self.capturing:
            self.end_step()

    def optimizer_step(self, cls: str, params: list[tuple[str, Any]], state: Any = ()) -> Any:
        """Record an optimizer's step over ``(qual, parameter)`` pairs, after it ran; returns the node.

        ``state``: ``(qual, key, tensor)`` triples, the optimizer's state after the step (``exp_avg`` ...),
        recorded as slots ``{key}.{qual}``: the per-parameter statistics of the step whichever
        implementation ran it (one op per parameter, ``foreach`` lists, a fused kernel); each gets an edge
        from the op of the step that wrote it last (AdamW's ``Tensor.__iadd__`` of ``state['step']``). A kernel that
        updates tensors without bumping their version counter: the adapter drops their records first."""
        name = f"Optimizer.{cls}.step.{self._opt_calls}"
        self._opt_calls += 1
        node = self.session.node(name, kind="op", op_type="step", scope="optimizer", section="optimizer")
        graph = self.session.graph
        refuse = self.session.store.refuse
        names = self._opt_names.get(name)
        if names is None:
            names = self._opt_names[name] = {}
        versions = self.ops.has_versions
        for qual, p in params:
            named = names.get(qual)
            if named is None:  # the same strings every step: no formatting per slot and step
                slot = f"parameters.{qual}"
                named = names[qual] = (slot, (name, slot), f"Parameter.{qual}", (
                    f"not retained: {name} {slot} is kept as statistics only; "
                    f"the updated value is Parameter.{qual} output.0 of the next step"))
            slot, key, pnode, reason = named
            if not versions:  # updated in place, and no version counter says so: measure again
                self._seen.pop(id(p), None)
            self.slot(node, slot, p, as_input=False, keep=False)
            refuse(key, reason)
            if pnode in graph.nodes:
                graph.add_edge(pnode, name, "output.0", slot)
            last = self._pgrad_last.get(qual)
            if last is not None:
                graph.add_edge(last[0], name, last[1], slot)
        for qual, key, t in state:
            named = names.get((key, qual))
            if named is None:
                slot = f"{key}.{qual}"
                reason = f"not retained: {name} {slot} is kept as statistics only"
                named = names[(key, qual)] = (slot, (name, slot), reason)
            slot, skey, reason = named
            if not versions:
                self._seen.pop(id(t), None)
            producer = self.slot(node, slot, t, as_input=False, origin=False, keep=False).producer
            if producer is not None and producer[0] != name:  # the op of this step that wrote it last
                graph.add_edge(producer[0], name, producer[1], slot)
            refuse(skey, reason)
        return node
