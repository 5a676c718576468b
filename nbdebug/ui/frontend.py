"""The kernel side of nbdebug's own front end (``frontend/``, built into ``ui/static/nbdebug-ui.js``).

Every interactive picture of the panel (graph, tensor heatmap, relationship diagram) is a
:class:`FrontendWidget`: an anywidget whose ``_esm`` is a stub of a few hundred bytes. The stub
``import()``s the real module from the labextension's static files, so the browser fetches it once per
page however many panels there are, and the kernel websocket carries only data (see
``frontend/PROTOCOL.md``). Where the labextension is not there (VS Code, Colab, a Jupyter front end
without it) the stub asks the kernel for the bundle instead (``nbdebug-bundle``), once per page, and
imports it from a blob URL.

Nothing is sent before a view has said ``hello`` (:attr:`FrontendWidget.greeted`): a message posted earlier
is recorded and goes out once, in the answer to the view's ``hello``.

Data goes as custom messages, not traits, so a saved notebook's widget state stays small; each widget
remembers the last message of each type (:meth:`FrontendWidget.recorded`) so a view that renders
later (a page reload, a second view) can ask for it again with ``hello``, and so a static snapshot
(``export_html``) can replay it without a kernel.

>>> w = FrontendWidget(view="graph")
>>> w.post({"type": "marks", "badges": {}})      # no browser listening: kept for the next hello
>>> [m["type"] for m in w.recorded()], w.greeted
(['marks'], False)
>>> len(FrontendWidget._esm) < 3000
True

"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anywidget
import traitlets as t

STATIC = Path(__file__).resolve().parent / "static"
BUNDLE = "nbdebug-ui.js"

#: The anywidget module: import the bundle from the labextension's static files (URL from the page's config;
#: the browser caches the module by URL); where that fails (no labextension: VS Code, Colab, a Jupyter
#: front end without it) ask the kernel for it once (``nbdebug-bundle``: the bundle as one buffer) and import
#: it from a blob URL. Either way one load per page (``globalThis.nbdebugUILoading``); export_html sets
#: window.nbdebugUI itself.
STUB = """
function load(model) {
  const g = globalThis;
  if (g.nbdebugUI) return Promise.resolve(g.nbdebugUI);
  if (!g.nbdebugUILoading) {
    let base = "";
    try {
      const cfg = JSON.parse(document.getElementById("jupyter-config-data").textContent);
      base = cfg.fullLabextensionsUrl || (cfg.baseUrl || "/") + "lab/extensions";
    } catch (e) { base = "/lab/extensions"; }
    const url = new URL(base.replace(/\\/$/, "") + "/nbdebug/static/nbdebug-ui.js", location.href).href;
    g.nbdebugUILoading = import(url).then(m => { g.nbdebugUISource = "labextension"; return m; },
                                           () => fromKernel(model))
      .then(m => (g.nbdebugUI = m), e => { g.nbdebugUILoading = null; throw e; });
  }
  return g.nbdebugUILoading;
}
function fromKernel(model) {
  return new Promise((resolve, reject) => {
    const got = (msg, buffers) => {
      if (!msg || msg.type !== "nbdebug-bundle") return;
      model.off("msg:custom", got);
      if (msg.error || !buffers || !buffers.length) { reject(new Error(msg.error || "no bundle")); return; }
      const url = URL.createObjectURL(new Blob([buffers[0]], { type: "text/javascript" }));
      import(url).then(m => { globalThis.nbdebugUISource = "kernel"; resolve(m); }, reject);
    };
    model.on("msg:custom", got);
    model.send({ type: "nbdebug-bundle" });
  });
}
export default {
  async render({ model, el }) {
    let m;
    try { m = await load(model); } catch (e) {
      el.innerHTML = "<div class='nbdebug-missing' style='color:#cf222e'>nbdebug: the front end did not load (" +
        String(e).replace(/</g, "&lt;") + ").</div>";
      return;
    }
    return m.render({ model, el });
  }
};
"""


def bundle_source() -> str:
    """The built front end (for self-contained HTML); a clear error when it has not been built."""
    path = STATIC / BUNDLE
    if not path.is_file():
        raise FileNotFoundError(f"nbdebug's front end is not built ({path}); run `make` "
                                "(or `cd frontend && npm ci && npm run build`)")
    return path.read_text(encoding="utf-8")


class FrontendWidget(anywidget.AnyWidget):
    """One picture drawn by nbdebug's front end; ``view`` picks which (graph, heatmap, relations)."""

    _esm = STUB
    view = t.Unicode("graph").tag(sync=True)
    height = t.Int(420).tag(sync=True)
    status = t.Unicode("live").tag(sync=True)
    #: unique per widget: every view of it in the page shares one cache of the data it was sent
    uid = t.Unicode().tag(sync=True)

    @t.default("uid")
    def _uid(self) -> str:
        return uuid.uuid4().hex

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._last: dict[str, dict[str, Any]] = {}
        self._buffers: dict[str, list[bytes]] = {}  # the buffers of the recorded messages that had some
        self._handlers: dict[str, Callable[[dict[str, Any], list[Any]], Any]] = {}
        #: a view has said ``hello``: before that, messages are only recorded (the view's ``hello`` gets them),
        #: so a panel's data crosses the websocket once, not once on creation and again for the view
        self.greeted = False
        self.on_msg(self._dispatch)

    # -- kernel → browser ---------------------------------------------------------------------------
    def post(self, content: dict[str, Any], buffers: list[Any] | None = None, *, record: bool = True) -> None:
        """Send ``content`` to every view of this widget (and remember it for later views)."""
        if record:
            self._last[content["type"]] = content
            if buffers:
                self._buffers[content["type"]] = [bytes(memoryview(b).cast("B")) for b in buffers]
            else:
                self._buffers.pop(content["type"], None)
        if self.comm is not None and self.greeted:
            self.send(content, buffers)

    def recorded(self) -> list[dict[str, Any]]:
        """The last message of each type, in the order the types were first sent."""
        return list(self._last.values())

    def recorded_buffers(self, msg_type: str) -> list[bytes]:
        """The buffers sent with the recorded message of ``msg_type`` (``[]`` if it had none)."""
        return list(self._buffers.get(msg_type, []))

    def forget(self, *types: str) -> None:
        for ty in types:
            self._last.pop(ty, None)
            self._buffers.pop(ty, None)

    # -- browser → kernel ---------------------------------------------------------------------------
    def handle(self, msg_type: str, handler: Callable[[dict[str, Any], list[Any]], Any]) -> None:
        """Call ``handler(content, buffers)`` for browser messages of ``msg_type``."""
        self._handlers[msg_type] = handler

    def _dispatch(self, _widget: Any, content: Any, buffers: list[Any]) -> None:
        if not isinstance(content, dict):
            return
        ty = content.get("type")
        if ty == "hello":
            self.greeted = True
        elif ty == "nbdebug-bundle":  # the page could not import the labextension's copy
            self._send_bundle()
            return
        handler = self._handlers.get(ty) if isinstance(ty, str) else None
        if handler is not None:
            handler(content, buffers)
        elif ty == "hello":
            for msg in self.recorded():
                self.post(msg, self._buffers.get(msg["type"]), record=False)

    def _send_bundle(self) -> None:
        try:
            data = bundle_source().encode("utf-8")
        except FileNotFoundError as e:
            self.send({"type": "nbdebug-bundle", "error": str(e)}) if self.comm is not None else None
            return
        if self.comm is not None:
            self.send({"type": "nbdebug-bundle", "bytes": len(data)}, [data])

    def receive(self, content: dict[str, Any], buffers: list[Any] | None = None) -> None:
        """Act as if the browser had sent ``content`` (tests, and the static replay)."""
        self._dispatch(self, content, buffers or [])

    def snapshot(self) -> dict[str, Any]:
        """Traits and recorded messages: what ``renderStatic`` needs to draw this widget with no kernel.
        A message's buffers go base64-encoded in its ``buffers_b64`` (``StaticModel`` decodes them)."""
        state = {k: getattr(self, k) for k in self.keys if not k.startswith("_") and k not in (
            "comm", "keys", "log", "layout", "tabbable", "tooltip")}
        messages = [{**m, "buffers_b64": [base64.b64encode(b).decode("ascii") for b in self._buffers[m["type"]]]}
                    if m["type"] in self._buffers else m for m in self.recorded()]
        return {"state": _jsonable(state), "messages": messages}


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    return str(value)
