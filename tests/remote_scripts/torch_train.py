"""A small PyTorch training script for the remote-attach tests.

usage: torch_train.py OUT_DIR STEPS DELAY [attach|plain] [nan_step] [fail_step]

``attach``: calls nbdebug.attach(model) itself (NBDEBUG_CONNECT/NBDEBUG_TOKEN from the environment);
``plain``: no nbdebug at all (for ``python -m nbdebug.run``). Each step it saves the first Linear's
output as it computed it (``ref_<step>.npy``, the reference for the remote tensor view) and writes the
number of finished steps to ``progress``.
"""

import os
import sys
import time

import numpy as np
import torch

out, steps, delay = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
mode = sys.argv[4] if len(sys.argv) > 4 else "attach"
nan_step = int(sys.argv[5]) if len(sys.argv) > 5 else -1
fail_step = int(sys.argv[6]) if len(sys.argv) > 6 else -1

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
current = [0]
model[0].register_forward_hook(
    lambda m, i, o: np.save(os.path.join(out, f"ref_{current[0]}.npy"), o.detach().numpy().copy()))

if mode == "attach":
    import nbdebug

    dbg = nbdebug.attach(model)

for step in range(steps):
    current[0] = step
    x = torch.randn(16, 4)
    if step == nan_step:
        x[0, 0] = float("nan")
    if step == fail_step:
        raise RuntimeError(f"boom at step {step}")
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    with open(os.path.join(out, "progress.tmp"), "w") as f:
        f.write(str(step + 1))
    os.replace(os.path.join(out, "progress.tmp"), os.path.join(out, "progress"))
    time.sleep(delay)
print("done", flush=True)
