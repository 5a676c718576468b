"""A small data-parallel MindSpore training run under nbdebug, one process per rank, for
``tests/test_ranks_msrun.py``.

Started by ``msrun --worker_num N --local_worker_num N tests/ranks_train_ms.py DUMP_DIR NAN_RANK NAN_STEP
STEPS`` (CPU, PyNative). ``mindspore.communication.init()`` makes the ranks; the gradients are averaged
over them by ``nn.DistributedGradReducer`` (an AllReduce) before the optimizer. Each rank dumps through
msProbe's API ``nbdebug.PrecisionDebugger`` (tensor task, L0) into ``DUMP_DIR/step{N}/rank{R}``. On rank
``NAN_RANK`` in step ``NAN_STEP`` the ``fault`` cell returns ``sqrt(x - 10)``: NaN from finite inputs.
"""

from __future__ import annotations

import json
import sys

import mindspore as ms
import numpy as np
from mindspore import communication, nn, ops

import nbdebug


class Fault(nn.Cell):
    """Identity, or (armed) ``sqrt(x - 10)``."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = False

    def construct(self, x):
        return ops.sqrt(x - 10.0) if self.armed else x


class Net(nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Dense(6, 16)
        self.act = nn.Tanh()
        self.fault = Fault()
        self.fc2 = nn.Dense(16, 1)

    def construct(self, x):
        return self.fc2(self.fault(self.act(self.fc1(x))))


def main(dump_dir: str, nan_rank: int, nan_step: int, steps: int) -> None:
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    communication.init()
    rank, world = communication.get_rank(), communication.get_group_size()
    ms.set_seed(0)
    net = Net()
    loss_fn = nn.MSELoss()
    opt = nn.SGD(net.trainable_params(), learning_rate=0.05)
    grad_fn = ms.value_and_grad(lambda x, y: loss_fn(net(x), y), None, opt.parameters)
    reducer = nn.DistributedGradReducer(opt.parameters, mean=True, degree=world)
    pd = nbdebug.PrecisionDebugger(dump_path=dump_dir, task="tensor", level="L0")
    data = np.random.RandomState(1000 + rank)  # each rank its own shard
    for step in range(steps):
        x = data.randn(8, 6).astype(np.float32)
        y = x.sum(1, keepdims=True)
        net.fault.armed = rank == nan_rank and step == nan_step
        pd.start(net)
        _loss, grads = grad_fn(ms.Tensor(x), ms.Tensor(y))
        opt(reducer(grads))
        pd.stop()
        pd.step()
    pd.close()
    total = float(sum(p.asnumpy().astype(np.float64).sum() for p in net.trainable_params()))
    # one write of the whole line: the ranks share torchrun's stdout, and print() writes the end apart
    sys.stdout.write("RESULT " + json.dumps({"rank": rank, "world": world, "param_sum": total}) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
