"""Benchmark: widget messages the kernel sends for one notebook panel (kernel side, no browser).

Counts, while ``dbg.panel()`` builds a panel in-process: ``comm_open`` messages (one per widget model, its
state inside), ``update`` messages (a trait changed after the model was opened: each one a websocket frame)
and ``custom`` messages (the front end's data). For the quickstart model, a 6-layer GPT-2 and the same GPT-2
after 5,000+ TO hits (the setups of bench/ui_notebook.py, run in this process).

>>> counts = count_messages(lambda: None)
>>> counts["update"], counts["comm_open"]
(0, 0)

Run: ``.venv/bin/python bench/panel_messages.py [--quick]`` (``--quick``: the quickstart model only).
"""

from __future__ import annotations

import argparse
import collections
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))


def count_messages(build: Callable[[], Any]) -> dict[str, Any]:
    """Messages sent while ``build()`` runs: per method, and the classes of widgets sent an update."""
    from ipywidgets import Widget

    counts: collections.Counter[str] = collections.Counter()
    updated: collections.Counter[str] = collections.Counter()
    send, open_ = Widget._send, Widget.open

    def _send(self: Any, msg: dict[str, Any], buffers: Any = None) -> Any:
        if self.comm is None:  # before its comm_open (a trait set inside the constructor): nothing is sent
            return send(self, msg, buffers)
        counts[msg.get("method", "?")] += 1
        if msg.get("method") == "update":
            updated[f"{type(self).__name__}:{','.join(sorted(msg.get('state', {})))}"] += 1
        return send(self, msg, buffers)

    def _open(self: Any) -> Any:
        counts["comm_open"] += self.comm is None
        return open_(self)

    Widget._send, Widget.open = _send, _open  # type: ignore[method-assign]
    try:
        build()
    finally:
        Widget._send, Widget.open = send, open_  # type: ignore[method-assign]
    return {"comm_open": counts["comm_open"], "update": counts["update"], "custom": counts["custom"],
            "updated": dict(updated.most_common(8))}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    import ui_notebook as nb

    setups = [("quickstart", nb.QUICKSTART_SETUP)]
    if not args.quick:
        setups += [("gpt2_6layer", nb.GPT2_SETUP), ("gpt2_5000_hits", nb.MANY_HITS_SETUP)]
    for name, setup in setups:
        env: dict[str, Any] = {}
        exec(setup, env)  # noqa: S102 - our own setup text
        dbg = env["dbg"]
        panels: list[Any] = []
        first = count_messages(lambda: panels.append(dbg.panel()))  # noqa: B023
        second = count_messages(lambda: panels.append(dbg.panel()))  # noqa: B023
        print(f"{name:15s} first panel: {first['comm_open']} comm_open, {first['update']} update, "
              f"{first['custom']} custom; next panel: {second['comm_open']} / {second['update']} / "
              f"{second['custom']}")
        print(f"{'':15s} updates by widget:trait: {first['updated']}")
        for p in panels:
            p.close()
        dbg.close()


if __name__ == "__main__":
    main()
