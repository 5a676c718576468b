"""A small MindSpore PyNative training script for the remote-attach tests.

usage: ms_train.py OUT_DIR STEPS DELAY [attach|plain] [pynative|graph]

PyNative: each step it saves ``fc1``'s output as it computed it (``ref_<step>.npy``, from a forward hook).
GRAPH: a ``TrainOneStepCell`` compiled once, run every step. Both write the number of finished steps
to ``progress``.
"""

import os
import sys
import time

import mindspore as ms
import numpy as np
from mindspore import nn

out, steps, delay = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
mode = sys.argv[4] if len(sys.argv) > 4 else "attach"
graph = len(sys.argv) > 5 and sys.argv[5] == "graph"
ms.set_context(mode=ms.GRAPH_MODE if graph else ms.PYNATIVE_MODE)
ms.set_seed(0)


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Dense(4, 8)
        self.relu = nn.ReLU()
        self.fc2 = nn.Dense(8, 1)

    def construct(self, x):
        return self.fc2(self.relu(self.fc1(x)))


net = Net()
current = [0]
if not graph:
    net.fc1.register_forward_hook(
        lambda cell, inputs, output: np.save(os.path.join(out, f"ref_{current[0]}.npy"), output.asnumpy().copy()))
if mode == "attach":
    import nbdebug

    dbg = nbdebug.attach(net)
loss_fn = nn.MSELoss()
opt = nn.SGD(net.trainable_params(), 0.01)
grad_fn = ms.value_and_grad(lambda x, y: loss_fn(net(x), y), None, opt.parameters)
train_step = nn.TrainOneStepCell(nn.WithLossCell(net, loss_fn), opt) if graph else None
rng = np.random.default_rng(0)
for step in range(steps):
    current[0] = step
    x = ms.Tensor(rng.standard_normal((16, 4)).astype(np.float32))
    y = ms.Tensor(np.zeros((16, 1), np.float32))
    if graph:
        train_step(x, y)
    else:
        _, grads = grad_fn(x, y)
        opt(grads)
    with open(os.path.join(out, "progress.tmp"), "w") as f:
        f.write(str(step + 1))
    os.replace(os.path.join(out, "progress.tmp"), os.path.join(out, "progress"))
    time.sleep(delay)
print("done", flush=True)
