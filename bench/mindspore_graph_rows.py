"""GRAPH-mode rows of ``bench/overhead_mindspore.py``: a compiled ``TrainOneStepCell`` step, plain, under
nbdebug (MindSpore's kernel dump read back after every step), and the floor (the dump armed, nothing read).

MindSpore arms its kernel dump only before the first graph compile of a process, so every measurement is
a fresh process: ``baseline`` (plain GRAPH mode) or ``nbdebug`` (``Debugger(net)`` created first, default
settings) or ``floor`` (MindSpore's kernel dump armed as nbdebug arms it, no Debugger: what MindSpore's
own dump costs, nothing read). Rounds alternate the order per model; a configuration's figure is the
median over rounds of the mean step time of ``steps`` timed steps after ``warmup`` (the first compile is
in the warm-up), and the ratio is nbdebug's median over the baseline's. Each process then times
``steps`` single steps: the fastest one over all rounds (``best_ms``) is the figure least disturbed by
other load on a shared machine; ``cpu_ms`` is the process's CPU time per step over them. The floor's dump
files are deleted between steps, untimed.

Models: ``lenet`` and ``mlp`` (as the PyNative rows, cross-entropy), ``bn_cnn`` (two conv + BatchNorm +
ReLU blocks, cross-entropy), ``regressor`` (dense 64→128→1 with MSELoss, batch 16), ``transformer`` (one
encoder block, d=64, 4 heads, 16 tokens, batch 8), ``resnet18`` (mindcv's ResNet-18 layout, built here with
``mindspore.nn``; 32x32 inputs, batch 4), ``model_train`` (LeNet through ``mindspore.train.Model.train``,
non-sink, one batch per call) and ``amp_o2`` (LeNet through ``amp.build_train_network(level="O2")``). Run through
``python bench/overhead_mindspore.py --graph`` or directly: ``python bench/mindspore_graph_rows.py``;
``python bench/mindspore_graph_rows.py --dump-options`` measures the floor under each MindSpore dump
setting nbdebug could choose (:data:`DUMP_OPTIONS`); ``python bench/mindspore_graph_rows.py --sampled`` the
sampled capture (``Debugger(net, graph_every=k)``, k = 5 and 10) on the tiny models (:func:`sampled_rows`).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MODELS = ("lenet", "mlp", "bn_cnn", "regressor", "transformer", "resnet18", "model_train", "amp_o2")
CONFIGS = ("baseline", "floor", "nbdebug")
#: the dump settings measured by ``--dump-options`` (each a floor: armed, nothing read): MindSpore's config
#: keys changed from nbdebug's, or ``disk`` (the system's temporary directory instead of /dev/shm)
DUMP_OPTIONS: dict[str, dict[str, Any]] = {
    "default": {},
    "disk": {},
    "outputs_only": {"input_output": 2},
    "bin": {"file_format": "bin"},
    "overflow_only": {"op_debug_mode": 3},
    "first_step_only": {"iteration": "0"},
}


def _build(name: str) -> tuple[Any, Any, Any, Any]:
    import mindspore as ms
    import numpy as np
    from mindspore import nn

    sys.path.insert(0, str(HERE))
    rng = np.random.default_rng(0)
    ce = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    if name in ("lenet", "mlp"):
        from overhead_mindspore import _models

        cls, x, y = _models()[name]
        return cls(), x, y, ce
    if name == "bn_cnn":
        class BNCNN(nn.Cell):
            def __init__(self):
                super().__init__()
                self.block1 = nn.SequentialCell(nn.Conv2d(3, 16, 3), nn.BatchNorm2d(16), nn.ReLU())
                self.block2 = nn.SequentialCell(nn.Conv2d(16, 32, 3, stride=2), nn.BatchNorm2d(32), nn.ReLU())
                self.pool = nn.AdaptiveAvgPool2d(1)
                self.flatten = nn.Flatten()
                self.fc = nn.Dense(32, 10)

            def construct(self, x):
                return self.fc(self.flatten(self.pool(self.block2(self.block1(x)))))

        return (BNCNN(), ms.Tensor(rng.standard_normal((16, 3, 32, 32)).astype(np.float32)),
                ms.Tensor(rng.integers(0, 10, 16).astype(np.int32)), ce)
    if name == "transformer":
        return (_transformer(), ms.Tensor(rng.standard_normal((8, 16, 64)).astype(np.float32)),
                ms.Tensor(rng.integers(0, 10, 8).astype(np.int32)), ce)
    if name == "resnet18":
        return (_resnet18(), ms.Tensor(rng.standard_normal((4, 3, 32, 32)).astype(np.float32)),
                ms.Tensor(rng.integers(0, 10, 4).astype(np.int32)), ce)
    if name in ("model_train", "amp_o2"):
        return _build("lenet")
    if name == "regressor":
        net = nn.SequentialCell(nn.Dense(64, 128), nn.ReLU(), nn.Dense(128, 1))
        return (net, ms.Tensor(rng.standard_normal((16, 64)).astype(np.float32)),
                ms.Tensor(rng.standard_normal((16, 1)).astype(np.float32)), nn.MSELoss())
    raise ValueError(f"unknown model {name!r}; choose from {', '.join(MODELS)}")


def _transformer() -> Any:
    """One pre-norm Transformer encoder block (d=64, 4 heads, FFN 256) over 16 tokens, mean-pooled, a
    10-way head: attention written out (Dense q/k/v, BatchMatMul, Softmax) as a small model would."""
    from mindspore import nn, ops

    class Block(nn.Cell):
        def __init__(self, d: int = 64, heads: int = 4):
            super().__init__()
            self.heads, self.dh = heads, d // heads
            self.ln1, self.ln2 = nn.LayerNorm((d,)), nn.LayerNorm((d,))
            self.q, self.k, self.v, self.o = (nn.Dense(d, d) for _ in range(4))
            self.ff = nn.SequentialCell(nn.Dense(d, 4 * d), nn.GELU(), nn.Dense(4 * d, d))
            self.drop = nn.Dropout(p=0.1)

        def _split(self, t):
            b, n, _ = t.shape
            return t.reshape(b, n, self.heads, self.dh).transpose(0, 2, 1, 3)

        def construct(self, x):
            h = self.ln1(x)
            q, k, v = self._split(self.q(h)), self._split(self.k(h)), self._split(self.v(h))
            att = ops.softmax(ops.matmul(q, k.transpose(0, 1, 3, 2)) / (self.dh ** 0.5), axis=-1)
            a = ops.matmul(self.drop(att), v).transpose(0, 2, 1, 3)
            x = x + self.o(a.reshape(x.shape))
            return x + self.drop(self.ff(self.ln2(x)))

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.block = Block()
            self.head = nn.Dense(64, 10)

        def construct(self, x):
            return self.head(self.block(x).mean(axis=1))

    return Net()


def _resnet18() -> Any:
    """ResNet-18 as mindcv builds it (mindcv is not installed here): 7x7/2 stem + max pool, four stages of
    two BasicBlocks (64-128-256-512, 1x1 projection shortcuts), global average pool, a 10-way head."""
    from mindspore import nn

    def conv_bn(cin, cout, k, stride):
        return nn.SequentialCell(nn.Conv2d(cin, cout, k, stride=stride, pad_mode="pad", padding=k // 2,
                                           has_bias=False), nn.BatchNorm2d(cout))

    class BasicBlock(nn.Cell):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1 = conv_bn(cin, cout, 3, stride)
            self.conv2 = conv_bn(cout, cout, 3, 1)
            self.relu = nn.ReLU()
            self.down = conv_bn(cin, cout, 1, stride) if stride != 1 or cin != cout else None

        def construct(self, x):
            identity = self.down(x) if self.down is not None else x
            return self.relu(self.conv2(self.relu(self.conv1(x))) + identity)

    class ResNet18(nn.Cell):
        def __init__(self):
            super().__init__()
            self.stem = nn.SequentialCell(conv_bn(3, 64, 7, 2), nn.ReLU(),
                                          nn.MaxPool2d(3, 2, pad_mode="same"))
            layers, cin = [], 64
            for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
                layers += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
                cin = cout
            self.layers = nn.SequentialCell(layers)
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.flatten = nn.Flatten()
            self.fc = nn.Dense(512, 10)

        def construct(self, x):
            return self.fc(self.flatten(self.pool(self.layers(self.stem(x)))))

    return ResNet18()


def _trainer(model: str, net: Any, loss: Any, x: Any, y: Any) -> Any:
    """A callable running one training step: ``TrainOneStepCell`` (SGD), or for ``model_train``
    ``mindspore.train.Model.train`` over a one-batch dataset (non-sink), or for ``amp_o2``
    ``amp.build_train_network(level="O2")`` (Momentum)."""
    import mindspore as ms
    from mindspore import amp, nn

    if model == "model_train":
        ds = ms.dataset.GeneratorDataset([(x.asnumpy(), y.asnumpy())], ["x", "y"], shuffle=False)
        m = ms.train.Model(net, loss, nn.SGD(net.trainable_params(), 0.01))
        return lambda: m.train(1, ds, dataset_sink_mode=False)
    if model == "amp_o2":
        train = amp.build_train_network(net, nn.Momentum(net.trainable_params(), 0.01, 0.9), loss, level="O2",
                                        loss_scale_manager=None)
    else:
        train = nn.TrainOneStepCell(nn.WithLossCell(net, loss), nn.SGD(net.trainable_params(), 0.01))
    return lambda: float(train(x, y).asnumpy())


def child(model: str, config: str, warmup: int, steps: int) -> dict[str, Any]:
    """One measurement in this (fresh) process: mean ms per step."""
    import mindspore as ms

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(0)
    net, x, y, loss = _build(model)
    dbg = None
    between = None
    if config != "baseline":
        sys.path.insert(0, str(HERE.parent))
    if config.startswith("floor"):
        # MindSpore's own dump cost: nbdebug's dump config armed, nothing patched or read; the files are
        # deleted between steps, outside the timed step. "floor:<option>" changes the config (DUMP_OPTIONS)
        from nbdebug.frameworks.mindspore import graph as kd

        option = config.partition(":")[2] or "default"
        every = int(option[len("every="):]) if option.startswith("every=") else 1
        if option == "disk":
            os.environ["NBDEBUG_DUMP_PARENT"] = tempfile.gettempdir()
        if every == 1 and option in DUMP_OPTIONS:
            base_config = kd.dump_config
            kd.dump_config = lambda path, net_name=kd.NET_NAME: _changed(base_config(path, net_name), option)
        kd.arm_kernel_dump(every)

        def between():
            for rank in kd.find_rank_dirs(kd.armed_dump_dir()):
                for _it, _g, path in kd.iteration_dirs(rank):
                    kd.remove_files(os.path.join(path, f) for f in os.listdir(path))
    if config.startswith("nbdebug"):  # "nbdebug:every=K": Debugger(net, graph_every=K)
        import nbdebug

        option = config.partition(":")[2]
        every = int(option[len("every="):]) if option.startswith("every=") else 1
        dbg = nbdebug.Debugger(net, graph_every=every)  # before the first compile
    step = _trainer(model, net, loss, x, y)
    if config == "floor:removal":  # the floor with its deletion inside the timed step (nbdebug deletes too)
        remove, between, plain = between, None, step

        def step():
            plain()
            remove()
    out = _timed_steps(step, warmup, steps, between)
    if dbg is not None:
        out["steps_recorded"] = dbg.step_index
        out["steps_captured"] = len(dbg.session.steps) + len(dbg.session.history.steps)
        out["nodes"] = len(dbg.graph)
        dbg.close()
    return out


def _changed(cfg: dict[str, Any], option: str) -> dict[str, Any]:
    cfg["common_dump_settings"].update(DUMP_OPTIONS[option])
    return cfg


def dump_options(models: tuple[str, ...] = MODELS, warmup: int = 3, steps: int = 10) -> str:
    """A floor per dump setting and model (fresh processes), against the plain step: the table of what
    MindSpore's dump itself costs under each setting nbdebug could choose (fastest step, CPU per step)."""
    lines = [f"{'model':10s} {'setting':16s} {'best ms':>8s} {'ratio':>7s} {'cpu ms':>8s} {'ratio':>7s}"]
    for m in models:
        base = measure(m, "baseline", warmup, steps)
        for option in DUMP_OPTIONS:
            r = measure(m, f"floor:{option}", warmup, steps)
            lines.append(f"{m:10s} {option:16s} {r['best_ms']:8.2f} {r['best_ms'] / base['best_ms']:6.2f}× "
                         f"{r['cpu_ms']:8.2f} {r['cpu_ms'] / base['cpu_ms']:6.2f}×")
            print(lines[-1], file=sys.stderr, flush=True)
    return "\n".join(lines)


def _timed_steps(step: Any, warmup: int, steps: int, between: Any = None) -> dict[str, float]:
    """Mean wall time per step over ``steps`` steps after ``warmup``, then the fastest single step of as many
    again (on a shared machine, the figure least disturbed by others) and the process's CPU time per step
    (all threads: the work done, whatever else the machine runs); ``between`` runs untimed after each."""
    walls, cpus = [], []
    for i in range(warmup + 2 * steps):
        t0, c0 = time.perf_counter(), time.process_time()
        step()
        if i >= warmup:
            walls.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)
        if between is not None:
            between()
    return {"ms": sum(walls[:steps]) / steps * 1e3, "best_ms": min(walls[steps:]) * 1e3,
            "cpu_ms": sum(cpus[steps:]) / steps * 1e3}


def measure(model: str, config: str, warmup: int, steps: int) -> dict[str, Any]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("MINDSPORE_DUMP_CONFIG", None)
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", model, config, str(warmup),
                           str(steps)], capture_output=True, text=True, env=env, timeout=900)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"GRAPH-mode {model}/{config} failed (rc={proc.returncode}):\n"
                           + (proc.stdout + proc.stderr)[-3000:])
    return json.loads(lines[-1])


def graph_rows(models: tuple[str, ...] = MODELS, rounds: int = 3, warmup: int = 3, steps: int = 10,
               configs: tuple[str, ...] = CONFIGS) -> dict:
    """Every model under every configuration, rounds alternating the order (``configs`` may add
    ``"floor:removal"``: the floor with the deletion of its files timed, as nbdebug's is)."""
    times: dict[tuple[str, str], list[float]] = {}
    best: dict[tuple[str, str], list[float]] = {}
    cpu: dict[tuple[str, str], list[float]] = {}
    extra: dict[str, dict[str, Any]] = {}
    load_start = os.getloadavg()[0]
    for r in range(rounds):
        for m in models:
            order = configs if r % 2 == 0 else configs[::-1]
            for c in order:
                res = measure(m, c, warmup, steps)
                times.setdefault((m, c), []).append(res["ms"])
                best.setdefault((m, c), []).append(res["best_ms"])
                cpu.setdefault((m, c), []).append(res["cpu_ms"])
                if c == "nbdebug":
                    extra[m] = {k: v for k, v in res.items() if k not in ("ms", "best_ms", "cpu_ms")}
                print(f"GRAPH round {r + 1} {m:10s} {c:9s} {res['ms']:8.2f} ms/step", file=sys.stderr, flush=True)
    rows = {}
    load = (load_start, os.getloadavg()[0])
    for m in models:
        base = statistics.median(times[(m, "baseline")])
        floor = statistics.median(times[(m, "floor")])
        dbg = statistics.median(times[(m, "nbdebug")])
        rows[m] = {"baseline_ms": base, "floor_ms": floor, "floor_ratio": floor / base, "nbdebug_ms": dbg,
                   "ratio": dbg / base, **extra.get(m, {})}
        fastest = {c: min(best[(m, c)]) for c in CONFIGS}
        rows[m]["best_ms"] = fastest
        rows[m]["best_ratio"] = fastest["nbdebug"] / fastest["baseline"]
        rows[m]["best_floor_ratio"] = fastest["floor"] / fastest["baseline"]
        rows[m]["cpu_ms"] = {c: statistics.median(cpu[(m, c)]) for c in configs}
        rows[m]["cpu_rounds"] = {c: cpu[(m, c)] for c in configs}
        rows[m]["loadavg"] = load
    return rows


#: the sampled-capture rows: the plain step, nbdebug capturing every step, every 5th and every 10th, and
#: MindSpore's dump alone at every 5th and 10th
SAMPLED_CONFIGS = ("baseline", "nbdebug", "nbdebug:every=5", "nbdebug:every=10", "floor:every=5", "floor:every=10")


def sampled_rows(models: tuple[str, ...] = ("mlp", "regressor"), rounds: int = 3, warmup: int = 3,
                 steps: int = 20) -> str:
    """``Debugger(net, graph_every=k)`` against the plain step (fresh processes, rounds alternating the order):
    median over rounds of the mean wall time per step and of the process CPU time per step. ``steps`` is a
    multiple of 5 and 10, so each mean holds the same share of captured steps as a long run; the fastest
    single step means nothing here (it is a skipped one) and is not reported."""
    wall: dict[tuple[str, str], list[float]] = {}
    cpu: dict[tuple[str, str], list[float]] = {}
    for r in range(rounds):
        for m in models:
            for c in SAMPLED_CONFIGS if r % 2 == 0 else SAMPLED_CONFIGS[::-1]:
                res = measure(m, c, warmup, steps)
                wall.setdefault((m, c), []).append(res["ms"])
                cpu.setdefault((m, c), []).append(res["cpu_ms"])
                print(f"sampled round {r + 1} {m:10s} {c:17s} {res['ms']:8.2f} ms/step", file=sys.stderr, flush=True)
    lines = [f"{'model':10s} {'config':17s} {'wall ms':>8s} {'ratio':>7s} {'cpu ms':>8s} {'ratio':>7s}"]
    for m in models:
        bw, bc = statistics.median(wall[(m, "baseline")]), statistics.median(cpu[(m, "baseline")])
        for c in SAMPLED_CONFIGS:
            w, cp = statistics.median(wall[(m, c)]), statistics.median(cpu[(m, c)])
            lines.append(f"{m:10s} {c:17s} {w:8.2f} {w / bw:6.2f}× {cp:8.2f} {cp / bc:6.2f}×")
    return "\n".join(lines)


def format_rows(rows: dict) -> str:
    """The table: plain step, the floor (MindSpore's dump armed, nothing read) and nbdebug, with ratios."""
    out = [f"{'GRAPH model':12s} {'base ms':>8s} {'floor ms':>9s} {'floor':>7s} {'nbdebug ms':>10s} {'ratio':>7s}"
           f"  (target ≤ 2×; floor = MindSpore's kernel dump armed, nothing read)"]
    for m, r in rows.items():
        out.append(f"{m:12s} {r['baseline_ms']:8.2f} {r['floor_ms']:9.2f} {r['floor_ratio']:6.2f}× "
                   f"{r['nbdebug_ms']:10.2f} {r['ratio']:6.2f}×  {r.get('nodes', '?')} nodes")
    out.append("fastest single step (least disturbed by other load): base / floor / nbdebug ms")
    for m, r in rows.items():
        b = r["best_ms"]
        out.append(f"{m:12s} {b['baseline']:8.2f} {b['floor']:9.2f} {r['best_floor_ratio']:6.2f}× "
                   f"{b['nbdebug']:10.2f} {r['best_ratio']:6.2f}×")
    out.append("process CPU time per step (all threads): base / floor / nbdebug ms, and nbdebug ÷ floor (target ≤ 1.2)")
    for m, r in rows.items():
        c = r["cpu_ms"]
        out.append(f"{m:12s} {c['baseline']:8.2f} {c['floor']:9.2f} {c['floor'] / c['baseline']:6.2f}× "
                   f"{c['nbdebug']:10.2f} {c['nbdebug'] / c['baseline']:6.2f}×  {c['nbdebug'] / c['floor']:5.2f}× floor"
                   f"  (rounds: {' '.join(f'{v:.1f}' for v in r['cpu_rounds']['nbdebug'])} / "
                   f"{' '.join(f'{v:.1f}' for v in r['cpu_rounds']['floor'])})")
    for m, r in rows.items():
        c = r["cpu_ms"]
        if "floor:removal" in c:
            out.append(f"{m:12s} floor with its deletion timed {c['floor:removal']:8.2f} ms: nbdebug ÷ it "
                       f"{c['nbdebug'] / c['floor:removal']:5.2f}×  (rounds: "
                       f"{' '.join(f'{v:.1f}' for v in r['cpu_rounds']['floor:removal'])})")
    if any("loadavg" in r for r in rows.values()):
        load = next(r["loadavg"] for r in rows.values() if "loadavg" in r)
        out.append(f"load average (1 min) at the start / end of the rounds: {load[0]:.1f} / {load[1]:.1f}")
    return "\n".join(out)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _m, _c, _w, _s = sys.argv[2:6]
        print(json.dumps(child(_m, _c, int(_w), int(_s))))
    elif len(sys.argv) > 1 and sys.argv[1] == "--dump-options":
        print(dump_options())
    elif len(sys.argv) > 1 and sys.argv[1] == "--sampled":
        print(sampled_rows())
    else:
        print(format_rows(graph_rows()))
