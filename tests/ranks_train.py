"""A small DDP training run under nbdebug, one process per rank, for ``tests/test_ranks_torchrun.py``.

Started by ``torchrun --nproc-per-node N tests/ranks_train.py DUMP_DIR NAN_RANK NAN_STEP STEPS TOOL`` (gloo
backend, CPU). Every rank trains the same model on its own data shard under its own
``nbdebug.Debugger(..., dump_dir=DUMP_DIR, task="tensor")`` (TOOL ``debugger``) or msProbe's API
``nbdebug.PrecisionDebugger`` (TOOL ``precision``), so the dump is ``DUMP_DIR/step{N}/rank{R}``. On rank
``NAN_RANK`` in step ``NAN_STEP`` the ``fault`` module returns ``sqrt(x - 10)`` — NaN from finite inputs —
and DDP's gradient allreduce carries the NaN to every rank in the same step. Each rank prints
``RESULT {json}`` (its rank, world size and final parameters' sum) for the test to check.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import nbdebug


class Fault(torch.nn.Module):
    """Identity, or (armed) ``sqrt(x - 10)``: NaN wherever ``x < 10``."""

    armed = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sqrt(x - 10.0) if self.armed else x


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(6, 16)
        self.act = torch.nn.Tanh()
        self.fault = Fault()
        self.fc2 = torch.nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.fault(self.act(self.fc1(x))))


def main(dump_dir: str, nan_rank: int, nan_step: int, steps: int, tool: str) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = Net()
    if tool == "precision":
        dbg = nbdebug.PrecisionDebugger(dump_path=dump_dir, task="tensor", level="L0")
    else:
        dbg = nbdebug.Debugger(model, level="L0", dump_dir=dump_dir, task="tensor")
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(1000 + rank)  # each rank its own shard
    for step in range(steps):
        x = torch.randn(8, 6, generator=data)
        y = x.sum(1, keepdim=True)
        model.fault.armed = rank == nan_rank and step == nan_step
        if tool == "precision":
            dbg.start(model)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
        if tool == "precision":
            dbg.stop()
            dbg.step()
    dbg.close()
    total = float(sum(p.detach().double().sum() for p in model.parameters()))
    # one write of the whole line: the ranks share torchrun's stdout, and print() writes the end apart
    sys.stdout.write("RESULT " + json.dumps({"rank": rank, "world": world, "param_sum": total}) + "\n")
    sys.stdout.flush()
    dist.barrier()
    # Everything is written (dbg.close() above). gloo's teardown at interpreter exit aborts now and then here
    # ("terminate called without an active exception", SIGABRT, also in a plain DDP script without nbdebug,
    # with or without destroy_process_group), so the process ends without it.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
