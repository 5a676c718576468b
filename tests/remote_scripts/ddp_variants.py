"""Multi-rank training patterns for the held-out job trials (round 4), run unedited under
``torchrun --nproc-per-node N -m nbdebug.run ddp_variants.py GATE OUT MODE STEPS [ARG]`` (gloo, CPU).

MODE:

* ``nosync``: DDP with gradient accumulation, two micro-batches per optimizer step, the first under
  ``ddp.no_sync()``;
* ``unused``: DDP with ``find_unused_parameters=True``; the ``side`` branch runs on even steps only;
* ``fsdp2``: ``fully_shard`` on each Linear and the model (parameters are DTensors sharded on dim 0);
* ``crash``: rank ARG raises in step 3 of the first attempt (``TORCHELASTIC_RESTART_COUNT`` 0): under
  ``torchrun --max-restarts 1`` the job restarts and the second attempt trains to the end;
* ``uneven``: rank ARG stops after half the steps and leaves normally (no collective after: plain SGD on a
  non-DDP model whose gradients are averaged by hand with ``all_reduce`` only while every rank trains); the
  others take 0.3 s a step from then on (time for the notebook to act);
* ``slow``: rank ARG sleeps 1.5 s in each step (DDP: the others wait for it in the allreduce); ``slowfree``
  the same without DDP (no collective: the ranks drift apart);
* ``bucketview`` / ``static``: DDP with ``gradient_as_bucket_view=True`` / ``static_graph=True``;
* ``nan``: DDP; rank ARG's batch holds a NaN in step ``NAN_STEP`` (the allreduce brings it to every rank).

Step 0 runs (the runner attaches at the first model call), then every rank waits for the file GATE. Each rank
writes what it computed, per step, to ``OUT/rank{R}.json`` (loss, and each parameter's norm after the step)
and its progress to ``OUT/progress{R}``.
"""

import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

gate, out, mode, steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
arg = int(sys.argv[5]) if len(sys.argv) > 5 else -1
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
NAN_STEP = 4
if mode == "crash":  # a store of each attempt's own: gloo's mesh of a restart found the last one's addresses
    dist.init_process_group("gloo", init_method=f"file://{os.path.join(out, f'store{attempt}')}",
                            rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
else:
    dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = torch.nn.Linear(6, 8)
        self.side = torch.nn.Linear(8, 8)
        self.head = torch.nn.Linear(8, 1)

    def forward(self, x, use_side=True):
        h = torch.relu(self.inp(x))
        if use_side:
            h = h + self.side(h)
        return self.head(h)


torch.manual_seed(0)
net = Net()
if mode == "fsdp2":
    from torch.distributed.fsdp import fully_shard

    for layer in (net.inp, net.side, net.head):
        fully_shard(layer)
    model = fully_shard(net)
elif mode in ("uneven", "slowfree"):
    model = net
else:
    model = DistributedDataParallel(net, find_unused_parameters=mode == "unused",
                                    gradient_as_bucket_view=mode == "bucketview", static_graph=mode == "static")
opt = torch.optim.SGD(model.parameters(), lr=0.05)
data = torch.Generator().manual_seed(1000 + rank + 100 * attempt)  # a restart draws other batches
record = {"attempt": attempt, "loss": [], "micro": [], "norms": [], "grads": [], "grads_first": []}


def local(p):
    return p.to_local() if hasattr(p, "to_local") else p


def norms(grad=False):
    return {n: float(local(p.grad if grad else p).detach().norm()) for n, p in net.named_parameters()
            if not grad or p.grad is not None}


my_steps = steps // 2 if mode == "uneven" and rank == arg else steps
for step in range(my_steps):
    if step == 1:
        end = time.monotonic() + 120
        while not os.path.exists(gate):
            if time.monotonic() > end:
                sys.exit(f"rank {rank}: no {gate} within 120 s")
            time.sleep(0.02)
    if mode == "crash" and attempt == 0 and rank == arg and step == 3:
        raise RuntimeError(f"rank {rank}: simulated crash in step {step} of attempt {attempt}")
    x = torch.randn(8, 6, generator=data)
    if (mode == "nan" and rank == arg or mode == "slowfree" and rank == 0) and step == NAN_STEP:
        x[0, 0] = float("nan")
    y = x.sum(1, keepdim=True)
    opt.zero_grad()
    if mode == "nosync":
        with model.no_sync():
            first = torch.nn.functional.mse_loss(model(x[:4]), y[:4]) / 2
            first.backward()
        record["grads_first"].append(norms(grad=True))
        second = torch.nn.functional.mse_loss(model(x[4:]), y[4:]) / 2
        second.backward()
        loss = first.item() + second.item()
        record["micro"].append([first.item(), second.item()])
    elif mode == "unused":
        lv = torch.nn.functional.mse_loss(model(x, use_side=step % 2 == 0), y)
        lv.backward()
        loss = lv.item()
    else:
        lv = torch.nn.functional.mse_loss(model(x), y)
        lv.backward()
        loss = lv.item()
        if mode == "uneven" and step < steps // 2:
            for p in net.parameters():
                dist.all_reduce(p.grad)
                p.grad /= world
    record["grads"].append(norms(grad=True))
    opt.step()
    record["loss"].append(loss)
    record["norms"].append(norms())
    record["pid"] = os.getpid()
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(record, f)
    with open(os.path.join(out, f"progress{rank}"), "w") as f:
        f.write(str(step + 1))
    slow = mode in ("slow", "slowfree") and rank == arg
    time.sleep(1.5 if slow else 0.3 if mode == "uneven" and step >= steps // 2 else 0.05)
if mode != "uneven":
    dist.destroy_process_group()
