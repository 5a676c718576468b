"""Soak: 1,000 training steps at level ``mix`` with two watchpoints; RSS growth after warm-up.

A small MLP trains with SGD under a :class:`nbdebug.Debugger` (level ``mix``, default ``stats_window``)
with two watchpoints — ``TL`` (a statistics condition, on every node) and ``AR`` (a value condition on the
ReLU: its output value is kept each step). RSS (``VmRSS`` of ``/proc/self/status``) is read after the
warm-up steps and at the end; the growth in between is what the run keeps per step (target: at most 5%
over 1,000 steps, issue #12). Per-step statistics tables are kept for the window only; older steps keep
the compact history (a few floats per output tensor).

Run: ``.venv/bin/python bench/soak.py [--steps 1000] [--warmup 100] [--window 8]``; prints one line per
checkpoint and a summary; ``--out`` writes the numbers as JSON.
"""

from __future__ import annotations

import argparse
import gc
import json
import time


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--window", type=int, default=8, help="Debugger(stats_window=)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    import torch

    import nbdebug

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 10))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(16, 32), torch.randint(0, 10, (16,))
    dbg = nbdebug.Debugger(model, level="mix", stats_window=args.window)
    dbg.watch("TL", max_gt=1e6)
    dbg.watch("AR", nodes="Module.1.ReLU.forward.0", range_start_inclusive=0, range_end_inclusive=1,
              range_percentage_lt=1)
    points: list[tuple[int, int]] = []
    t0 = time.perf_counter()
    base = None
    for step in range(args.steps):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        if step + 1 == args.warmup or (step + 1) % 100 == 0 or step + 1 == args.steps:
            gc.collect()
            rss = rss_bytes()
            points.append((step + 1, rss))
            if step + 1 == args.warmup:
                base = rss
            print(f"step {step + 1:5d}: RSS {rss / 2**20:8.1f} MiB", flush=True)
    elapsed = time.perf_counter() - t0
    end = points[-1][1]
    base = base if base is not None else points[0][1]
    growth = (end - base) / base
    per_step = (end - base) / max(1, args.steps - args.warmup)
    hist = dbg.session.history.nbytes
    dbg.close()
    result = {"steps": args.steps, "warmup": args.warmup, "stats_window": args.window,
              "rss_after_warmup": base, "rss_end": end, "growth": growth, "bytes_per_step": per_step,
              "history_bytes": hist, "hits": 0, "seconds": elapsed, "points": points}
    print(f"RSS growth after warm-up: {growth * 100:+.2f}% ({per_step / 1024:.1f} KiB/step over "
          f"{args.steps - args.warmup} steps; compact history {hist / 1024:.1f} KiB); {elapsed:.1f} s")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
