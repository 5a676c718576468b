"""Step-time overhead of nbdebug (and msProbe) against the un-instrumented training step.

Method
------
* Three models are defined here with ``torch.nn`` (nothing is downloaded), each with synthetic data
  from a fixed seed: an MLP, a small CNN (with BatchNorm) and a small transformer (4 post-LN encoder
  blocks like ``nn.TransformerEncoderLayer``: d=256, 4 heads, FFN 1024, dropout 0; batch 8 x 64
  tokens; embedding in, vocabulary head out).
* One *step* is ``zero_grad, forward, loss, backward, optimizer.step()`` (plain SGD). For msProbe the
  step also holds ``debugger.start(model)`` before it and ``debugger.stop(); debugger.step()`` after
  it, where msProbe writes its JSON for the step: that write is part of what msProbe costs.
* Configurations, per model:

  - ``baseline``: un-instrumented;
  - ``nbdebug-L0``, ``nbdebug-L1``, ``nbdebug-mix``: ``nbdebug.Debugger(model, level=...)``, statistics
    every step (the default), the step ended by the optimizer's step;
  - ``nbdebug-mix-noretain``: mix with ``retain=False`` (statistics only: the cost of retention is the
    difference to ``nbdebug-mix``);
  - ``nbdebug-off``: attached at mix with ``capture=False`` (hooks in place, recording nothing);
  - ``msprobe-L0``, ``msprobe-L1``, ``msprobe-mix``: msProbe's ``PrecisionDebugger`` with the
    ``statistics`` task and its defaults otherwise (``summary_mode: statistics``, ``extra_info: true``
    and ``risk_level: FOCUS``, which skips low-risk APIs such as view/reshape/transpose at L1 and mix).

* Measurement is round-robin: for each round, for each model, for each configuration (the order is
  rotated every round), the configuration is attached to a freshly reset copy of the model's initial
  weights, ``--warmup`` steps run untimed, ``--steps`` steps are timed together, and it is detached.
  A round's figure is the mean step time of its timed block; a configuration's figure is the median
  over the rounds, and ``ratio = median(config) / median(baseline)`` for the same model.
* Isolation: after every nbdebug configuration the bench checks that no module hook, parameter hook,
  global optimizer hook or torch-function mode is left behind (it fails loudly otherwise).
  msProbe cannot be detached inside a process: ``PrecisionDebugger`` is a singleton whose construction
  patches ``torch``/``torch.nn.functional``/``Tensor`` APIs and whose ``start`` registers module and
  global optimizer hooks, and there is no public call that undoes them. Each msProbe measurement
  therefore runs in its own subprocess, launched in its slot of the round-robin. That subprocess first
  times the un-instrumented step itself (before importing msProbe), so msProbe has two ratios: against
  the main process's baseline (``ratio``) and against its own process's baseline (``ratio_local``).
  msProbe's dump goes to a temporary directory under /tmp that is removed afterwards; its size is
  reported as bytes per step.
* ``torch.set_num_threads(--threads)`` (default 1) is applied in the main process and in every
  subprocess. Timings on a shared machine are noisy; the load average is recorded in the results.

Results are printed as a table and written to ``bench/results/overhead.json`` (``--out``). For the small
transformer the issue's targets are checked: L0 <= 1.15x, L1 <= 1.5x, mix <= 1.6x, capture off <= 1.02x.

Usage::

    python bench/overhead.py                       # full run (5 rounds)
    python bench/overhead.py --quick --no-msprobe  # smoke run
    python bench/overhead.py --models transformer --profile nbdebug-L1   # + cProfile of one config
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import math
import os
import platform
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim.optimizer as _optim

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "results" / "overhead.json"

MODELS = ("mlp", "cnn", "transformer")
NBDEBUG_CONFIGS: dict[str, dict[str, Any]] = {
    "nbdebug-L0": {"level": "L0"},
    "nbdebug-L1": {"level": "L1"},
    "nbdebug-mix": {"level": "mix"},
    "nbdebug-mix-noretain": {"level": "mix", "retain": False},
    "nbdebug-off": {"level": "mix", "capture": False},
}
MSPROBE_LEVELS = ("L0", "L1", "mix")
TARGET_MODEL = "transformer"
TARGETS = {"nbdebug-L0": 1.15, "nbdebug-L1": 1.5, "nbdebug-mix": 1.6, "nbdebug-off": 1.02}
LR = 0.01
N_BATCHES = 4  # fixed synthetic batches, cycled


# -- models ----------------------------------------------------------------------------------------
class MLP(nn.Module):
    def __init__(self, d_in: int = 256, hidden: int = 512, depth: int = 3, classes: int = 10) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        d = d_in
        for _ in range(depth):
            layers += [nn.Linear(d, hidden), nn.ReLU()]
            d = hidden
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(d, classes)

    def forward(self, x):
        return self.head(self.body(x))


class SmallCNN(nn.Module):
    def __init__(self, classes: int = 10) -> None:
        super().__init__()

        def stage(cin: int, cout: int, stride: int) -> nn.Sequential:
            return nn.Sequential(nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False),
                                 nn.BatchNorm2d(cout), nn.ReLU())

        self.features = nn.Sequential(stage(3, 32, 1), stage(32, 64, 2), stage(64, 128, 2))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(128, classes)

    def forward(self, x):
        return self.head(torch.flatten(self.pool(self.features(x)), 1))


class SelfAttention(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.out_proj = nn.Linear(d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        y = F.scaled_dot_product_attention(q, k, v)
        return self.out_proj(y.transpose(1, 2).reshape(b, t, d))


class EncoderBlock(nn.Module):
    """Post-LN like ``nn.TransformerEncoderLayer`` (ReLU FFN), written out so every op is visible."""

    def __init__(self, d: int = 256, heads: int = 4, ffn: int = 1024, dropout: float = 0.0) -> None:
        super().__init__()
        self.self_attn = SelfAttention(d, heads)
        self.linear1 = nn.Linear(d, ffn)
        self.linear2 = nn.Linear(ffn, d)
        self.norm1 = nn.LayerNorm(d)
        self.norm2 = nn.LayerNorm(d)
        self.dropout = nn.Dropout(dropout)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)

    def forward(self, x):
        x = self.norm1(x + self.dropout1(self.self_attn(x)))
        return self.norm2(x + self.dropout2(self.linear2(self.dropout(F.relu(self.linear1(x))))))


class SmallTransformer(nn.Module):
    def __init__(self, vocab: int = 1000, d: int = 256, heads: int = 4, ffn: int = 1024, blocks: int = 4,
                 seq: int = 64) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(seq, d) * 0.02)
        self.blocks = nn.ModuleList(EncoderBlock(d, heads, ffn) for _ in range(blocks))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, tokens):
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def _lm_loss(logits, target):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


@dataclass
class Workload:
    name: str
    model: nn.Module
    batches: list[tuple[torch.Tensor, torch.Tensor]]
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    init_state: dict[str, torch.Tensor]
    _i: int = 0

    def reset(self) -> torch.optim.Optimizer:
        """Initial weights back, a fresh optimizer, data from the first batch: every block starts alike."""
        self.model.load_state_dict(self.init_state)
        self.model.train()
        self._i = 0
        return torch.optim.SGD(self.model.parameters(), lr=LR)

    def step(self, opt: torch.optim.Optimizer) -> None:
        x, y = self.batches[self._i % len(self.batches)]
        self._i += 1
        opt.zero_grad(set_to_none=True)
        loss = self.loss_fn(self.model(x), y)
        loss.backward()
        opt.step()


def make_workload(name: str, seed: int = 0) -> Workload:
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed + 1)
    if name == "mlp":
        model: nn.Module = MLP()
        batches = [(torch.randn(64, 256, generator=g), torch.randint(0, 10, (64,), generator=g))
                   for _ in range(N_BATCHES)]
        loss_fn = F.cross_entropy
    elif name == "cnn":
        model = SmallCNN()
        batches = [(torch.randn(16, 3, 32, 32, generator=g), torch.randint(0, 10, (16,), generator=g))
                   for _ in range(N_BATCHES)]
        loss_fn = F.cross_entropy
    elif name == "transformer":
        model = SmallTransformer()
        batches = []
        for _ in range(N_BATCHES):
            tokens = torch.randint(0, 1000, (8, 65), generator=g)
            batches.append((tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()))
        loss_fn = _lm_loss
    else:
        raise ValueError(f"unknown model {name!r}; choose from {', '.join(MODELS)}")
    init = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return Workload(name, model, batches, loss_fn, init)


def _import_nbdebug():
    """The installed nbdebug, else this checkout's (the bench lives in the repository)."""
    try:
        import nbdebug
    except ImportError:
        sys.path.insert(0, str(HERE.parent))
        import nbdebug
    return nbdebug


# -- timing ----------------------------------------------------------------------------------------
#: the clock steps are timed with: wall time, or this process's CPU time (``use_clock("cpu")``: robust when
#: the machine is shared; with one torch thread it is the step's own work, nbdebug's included)
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
_CLOCK = [time.perf_counter]


def use_clock(name: str) -> None:
    _CLOCK[0] = CLOCKS[name]


def _timed_block(wl: Workload, opt, steps: int, warmup: int, before: Callable[[], None] | None = None,
                 after: Callable[[], None] | None = None) -> float:
    """Mean ms per step over ``steps`` timed steps, after ``warmup`` untimed ones."""
    def one() -> None:
        if before is not None:
            before()
        wl.step(opt)
        if after is not None:
            after()

    for _ in range(warmup):
        one()
    gc.collect()
    clock = _CLOCK[0]
    t0 = clock()
    for _ in range(steps):
        one()
    return (clock() - t0) * 1e3 / steps


def _hook_census(model: nn.Module) -> dict[str, int]:
    """Counts of everything an instrumentation could leave behind."""
    mod_hooks = 0
    for m in model.modules():
        for attr in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks",
                     "_forward_hooks_with_kwargs", "_forward_hooks_always_called",
                     "_forward_pre_hooks_with_kwargs"):
            mod_hooks += len(getattr(m, attr, None) or ())
    param_hooks = sum(len(p._post_accumulate_grad_hooks or ()) + len(p._backward_hooks or ())
                      for p in model.parameters())
    import torch.nn.modules.module as _mm

    return {
        "module_hooks": mod_hooks,
        "param_hooks": param_hooks,
        "global_module_hooks": len(_mm._global_forward_hooks) + len(_mm._global_forward_pre_hooks)
        + len(_mm._global_backward_hooks) + len(_mm._global_backward_pre_hooks),
        "optimizer_hooks": len(_optim._global_optimizer_pre_hooks) + len(_optim._global_optimizer_post_hooks),
        "function_modes": len(torch.overrides._get_current_function_mode_stack()),
    }


def run_baseline(wl: Workload, steps: int, warmup: int) -> float:
    return _timed_block(wl, wl.reset(), steps, warmup)


def run_nbdebug(wl: Workload, steps: int, warmup: int, kwargs: dict[str, Any], clean: dict[str, int]) -> float:
    nbdebug = _import_nbdebug()

    opt = wl.reset()
    kw = {"level": "mix", "capture": True, **kwargs}
    dbg = nbdebug.Debugger(wl.model, **kw)
    try:
        ms = _timed_block(wl, opt, steps, warmup)
        if kw["capture"]:
            assert dbg.step_index >= steps + warmup, f"nbdebug recorded {dbg.step_index} steps"
    finally:
        dbg.close()
    del dbg
    gc.collect()
    left = _hook_census(wl.model)
    if left != clean:
        raise RuntimeError(f"nbdebug {kwargs} left instrumentation behind: {left} (clean: {clean})")
    return ms


# -- msProbe (one subprocess per measurement) ------------------------------------------------------
def _msprobe_config(level: str, dump_path: str) -> dict[str, Any]:
    return {
        "task": "statistics",
        "dump_path": dump_path,
        "rank": [],
        "step": [],
        "level": level,
        "statistics": {"scope": [], "list": [], "data_mode": ["all"], "summary_mode": "statistics"},
    }


def _dir_bytes(path: str) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            total += os.path.getsize(os.path.join(root, f))
    return total


def msprobe_worker(spec: dict[str, Any]) -> dict[str, Any]:
    """Runs in a fresh process: local baseline first, then msProbe (which cannot be detached)."""
    torch.set_num_threads(spec["threads"])
    wl = make_workload(spec["model"], spec["seed"])
    steps, warmup = spec["steps"], spec["warmup"]
    local = run_baseline(wl, steps, warmup)
    tmp = tempfile.mkdtemp(prefix="nbdebug_bench_msprobe_", dir="/tmp")
    try:
        dump = os.path.join(tmp, "dump")
        cfg_path = os.path.join(tmp, "config.json")
        with open(cfg_path, "w") as f:
            json.dump(_msprobe_config(spec["level"], dump), f)
        from msprobe.pytorch import PrecisionDebugger

        debugger = PrecisionDebugger(config_path=cfg_path)
        model = wl.model

        def after() -> None:
            debugger.stop()
            debugger.step()

        opt = wl.reset()
        ms = _timed_block(wl, opt, steps, warmup, before=lambda: debugger.start(model), after=after)
        nbytes = _dir_bytes(dump)
        nsteps = len([d for d in os.listdir(dump) if d.startswith("step")]) if os.path.isdir(dump) else 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"ms": ms, "local_baseline_ms": local, "dump_bytes_per_step": nbytes / max(nsteps, 1),
            "dumped_steps": nsteps}


def run_msprobe(model: str, level: str, steps: int, warmup: int, threads: int, seed: int) -> dict[str, Any]:
    spec = {"model": model, "level": level, "steps": steps, "warmup": warmup, "threads": threads, "seed": seed}
    with tempfile.TemporaryDirectory(prefix="nbdebug_bench_", dir="/tmp") as tmp:
        result = os.path.join(tmp, "result.json")
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--_worker", json.dumps(spec),
                               "--_result", result], cwd=tmp, env=env, capture_output=True, text=True)
        if proc.returncode != 0 or not os.path.exists(result):
            tail = (proc.stdout + proc.stderr)[-3000:]
            raise RuntimeError(f"msProbe worker {model}/{level} failed (rc={proc.returncode}):\n{tail}")
        with open(result) as f:
            return json.load(f)


# -- driver ----------------------------------------------------------------------------------------
def _configs(with_msprobe: bool) -> list[str]:
    names = ["baseline", *NBDEBUG_CONFIGS]
    if with_msprobe:
        names += [f"msprobe-{lvl}" for lvl in MSPROBE_LEVELS]
    return names


def _median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def profile_config(model: str, config: str, steps: int, threads: int, seed: int, top: int = 15) -> str:
    """cProfile of ``steps`` nbdebug steps (after 2 warm-up steps); top entries from nbdebug's code."""
    nbdebug = _import_nbdebug()

    torch.set_num_threads(threads)
    wl = make_workload(model, seed)
    opt = wl.reset()
    dbg = nbdebug.Debugger(wl.model, **{"level": "mix", **NBDEBUG_CONFIGS[config]})
    try:
        for _ in range(2):
            wl.step(opt)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(steps):
            wl.step(opt)
        prof.disable()
    finally:
        dbg.close()
    out = io.StringIO()
    st = pstats.Stats(prof, stream=out)
    st.sort_stats("cumulative").print_stats(r"/nbdebug/", top)
    return out.getvalue()


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=None, help="round-robin rounds (default 5; 2 with --quick)")
    ap.add_argument("--steps", type=int, default=None, help="timed steps per block (default 10; 3 with --quick)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps per block (at least 2)")
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    ap.add_argument("--quick", action="store_true", help="few rounds and steps: a smoke run, not a measurement")
    ap.add_argument("--no-msprobe", action="store_true", help="skip the msProbe configurations")
    ap.add_argument("--no-mindspore", action="store_true",
                    help="skip the MindSpore PyNative rows (bench/overhead_mindspore.py, run in its own process)")
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads everywhere (default 1)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON results (default {DEFAULT_OUT})")
    ap.add_argument("--profile", choices=list(NBDEBUG_CONFIGS), default=None,
                    help="also cProfile this nbdebug config on the last model given and print nbdebug's top 15")
    ap.add_argument("--_worker", help=argparse.SUPPRESS)
    ap.add_argument("--_result", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args._worker:  # msProbe subprocess
        res = msprobe_worker(json.loads(args._worker))
        with open(args._result, "w") as f:
            json.dump(res, f)
        return res

    rounds = args.rounds or (2 if args.quick else 5)
    steps = args.steps or (3 if args.quick else 10)
    warmup = max(2, args.warmup)
    with_msprobe = not args.no_msprobe
    names = _configs(with_msprobe)
    prev_threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    t_start = time.time()
    try:
        workloads = {m: make_workload(m, args.seed) for m in args.models}
        clean = {m: _hook_census(wl.model) for m, wl in workloads.items()}
        times: dict[str, dict[str, list[float]]] = {m: {c: [] for c in names} for m in args.models}
        extra: dict[str, dict[str, list[dict[str, Any]]]] = {m: {} for m in args.models}
        for r in range(rounds):
            for m, wl in workloads.items():
                k = r % len(names)
                for cfg in names[k:] + names[:k]:
                    if cfg == "baseline":
                        ms = run_baseline(wl, steps, warmup)
                    elif cfg in NBDEBUG_CONFIGS:
                        ms = run_nbdebug(wl, steps, warmup, NBDEBUG_CONFIGS[cfg], clean[m])
                    else:
                        res = run_msprobe(m, cfg.split("-", 1)[1], steps, warmup, args.threads, args.seed)
                        ms = res["ms"]
                        extra[m].setdefault(cfg, []).append(res)
                    times[m][cfg].append(ms)
            print(f"round {r + 1}/{rounds} done ({time.time() - t_start:.0f} s)", file=sys.stderr, flush=True)
        profile = None
        if args.profile:
            profile = profile_config(args.models[-1], args.profile, 1, args.threads, args.seed)
    finally:
        torch.set_num_threads(prev_threads)

    results: dict[str, Any] = {
        "meta": {
            "rounds": rounds, "steps": steps, "warmup": warmup, "threads": args.threads, "seed": args.seed,
            "quick": args.quick, "torch": torch.__version__, "python": platform.python_version(),
            "machine": platform.machine(), "cpu_count": os.cpu_count(),
            "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
            "wall_s": round(time.time() - t_start, 1),
            "msprobe_isolation": "subprocess per measurement (PrecisionDebugger cannot be detached in-process)",
            "msprobe_risk_level": "FOCUS (msProbe default: low-risk APIs skipped at L1/mix)",
        },
        "models": {},
        "targets": {},
    }
    if with_msprobe:
        import importlib.metadata as md

        try:
            results["meta"]["msprobe"] = md.version("mindstudio-probe")
        except md.PackageNotFoundError:  # pragma: no cover
            results["meta"]["msprobe"] = None
    for m in args.models:
        base = _median(times[m]["baseline"])
        base_min = min(times[m]["baseline"])
        cfgs: dict[str, Any] = {}
        for cfg in names:
            med = _median(times[m][cfg])
            entry: dict[str, Any] = {"median_ms": med, "rounds_ms": times[m][cfg], "ratio": med / base,
                                     "ratio_min": min(times[m][cfg]) / base_min}
            if cfg in extra[m]:
                local = _median([e["local_baseline_ms"] for e in extra[m][cfg]])
                entry["local_baseline_ms"] = local
                entry["ratio_local"] = med / local
                entry["dump_bytes_per_step"] = _median([e["dump_bytes_per_step"] for e in extra[m][cfg]])
                entry["dumped_steps"] = [e["dumped_steps"] for e in extra[m][cfg]]
            cfgs[cfg] = entry
        results["models"][m] = {"configs": cfgs}
    if TARGET_MODEL in results["models"]:
        cfgs = results["models"][TARGET_MODEL]["configs"]
        for cfg, target in TARGETS.items():
            ratio = cfgs[cfg]["ratio"]
            results["targets"][cfg] = {"model": TARGET_MODEL, "target": target, "ratio": ratio,
                                       "met": bool(ratio <= target), "ratio_min": cfgs[cfg]["ratio_min"],
                                       "met_min": bool(cfgs[cfg]["ratio_min"] <= target)}
    if profile is not None:
        results["profile"] = {"model": args.models[-1], "config": args.profile, "text": profile}
    if not args.no_mindspore:
        results["mindspore"] = mindspore_rows(args.quick, rounds, steps, warmup, with_msprobe, args.out)

    print(format_table(results))
    if profile is not None:
        print(f"\ncProfile, 1 step of {args.profile} on {args.models[-1]} (nbdebug functions, cumulative):")
        print(profile)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    print(f"\nwrote {args.out}")
    return results


def mindspore_rows(quick: bool, rounds: int, steps: int, warmup: int, with_msprobe: bool,
                   out: Path) -> dict[str, Any]:
    """MindSpore PyNative rows: nbdebug vs msProbe's MindSpore dump at the same levels, same method
    (interleaved, median of rounds), in a process of their own (one MindSpore import, no torch mixing)."""
    ms_out = out.with_name(out.stem + "_mindspore.json")
    cmd = [sys.executable, str(Path(__file__).with_name("overhead_mindspore.py")), "--rounds", str(rounds),
           "--steps", str(steps), "--warmup", str(warmup), "--out", str(ms_out)]
    if quick:
        cmd.append("--quick")
    if not with_msprobe:
        cmd.append("--no-msprobe")
    print("\nMindSpore PyNative (bench/overhead_mindspore.py):", flush=True)
    subprocess.run(cmd, check=True)
    return json.loads(ms_out.read_text())


def format_table(results: dict[str, Any]) -> str:
    meta = results["meta"]
    lines = [f"step time, median of {meta['rounds']} rounds x {meta['steps']} steps ({meta['warmup']} warm-up), "
             f"torch threads={meta['threads']}, load avg before/after "
             f"{meta['loadavg_before'][0]:.2f}/{meta['loadavg_after'][0]:.2f} on {meta['cpu_count']} CPUs"]
    head = (f"{'model':<12} {'config':<22} {'median ms':>10} {'ratio':>8} {'min-ratio':>9} {'ratio*':>8} "
            f"{'spread ms':>17}  target (on ratio; min-ratio)")
    lines += ["", head, "-" * len(head)]
    for m, data in results["models"].items():
        for cfg, e in data["configs"].items():
            spread = f"{min(e['rounds_ms']):.2f}-{max(e['rounds_ms']):.2f}"
            local = f"{e['ratio_local']:.2f}x" if "ratio_local" in e else ""
            tgt = ""
            t = results["targets"].get(cfg)
            if m == TARGET_MODEL and t is not None:
                tgt = (f"<= {t['target']:.2f}x {'met' if t['met'] else 'MISSED'}; "
                       f"{'met' if t['met_min'] else 'MISSED'}")
            rtxt, mtxt = (f"{r:.2f}x" if math.isfinite(r) else "n/a" for r in (e["ratio"], e["ratio_min"]))
            lines.append(f"{m:<12} {cfg:<22} {e['median_ms']:>10.2f} {rtxt:>8} {mtxt:>9} {local:>8} {spread:>17}  "
                         f"{tgt}".rstrip())
        lines.append("")
    lines += [
        "notes:",
        "  ratio  = median(config) / median(baseline) of the main process (baseline interleaved with nbdebug).",
        "  min-ratio = min(config rounds) / min(baseline rounds): less sensitive to other load on the machine",
        "    (interference only adds time); the targets are judged on ratio, min-ratio shown for comparison.",
        "  ratio* = msProbe only: against the un-instrumented step timed in the same subprocess first.",
        "  msProbe runs in a subprocess per measurement: PrecisionDebugger is a singleton that patches torch",
        "    APIs and registers module/optimizer hooks with no way to detach; its step includes stop()+step(),",
        "    which write dump.json/stack.json/construct.json every step (to a temp dir, deleted afterwards).",
        "  msProbe uses its default risk_level FOCUS: at L1/mix it skips low-risk APIs (view, reshape,",
        "    transpose, permute, to, cat, clone, ...), so it records fewer ops than nbdebug's L1/mix.",
        "  nbdebug-off: attached at mix with capture=False. nbdebug-mix-noretain: retain=False (no values kept).",
    ]
    for m, data in results["models"].items():
        for cfg, e in data["configs"].items():
            if "dump_bytes_per_step" in e:
                lines.append(f"  {m} {cfg}: {e['dump_bytes_per_step'] / 1e3:.0f} kB of dump per step")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
