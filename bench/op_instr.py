"""Instructions per captured step under callgrind: the capture's per-op cost as a count that load does not move.

On a machine shared with other work, step times (even CPU times) vary by ±10 % from run to run, more than
most single changes to the hot path. Valgrind's callgrind counts the instructions a step executes: the same
count on every run, whatever else runs. This runs the workload of ``bench/op_cost.py`` (``gpt2`` or ``cnn``,
AdamW, one torch thread) under ``valgrind --tool=callgrind``, instrumented only while the timed steps run
(they run inside ``functools.reduce``, the one C function callgrind is told to collect), for this tree or
another (``--tree``, as ``op_cost.py --base``), with the capture attached at ``--level`` or not at all
(``--level plain``), and prints instructions per step. Each run takes minutes (the import runs under
valgrind too); the count is what a profile of the C level (``callgrind_annotate``) reads from the output.

Usage::

    python bench/op_instr.py --level plain && python bench/op_instr.py --level L1
    python bench/op_instr.py --level L1 --tree /tmp/base --model cnn
    python bench/op_instr.py --level L1 --optimizer foreach --phase optimizer   # only opt.step()

>>> per_step(3_000_000, 2)
1500000
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
OPTIMIZERS = {"single": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}


def per_step(total: int, steps: int) -> int:
    return total // steps


def _worker(tree: str, model_name: str, level: str, steps: int, optimizer: str = "single",
            phase: str = "step") -> None:
    sys.path.insert(0, str(HERE))
    sys.path.insert(0, tree)
    import op_cost
    import torch

    torch.set_num_threads(1)
    model, batches, loss_fn = op_cost._workload(model_name)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, **OPTIMIZERS[optimizer])

    def step(_acc: int, i: int) -> int:
        opt.zero_grad(set_to_none=True)
        loss_fn(batches[i % len(batches)]).backward()
        opt.step()
        return 0

    def opt_step(_acc: int, _i: int) -> int:
        opt.step()
        return 0

    if level != "plain":
        from nbdebug.frameworks.core.gc_tuning import hold
        from nbdebug.frameworks.torch.adapter import TorchAdapter
        from nbdebug.session.session import Session

        hold()
        session = Session(framework="pytorch")
        TorchAdapter(model, level, session)
    functools.reduce(step, range(2), 0)  # warm-up: not collected (collect-atstart=no)
    subprocess.run(["callgrind_control", "-i", "on", str(os.getpid())], stdout=subprocess.DEVNULL, check=False)
    if phase == "step":
        functools.reduce(step, range(steps), 0)
        return
    for i in range(steps):  # only the optimizer's step collected (forward and backward outside ``reduce``)
        opt.zero_grad(set_to_none=True)
        loss_fn(batches[i % len(batches)]).backward()
        functools.reduce(opt_step, range(1), 0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="gpt2", choices=("gpt2", "cnn"))
    ap.add_argument("--level", default="L1", help="L0, L1, mix, or plain (no capture)")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--optimizer", choices=tuple(OPTIMIZERS), default="single",
                    help="AdamW's implementation (foreach: what a GPU runs by default)")
    ap.add_argument("--phase", choices=("step", "optimizer"), default="step",
                    help="count the whole step, or only optimizer.step() (its hooks and the step end included)")
    ap.add_argument("--tree", default=str(HERE.parent), help="the nbdebug tree to measure")
    ap.add_argument("--_worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._worker:
        _worker(args.tree, args.model, args.level, args.steps, args.optimizer, args.phase)
        return
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed")
    with tempfile.TemporaryDirectory(prefix="nbdebug_instr_") as tmp:
        out = Path(tmp) / "callgrind.out"
        cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--collect-atstart=no",
               "--toggle-collect=functools_reduce", f"--callgrind-out-file={out}", sys.executable, __file__,
               "--_worker", "--model", args.model, "--level", args.level, "--steps", str(args.steps),
               "--tree", args.tree, "--optimizer", args.optimizer, "--phase", args.phase]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        totals = re.search(r"^totals:\s+(\d+)", out.read_text(), re.M)
        if totals is None:
            raise SystemExit("callgrind wrote no totals")
        n = per_step(int(totals.group(1)), args.steps)
    what = "step" if args.phase == "step" else "optimizer step"
    print(f"{args.model} at {args.level}, AdamW {args.optimizer} ({args.tree}): {n / 1e6:.1f} M instructions "
          f"per {what}")


if __name__ == "__main__":
    main()
