"""Step-time overhead of nbdebug and msProbe on MindSpore PyNative (CPU), against the un-instrumented step.

Method (the one of ``bench/overhead.py``, for MindSpore)
------------------------------------------------------
* Two models built with ``mindspore.nn`` (nothing downloaded), synthetic data from a fixed seed: ``lenet``
  (conv 1->6->16, two max-pools, dense 256->120->84->10; batch 32 of 1x28x28) and ``mlp``
  (784->256->256->10, ReLU; batch 64).
* One *step* is ``loss, grads = value_and_grad(...)(x, y); optimizer(grads)`` with plain SGD, and a host
  read of the loss (``loss.asnumpy()``) so that MindSpore's asynchronous queue is drained inside the
  timed block. For msProbe the step also holds ``debugger.start(model)`` before it and
  ``debugger.stop(); debugger.step()`` after it (where msProbe writes the step's JSON).
* Configurations per model: ``baseline``; ``nbdebug-L0`` / ``-L1`` / ``-mix`` (``Debugger(model, level)``,
  statistics every step, values retained — the default); ``nbdebug-mix-noretain`` (``retain=False``);
  ``nbdebug-off`` (attached at mix with ``capture=False``); ``msprobe-L0`` / ``-L1`` / ``-mix``
  (``PrecisionDebugger`` with the ``statistics`` task, ``summary_mode: statistics``).
* Round-robin: each round visits every model and configuration (order rotated each round); a
  configuration is attached to a fresh copy of the model's initial weights, ``--warmup`` steps run
  untimed, ``--steps`` steps are timed together, and it is detached. A round's figure is the mean step
  time; a configuration's figure is the median over ``--rounds`` (>= 5 by default) rounds, and
  ``ratio = median(config) / median(baseline)``.
* msProbe patches MindSpore process-wide and cannot be detached, so each msProbe measurement runs in its
  own subprocess in its slot of the round-robin; that subprocess first times the un-instrumented step
  itself, giving ``ratio_local`` (against its own baseline) beside ``ratio``. As in the test suite,
  msProbe's MindSpore statistics get ``ops.norm`` for ``mint.norm`` (no CPU kernel in MindSpore 2.10).
* Timings on a shared machine are noisy; the load average is recorded.

Usage::

    python bench/overhead_mindspore.py                    # full run (5 rounds)
    python bench/overhead_mindspore.py --quick --no-msprobe
    python bench/overhead_mindspore.py --graph            # GRAPH-mode rows (bench/mindspore_graph_rows.py)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "results" / "overhead_mindspore.json"
NBDEBUG = ["baseline", "nbdebug-L0", "nbdebug-L1", "nbdebug-mix", "nbdebug-mix-noretain", "nbdebug-off"]
MSPROBE = ["msprobe-L0", "msprobe-L1", "msprobe-mix"]


def _models():
    import mindspore as ms
    from mindspore import nn

    class LeNet(nn.Cell):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(1, 6, 5, pad_mode="valid")
            self.conv2 = nn.Conv2d(6, 16, 5, pad_mode="valid")
            self.relu = nn.ReLU()
            self.pool = nn.MaxPool2d(2, 2)
            self.flatten = nn.Flatten()
            self.fc1 = nn.Dense(256, 120)
            self.fc2 = nn.Dense(120, 84)
            self.fc3 = nn.Dense(84, 10)

        def construct(self, x):
            x = self.pool(self.relu(self.conv1(x)))
            x = self.pool(self.relu(self.conv2(x)))
            x = self.flatten(x)
            x = self.relu(self.fc1(x))
            x = self.relu(self.fc2(x))
            return self.fc3(x)

    class MLP(nn.Cell):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Dense(784, 256)
            self.fc2 = nn.Dense(256, 256)
            self.fc3 = nn.Dense(256, 10)
            self.relu = nn.ReLU()

        def construct(self, x):
            return self.fc3(self.relu(self.fc2(self.relu(self.fc1(x)))))

    rng = np.random.default_rng(0)
    return {
        "lenet": (LeNet, ms.Tensor(rng.standard_normal((32, 1, 28, 28)).astype(np.float32)),
                  ms.Tensor(rng.integers(0, 10, 32).astype(np.int32))),
        "mlp": (MLP, ms.Tensor(rng.standard_normal((64, 784)).astype(np.float32)),
                ms.Tensor(rng.integers(0, 10, 64).astype(np.int32))),
    }


class Bench:
    """One model: a reference copy of its initial weights and a step function factory."""

    def __init__(self, name: str) -> None:
        import mindspore as ms

        ms.set_context(mode=ms.PYNATIVE_MODE)
        ms.set_seed(0)
        cls, self.x, self.y = _models()[name]
        self.cls = cls
        self.init = {p.name: p.asnumpy().copy() for p in cls().get_parameters()}

    def fresh(self):
        import mindspore as ms
        from mindspore import nn

        net = self.cls()
        for p in net.get_parameters():
            p.set_data(ms.Tensor(self.init[p.name]))
        crit = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
        opt = nn.SGD(net.trainable_params(), 0.01)
        grad_fn = ms.value_and_grad(lambda x, y: crit(net(x), y), None, opt.parameters)

        def step():
            loss, grads = grad_fn(self.x, self.y)
            opt(grads)
            return float(loss.asnumpy())

        return net, step


def _time(step, warmup: int, steps: int, around=None) -> float:
    for _ in range(warmup):
        around(step) if around else step()
    t0 = time.perf_counter()
    for _ in range(steps):
        around(step) if around else step()
    return (time.perf_counter() - t0) / steps


def measure_nbdebug(bench: Bench, config: str, warmup: int, steps: int) -> float:
    import nbdebug

    net, step = bench.fresh()
    if config == "baseline":
        return _time(step, warmup, steps)
    level = config.split("-")[1] if config != "nbdebug-off" else "mix"
    dbg = nbdebug.Debugger(net, level=level, retain=not config.endswith("noretain"),
                           capture=config != "nbdebug-off")
    try:
        return _time(step, warmup, steps)
    finally:
        dbg.close()
        _check_detached(net)


def _check_detached(net) -> None:
    from mindspore import nn, ops

    for _, cell in net.cells_and_names():
        if cell._forward_pre_hook or cell._forward_hook:
            raise RuntimeError(f"hooks left on {type(cell).__name__} after close()")
    if "__call__" in nn.Optimizer.__dict__ or getattr(ops.relu, "__nbdebug_wrapped__", False):
        raise RuntimeError("wrappers left installed after close()")


def _msprobe_child(model: str, level: str, warmup: int, steps: int) -> dict[str, Any]:
    """In a subprocess: time the plain step, then the step under msProbe's statistics dump."""
    import mindspore as ms
    from mindspore import mint, ops

    bench = Bench(model)
    _, step = bench.fresh()
    base = _time(step, warmup, steps)

    import types

    from msprobe.core.dump.data_dump.data_processor import mindspore_processor
    from msprobe.mindspore import PrecisionDebugger

    class _Mint(types.ModuleType):  # mint with a CPU-capable norm (MindSpore 2.10 has no CPU mint.norm)
        def __getattr__(self, name):
            return getattr(mint, name)

    proxy = _Mint("mint")
    proxy.norm = ops.norm
    mindspore_processor.mint = proxy
    out = tempfile.mkdtemp(prefix="nbdebug-bench-msprobe-")
    try:
        cfg = os.path.join(out, "config.json")
        with open(cfg, "w") as f:
            json.dump({"task": "statistics", "dump_path": os.path.join(out, "dump"), "rank": [], "step": [],
                       "level": level, "async_dump": False,
                       "statistics": {"scope": [], "list": [], "data_mode": ["all"], "summary_mode": "statistics"}},
                      f)
        net, step = bench.fresh()
        dbg = PrecisionDebugger(config_path=cfg)

        def around(fn):
            dbg.start(net)
            fn()
            dbg.stop()
            dbg.step()

        t = _time(step, warmup, steps, around)
        size = sum(p.stat().st_size for p in Path(out, "dump").rglob("*") if p.is_file())
        return {"time": t, "local_baseline": base, "dump_bytes_per_step": size / (warmup + steps),
                "mindspore": ms.__version__}
    finally:
        shutil.rmtree(out, ignore_errors=True)


def measure_msprobe(model: str, config: str, warmup: int, steps: int) -> dict[str, Any]:
    level = config.split("-")[1]
    env = dict(os.environ, PYTHONPATH=str(HERE.parent) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, __file__, "--child", model, level, str(warmup), str(steps)],
                          capture_output=True, text=True, env=env, timeout=900)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not line:
        raise RuntimeError(f"msProbe {config} on {model} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return json.loads(line[-1])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=["lenet", "mlp"])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="2 rounds, 4 steps, 2 warmup")
    ap.add_argument("--no-msprobe", action="store_true")
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    ap.add_argument("--floor-removal", action="store_true",
                    help="with --graph: also the floor with the deletion of its files timed (nbdebug deletes them)")
    ap.add_argument("--child", nargs=4, metavar=("MODEL", "LEVEL", "WARMUP", "STEPS"), help=argparse.SUPPRESS)
    ap.add_argument("--graph", action="store_true",
                    help="GRAPH-mode rows instead (TrainOneStepCell, fresh process per measurement): "
                         "bench/mindspore_graph_rows.py")
    args = ap.parse_args(argv)
    if args.child:
        model, level, warmup, steps = args.child
        print(json.dumps(_msprobe_child(model, level, int(warmup), int(steps))))
        return {}
    if args.quick:
        args.rounds, args.steps, args.warmup = 2, 4, 2
    if args.graph:
        sys.path.insert(0, str(HERE))
        from mindspore_graph_rows import CONFIGS, MODELS, format_rows, graph_rows

        models = tuple(m for m in args.models if m in MODELS) if args.models != ["lenet", "mlp"] else MODELS
        configs = CONFIGS + (("floor:removal",) if args.floor_removal else ())
        rows = graph_rows(models, rounds=min(args.rounds, 3), warmup=args.warmup, steps=args.steps, configs=configs)
        print(format_rows(rows))
        return {"graph": rows}
    import mindspore as ms

    configs = NBDEBUG + ([] if args.no_msprobe else MSPROBE)
    benches = {m: Bench(m) for m in args.models}
    times: dict[str, dict[str, list[float]]] = {m: {c: [] for c in configs} for m in args.models}
    extra: dict[str, dict[str, list[dict[str, Any]]]] = {m: {c: [] for c in MSPROBE} for m in args.models}
    t_start = time.time()
    for r in range(args.rounds):
        for m in args.models:
            order = configs[r % len(configs):] + configs[: r % len(configs)]
            for c in order:
                if c.startswith("msprobe"):
                    res = measure_msprobe(m, c, args.warmup, args.steps)
                    times[m][c].append(res["time"])
                    extra[m][c].append(res)
                else:
                    times[m][c].append(measure_nbdebug(benches[m], c, args.warmup, args.steps))
        print(f"round {r + 1}/{args.rounds} done ({time.time() - t_start:.0f} s)", file=sys.stderr)
    results: dict[str, Any] = {}
    for m in args.models:
        base = statistics.median(times[m]["baseline"])
        rows = {}
        for c in configs:
            med = statistics.median(times[m][c])
            row = {"median_ms": med * 1e3, "ratio": med / base, "rounds_ms": [t * 1e3 for t in times[m][c]]}
            if c in MSPROBE and extra[m][c]:
                local = statistics.median(e["local_baseline"] for e in extra[m][c])
                row["ratio_local"] = med / local
                row["dump_bytes_per_step"] = statistics.median(e["dump_bytes_per_step"] for e in extra[m][c])
            rows[c] = row
        results[m] = rows
    data = {
        "meta": {"mindspore": ms.__version__, "python": platform.python_version(), "machine": platform.machine(),
                 "cpus": os.cpu_count(), "loadavg": os.getloadavg(), "rounds": args.rounds, "steps": args.steps,
                 "warmup": args.warmup, "mode": "PyNative, CPU", "duration_s": time.time() - t_start},
        "models": results,
    }
    print(f"{'model':8s} {'config':22s} {'median ms':>10s} {'ratio':>7s} {'local':>7s}")
    for m, rows in results.items():
        for c, row in rows.items():
            local = f"{row['ratio_local']:7.2f}" if "ratio_local" in row else " " * 7
            print(f"{m:8s} {c:22s} {row['median_ms']:10.2f} {row['ratio']:7.2f} {local}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1))
    return data


if __name__ == "__main__":
    main()
