"""A 3-rank DistributedDataParallel job (gloo, CPU) of a tiny GPT-2 built from a config (no weights), for the
held-out job trials, run unedited under
``torchrun --nproc-per-node 3 -m nbdebug.run ddp_gpt2_odd.py GATE ODD_RANK ODD_STEP NAN_STEP STEPS``.

Step 0 runs (the runner attaches each rank at its first model call), then every rank waits for the file GATE;
rank ODD_RANK's input embeddings are scaled ×100 from step ODD_STEP on (a bad shard) and hold a NaN at step
NAN_STEP (-1: never). Each step sleeps a little, as a real step takes time.
"""

import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from transformers import GPT2Config, GPT2LMHeadModel

gate, odd_rank, odd_step, nan_step, steps = sys.argv[1], *map(int, sys.argv[2:6])
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=2, n_head=2,
                                   bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
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
    ids = torch.randint(0, 64, (2, 8), generator=data)
    # the token embedding looked up by hand (no module call: the runner attaches at the first one, the model's)
    embeds = torch.nn.functional.embedding(ids, model.transformer.wte.weight)
    if rank == odd_rank and step >= odd_step:
        embeds = embeds * 100.0
    if rank == odd_rank and step == nan_step:
        embeds = embeds.clone()
        embeds[0, 0, 0] = float("nan")
    opt.zero_grad()
    ddp(inputs_embeds=embeds, labels=ids).loss.backward()
    opt.step()
    time.sleep(0.05)
dist.destroy_process_group()
