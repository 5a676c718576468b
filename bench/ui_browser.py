"""Benchmark: nbdebug's graph view in Chromium (the browser side of the panel), timed with
``performance.now()`` inside the page.

Each function takes a harness page (``tests/graph_fixtures.harness_page()``: the built bundle drawn with
``nbdebugUI.renderStatic``, no kernel), prints one line and returns its figures:

* :func:`open_collapsed`: time from ``renderStatic`` to the first drawn frame of an ``n``-node graph,
  scopes collapsed (targets: 5k ≤ 1 s, 50k ≤ 3 s);
* :func:`expand_scope`: time to open one scope (layout of that scope and its ancestors, then a frame),
  with the number of nodes visible after it (target ≤ 300 ms with ≤ 2k visible);
* :func:`expand_flat`: the same for one scope of ~2k direct children (the fast layered layout);
* :func:`expand_many`: a whole stage opened at once, nothing cached (the worst case, no target);
* :func:`pan_frames`: frame times while panning (the canvas redrawn per step), median and worst.

:func:`graph_timings` runs them all. The panel as a user meets it in real JupyterLab — time to first panel,
bytes over the kernel websocket per panel, saved notebook metadata per panel, for the quickstart model and
a 6-layer GPT-2 — is measured by ``bench/ui_notebook.py`` (:func:`notebook_metrics`), which the main run
below also prints. Run: ``.venv/bin/python bench/ui_browser.py`` (``--graph-only`` / ``--notebook-only``).
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import graph_fixtures as fx  # noqa: E402

G = "document.getElementById('g').nbdebugGraph"


def open_collapsed(page: Any, n: int, runs: int = 3) -> dict[str, Any]:
    """Median time to open an ``n``-node synthetic graph, collapsed."""
    widget = fx.synthetic(n).widget(sections=["forward"])
    times = [fx.draw(page, widget)["openMs"] for _ in range(runs)]
    st = page.evaluate(f"() => {G}.stats()")
    out = {"nodes": len(widget["messages"][0]["nodes"]), "open_ms": statistics.median(times),
           "visible": st["visibleNodes"] + st["visibleBoxes"]}
    print(f"graph open collapsed {out['nodes']:>6} nodes: {out['open_ms']:7.1f} ms (median of {runs}; "
          f"{out['visible']} items visible)")
    return out


def expand_scope(page: Any, n: int = 5000) -> dict[str, Any]:
    """Open the first stage of an ``n``-node graph with all but its last block open (sub-scopes too), then
    time opening the last block (its not yet laid out scopes, then its ancestors around it) and closing it."""
    g = fx.synthetic(n)
    widget = g.widget(sections=["forward"])
    blocks = [k for k in g.scopes if k.startswith("forward:stage0/block") and k.count("/") == 1]
    inner = [k for k in g.scopes if k.startswith("forward:stage0/block") and k.count("/") == 2]
    last = blocks[-1]
    # everything in the stage is open except the last block: opening it shows its ~100 nodes
    widget["state"]["expanded"] = ["forward:stage0", *blocks[:-1], *inner]
    fx.draw(page, widget)
    before = page.evaluate(f"() => {G}.stats().visibleNodes")
    ms = page.evaluate(f"""async (k) => {{ const t = performance.now(); await {G}.expand(k);
        return performance.now() - t; }}""", last)
    st = page.evaluate(f"() => {G}.stats()")
    ms_close = page.evaluate(f"""async (k) => {{ const t = performance.now(); await {G}.collapse(k);
        return performance.now() - t; }}""", last)
    out = {"expand_ms": ms, "collapse_ms": ms_close, "visible_before": before, "visible_after": st["visibleNodes"],
           "scopes_laid_out": st["computedScopes"]}
    print(f"graph expand one scope: {ms:7.1f} ms ({before} → {st['visibleNodes']} nodes visible, "
          f"{st['computedScopes']} scope layouts computed); collapse {ms_close:.1f} ms")
    return out


def expand_many(page: Any, n: int = 5000) -> dict[str, Any]:
    """Open a whole stage at once, every block and sub-scope in it (nothing cached): the worst case."""
    g = fx.synthetic(n)
    fx.draw(page, g.widget(sections=["forward"]))
    keys = [k for k in g.scopes if k == "forward:stage0" or k.startswith("forward:stage0/")]
    ms = page.evaluate(f"""async (keys) => {{ const el = document.getElementById('g');
        const t = performance.now(); for (const k of keys) {G}.expand(k); await {G}.idle();
        return performance.now() - t; }}""", keys)
    st = page.evaluate(f"() => {G}.stats()")
    out = {"expand_all_ms": ms, "visible_after": st["visibleNodes"], "scopes": len(keys)}
    print(f"graph expand a stage fully ({len(keys)} scopes, nothing cached): {ms:7.1f} ms "
          f"({st['visibleNodes']} nodes visible)")
    return out


def expand_flat(page: Any, n: int = 1900) -> dict[str, Any]:
    """Open one scope of ``n`` direct children (the fast layered layout), ``n + 2`` nodes visible after."""
    fx.draw(page, fx.flat(n).widget(sections=["forward"]))
    ms = page.evaluate(f"""async () => {{ const t = performance.now(); await {G}.expand('forward:big');
        return performance.now() - t; }}""")
    st = page.evaluate(f"() => {G}.stats()")
    out = {"expand_ms": ms, "visible_after": st["visibleNodes"]}
    print(f"graph expand a flat scope: {ms:7.1f} ms ({st['visibleNodes']} nodes visible)")
    return out


def pan_frames(page: Any, n: int = 5000, steps: int = 60, flat: bool = False) -> dict[str, Any]:
    """Frame times while panning over a fully opened stage (or a flat scope of ``n`` ops), fitted to the
    view: every item drawn."""
    if flat:
        fx.draw(page, fx.flat(n).widget(sections=["forward"], expanded=["forward:big"]))
    else:
        g = fx.synthetic(n)
        keys = [k for k in g.scopes if k == "forward:stage0" or k.startswith("forward:stage0/")]
        fx.draw(page, g.widget(sections=["forward"], expanded=keys))
    page.evaluate(f"() => {G}.fit()")  # every node on screen: the worst case for a frame
    # draw: the JS time of one redraw; interval: between animation frames while panning every frame
    # (includes rasterising; 16.7 ms is the display's pace)
    times, intervals = page.evaluate(f"""async (steps) => {{ const out = [], gaps = [];
        let last = await new Promise(requestAnimationFrame);
        for (let i = 0; i < steps; i++) {{ const t = performance.now(); {G}.pan(i % 20 < 10 ? 25 : -25, 7);
          out.push(performance.now() - t);
          const now = await new Promise(requestAnimationFrame); gaps.push(now - last); last = now; }}
        return [out, gaps]; }}""", steps)
    st = page.evaluate(f"() => {G}.stats()")
    out = {"median_ms": statistics.median(times), "max_ms": max(times), "items": st["visibleItems"],
           "frame_interval_median_ms": statistics.median(intervals), "frame_interval_max_ms": max(intervals)}
    print(f"graph pan: draw median {out['median_ms']:.1f} ms, worst {out['max_ms']:.1f} ms; frame interval median "
          f"{out['frame_interval_median_ms']:.1f} ms, worst {out['frame_interval_max_ms']:.1f} ms "
          f"({st['visibleItems']} items laid out, {st['visibleNodes']} nodes)")
    return out


def graph_timings() -> dict[str, Any]:
    """Every graph-view figure, one printed line each."""
    with fx.harness_page() as page:
        fx.draw(page, fx.residual().widget())  # start the layout worker
        res = {
            "open_5k": open_collapsed(page, 5000),
            "open_50k": open_collapsed(page, 50000),
            "expand": expand_scope(page, 5000),
            "expand_many": expand_many(page, 5000),
            "expand_flat": expand_flat(page, 1900),
            "pan": pan_frames(page, 5000),
            "pan_flat": pan_frames(page, 1900, flat=True),
        }
        if page.errors:
            raise RuntimeError(f"page errors: {page.errors}")
    return res


if __name__ == "__main__":
    if "--notebook-only" not in sys.argv:
        graph_timings()
    if "--graph-only" not in sys.argv:
        sys.path.insert(0, str(ROOT / "bench"))
        import ui_notebook

        ui_notebook.report(ui_notebook.notebook_metrics())
