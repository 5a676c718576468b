"""A DistributedDataParallel job (gloo, CPU) for the live ODD_RANK test, run unedited under
``torchrun --nproc-per-node N -m nbdebug.run ddp_odd.py GATE ODD_RANK ODD_STEP STEPS``.

The model is ``tests/ranks_train.py``'s (its ``fault`` module stays disarmed). Step 0 runs (the runner attaches
each rank at its first model call), then every rank waits for the file GATE — the test creates it once its
watchpoints are set — and trains on; rank ODD_RANK's data is scaled ×1e3 from step ODD_STEP on (a bad shard).
Each step sleeps a little, as a real step takes time.
"""

import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from ranks_train import Net  # noqa: E402 - tests/ is put on the path just above

gate, odd_rank, odd_step, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = Net()
ddp = DistributedDataParallel(model)
opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
data = torch.Generator().manual_seed(1000 + rank)  # each rank its own shard
for step in range(steps):
    if step == 1:  # attached (step 0 called the model): wait for the notebook's watchpoints
        end = time.monotonic() + 120
        while not os.path.exists(gate):
            if time.monotonic() > end:
                sys.exit(f"rank {rank}: no {gate} within 120 s")
            time.sleep(0.02)
    x = torch.randn(8, 6, generator=data) * (1e3 if rank == odd_rank and step >= odd_step else 1.0)
    opt.zero_grad()
    torch.nn.functional.mse_loss(ddp(x), x.sum(1, keepdim=True)).backward()
    opt.step()
    time.sleep(0.05)
dist.destroy_process_group()
