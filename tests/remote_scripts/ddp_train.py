"""A DistributedDataParallel (gloo, CPU) training script for the remote tests; run under
``torchrun --nproc-per-node N -m nbdebug.run ddp_train.py STEPS`` (nbdebug attaches to the DDP model)."""

import sys
import time

import torch
import torch.distributed as dist

steps = int(sys.argv[1])
dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(
    torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _step in range(steps):
    loss = model(torch.randn(16, 4)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    time.sleep(0.02)
dist.destroy_process_group()
