"""msProbe interchange on the zoo: the same training under msProbe and under nbdebug, entry sets and
``msprobe compare`` of the two dumps (issue 26).

Each zoo model (``bench/zoo.py``'s small configurations, random weights, seed 0, the same batches; plus
Llama without autocast, ResNet-18 with gradient checkpointing, and both checkpointed models with the
checkpoint's early stop off: ``…_ckpt_full``) trains 2 AdamW steps twice, each in a fresh
subprocess: once under msProbe's ``PrecisionDebugger`` (task ``statistics``; made before the model is built, as
msProbe's documentation does), once under
``nbdebug.Debugger(model, dump_dir=..., task="statistics", config=<the same config.json>)``. Then, on the last
step: the entry sets (``dump.json``'s ``data`` keys) — ours / msProbe's, only ours / only msProbe's with
examples — and ``msprobe compare -tp ours -gp theirs``: rows, unmatched rows (no bench entry; in brackets
those that no decided difference explains, :data:`REASONS`), rows that do not pass (msProbe's ``Result``
column is not ``pass``), the same with the two dumps' roles swapped (msProbe's as ``-tp``: its every entry
should find ours), and ``nbdebug.compare`` of the same pair.

Usage::

    python bench/interchange.py                          # the whole zoo at L0, L1 and mix
    python bench/interchange.py --models bert,t5 --levels mix --keep /tmp/ic   # keep the dumps
"""

from __future__ import annotations

import argparse
import csv
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
MODELS = ("gpt2", "bert", "t5", "llama", "llama_amp", "resnet", "mobilenet", "vit", "gpt2_ckpt", "resnet_ckpt",
          "gpt2_ckpt_full", "resnet_ckpt_full")
LEVELS = ("L0", "L1", "mix")
STEPS = 2
MSPROBE = os.path.join(os.path.dirname(sys.executable), "msprobe")


def config(level: str, dump_path: str) -> dict[str, Any]:
    """The one ``config.json`` both tools read."""
    return {"task": "statistics", "dump_path": dump_path, "rank": [], "step": [], "level": level,
            "async_dump": False,
            "statistics": {"scope": [], "list": [], "data_mode": ["all"], "summary_mode": "statistics"}}


def workload(name: str):
    """A zoo workload; ``llama`` is ``llama_amp`` without autocast and GradScaler, ``resnet_ckpt`` the ResNet-18
    layout whose four stages run under ``torch.utils.checkpoint`` (non-reentrant); ``…_ckpt_full``: the same
    with the checkpoint's early stop off (see :func:`worker`)."""
    import torch
    import torch.utils.checkpoint as cp

    sys.path.insert(0, str(HERE))
    from zoo import make_zoo_workload

    if name.endswith("_full"):
        wl = workload(name[: -len("_full")])
        wl.name = name
        return wl

    if name == "llama":
        wl = make_zoo_workload("llama_amp")
        wl.amp = False
        wl.name = "llama"
        return wl
    if name != "resnet_ckpt":
        return make_zoo_workload(name)
    wl = make_zoo_workload("resnet")
    model = wl.model

    def forward(x):
        x = model.stem(x)
        for layer in (model.layer1, model.layer2, model.layer3, model.layer4):
            x = cp.checkpoint(layer, x, use_reentrant=False)
        return model.fc(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(x, 1), 1))

    model.forward = forward
    wl.name = "resnet_ckpt"
    return wl


def worker(tool: str, model: str, level: str, out: str) -> None:
    """In a fresh process: train ``STEPS`` steps of ``model`` under ``tool``, dumping into ``out/dump``."""
    import torch

    torch.set_num_threads(1)
    os.makedirs(out, exist_ok=True)
    cfg = os.path.join(out, "config.json")
    with open(cfg, "w") as f:
        json.dump(config(level, os.path.join(out, "dump")), f)
    import torch.utils.checkpoint as cp

    if tool == "msprobe":  # made before the model is built, as msProbe's documentation does: its API hooks are
        from msprobe.pytorch import PrecisionDebugger  # in place when a model keeps a function (HF's gelu)

        dbg = PrecisionDebugger(config_path=cfg)
    wl = workload(model)
    opt = wl.reset()
    step = wl.step
    if model.endswith("_full"):  # the early stop is read when the forward runs

        def step(o):
            with cp.set_checkpoint_early_stop(False):
                return wl.step(o)
    if tool == "msprobe":
        for _ in range(STEPS):
            dbg.start(wl.model)
            step(opt)
            dbg.stop()
            dbg.step()
        return
    sys.path.insert(0, str(REPO))
    import nbdebug

    d = nbdebug.Debugger(wl.model, level, dump_dir=os.path.join(out, "dump"), task="statistics", config=cfg)
    try:
        for _ in range(STEPS):
            step(opt)
    finally:
        d.close()


def run_worker(tool: str, model: str, level: str, out: str, reuse: bool = False) -> str:
    if reuse and glob.glob(os.path.join(out, "dump", f"step{STEPS - 1}", "*", "dump.json")):
        return os.path.join(out, "dump")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, __file__, "--_worker", tool, model, level, out], cwd=out if
                          os.path.isdir(out) else None, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"{tool} {model} {level} failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
    return os.path.join(out, "dump")


def step_dir(dump: str, step: int) -> str:
    """``dump/step{N}`` (msProbe compares a step folder holding ``rank/`` folders)."""
    return os.path.join(dump, f"step{step}")


def entries(dump: str, step: int) -> list[str]:
    (path,) = glob.glob(os.path.join(step_dir(dump, step), "*", "dump.json"))
    with open(path) as f:
        return list(json.load(f)["data"])


def _load(dump: str, step: int) -> dict[str, Any]:
    (path,) = glob.glob(os.path.join(step_dir(dump, step), "*", "dump.json"))
    with open(path) as f:
        return json.load(f)["data"]


#: entries only in our dump that a decided difference explains (the test that decides it, in tests/)
REASONS = {
    "gelu bound before msProbe's start()": "test_interchange_zoo.py::"
                                           "test_function_bound_before_start_msprobe_misses_it",
    "backward msProbe misses after an in-place op": "test_interchange_zoo.py::"
                                                    "test_module_overwritten_in_place_msprobe_misses_its_backward",
    "msProbe records no forward API after a checkpoint's early stop": "test_interchange_hf.py::"
                                                                      "test_checkpoint_early_stop_msprobe_records_no_"
                                                                      "forward_after_it",
    "float rounding: msProbe's gradient summation order": "test_interchange_zoo.py::"
                                                          "test_msprobe_hooks_change_gradient_summation_order_ours_do_not",
    "downstream of msProbe's summation order (bf16 amplifies it)": "test_interchange_amp.py::"
                                                                   "test_amp_llama_not_pass_rows_are_downstream_of_"
                                                                   "msprobe_deviation",
}


def explain(name: str, ours: dict[str, Any], theirs: dict[str, Any]) -> str | None:
    """The decided difference that explains entry ``name`` being only in our dump, if one does."""
    if name.startswith("Functional.gelu."):
        return "gelu bound before msProbe's start()"
    if ".BatchNorm2d.backward." in name:
        return "backward msProbe misses after an in-place op"
    stopped = [k for k, v in theirs.items() if k.endswith(".forward") and "output" not in v]
    if stopped and name.endswith(".forward"):
        order = list(ours)
        if stopped[0] in ours and order.index(name) > order.index(stopped[0]):
            return "msProbe records no forward API after a checkpoint's early stop"
    return None


def _num(v: Any) -> float:
    try:
        return abs(float(str(v).rstrip("%")))
    except ValueError:
        return float("inf")


def explain_row(row_name: str, theirs: dict[str, Any], row: dict[str, str] | None = None) -> str | None:
    """The decided difference that explains a ``msprobe compare`` row that does not pass, if one does: an
    in-place ReLU's backward, or a difference in rounding only (every statistic within 1e-9 absolute or 1e-5
    relative: msProbe's hooks change autograd's summation order, on values that can be near zero)."""
    if row is not None and all(_num(row.get(f"{k} diff")) <= max(1e-9, 1e-5 * _num(row.get(f"Bench {b}")))
                               for k, b in (("Max", "max"), ("Min", "min"), ("Mean", "mean"), ("L2norm", "l2norm"))):
        return "float rounding: msProbe's gradient summation order"
    entry = _entry_of(row_name, theirs)
    e = theirs.get(entry)
    if entry.endswith(".backward") and isinstance(e, dict) and e.get("input") and e.get("output") == e["input"] \
            and ".relu." in entry:  # msProbe's in-place ReLU backward repeats its output gradient
        return "backward msProbe misses after an in-place op"
    return None


def _stat_values(record: Any) -> list[Any]:
    """Every statistic of an entry's record, in order (a tensor's Max, Min, Mean, Norm; other values as such)."""
    if isinstance(record, dict):
        if "Max" in record:
            return [record.get(k) for k in ("Max", "Min", "Mean", "Norm")]
        return [v for k in sorted(record) for v in _stat_values(record[k])]
    if isinstance(record, list):
        return [v for x in record for v in _stat_values(x)]
    return [record]


def _last_bits(ours: Any, theirs: Any) -> bool:
    """The two records differ in rounding only: the same structure, every statistic within 1e-5 relative."""
    a, b = _stat_values(ours), _stat_values(theirs)
    return len(a) == len(b) and all(x == y or (isinstance(x, float) and isinstance(y, float)
                                               and abs(x - y) <= 1e-5 * max(abs(x), abs(y)))
                                    for x, y in zip(a, b, strict=True))


def first_deviation(ours: str, theirs: str) -> tuple[int, str] | None:
    """(step, entry): where msProbe's dump first differs from ours, in execution order, if that difference is
    rounding only in a backward entry (its hooks sum a gradient's shares in another order; everything before it,
    the forward included, agrees bitwise); else None. Rows after it differ because msProbe's run did."""
    for step in range(STEPS):
        o, t = _load(ours, step), _load(theirs, step)
        for name, record in o.items():
            if name in t and t[name] != record:  # (an entry only in ours: explained by :func:`explain`)
                return (step, name) if name.endswith(".backward") and _last_bits(record, t[name]) else None
    return None


def downstream(row_name: str, deviation: tuple[int, str] | None, step: int, ours: dict[str, Any]) -> bool:
    """Row ``row_name`` of step ``step`` is after msProbe's first deviation (a later step, or later in its step)."""
    if deviation is None:
        return False
    order, entry = list(ours), _entry_of(row_name, ours)
    return step > deviation[0] or (entry in ours and deviation[1] in ours
                                   and order.index(entry) > order.index(deviation[1]))


def msprobe_compare(target: str, golden: str, out: str) -> list[dict[str, str]]:
    os.makedirs(out, exist_ok=True)
    proc = subprocess.run([MSPROBE, "compare", "-tp", target, "-gp", golden, "-o", out], capture_output=True,
                          text=True, timeout=900)
    paths = glob.glob(os.path.join(out, "compare_result_*.csv")) + glob.glob(os.path.join(out, "*", "*.csv"))
    if proc.returncode != 0 or not paths:
        raise RuntimeError(f"msprobe compare failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
    with open(paths[0], newline="") as f:
        return list(csv.DictReader(f))


def _entry_of(row_name: str, entries: dict[str, Any]) -> str:
    """The dump entry of a ``msprobe compare`` row (``Functional.gelu.0.forward.input.0``)."""
    for cut in (2, 3, 1):
        head = row_name.rsplit(".", cut)[0]
        if head in entries:
            return head
    return row_name


def unmatched(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    return [r for r in rows if r.get("Bench Name", "N/A") in ("N/A", "", None)]


def not_pass(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    return [r for r in rows if r.get("Result", "pass").strip().lower() not in ("pass", "")]


def measure(model: str, level: str, root: str, reuse: bool = False) -> dict[str, Any]:
    """Both runs of one (model, level) and their comparison on the last step (``reuse``: msProbe's dump of an
    earlier run in ``root``)."""
    theirs = run_worker("msprobe", model, level, os.path.join(root, f"{model}_{level}_msprobe"), reuse)
    shutil.rmtree(os.path.join(root, f"{model}_{level}_nbdebug"), ignore_errors=True)
    shutil.rmtree(os.path.join(root, f"{model}_{level}_cmp"), ignore_errors=True)
    ours = run_worker("nbdebug", model, level, os.path.join(root, f"{model}_{level}_nbdebug"))
    last = STEPS - 1
    e_ours, e_theirs = entries(ours, last), entries(theirs, last)
    only_ours = [e for e in e_ours if e not in set(e_theirs)]
    only_theirs = [e for e in e_theirs if e not in set(e_ours)]
    rows = msprobe_compare(step_dir(ours, last), step_dir(theirs, last), os.path.join(root, f"{model}_{level}_cmp"))
    shutil.rmtree(os.path.join(root, f"{model}_{level}_rev"), ignore_errors=True)
    reverse = msprobe_compare(step_dir(theirs, last), step_dir(ours, last), os.path.join(root, f"{model}_{level}_rev"))
    d_ours, d_theirs = _load(ours, last), _load(theirs, last)
    sys.path.insert(0, str(REPO))
    import nbdebug

    res = nbdebug.compare(ours, theirs, step=last, golden_step=last, mode="statistics")
    ours_cmp = {"unmatched_ours": len(res.unmatched_target), "unmatched_theirs": len(res.unmatched_golden),
                "counts": res.counts()}
    why = {e: explain(e, d_ours, d_theirs) for e in only_ours}
    lone = [r["NPU Name"] for r in unmatched(rows)]
    deviation = first_deviation(ours, theirs)  # not-pass rows after it: msProbe's run differed from there on
    rest = [r["NPU Name"] for r in not_pass(rows) if not explain_row(r["NPU Name"], d_theirs, r)]
    after = [n for n in rest if n not in lone and downstream(n, deviation, last, d_ours)]
    rest = [n for n in rest if n not in after]
    after = ["downstream of msProbe's summation order (bf16 amplifies it)"] if after else []
    return {"model": model, "level": level, "ours": len(e_ours), "theirs": len(e_theirs),
            "only_ours": only_ours, "only_theirs": only_theirs, "rows": len(rows), "unmatched": lone,
            "unexplained": [n for n in lone if not why.get(_entry_of(n, why))],
            "reasons": sorted({w for w in why.values() if w} | set(after)), "nbdebug_compare": ours_cmp,
            "not_pass": [(r["NPU Name"], r.get("Err_message", "")) for r in not_pass(rows)],
            "not_pass_unexplained": rest,
            "reverse": {"rows": len(reverse), "unmatched": [r["NPU Name"] for r in unmatched(reverse)],
                        "not_pass": len(not_pass(reverse))},
            "dumps": (ours, theirs)}


def format_table(results: list[dict[str, Any]]) -> str:
    out = ["| model, level | entries ours / msProbe | only ours / only msProbe | `msprobe compare` rows, unmatched "
           "(not explained by a decided difference), not pass (not explained) | msProbe's dump as `-tp`, ours as "
           "`-gp`: rows, unmatched, not pass | decided differences |",
           "| --- | --- | --- | --- | --- | --- |"]
    for r in results:
        ex = ", ".join(f"`{e}`" for e in (r["only_ours"][:2] + r["only_theirs"][:2]))
        out.append(f"| {r['model']} {r['level']} | {r['ours']:,} / {r['theirs']:,} | "
                   f"{len(r['only_ours'])} / {len(r['only_theirs'])}{' (' + ex + ')' if ex else ''} | "
                   f"{r['rows']:,}, {len(r['unmatched'])} ({len(r['unexplained'])}), {len(r['not_pass'])} "
                   f"({len(r['not_pass_unexplained'])}) | "
                   f"{r['reverse']['rows']:,}, {len(r['reverse']['unmatched'])}, {r['reverse']['not_pass']} | "
                   f"{'; '.join(r['reasons'])} |")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--levels", default=",".join(LEVELS))
    ap.add_argument("--keep", help="keep the dumps and comparisons in this folder (msProbe's dumps found there "
                    "are reused)")
    ap.add_argument("--verbose", action="store_true", help="print every differing entry and not-pass row")
    ap.add_argument("--_worker", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args._worker:
        worker(*args._worker)
        return []
    root = args.keep or tempfile.mkdtemp(prefix="nbdebug_interchange_")
    os.makedirs(root, exist_ok=True)
    results = []
    try:
        for model in [m for m in args.models.split(",") if m]:
            for level in [lv for lv in args.levels.split(",") if lv]:
                r = measure(model, level, root, reuse=bool(args.keep))
                results.append(r)
                print(f"{model:12s} {level:4s} ours {r['ours']:5d} msProbe {r['theirs']:5d} only ours "
                      f"{len(r['only_ours']):4d} only msProbe {len(r['only_theirs']):4d} rows {r['rows']:5d} "
                      f"unmatched {len(r['unmatched']):4d} ({len(r['unexplained'])}) not pass {len(r['not_pass']):3d} "
                      f"({len(r['not_pass_unexplained'])}) reversed: unmatched {len(r['reverse']['unmatched'])}",
                      flush=True)
                if args.verbose:
                    print(f"    nbdebug.compare: {r['nbdebug_compare']}")
                    for key in ("only_ours", "only_theirs", "unexplained", "not_pass"):
                        for e in r[key][:40]:
                            print(f"    {key}: {e}")
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    print(format_table(results))
    return results


if __name__ == "__main__":
    main()
