"""The cost of keeping each step's pre-step state for replay (``@dbg.step_fn``, ``replay_window=1``).

Runs zoo workloads (``bench/zoo.py``; ``--size real``: published sizes) at a capture level twice — plain, and
with the step function marked so that each step keeps its pre-step state — and reports the time per step of
both (process CPU time, median of the timed steps), their ratio, and the bytes the kept state copies (and
holds by reference: the previous step's gradients) per step. Then one replay at ``mix`` (its time, and
whether it came out bitwise). Example::

    python bench/replay.py --models gpt2,bert,resnet --size real --steps 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from zoo import make_zoo_workload  # noqa: E402

import nbdebug  # noqa: E402


def timed(wl, level: str, steps: int, warmup: int, keep: bool) -> dict:
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

    step = dbg.step_fn(train, optimizers=opt, scalers=wl._scaler) if keep else train
    times = []
    for i in range(warmup + steps):
        t = time.process_time()
        step(wl.batches[i % len(wl.batches)])
        if i >= warmup:
            times.append(time.process_time() - t)
    out = {"step_s": statistics.median(times)}
    if keep:
        kept = dbg._replay.get("last")
        out["kept_bytes"], out["held_bytes"] = kept.state.nbytes, kept.state.held
        t = time.process_time()
        r = dbg.replay(level="mix")
        out["replay_s"], out["bitwise"] = time.process_time() - t, r.bitwise
    dbg.close()
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="gpt2,bert,resnet")
    ap.add_argument("--size", default="real")
    ap.add_argument("--level", default="L0")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    a = ap.parse_args(argv)
    rows = {}
    for name in a.models.split(","):
        wl = make_zoo_workload(name, size=a.size)
        params = sum(p.numel() for p in wl.model.parameters())
        plain = timed(wl, a.level, a.steps, a.warmup, keep=False)
        kept = timed(wl, a.level, a.steps, a.warmup, keep=True)
        rows[name] = dict(kept, params=params, plain_s=plain["step_s"], ratio=kept["step_s"] / plain["step_s"])
        r = rows[name]
        print(f"{name:10s} {params / 1e6:6.1f}M params  {a.level} {r['plain_s']:.3f}s/step"
              f"  +keep {r['step_s']:.3f}s/step"
              f"  x{r['ratio']:.3f}  kept {r['kept_bytes'] / 2**20:.0f} MiB (+{r['held_bytes'] / 2**20:.0f} MiB held)"
              f"  replay@mix {r['replay_s']:.2f}s bitwise={r['bitwise']}", flush=True)
    return rows


if __name__ == "__main__":
    main()
