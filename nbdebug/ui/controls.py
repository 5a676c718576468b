"""Training control: step count + OK, CONTINUE, PAUSE, TERMINATE, run to the selected node, next node.

Buttons are enabled by the training state:

=========== ====== ======== ===== ========= ====== ====
state       OK     CONTINUE PAUSE TERMINATE run to next
=========== ====== ======== ===== ========= ====== ====
idle        –      –        –     –         –      –
running     –      –        yes   yes       –      –
paused      yes    yes      –     yes       yes*   yes
over        –      –        –     –         –      –
closed      –      –        –     –         –      –
=========== ====== ======== ===== ========= ====== ====

(* when a node is selected.) While idle the bar says how to start training under the debugger; after a
failure it shows the exception and the node that ran last; once the debugger is closed (``dbg.close()``)
it says so and every control stays disabled. Each button only posts a command to the training thread, so a click
returns at once, even while a step is running.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any

import ipywidgets as w

from .kit import Kit
from .source import SourceView

START_HINT = ("Training has not started. Run your training function under the debugger, e.g. "
              "<code>dbg.run(train, paused=True)</code> — it runs on a worker thread and waits here for "
              "CONTINUE or OK.")


def paused_text(reason: str | None, node: str | None) -> str:
    """The control bar's line while paused: where, and why when there is more to say than "paused".

    >>> paused_text("paused", None)
    'Paused.'
    >>> paused_text("2 watchpoint hits in step 3", "Torch.log.0.forward")
    'Paused at <code>Torch.log.0.forward</code>: 2 watchpoint hits in step 3.'
    """
    where = f" at <code>{html.escape(node)}</code>" if node else ""
    why = (reason or "").strip().rstrip(".")
    if why.lower() in ("", "paused"):
        return f"Paused{where}."
    return f"Paused{where}: {html.escape(why)}."


def idle_text(source: Any) -> str:
    """The line while no ``dbg.run`` drives training: the start hint before any step; once steps were
    recorded (training called directly, outside ``dbg.run``), how many, and that control needs ``dbg.run``."""
    session = source.session
    steps = int(getattr(session, "step_index", 0) or 0)
    if steps <= 0 and source.step < 0:
        return START_HINT
    steps = max(steps, source.step + 1)
    return (f"{steps} step{'s' if steps != 1 else ''} recorded; training is not running under the debugger's "
            "control now (it ran outside <code>dbg.run</code>, or has returned). To pause, step and continue "
            "from here, run it as <code>dbg.run(train, paused=True)</code>.")


class Controls:
    """The control bar of a live session; ``selected()`` gives the node for "run to"."""

    def __init__(self, source: SourceView, selected: Callable[[], str | None] = lambda: None,
                 on_action: Callable[[], Any] = lambda: None) -> None:
        self.source = source
        self.selected = selected
        self.on_action = on_action
        self._kit = Kit()  # the labels' and buttons' Layout and style models, shared
        self.step_count = w.BoundedIntText(value=1, min=1, max=10**9, description="steps",
                                           layout=w.Layout(width="150px"), style={"description_width": "40px"},
                                           _dom_classes=("nbdebug-step-count",))
        self.ok = self._button("OK", "nbdebug-step-ok", "run this many steps (stops earlier on a hit)",
                               lambda: self.source.command("cont", int(self.step_count.value)))
        self.cont = self._button("CONTINUE", "nbdebug-continue", "run until a watchpoint hit or the end",
                                 lambda: self.source.command("cont"), button_style="success")
        self.pause = self._button("PAUSE", "nbdebug-pause", "pause at the next node",
                                  lambda: self.source.command("pause"))
        self.terminate = self._button("TERMINATE", "nbdebug-terminate", "end the training cleanly",
                                      lambda: self.source.command("terminate"), button_style="danger")
        self.run_to = self._button("run to selected node", "nbdebug-run-to",
                                   "run until the selected node has executed (at most one step)",
                                   self._run_to)
        self.next_node = self._button("next node", "nbdebug-next-node", "execute one more node",
                                      lambda: self.source.command("next_node"))
        self.status = self._kit.html(classes=("nbdebug-control-status",))
        self.widget = w.VBox([
            self._kit.html("<b>Training control</b>"),
            w.HBox([self.step_count, self.ok, self.cont, self.pause, self.terminate],
                   layout=w.Layout(flex_flow="row wrap")),
            w.HBox([self.run_to, self.next_node], layout=w.Layout(flex_flow="row wrap")),
            self.status,
        ], _dom_classes=("nbdebug-controls",))
        self._state: Any = None
        self.refresh()

    def _button(self, text: str, css: str, tooltip: str, action: Callable[[], Any],
                button_style: str = "") -> w.Button:
        b = self._kit.button(text, tooltip, classes=(css,), button_style=button_style, width="auto")

        def click(_b: Any) -> None:
            try:
                action()
            except Exception as e:  # noqa: BLE001 - a refused command is shown, not raised into the frontend
                self.status.value = f"<span style='color:#cf222e'>{html.escape(str(e))}</span>"
                return
            self.on_action()

        b.on_click(click)
        return b

    def _run_to(self) -> None:
        name = self.selected()
        if name is None:
            raise ValueError("select a node first (in the graph or the node list)")
        self.source.command("run_to", name)

    def refresh(self, force: bool = False) -> None:
        state = self.source.state
        sel = self.selected()
        sig = (state, sel is not None, self.source.pause_reason, self.source.current_node,
               self.source.error is not None,
               self.source.step if state == "idle" else None)  # idle: "N steps recorded" follows the steps
        if sig == self._state and not force:
            return
        self._state = sig
        paused = state == "paused"
        running = state == "running"
        for b, on in ((self.ok, paused), (self.step_count, paused), (self.cont, paused), (self.pause, running),
                      (self.terminate, paused or running), (self.run_to, paused and sel is not None),
                      (self.next_node, paused)):
            if b.disabled != (not on):
                b.disabled = not on
        if state == "idle":
            text = idle_text(self.source)
        elif state == "running":
            text = "Training is running."
        elif paused:
            text = paused_text(self.source.pause_reason, self.source.current_node)
        elif state == "closed":
            text = ("The debugger is closed: its hooks are removed and there is no training to control. "
                    "Create a new <code>nbdebug.Debugger(model)</code> to debug again.")
        elif state == "failed":
            err = self.source.error or ""
            last = err.strip().splitlines()[-1] if err.strip() else "unknown error"
            node = self.source.failed_node
            where = f" (last node: <code>{html.escape(node)}</code>)" if node else ""
            what = "interrupted" if last.split(":")[0] == "KeyboardInterrupt" else "failed"  # the kernel's Interrupt
            text = (f"<span style='color:#cf222e'>Training {what}: {html.escape(last)}</span>{where}"
                    f"<details><summary>traceback</summary><pre style='font-size:11px'>{html.escape(err)}</pre>"
                    "</details>")
        elif state == "connecting":  # a remote process between its hello and its state (nbdebug.listen)
            text = "The process is connecting: its state and step follow."
        else:
            text = f"Training {html.escape(state)}."
        if self.status.value != text:
            self.status.value = text

    def buttons(self) -> dict[str, w.Button]:
        return {"ok": self.ok, "continue": self.cont, "pause": self.pause, "terminate": self.terminate,
                "run_to": self.run_to, "next_node": self.next_node}
