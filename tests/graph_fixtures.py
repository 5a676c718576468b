"""Graph messages (frontend/PROTOCOL.md) for the graph view's browser tests and benchmarks, and a
harness page that draws them with ``nbdebugUI.renderStatic`` in Chromium.

Graphs: :func:`residual` (one pre-norm residual block with LayerNorm: the skip edge must go beside
the branch), :func:`gpt2` (a GPT-2-like model, forward / backward / optimizer grouped per parameter,
~1.7k nodes at 6 layers) and :func:`synthetic` (``n`` nodes in nested scopes: stages → blocks →
attn/mlp/norm → core).

>>> g = residual()
>>> msg = g.message()
>>> msg["type"], len(msg["nodes"]) == len(g.nodes), msg["scopes"][0][0]
('graph', True, 'forward:')
>>> 1600 < len(gpt2().nodes) < 1800
True
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BUNDLE = REPO / "nbdebug" / "ui" / "static" / "nbdebug-ui.js"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu"]


class GraphBuilder:
    """Nodes, scopes and edges, written out as one ``graph`` message."""

    def __init__(self) -> None:
        self.nodes: list[list[Any]] = []
        self.scopes: dict[str, list[Any]] = {}
        self.edges: list[int] = []
        self.ids: dict[str, int] = {}

    def scope(self, key: str, label: str | None = None) -> str:
        if key in self.scopes:
            return key
        section, _, path = key.partition(":")
        if not path:
            self.scopes[key] = [key, None, section, section, -1, 0]
            return key
        parent = f"{section}:{path.rsplit('/', 1)[0]}" if "/" in path else f"{section}:"
        self.scope(parent)
        self.scopes[key] = [key, parent, label or path.rsplit("/", 1)[-1], section, -1, 0]
        return key

    def node(self, name: str, label: str, cls: str, scope: str, op: str = "", shape: str = "4×8",
             dtype: str = "float32", inputs: tuple[int, ...] = ()) -> int:
        self.scope(scope)
        i = len(self.nodes)
        self.nodes.append([name, label, cls, scope, op or label, i, shape, dtype])
        self.ids[name] = i
        for j in inputs:
            self.edge(j, i)
        return i

    def edge(self, src: int, dst: int) -> None:
        self.edges += [src, dst]

    def message(self, rev: int = 1) -> dict[str, Any]:
        counts = dict.fromkeys(self.scopes, 0)
        for row in self.nodes:
            key = row[3]
            while key is not None:
                counts[key] += 1
                key = self.scopes[key][1]
        scopes = [[*row[:5], counts[row[0]]] for row in self.scopes.values()]
        return {"type": "graph", "rev": rev, "nodes": self.nodes, "scopes": scopes, "edges": self.edges}

    def widget(self, **state: Any) -> dict[str, Any]:
        """What ``renderStatic`` takes: traits and the recorded messages."""
        marks = state.pop("marks", None)
        st = {"view": "graph", "height": 560, "expanded": [], "selected": "",
              "sections": ["forward", "backward", "optimizer"], "status": "offline", **state}
        messages = [self.message()]
        if marks is not None:
            messages.append({"type": "marks", "badges": {}, "paused": -1, "error": -1, "path": [], "step": "", **marks})
        return {"state": st, "messages": messages}


def residual() -> GraphBuilder:
    """x → LayerNorm → Linear → GELU → Linear → Dropout → add(x, ·) → LayerNorm: a pre-norm residual block."""
    g = GraphBuilder()
    s = "forward:block"
    x = g.node("input.x", "x", "input", s, "input")
    ln = g.node("block.ln.LayerNorm.0", "LayerNorm", "op", s, "layer_norm", inputs=(x,))
    fc1 = g.node("block.fc1.Linear.0", "Linear fc1", "op", s, "linear", "4×32", inputs=(ln,))
    act = g.node("block.act.GELU.0", "GELU", "op", s, "gelu", "4×32", inputs=(fc1,))
    fc2 = g.node("block.fc2.Linear.0", "Linear fc2", "op", s, "linear", inputs=(act,))
    drop = g.node("block.drop.Dropout.0", "Dropout", "op", s, "dropout", inputs=(fc2,))
    add = g.node("block.add.0", "add", "op", s, "Tensor.__add__", inputs=(x, drop))
    g.node("final.ln.LayerNorm.0", "LayerNorm final", "op", "forward:", "layer_norm", inputs=(add,))
    for pname, op in (("ln.weight", ln), ("fc1.weight", fc1), ("fc2.weight", fc2)):
        p = g.node(f"block.{pname}", pname, "parameter", s, "parameter", "8×32")
        g.edge(p, op)
    return g


RESIDUAL_BRANCH = ["block.ln.LayerNorm.0", "block.fc1.Linear.0", "block.act.GELU.0", "block.fc2.Linear.0",
                   "block.drop.Dropout.0"]


def gpt2(layers: int = 6) -> GraphBuilder:
    """A GPT-2-like model's step: forward ops in module scopes, a backward mirror with gradients, and the
    AdamW update of each parameter in its own optimizer scope."""
    g = GraphBuilder()
    params: list[tuple[str, int]] = []
    fwd: list[tuple[int, str, str]] = []  # (node, scope path, label)

    def param(path: str, name: str, op: int) -> None:
        p = g.node(f"{path.replace('/', '.')}.{name}", name, "parameter", f"forward:{path}", "parameter", "768×768")
        g.edge(p, op)
        params.append((f"{path.replace('/', '.')}.{name}", p))

    def op(path: str, label: str, kind: str, inputs: tuple[int, ...], shape: str = "8×64×768") -> int:
        name = f"{path.replace('/', '.')}.{label}.{len(g.nodes)}"
        i = g.node(name, label, "op", f"forward:{path}", kind, shape, inputs=inputs)
        fwd.append((i, path, label))
        return i

    ids = g.node("input_ids", "input_ids", "input", "forward:", "input", "8×64", "int64")
    tok = op("transformer/wte", "Embedding", "embedding", (ids,))
    param("transformer/wte", "weight", tok)
    pos = op("transformer/wpe", "Embedding", "embedding", (ids,))
    param("transformer/wpe", "weight", pos)
    h = op("transformer", "add", "Tensor.__add__", (tok, pos))
    h = op("transformer/drop", "Dropout", "dropout", (h,))
    for i in range(layers):
        b = f"transformer/h/{i}"
        ln1 = op(f"{b}/ln_1", "LayerNorm", "layer_norm", (h,))
        param(f"{b}/ln_1", "weight", ln1)
        param(f"{b}/ln_1", "bias", ln1)
        qkv = op(f"{b}/attn/c_attn", "Conv1D", "addmm", (ln1,), "8×64×2304")
        param(f"{b}/attn/c_attn", "weight", qkv)
        param(f"{b}/attn/c_attn", "bias", qkv)
        q = op(f"{b}/attn", "split q", "split", (qkv,))
        k = op(f"{b}/attn", "split k", "split", (qkv,))
        v = op(f"{b}/attn", "split v", "split", (qkv,))
        q = op(f"{b}/attn", "view q", "view", (q,), "8×12×64×64")
        k = op(f"{b}/attn", "view k", "view", (k,), "8×12×64×64")
        v = op(f"{b}/attn", "view v", "view", (v,), "8×12×64×64")
        kt = op(f"{b}/attn", "transpose", "transpose", (k,), "8×12×64×64")
        s = op(f"{b}/attn", "matmul", "matmul", (q, kt), "8×12×64×64")
        s = op(f"{b}/attn", "div", "Tensor.__truediv__", (s,), "8×12×64×64")
        n_ctx = op(f"{b}/attn", "size", "size", (k,), "")
        bias = op(f"{b}/attn", "bias slice", "getitem", (n_ctx,), "1×1×64×64")
        mask = op(f"{b}/attn", "to bool", "to", (bias,), "1×1×64×64")
        s = op(f"{b}/attn", "masked_fill", "where", (s, mask), "8×12×64×64")
        s = op(f"{b}/attn", "softmax", "softmax", (s,), "8×12×64×64")
        s = op(f"{b}/attn/attn_dropout", "Dropout", "dropout", (s,), "8×12×64×64")
        a = op(f"{b}/attn", "matmul", "matmul", (s, v), "8×12×64×64")
        a = op(f"{b}/attn", "merge heads", "view", (a,))
        a = op(f"{b}/attn/c_proj", "Conv1D", "addmm", (a,))
        param(f"{b}/attn/c_proj", "weight", a)
        param(f"{b}/attn/c_proj", "bias", a)
        a = op(f"{b}/attn/resid_dropout", "Dropout", "dropout", (a,))
        h = op(b, "add", "Tensor.__add__", (h, a))
        ln2 = op(f"{b}/ln_2", "LayerNorm", "layer_norm", (h,))
        param(f"{b}/ln_2", "weight", ln2)
        param(f"{b}/ln_2", "bias", ln2)
        m = op(f"{b}/mlp/c_fc", "Conv1D", "addmm", (ln2,), "8×64×3072")
        param(f"{b}/mlp/c_fc", "weight", m)
        param(f"{b}/mlp/c_fc", "bias", m)
        x3 = op(f"{b}/mlp/act", "pow", "Tensor.__pow__", (m,), "8×64×3072")
        t = op(f"{b}/mlp/act", "mul", "Tensor.__mul__", (x3,), "8×64×3072")
        t = op(f"{b}/mlp/act", "add", "Tensor.__add__", (m, t), "8×64×3072")
        t = op(f"{b}/mlp/act", "mul", "Tensor.__mul__", (t,), "8×64×3072")
        t = op(f"{b}/mlp/act", "tanh", "tanh", (t,), "8×64×3072")
        t = op(f"{b}/mlp/act", "add", "Tensor.__add__", (t,), "8×64×3072")
        half = op(f"{b}/mlp/act", "mul", "Tensor.__mul__", (m,), "8×64×3072")
        m = op(f"{b}/mlp/act", "mul", "Tensor.__mul__", (half, t), "8×64×3072")
        m = op(f"{b}/mlp/c_proj", "Conv1D", "addmm", (m,))
        param(f"{b}/mlp/c_proj", "weight", m)
        param(f"{b}/mlp/c_proj", "bias", m)
        m = op(f"{b}/mlp/dropout", "Dropout", "dropout", (m,))
        h = op(b, "add", "Tensor.__add__", (h, m))
    h = op("transformer/ln_f", "LayerNorm", "layer_norm", (h,))
    param("transformer/ln_f", "weight", h)
    param("transformer/ln_f", "bias", h)
    logits = op("lm_head", "Linear", "linear", (h,), "8×64×50257")
    labels = g.node("labels", "labels", "input", "forward:", "input", "8×64", "int64")
    loss = g.node("loss.cross_entropy.0", "cross_entropy", "op", "forward:", "cross_entropy", "", "float32",
                  inputs=(logits, labels))
    # backward: one grad op per forward op, in reverse, in the same module scopes
    grad_of: dict[int, int] = {}
    prev = g.node("loss.backward", "loss grad", "gradient", "backward:", "ones_like", "", inputs=(loss,))
    producers: dict[int, list[int]] = {}
    for s_, d_ in zip(g.edges[::2], g.edges[1::2], strict=True):
        producers.setdefault(d_, []).append(s_)
    for i, path, label in reversed(fwd):
        gi = g.node(f"{g.nodes[i][0]}.backward", f"{label}Backward", "op", f"backward:{path}", f"{label}_backward",
                    g.nodes[i][6])
        consumers = [grad_of[d] for s_, d in zip(g.edges[::2], g.edges[1::2], strict=True)
                     if s_ == i and d in grad_of]
        for c in consumers or [prev]:
            g.edge(c, gi)
        g.edge(i, gi)  # saved activation (across sections: not drawn)
        grad_of[i] = gi
    # parameter gradients and AdamW per parameter
    for name, p in params:
        consumer = next(d for s_, d in zip(g.edges[::2], g.edges[1::2], strict=True) if s_ == p)
        path = g.nodes[p][3].partition(":")[2]
        acc = g.node(f"{name}.AccumulateGrad", "AccumulateGrad", "op", f"backward:{path}", "accumulate_grad",
                     g.nodes[p][6], inputs=(grad_of[consumer],))
        gr = g.node(f"{name}.grad", f"{name.rsplit('.', 1)[-1]}.grad", "gradient", f"backward:{path}", "grad",
                    g.nodes[p][6], inputs=(acc,))
        sc = f"optimizer:{name}"
        g.scope(sc, name)
        chain = [("mul", "exp_avg.mul_"), ("add", "exp_avg.add_"), ("mul", "exp_avg_sq.mul_"),
                 ("addcmul", "exp_avg_sq.addcmul_"), ("div", "bias_correction"), ("sqrt", "denom.sqrt"),
                 ("add", "denom.add_"), ("div", "step_size"), ("addcdiv", "param.addcdiv_"), ("mul", "weight_decay"),
                 ("sub", "param.sub_"), ("add", "step.add_")]
        last = g.node(f"{name}.zero_grad", "zero_grad", "optimizer", sc, "zero_", g.nodes[p][6], inputs=(gr,))
        for j, (kind, lab) in enumerate(chain):
            o = g.node(f"{name}.adamw.{j}", lab, "optimizer", sc, kind, g.nodes[p][6], inputs=(last,))
            if j in (3, 8):
                g.edge(gr, o)
            last = o
        g.edge(last, p)
    return g


def synthetic(n: int) -> GraphBuilder:
    """About ``n`` forward nodes: stages of blocks; each block has norm, attn (with a nested core) and mlp
    scopes, parameters, and residual adds (skip edges)."""
    g = GraphBuilder()
    per_block = 100
    blocks = max(1, n // per_block)
    stages = max(1, round(blocks ** 0.5 / 1.5))
    h = g.node("input", "input", "input", "forward:", "input")
    made = 1
    for b in range(blocks):
        st = b * stages // blocks
        base = f"stage{st}/block{b}"

        def op(path: str, label: str, inputs: tuple[int, ...], cls: str = "op") -> int:
            nonlocal made
            made += 1
            return g.node(f"{path.replace('/', '.')}.{label}.{len(g.nodes)}", label, cls, f"forward:{path}", label,
                          inputs=inputs)

        x = h
        for half in ("attn", "mlp"):
            y = op(f"{base}/norm_{half}", "LayerNorm", (x,))
            op(f"{base}/norm_{half}", "weight", (), "parameter")
            branches = []
            for j in range(3):
                z = op(f"{base}/{half}/proj{j}", "Linear", (y,))
                for _ in range(2):
                    op(f"{base}/{half}/proj{j}", "param", (), "parameter")
                branches.append(z)
            c = op(f"{base}/{half}/core", "matmul", tuple(branches[:2]))
            for t in range(14):
                c = op(f"{base}/{half}/core", ("softmax", "scale", "mask", "gelu", "mul", "view", "transpose")[t % 7],
                       (c,) if t % 5 else (c, branches[2]))
            for t in range(12):
                c = op(f"{base}/{half}", ("reshape", "dropout", "Linear", "bias_add")[t % 4], (c,))
            while made < (b + 1) * per_block * (0.5 if half == "attn" else 1.0) - 2:
                c = op(f"{base}/{half}", "elementwise", (c,))
            x = op(base, "add", (x, c))
        h = x
    return g


def flat(n: int) -> GraphBuilder:
    """One scope of ``n`` ops (more than ELK lays out in time: layout-fast.ts takes it): a chain of
    linear/relu/add/mul/softmax with a skip edge around every five."""
    g = GraphBuilder()
    ids = [g.node("input", "input", "input", "forward:", "input")]
    for i in range(n):
        ins = (ids[-1], ids[-5]) if i % 5 == 4 and len(ids) > 5 else (ids[-1],)
        ids.append(g.node(f"big.op{i}", ("linear", "relu", "add", "mul", "softmax")[i % 5], "op", "forward:big",
                          inputs=ins))
        if i % 50 == 0:
            g.edge(g.node(f"big.param{i}", "weight", "parameter", "forward:big", "parameter"), ids[-1])
    g.node("output", "output", "op", "forward:", "identity", inputs=(ids[-1],))
    return g


# -- the harness page ------------------------------------------------------------------------------------
HARNESS = """<!doctype html><html><head><meta charset="utf-8"><title>nbdebug graph harness</title>
<link rel="icon" href="data:,"></head>
<body style="margin:0;font-family:sans-serif"><div id="g" style="width:1100px;margin:8px"></div>
<script type="module">
import * as ui from "/nbdebug-ui.js";
window.nbdebugUI = ui;
window.draw = (data) => {
  const el = document.getElementById("g");
  if (window.cleanup) window.cleanup();
  const t0 = performance.now();
  window.cleanup = ui.renderStatic(el, data);
  return el.nbdebugGraph.ready.then(() => ({ openMs: performance.now() - t0 }));
};
window.uiLoaded = true;
</script></body></html>"""


class _Handler(http.server.SimpleHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path.startswith("/nbdebug-ui.js"):
            body, ctype = BUNDLE.read_bytes(), "text/javascript"
        elif self.path in ("/", "/index.html"):
            body, ctype = HARNESS.encode(), "text/html"
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@contextlib.contextmanager
def harness_server() -> Iterator[str]:
    """Serve the built bundle and the harness page on 127.0.0.1; yields the page's URL."""
    if not BUNDLE.is_file():
        raise FileNotFoundError(f"the front end is not built ({BUNDLE}); run `cd frontend && node build.mjs`")
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Handler))
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/"
    finally:
        srv.shutdown()
        srv.server_close()


@contextlib.contextmanager
def harness_page(viewport: tuple[int, int] = (1120, 720), browser: Any = None) -> Iterator[Any]:
    """A Chromium page on the harness, with ``page.errors`` collecting page errors. ``browser``: a running
    playwright browser to open it in (in pytest, the shared ``chromium`` fixture: one sync playwright per
    process); None starts one (the benchmark scripts)."""
    with harness_server() as url:
        if browser is not None:
            yield from _harness_page(browser, url, viewport)
            return
        from playwright.sync_api import sync_playwright

        with sync_playwright() as pw:
            own = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                yield from _harness_page(own, url, viewport)
            finally:
                own.close()


def _harness_page(browser: Any, url: str, viewport: tuple[int, int]) -> Iterator[Any]:
    ctx = browser.new_context(viewport={"width": viewport[0], "height": viewport[1]})
    try:
        page = ctx.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.errors = errors  # type: ignore[attr-defined]
        page.goto(url)
        page.wait_for_function("() => window.uiLoaded === true")
        yield page
    finally:
        ctx.close()


def draw(page: Any, widget: dict[str, Any]) -> dict[str, Any]:
    """Render ``widget`` (a :meth:`GraphBuilder.widget`) on the harness page; returns ``{openMs}``."""
    return page.evaluate("(d) => window.draw(d)", widget)
