"""µs per captured op at GPU-like step times, and an in-process A/B of two nbdebug trees (issue 25).

A tiny model whose step takes milliseconds on one CPU thread — ``gpt2``: HF GPT-2, 4 layers, d=64, batch
2×16 (~10 ms plain, ~800 ops and ~2,200 tensors captured at L1); ``cnn``: three conv/BatchNorm/ReLU blocks
on 4×3×16×16 images — trained with ``AdamW`` (``zero_grad, forward, loss, backward, step``). Plain steps and
captured steps alternate in blocks within one process (rotated order per round; the capture attached with
the adapter directly, its collector tuning held as the Debugger holds it), each step timed by this
process's CPU time (a machine shared with other work); the figures are medians. ``--base DIR`` adds a
second nbdebug tree (a checkout or ``git archive`` of another commit, with its built ``_fastats``), imported
under another package name beside this one, so both are measured in the same process, interleaved.

Usage::

    python bench/op_cost.py                      # gpt2 at L1, this tree
    python bench/op_cost.py --model cnn --rounds 9
    mkdir /tmp/base && git archive HEAD~3 nbdebug | tar -x -C /tmp/base \\
        && cp nbdebug/frameworks/_fastats*.so /tmp/base/nbdebug/frameworks/ \\
        && python bench/op_cost.py --base /tmp/base

>>> per_op(12.0, 10.0, (400, 1000))
(5.0, 2.0)
"""

from __future__ import annotations

import argparse
import gc
import importlib
import importlib.util
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def per_op(ms: float, plain_ms: float, census: tuple[int, int]) -> tuple[float, float]:
    """(µs per captured op, µs per captured tensor) that a step time adds over the plain one."""
    extra = (ms - plain_ms) * 1e3
    return extra / census[0], extra / census[1]


def _load_tree(root: str, alias: str) -> Any:
    """The ``nbdebug`` package under ``root``, imported as ``alias`` (its imports are relative)."""
    init = Path(root) / "nbdebug" / "__init__.py"
    spec = importlib.util.spec_from_file_location(alias, init, submodule_search_locations=[str(init.parent)])
    if spec is None or spec.loader is None:
        raise SystemExit(f"no nbdebug package under {root}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[alias] = module
    spec.loader.exec_module(module)
    return module


def _workload(name: str) -> tuple[Any, Any, Any]:
    import torch
    from torch import nn

    torch.manual_seed(0)
    if name == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        model = GPT2LMHeadModel(GPT2Config(n_layer=4, n_embd=64, n_head=4, vocab_size=512, n_positions=64,
                                           resid_pdrop=0, embd_pdrop=0, attn_pdrop=0, bos_token_id=0,
                                           eos_token_id=0))
        batches = [torch.randint(0, 512, (2, 16)) for _ in range(4)]

        def loss(b):
            return model(input_ids=b, labels=b).loss
    elif name == "cnn":
        model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                              nn.Conv2d(16, 32, 3, padding=1, stride=2), nn.BatchNorm2d(32), nn.ReLU(),
                              nn.Conv2d(32, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                              nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))
        batches = [(torch.randn(4, 3, 16, 16), torch.randint(0, 10, (4,))) for _ in range(4)]

        def loss(b):
            return nn.functional.cross_entropy(model(b[0]), b[1])
    else:
        raise SystemExit(f"unknown model {name!r}: gpt2 or cnn")
    return model, batches, loss


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="gpt2", choices=("gpt2", "cnn"))
    ap.add_argument("--level", default="L1")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=6, help="timed steps per block (after 2 untimed)")
    ap.add_argument("--base", help="another nbdebug tree to measure beside this one")
    args = ap.parse_args(argv)

    import torch

    torch.set_num_threads(1)
    model, batches, loss_fn = _workload(args.model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def run(n: int) -> list[float]:
        times = []
        for i in range(n):
            t0 = time.process_time()
            opt.zero_grad(set_to_none=True)
            loss_fn(batches[i % len(batches)]).backward()
            opt.step()
            times.append(time.process_time() - t0)
        return times

    trees = {"this": _load_tree(str(HERE.parent), "nbdebug")}
    if args.base:
        trees["base"] = _load_tree(args.base, "nbdebug_base")
    parts = {}
    for label, pkg in trees.items():
        name = pkg.__name__
        parts[label] = (importlib.import_module(f"{name}.frameworks.torch.adapter").TorchAdapter,
                        importlib.import_module(f"{name}.session.session").Session,
                        importlib.import_module(f"{name}.frameworks.core.gc_tuning").hold)
    configs = ["plain", *trees]
    times: dict[str, list[float]] = {c: [] for c in configs}
    census: dict[str, tuple[int, int]] = {}
    for r in range(args.rounds):
        for c in configs[r % len(configs):] + configs[:r % len(configs)]:
            if c == "plain":
                run(2)
                times[c] += run(args.steps)
                continue
            adapter_cls, session_cls, hold = parts[c]
            release = hold()
            session = session_cls(framework="pytorch")
            adapter = adapter_cls(model, args.level, session)
            try:
                run(2)
                times[c] += run(args.steps)
                table = session.steps[session.step_index - 1]
                census[c] = (len({k[0] for k in table.keys}), len(table.keys))
            finally:
                adapter.close()
                release()
            del adapter, session
            gc.collect()
    ms = {c: statistics.median(v) * 1e3 for c, v in times.items()}
    out: dict[str, Any] = {"model": args.model, "level": args.level, "ms": ms, "census": census}
    for c in trees:
        out[f"us_per_op_{c}"], out[f"us_per_tensor_{c}"] = per_op(ms[c], ms["plain"], census[c])
    print(f"{args.model} at {args.level}: plain {ms['plain']:.2f} ms/step (CPU time, median)")
    for c in trees:
        print(f"  {c:5s} {Path(trees[c].__file__).parent.parent}")
    for c in trees:
        print(f"  {c:5s} {ms[c]:7.2f} ms/step  {out[f'us_per_op_{c}']:6.1f} µs/op  "
              f"{out[f'us_per_tensor_{c}']:5.1f} µs/tensor  ({census[c][0]} ops, {census[c][1]} tensors)")
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
