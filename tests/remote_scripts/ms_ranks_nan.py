"""A data-parallel MindSpore job (``msrun``, CPU, PyNative) for the live multi-rank test: each rank attaches
itself (``nbdebug.attach``, the listener's address and token from the environment msrun passes on).

``msrun --worker_num N ... ms_ranks_nan.py GATE NAN_RANK NAN_STEP STEPS``: the model is
``tests/ranks_train_ms.py``'s (its ``fault`` cell returns ``sqrt(x - 10)`` when armed); the gradients are
averaged by an AllReduce (``nn.DistributedGradReducer``). Step 0 runs, then every rank waits for the file GATE
(the test creates it once its watchpoints are set); rank NAN_RANK arms ``fault`` in step NAN_STEP.
"""

import os
import sys
import time

import mindspore as ms
import numpy as np
from mindspore import communication, nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from ranks_train_ms import Net  # noqa: E402 - tests/ is put on the path just above

import nbdebug  # noqa: E402

gate, nan_rank, nan_step, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
ms.set_context(mode=ms.PYNATIVE_MODE)
ms.set_device("CPU")
communication.init()
rank, world = communication.get_rank(), communication.get_group_size()
ms.set_seed(0)
net = Net()
dbg = nbdebug.attach(net, level="L0")
loss_fn = nn.MSELoss()
opt = nn.SGD(net.trainable_params(), learning_rate=0.05)
grad_fn = ms.value_and_grad(lambda x, y: loss_fn(net(x), y), None, opt.parameters)
reducer = nn.DistributedGradReducer(opt.parameters, mean=True, degree=world)
data = np.random.RandomState(1000 + rank)  # each rank its own shard
for step in range(steps):
    if step == 1:  # attached and one step done: wait for the notebook's watchpoints
        end = time.monotonic() + 120
        while not os.path.exists(gate):
            if time.monotonic() > end:
                sys.exit(f"rank {rank}: no {gate} within 120 s")
            time.sleep(0.02)
    x = data.randn(8, 6).astype(np.float32)
    net.fault.armed = rank == nan_rank and step == nan_step
    _loss, grads = grad_fn(ms.Tensor(x), ms.Tensor(x.sum(1, keepdims=True)))
    opt(reducer(grads))
    time.sleep(0.05)
