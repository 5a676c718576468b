"""Where the test suite's time goes: CPU and wall time per test and per module, under pytest-xdist (issue 24).

A pytest plugin and its report in one file. As a plugin (``-p suite_cpu`` with ``bench/`` on
``PYTHONPATH``), every worker appends one JSON line per test to ``$SUITE_CPU_DIR/log-<worker>.jsonl``:
the test id, its start and end (wall clock, setup to teardown), the CPU the worker itself spent and the CPU
of the processes it started and reaped meanwhile (kernels, torchrun ranks, msProbe runs, pip; a
session-scoped server is reaped, and counted, at the last test of its worker). The controlling process
writes nothing (it only relays). Run as a script, it sums the logs per module, heaviest first.

Usage::

    mkdir -p /tmp/suite && SUITE_CPU_DIR=/tmp/suite PYTHONPATH=bench OMP_NUM_THREADS=1 \\
        .venv/bin/python -m pytest -q -n 3 --dist loadfile -p suite_cpu --doctest-modules nbdebug tests
    python bench/suite_cpu.py /tmp/suite            # modules by CPU (worker + children), wall, tests

>>> by_module([["tests/test_a.py::t1", 0.0, 2.0, 1.5, 0.5], ["tests/test_a.py::t2", 2.0, 3.0, 0.5, 0.0]])
{'tests/test_a.py': {'wall': 3.0, 'self': 2.0, 'children': 0.5, 'tests': 2}}
"""

from __future__ import annotations

import glob
import json
import os
import resource
import sys
import time
from typing import Any

_started: dict[str, tuple[float, float, float]] = {}
_log: Any = None
_on = True  # off in the controlling process of a pytest-xdist run (it relays the workers' reports)


def _cpu() -> tuple[float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime


def pytest_configure(config: Any) -> None:
    global _on
    _on = not (getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"))


def pytest_runtest_logstart(nodeid: str, location: Any) -> None:
    if _on:
        _started[nodeid] = (time.time(), *_cpu())


def pytest_runtest_logfinish(nodeid: str, location: Any) -> None:
    global _log
    start = _started.pop(nodeid, None)
    if start is None:
        return
    own, kids = _cpu()
    if _log is None:
        folder = os.environ.get("SUITE_CPU_DIR", ".")
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        _log = open(os.path.join(folder, f"log-{worker}.jsonl"), "a", buffering=1)  # noqa: SIM115 - whole run
    _log.write(json.dumps([nodeid, start[0], time.time(), own - start[1], kids - start[2]]) + "\n")


def by_module(rows: list[list[Any]]) -> dict[str, dict[str, Any]]:
    """Per module: wall seconds (summed over its tests), the worker's CPU, its children's CPU, tests."""
    out: dict[str, dict[str, Any]] = {}
    for nodeid, t0, t1, own, kids in rows:
        m = out.setdefault(nodeid.split("::", 1)[0], {"wall": 0.0, "self": 0.0, "children": 0.0, "tests": 0})
        m["wall"] += t1 - t0
        m["self"] += own
        m["children"] += kids
        m["tests"] += 1
    return out


def main(argv: list[str]) -> None:
    folder = argv[0] if argv else "."
    rows = [json.loads(line) for path in glob.glob(os.path.join(folder, "log-*.jsonl")) for line in open(path)]
    mods = by_module(rows)
    total = sum(m["self"] + m["children"] for m in mods.values())
    print(f"{len(rows)} tests, {total:.0f} s CPU in all (worker + children)")
    print(f"{'module':60} {'CPU s':>7} {'self':>7} {'child':>7} {'wall s':>7} {'tests':>6}")
    for name, m in sorted(mods.items(), key=lambda kv: -(kv[1]["self"] + kv[1]["children"]))[:40]:
        print(f"{name[-60:]:60} {m['self'] + m['children']:7.0f} {m['self']:7.0f} {m['children']:7.0f} "
              f"{m['wall']:7.0f} {m['tests']:6d}")


if __name__ == "__main__":
    main(sys.argv[1:])
