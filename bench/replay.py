"""The cost of keeping each step's pre-step state for replay (``@dbg.step_fn``, ``replay_window=1``).

Runs zoo workloads (``bench/zoo.py``; ``--size real``: published sizes) at a capture level, interleaved: each
round one plain step and one step that keeps its pre-step state (same Debugger, same step function taking
the batch as its argument; the order alternates), and reports the time per step of both (process CPU time,
median over rounds), the median of the per-round ratios, and the bytes the kept state copies (and holds by
reference: the previous step's gradients, frozen parameters) per step. Then one replay at ``mix`` of the
last kept step (its time, whether it came out bitwise, its first mismatch) and the machine's load average.
Example::

    python bench/replay.py --models gpt2,bert,resnet --size real --rounds 4
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from zoo import make_zoo_workload  # noqa: E402

import nbdebug  # noqa: E402


def measure(wl, level: str, rounds: int, warmup: int) -> dict:
    """Interleaved: each round runs one plain step and one step that keeps its pre-step state (the order
    alternates between rounds), through the same Debugger and step function (``replay_window`` 0 / 1)."""
    opt = wl.reset()
    dbg = nbdebug.Debugger(wl.model, level=level, replay_budget=1 << 40, memory_budget=256 * 2**20)

    def train(batch):  # ZooWorkload.step with the batch as an argument (what a replay needs)
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=wl.amp):
            loss = wl.loss(wl.model, batch)
        if wl._scaler is not None:
            wl._scaler.scale(loss).backward()
            wl._scaler.step(opt)
            wl._scaler.update()
        else:
            loss.backward()
            opt.step()
        return loss

    step = dbg.step_fn(train, optimizers=opt, scalers=wl._scaler)
    keeper = dbg._replay
    times: dict[int, list[float]] = {0: [], 1: []}
    i = 0
    for r in range(warmup + rounds):
        for keep in ((0, 1) if r % 2 == 0 else (1, 0)):
            keeper.window = keep  # 0: the step function runs as is, nothing kept
            t = time.process_time()
            step(wl.batches[i % len(wl.batches)])
            i += 1
            if r >= warmup:
                times[keep].append(time.process_time() - t)
    keeper.window = 1
    step(wl.batches[i % len(wl.batches)])  # a kept step to replay
    kept = dbg._replay.get("last")
    ratios = [k / p for p, k in zip(times[0], times[1], strict=True)]
    out = {"plain_s": statistics.median(times[0]), "step_s": statistics.median(times[1]),
           "ratio": statistics.median(ratios), "kept_bytes": kept.state.nbytes, "held_bytes": kept.state.held}
    t = time.process_time()
    r = dbg.replay(level="mix")
    out["replay_s"], out["bitwise"] = time.process_time() - t, r.bitwise
    out["first_mismatch"] = str(r.mismatches[0]) if r.mismatches else ""
    dbg.close()
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="gpt2,bert,resnet")
    ap.add_argument("--size", default="real")
    ap.add_argument("--level", default="L0")
    ap.add_argument("--rounds", type=int, default=4, help="timed rounds (one plain and one kept step each)")
    ap.add_argument("--warmup", type=int, default=1)
    a = ap.parse_args(argv)
    rows = {}
    for name in a.models.split(","):
        wl = make_zoo_workload(name, size=a.size)
        params = sum(p.numel() for p in wl.model.parameters())
        rows[name] = r = dict(measure(wl, a.level, a.rounds, a.warmup), params=params)
        print(f"{name:10s} {params / 1e6:6.1f}M params  {a.level} {r['plain_s']:.3f}s/step"
              f"  +keep {r['step_s']:.3f}s/step"
              f"  x{r['ratio']:.3f} (median of rounds)  kept {r['kept_bytes'] / 2**20:.0f} MiB"
              f" (+{r['held_bytes'] / 2**20:.0f} MiB held)"
              f"  replay@mix {r['replay_s']:.2f}s bitwise={r['bitwise']} {r['first_mismatch']}"
              f"  (load average {os.getloadavg()[0]:.1f})", flush=True)
    return rows


if __name__ == "__main__":
    main()
