"""A small MindSpore PyNative training script for the remote-attach tests.

usage: ms_train.py OUT_DIR STEPS DELAY [attach|plain]

Each step it saves ``fc1``'s output as it computed it (``ref_<step>.npy``, from a forward hook) and writes
the number of finished steps to ``progress``.
"""

import os
import sys
import time

import mindspore as ms
import numpy as np
from mindspore import nn

out, steps, delay = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
mode = sys.argv[4] if len(sys.argv) > 4 else "attach"
ms.set_context(mode=ms.PYNATIVE_MODE)
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
net.fc1.register_forward_hook(
    lambda cell, inputs, output: np.save(os.path.join(out, f"ref_{current[0]}.npy"), output.asnumpy().copy()))
if mode == "attach":
    import nbdebug

    dbg = nbdebug.attach(net)
loss_fn = nn.MSELoss()
opt = nn.SGD(net.trainable_params(), 0.01)
grad_fn = ms.value_and_grad(lambda x, y: loss_fn(net(x), y), None, opt.parameters)
rng = np.random.default_rng(0)
for step in range(steps):
    current[0] = step
    x = ms.Tensor(rng.standard_normal((16, 4)).astype(np.float32))
    y = ms.Tensor(np.zeros((16, 1), np.float32))
    _, grads = grad_fn(x, y)
    opt(grads)
    with open(os.path.join(out, "progress.tmp"), "w") as f:
        f.write(str(step + 1))
    os.replace(os.path.join(out, "progress.tmp"), os.path.join(out, "progress"))
    time.sleep(delay)
print("done", flush=True)
