"""Offline loading and comparison speed.

* load: a statistics-task ``dump.json`` with 100k entries (each with one input and one output tensor, the
  shape of an msProbe L1 dump) through ``nbdebug.load`` — target ≤ 2 s.
* compare: two sessions with 10k matched statistics pairs through ``nbdebug.compare`` — target ≤ 1 s.

Median of several runs (``--repeat``). Usage: ``python bench/compare.py [--entries N] [--pairs N]``.
Writes ``bench/results/compare.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

APIS = ("Functional.linear", "Functional.relu", "Tensor.add", "Torch.matmul", "Functional.gelu",
        "Functional.layer_norm", "Tensor.mul", "Functional.softmax")


def _tensor(rng: random.Random, shape: list[int], scale: float = 1.0) -> dict:
    mx = rng.uniform(0.5, 3.0) * scale
    mn = -rng.uniform(0.5, 3.0) * scale
    return {"type": "torch.Tensor", "dtype": "torch.float32", "shape": shape, "Max": mx, "Min": mn,
            "Mean": rng.uniform(-0.1, 0.1) * scale, "Norm": rng.uniform(1.0, 30.0) * scale, "requires_grad": True}


def make_dump(root: str, entries: int, seed: int = 0, scale: float = 1.0) -> str:
    """Write ``root/step0/rank0/dump.json`` with ``entries`` chained API entries; returns ``root``."""
    rng = random.Random(seed)
    counts: dict[str, int] = {}
    data = {}
    prev = _tensor(rng, [8, 64], scale)
    for _ in range(entries):
        api = APIS[rng.randrange(len(APIS))]
        n = counts.get(api, 0)
        counts[api] = n + 1
        out = _tensor(rng, [8, 64], scale)
        data[f"{api}.{n}.forward"] = {"input_args": [prev], "input_kwargs": {}, "output": [out]}
        prev = out
    d = os.path.join(root, "step0", "rank0")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "dump.json"), "w") as f:
        json.dump({"task": "statistics", "level": "L1", "framework": "pytorch", "dump_data_dir": None,
                   "data": data}, f, indent=1)
    with open(os.path.join(d, "construct.json"), "w") as f:
        json.dump({}, f)
    return root


def _median(fn, repeat: int) -> tuple[float, float, object]:
    times, out = [], None
    for _ in range(repeat):
        out = None  # release the previous result first
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), min(times), out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--entries", type=int, default=100_000)
    ap.add_argument("--pairs", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()

    import nbdebug

    tmp = tempfile.mkdtemp(prefix="nbdebug-bench-")
    big = make_dump(os.path.join(tmp, "big"), args.entries)
    size = os.path.getsize(os.path.join(big, "step0", "rank0", "dump.json"))
    from nbdebug.dump import load as load_mod

    nbdebug.load(big, warn=False)  # warm the page cache and imports

    def cold_load():
        load_mod._NAME_CACHE.clear()  # time a first load, not one helped by the name cache
        return nbdebug.load(big, warn=False, progress=lambda *a: None)

    t_load, t_load_min, off = _median(cold_load, args.repeat)
    rows = len(off.session.table(0))

    # 10k matched pairs: entries with one input and one output make 2 rows each
    n_entries = args.pairs // 2
    a = nbdebug.load(make_dump(os.path.join(tmp, "a"), n_entries, seed=1), warn=False)
    # golden values 1% off: every pair is flagged (the slow path: messages, warnings, first divergence)
    b = nbdebug.load(make_dump(os.path.join(tmp, "b"), n_entries, seed=1, scale=1.01), warn=False)
    nbdebug.compare(a, b)
    t_cmp, t_cmp_min, res = _median(lambda: nbdebug.compare(a, b), args.repeat)
    matched = sum(1 for r in res.rows if r.status != "unmatched")

    out = {
        "load_entries": args.entries, "load_rows": rows, "dump_json_mib": round(size / 2**20, 1),
        "load_s_median": round(t_load, 3), "load_s_min": round(t_load_min, 3), "load_target_s": 2.0,
        "compare_pairs": matched, "compare_s_median": round(t_cmp, 3), "compare_s_min": round(t_cmp_min, 3),
        "compare_target_s": 1.0,
        "repeat": args.repeat, "load_average_1min": round(os.getloadavg()[0], 2), "cpus": os.cpu_count(),
    }
    print(json.dumps(out, indent=1))
    os.makedirs(os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"), exist_ok=True)
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "compare.json"), "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
