"""Benchmark: kernel-side cost of the notebook panel on large synthetic graphs, and click latency while
a real PyTorch model trains on the worker thread.

What is timed (medians of several runs; kernel side only — building widgets and plotly figures, not
the browser rendering them):

* ``panel_5k_s``: ``Panel(source)`` for a 5,000-node graph (target ≤ 1 s).
* ``expand_2k_s``: expanding one scope of that graph so that ~2,000 nodes are visible (kernel side: the
  ``expanded`` trait; the layout runs in the browser, see bench/ui_browser.py); ``collapse_2k_s`` the way back.
* ``panel_50k_s``: ``Panel(source)`` for a 50,000-node graph, collapsed (target ≤ 3 s).
* ``graph_message_50k_s``: building the ``graph`` message of the 50k graph alone (nbdebug.ui.graph_data).
* ``first_panel_s``: the very first panel in the process (imports ipywidgets and plotly; one-time).
* ``click_*_ms``: how long a PAUSE / CONTINUE button click takes to return while the worker thread trains
  (target ≤ 200 ms), and ``pause_effect_ms`` until training is actually paused.

The synthetic graphs: ``blocks`` top-level scopes, each with ``layers`` sub-scopes of linear/relu/add
ops and two parameters, a backward mirror of every forward node (same scopes), chain edges plus
parameter edges; one extra flat scope ``big`` of ~1,900 nodes is the one expanded.

``--in-kernel`` runs the same measurements inside a real IPython kernel (through nbclient), where every
widget update is serialized and sent over the kernel's comm channel as in a notebook.

Run: ``.venv/bin/python bench/ui.py [--quick] [--in-kernel]``; writes ``bench/results/ui.json``
(``ui_kernel.json`` with ``--in-kernel``).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from nbdebug.session.graph import Graph  # noqa: E402
from nbdebug.session.session import Session  # noqa: E402


def synthetic_graph(n: int, big: int = 0) -> Graph:
    """A graph of about ``n`` nodes in nested scopes (half forward, half backward), plus ``big`` nodes in
    one flat scope ``big``."""
    g = Graph()
    order = 0
    prev: str | None = None
    fwd: list[str] = []
    per_layer = 8  # 2 parameters + 6 ops
    layers_total = max(1, -(-(n // 2 - big) // per_layer))
    blocks = max(1, int(round(layers_total ** 0.5)))
    layers = -(-layers_total // blocks)

    def add(name: str, kind: str, op: str, scope: str, section: str = "forward") -> str:
        nonlocal order, prev
        node = g.add_node(name, kind=kind, op_type=op, scope=scope, section=section)
        node.order = order
        node.shapes = {"output.0": (32, 64)}
        node.dtypes = {"output.0": "float32"}
        order += 1
        return name

    for b in range(blocks):
        for ly in range(min(layers, layers_total - b * layers)):
            scope = f"block{b}/layer{ly}"
            w = add(f"Parameter.{scope.replace('/', '.')}.weight", "parameter", "Parameter", scope)
            bias = add(f"Parameter.{scope.replace('/', '.')}.bias", "parameter", "Parameter", scope)
            fwd += [w, bias]
            for k, op in enumerate(("linear", "relu", "add", "linear", "relu", "add")):
                name = add(f"Functional.{op}.{b}_{ly}_{k}.forward", "op", op, scope)
                if prev is not None:
                    g.add_edge(prev, name, "output.0", "input.0")
                if op == "linear":
                    g.add_edge(w, name, "output.0", "input.1")
                    g.add_edge(bias, name, "output.0", "input.2")
                prev = name
                fwd.append(name)
    for k in range(big):
        name = add(f"Functional.mul.big{k}.forward", "op", "mul", "big")
        if prev is not None:
            g.add_edge(prev, name, "output.0", "input.0")
        prev = name
        fwd.append(name)
    for name in reversed(fwd):
        node = g.nodes[name]
        bname = name.replace(".forward", ".backward") if name.endswith(".forward") else name + ".grad"
        add(bname, "parameter" if node.kind == "parameter" else "op", node.op_type, node.scope, "backward")
        g.add_edge(prev, bname, "output.0", "input.0")
        prev = bname
    return g


def synthetic_source(n: int, big: int = 0):
    from nbdebug.ui.source import SessionSource

    s = Session(framework="synthetic", framework_version="0", device="cpu", live=False)
    s.graph = synthetic_graph(n, big)
    return SessionSource(s)


def timed(fn, runs: int) -> tuple[float, list[float]]:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), times


def click_latency(rounds: int) -> dict[str, float]:
    import torch
    import torch.nn as nn

    import nbdebug
    from nbdebug.ui.panel import Panel

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    dbg = nbdebug.Debugger(model, level="mix")
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    def train():
        while True:
            x = torch.randn(32, 64)
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()

    panel = Panel(dbg, recommend=False)
    dbg.run(train, paused=True)
    pause_click, cont_click, effect = [], [], []
    try:
        for _ in range(rounds):
            t = time.perf_counter()
            panel.controls.cont.click()
            cont_click.append(time.perf_counter() - t)
            time.sleep(0.15)  # training runs
            t = time.perf_counter()
            panel.controls.pause.click()
            pause_click.append(time.perf_counter() - t)
            dbg.wait(10)
            effect.append(time.perf_counter() - t)
            assert str(dbg.state) == "paused", dbg.state
    finally:
        dbg.terminate()
        dbg.wait(10)
        panel.close()
        dbg.close()
    ms = lambda xs: round(1000 * statistics.median(xs), 2)  # noqa: E731
    return {"click_continue_ms": ms(cont_click), "click_pause_ms": ms(pause_click),
            "click_pause_max_ms": round(1000 * max(pause_click), 2), "pause_effect_ms": ms(effect)}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer runs (smoke)")
    ap.add_argument("--out", default=None, help="default: bench/results/ui.json (ui_kernel.json in a kernel)")
    ap.add_argument("--in-kernel", action="store_true", help="measure inside a Jupyter kernel (nbclient)")
    args = ap.parse_args(argv)
    if args.out is None:
        args.out = str(ROOT / "bench" / "results" / ("ui_kernel.json" if args.in_kernel else "ui.json"))
    if args.in_kernel:
        return in_kernel(args)
    runs = 2 if args.quick else 5

    t = time.perf_counter()
    from nbdebug.ui.graph_data import GraphFeed
    from nbdebug.ui.panel import Panel

    first = Panel(synthetic_source(50))
    first_panel = time.perf_counter() - t
    first.close()

    src5 = synthetic_source(5000, big=1900)
    panels: list = []

    def build5() -> None:
        p = Panel(src5)
        panels.append(p)

    panel_5k, _ = timed(build5, runs)
    p = panels[-1]
    visible_collapsed = len(p.graph_view.visible_keys())
    exp_times, col_times = [], []
    visible_expanded = 0
    for _ in range(runs):
        t = time.perf_counter()
        p.graph_view.expand("forward:big")
        exp_times.append(time.perf_counter() - t)
        visible_expanded = len(p.graph_view.visible_keys())
        t = time.perf_counter()
        p.graph_view.collapse("forward:big")
        col_times.append(time.perf_counter() - t)
    for q in panels:
        q.close()

    src50 = synthetic_source(50000)
    panels = []

    def build50() -> None:
        panels.append(Panel(src50))

    panel_50k, _ = timed(build50, max(2, runs - 2))
    visible_50k = len(panels[-1].graph_view.visible_keys())
    for q in panels:
        q.close()
    message_50k, _ = timed(lambda: GraphFeed().full(src50.graph), runs)  # layout runs in the browser

    try:
        from IPython import get_ipython

        where = "jupyter kernel" if getattr(get_ipython(), "kernel", None) is not None else "plain python"
    except ImportError:  # pragma: no cover
        where = "plain python"
    result = {
        "meta": {"python": sys.version.split()[0], "machine": platform.machine(), "runs": runs,
                 "where": where, "note": "kernel side only; medians"},
        "first_panel_s": round(first_panel, 3),
        "panel_5k_s": round(panel_5k, 3),
        "nodes_5k": len(src5.graph),
        "visible_5k_collapsed": visible_collapsed,
        "expand_2k_s": round(statistics.median(exp_times), 6),  # a trait change: the layout is the browser's
        "collapse_2k_s": round(statistics.median(col_times), 6),
        "visible_after_expand": visible_expanded,
        "panel_50k_s": round(panel_50k, 3),
        "nodes_50k": len(src50.graph),
        "visible_50k_collapsed": visible_50k,
        "graph_message_50k_s": round(message_50k, 3),
        **click_latency(3 if args.quick else 7),
        "targets": {"panel_5k_s": 1.0, "expand_2k_s": 0.3, "panel_50k_s": 3.0, "click_pause_ms": 200},
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return result


def in_kernel(args: argparse.Namespace) -> dict:
    """Run :func:`main` in a fresh IPython kernel; returns what it wrote."""
    import nbclient
    import nbformat

    argv = ["--out", args.out] + (["--quick"] if args.quick else [])
    code = (f"import sys; sys.path.insert(0, {str(ROOT / 'bench')!r})\n"
            f"import ui as bench_ui\n_ = bench_ui.main({argv!r})")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code)])
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}
                            ).execute()
    for out in nb.cells[0].get("outputs", []):
        if out.get("output_type") == "stream":
            print(out["text"], end="")
    return json.loads(Path(args.out).read_text())


if __name__ == "__main__":
    main()
