"""Real ``mindstudio-probe`` dumps for the load/compare tests, made on demand and cached per pytest run.

msProbe's ``PrecisionDebugger`` is a process-wide singleton, so each dump is written by a subprocess
running this file (``python msprobe_runs.py torch|mindspore ...``). The models are tiny; a dump takes a
few seconds (mostly imports).

MindSpore 2.10 on CPU has no kernel for ``mint.norm`` (LinalgVectorNorm), which msProbe's MindSpore
statistics call; the MindSpore runs give msProbe's data processor ``ops.norm`` instead (same value: the
L2 norm). Nothing else of msProbe is touched.
"""

from __future__ import annotations

import atexit
import fcntl
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


#: set by tests/conftest.py for a run on pytest-xdist workers: one folder that every worker shares (made and
#: removed by the controlling process), so a dump is made once per run, not once per worker
SHARED_ROOT = "NBDEBUG_MSPROBE_RUNS"


@functools.cache
def root() -> str:
    """A temporary folder for this pytest run's dumps (removed at exit)."""
    shared = os.environ.get(SHARED_ROOT)
    if shared:
        os.makedirs(shared, exist_ok=True)
        return shared
    path = tempfile.mkdtemp(prefix="nbdebug-msprobe-")
    atexit.register(shutil.rmtree, path, True)
    return path


def _config(path: str, task: str, level: str, dump_path: str) -> None:
    cfg = {"task": task, "dump_path": dump_path, "rank": [], "step": [], "level": level, "extra_info": True,
           "async_dump": False,
           "statistics": {"scope": [], "list": [], "data_mode": ["all"], "summary_mode": "statistics"},
           "tensor": {"scope": [], "list": [], "data_mode": ["all"]}}
    with open(path, "w") as f:
        json.dump(cfg, f)


def _run(args: list[str], name: str) -> str:
    out = os.path.join(root(), name)
    with open(out + ".lock", "w") as lock:  # another worker making the same dump: wait for it, then reuse it
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            return _make(args, out)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _make(args: list[str], out: str) -> str:
    if os.path.exists(os.path.join(out, "done.npy")):  # made already (called with other spellings of the args)
        return out
    env = dict(os.environ, PYTHONPATH=os.path.dirname(HERE) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, __file__, *args, out], capture_output=True, text=True, env=env,
                          timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"msprobe run {args} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return out


@functools.cache
def torch_dump(task: str = "statistics", level: str = "mix", variant: str = "base", steps: int = 2) -> str:
    """Dump root of ``TorchNet`` trained ``steps`` SGD steps under msProbe (PyTorch).

    ``variant``: ``base``; ``perturbed`` (fc2's weight + 1e-3·noise); ``inf`` (an overflow in the block at
    step 1); ``port`` / ``port_changed`` (``PortNet``, see :func:`mindspore_dump`); ``lenet`` (``LeNetPort``).
    """
    return _run(["torch", task, level, variant, str(steps)], f"torch_{task}_{level}_{variant}_{steps}")


@functools.cache
def mindspore_dump(task: str = "tensor", level: str = "L0", variant: str = "port", steps: int = 1) -> str:
    """Dump root of the MindSpore port of ``PortNet`` (same weights and inputs as the torch ``port`` run).

    ``variant="port_changed"`` uses LeakyReLU(0.2) for ``act`` instead of ReLU: one changed layer.
    ``lenet`` / ``lenet_changed``: the port of ``LeNetPort`` (a biased conv — ``Conv2D`` + ``BiasAdd`` in
    MindSpore — pooled, then two dense layers with a functional relu between them); ``lenet_changed`` pools
    by average instead of max.
    """
    return _run(["mindspore", task, level, variant, str(steps)], f"ms_{task}_{level}_{variant}_{steps}")


_COMPARE_MARK = "@@nbdebug-msprobe-compare@@"

#: run in one process: msProbe's console entry point (the ``msprobe`` script calls ``msprobe.msprobe.main`` on
#: its ``sys.argv``) once per job, a marker line on stdout before each and the exit codes at the end
_COMPARE_SCRIPT = r"""
import json, os, sys, traceback
from msprobe.msprobe import main

MARK, jobs = sys.argv[1], json.loads(sys.argv[2])
codes = []
for i, (target, golden, out) in enumerate(jobs):
    sys.stdout.flush(); sys.stderr.flush()
    os.write(1, f"\n{MARK} {i}\n".encode())
    sys.argv = ["msprobe", "compare", "-tp", target, "-gp", golden, "-o", out]
    try:
        code = main() or 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else int(e.code is not None)
    except Exception:
        traceback.print_exc()
        code = 1
    sys.stdout.flush(); sys.stderr.flush()
    codes.append(code)
os.write(1, f"\n{MARK} codes {json.dumps(codes)}\n".encode())
"""


def msprobe_compare(jobs: list[tuple[str, str, str]]) -> list[tuple[int, str]]:
    """``msprobe compare -tp target -gp golden -o out`` for each ``(target, golden, out)``: each job's
    ``(exit code, output)`` (stdout and stderr together).

    All jobs run in one process, through the entry point the ``msprobe`` command runs: the command's own
    start (importing torch, MindSpore and msProbe, ~10 s on a 2-core machine) is paid once, not once a job.
    """
    proc = subprocess.run([sys.executable, "-c", _COMPARE_SCRIPT, _COMPARE_MARK, json.dumps(jobs)],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300 + 120 * len(jobs),
                          env=dict(os.environ, PYTHONUNBUFFERED="1", CUDA_VISIBLE_DEVICES=""))
    parts = proc.stdout.split(f"\n{_COMPARE_MARK} ")
    preamble, outputs, codes = parts[0], {}, None
    for part in parts[1:]:
        head, _, body = part.partition("\n")
        if head.startswith("codes "):
            codes = json.loads(head[len("codes "):])
        else:
            outputs[int(head)] = body
    if codes is None or proc.returncode != 0:  # the process died: every job gets its code and all the output
        return [(proc.returncode or 1, proc.stdout)] * len(jobs)
    return [(codes[i], preamble + outputs[i]) for i in range(len(jobs))]


# --------------------------------------------------------------------------------------------------
# the subprocess side
# --------------------------------------------------------------------------------------------------


def _port_arrays():
    import numpy as np

    rng = np.random.default_rng(7)
    w = {
        "fc1.weight": rng.standard_normal((16, 8)).astype(np.float32) * 0.3,
        "fc1.bias": rng.standard_normal(16).astype(np.float32) * 0.1,
        "fc2.weight": rng.standard_normal((4, 16)).astype(np.float32) * 0.3,
        "fc2.bias": rng.standard_normal(4).astype(np.float32) * 0.1,
    }
    xs = [rng.standard_normal((4, 8)).astype(np.float32) for _ in range(3)]
    ys = [rng.standard_normal((4, 4)).astype(np.float32) for _ in range(3)]
    return w, xs, ys


def _lenet_arrays():
    import numpy as np

    rng = np.random.default_rng(11)
    w = {
        "conv.weight": rng.standard_normal((4, 1, 3, 3)).astype(np.float32) * 0.3,
        "conv.bias": rng.standard_normal(4).astype(np.float32) * 0.1,
        "fc1.weight": rng.standard_normal((16, 36)).astype(np.float32) * 0.2,
        "fc1.bias": rng.standard_normal(16).astype(np.float32) * 0.1,
        "fc2.weight": rng.standard_normal((4, 16)).astype(np.float32) * 0.2,
        "fc2.bias": rng.standard_normal(4).astype(np.float32) * 0.1,
    }
    xs = [rng.standard_normal((2, 1, 8, 8)).astype(np.float32) for _ in range(3)]
    ys = [rng.standard_normal((2, 4)).astype(np.float32) for _ in range(3)]
    return w, xs, ys


@functools.cache
def lenet_model():
    """``LeNetPort`` (torch imported on first use): conv → ReLU module → max pool → fc1 → F.relu → fc2."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class LeNetPort(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(1, 4, 3)
            self.act = nn.ReLU()
            self.pool = nn.MaxPool2d(2)
            self.fc1 = nn.Linear(36, 16)
            self.fc2 = nn.Linear(16, 4)

        def forward(self, x):
            x = torch.flatten(self.pool(self.act(self.conv(x))), 1)
            return self.fc2(F.relu(self.fc1(x)))

    return LeNetPort


@functools.cache
def torch_models():
    """``(TorchNet, PortNet)`` classes (torch imported on first use)."""
    import torch.nn as nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(16, 16)
            self.blow = False

        def forward(self, x):
            h = self.lin(x)
            if self.blow:
                h = h * 1e30
                h = h * 1e30  # float32 overflow: inf first appears in this multiplication
            return self.lin(h)

    class TorchNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(8, 16)
            self.act = nn.ReLU()
            self.block = Block()
            self.fc2 = nn.Linear(16, 4)

        def forward(self, x):
            x = self.act(self.fc1(x))
            return self.fc2(self.block(x) + x)

    class PortNet(nn.Module):
        def __init__(self, changed: bool):
            super().__init__()
            self.fc1 = nn.Linear(8, 16)
            self.act = nn.LeakyReLU(0.2) if changed else nn.ReLU()
            self.fc2 = nn.Linear(16, 4)

        def forward(self, x):
            return self.fc2(self.act(self.fc1(x)))

    return TorchNet, PortNet


def torch_setup(variant: str):
    """``(model, batches)`` of a variant, built exactly as the dump runs build them."""
    import torch

    TorchNet, PortNet = torch_models()
    torch.manual_seed(0)
    if variant.startswith(("port", "lenet")):
        model = PortNet(variant == "port_changed") if variant.startswith("port") else lenet_model()()
        w, xs, ys = _port_arrays() if variant.startswith("port") else _lenet_arrays()
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(torch.from_numpy(w[name]))
        return model, [(torch.from_numpy(x), torch.from_numpy(y)) for x, y in zip(xs, ys, strict=True)]
    model = TorchNet()
    if variant == "perturbed":
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            model.fc2.weight.add_(1e-3 * torch.randn(model.fc2.weight.shape, generator=g))
    g = torch.Generator().manual_seed(0)
    return model, [(torch.randn(2, 8, generator=g), torch.randn(2, 4, generator=g)) for _ in range(3)]


def torch_train(model, batches, steps: int, variant: str, start, stop) -> None:
    """The training loop of the dump runs; ``start()``/``stop()`` bracket each step."""
    import torch
    import torch.nn.functional as F

    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(steps):
        x, y = batches[step]
        if variant == "inf":
            model.block.blow = step == 1
        start()
        loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        stop()


def _torch_main(task: str, level: str, variant: str, steps: int, out: str) -> None:
    import numpy as np
    from msprobe.pytorch import PrecisionDebugger

    os.makedirs(out, exist_ok=True)
    cfg = os.path.join(out, "config.json")
    _config(cfg, task, level, os.path.join(out, "dump"))
    model, batches = torch_setup(variant)
    dbg = PrecisionDebugger(config_path=cfg)

    def stop():
        dbg.stop()
        dbg.step()

    torch_train(model, batches, steps, variant, lambda: dbg.start(model), stop)
    np.save(os.path.join(out, "done.npy"), np.array([steps]))


def _mindspore_main(task: str, level: str, variant: str, steps: int, out: str) -> None:
    import types

    import mindspore as ms
    import numpy as np
    from mindspore import mint, nn, ops

    ms.set_context(mode=ms.PYNATIVE_MODE)
    from msprobe.core.dump.data_dump.data_processor import mindspore_processor
    from msprobe.mindspore import PrecisionDebugger

    class _Mint(types.ModuleType):  # mint with a CPU-capable norm (see the module docstring)
        def __getattr__(self, name):
            return getattr(mint, name)

    proxy = _Mint("mint")
    proxy.norm = ops.norm
    mindspore_processor.mint = proxy

    class PortNet(nn.Cell):
        def __init__(self, changed: bool):
            super().__init__()
            self.fc1 = nn.Dense(8, 16)
            self.act = nn.LeakyReLU(0.2) if changed else nn.ReLU()
            self.fc2 = nn.Dense(16, 4)

        def construct(self, x):
            return self.fc2(self.act(self.fc1(x)))

    class LeNetPort(nn.Cell):
        def __init__(self, changed: bool):
            super().__init__()
            self.conv = nn.Conv2d(1, 4, 3, pad_mode="valid", has_bias=True)
            self.act = nn.ReLU()
            self.pool = nn.AvgPool2d(2, 2) if changed else nn.MaxPool2d(2, 2)
            self.fc1 = nn.Dense(36, 16)
            self.fc2 = nn.Dense(16, 4)

        def construct(self, x):
            x = self.pool(self.act(self.conv(x)))
            return self.fc2(ops.relu(self.fc1(x.reshape(x.shape[0], -1))))

    os.makedirs(out, exist_ok=True)
    cfg = os.path.join(out, "config.json")
    _config(cfg, task, level, os.path.join(out, "dump"))
    if variant.startswith("lenet"):
        net = LeNetPort(variant == "lenet_changed")
        w, xs, ys = _lenet_arrays()
    else:
        net = PortNet(variant == "port_changed")
        w, xs, ys = _port_arrays()
    for name, p in net.parameters_and_names():
        p.set_data(ms.Tensor(w[name]))
    opt = nn.SGD(net.trainable_params(), learning_rate=0.01)
    loss_fn = nn.MSELoss()

    def forward(x, y):
        return loss_fn(net(x), y)

    grad_fn = ms.value_and_grad(forward, None, opt.parameters)
    dbg = PrecisionDebugger(config_path=cfg)
    for step in range(steps):
        x, y = ms.Tensor(xs[step]), ms.Tensor(ys[step])
        dbg.start(net)
        _loss, grads = grad_fn(x, y)
        opt(grads)
        dbg.stop()
        dbg.step()
    np.save(os.path.join(out, "done.npy"), np.array([steps]))


if __name__ == "__main__":
    kind, task, level, variant, steps, out = sys.argv[1:7]
    if kind == "torch":
        _torch_main(task, level, variant, int(steps), out)
    else:
        _mindspore_main(task, level, variant, int(steps), out)
