"""Seeded corruption fuzz (issue #12): damaged nbdebug and msProbe dumps never crash ``load``/``compare``
with anything but the documented errors, never hang, and every damaged file is named in ``problems``."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import warnings

import pytest
import torch
from msprobe_runs import mindspore_dump, torch_dump

import nbdebug

CASES = 300
#: what load() and compare() may raise (documented in their docstrings): nothing of the dump is usable
DOCUMENTED = (ValueError, OSError)


class Hang(Exception):
    pass


def _alarm(_sig, _frame):
    raise Hang


def _our_dump(root: str) -> str:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.ReLU(), torch.nn.Linear(6, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with nbdebug.Debugger(model, level="mix", dump_dir=root, task="tensor"):
        for _ in range(2):
            opt.zero_grad()
            model(torch.randn(3, 4)).sum().backward()
            opt.step()
    return root


WEIRD = [{}, [], None, "x", "nan", -1, 1e308, True, [[1]], {"a": {}}, "\u0000", 10**30]


def _walk_json(doc, rng, depth=0):
    """A random (container, key) inside ``doc``."""
    cur, key = None, None
    node = doc
    for _ in range(rng.randint(1, 8)):
        if isinstance(node, dict) and node:
            k = rng.choice(list(node))
        elif isinstance(node, list) and node:
            k = rng.randrange(len(node))
        else:
            break
        cur, key, node = node, k, node[k]
    return cur, key


def _mutate(path: str, rng: random.Random) -> tuple[str, bool]:
    """Damage ``path`` one way; returns (what was done, whether the file is now unusable as it was)."""
    kind = rng.choice(["truncate", "garbage", "devzero", "fifo", "dir", "deep", "toplevel", "value", "value",
                       "stat", "delete_key", "huge_shape", "empty"])
    is_json = path.endswith(".json")
    if kind in ("deep", "toplevel", "value", "stat", "delete_key", "huge_shape") and not is_json:
        kind = "truncate"
    if kind == "truncate":
        size = os.path.getsize(path)
        with open(path, "r+b") as f:
            f.truncate(rng.randrange(max(1, size // 2)) if size > 1 else 0)
        return kind, True
    if kind == "empty":
        open(path, "w").close()
        return kind, True
    if kind == "garbage":
        with open(path, "wb") as f:
            f.write(bytes(rng.randrange(256) for _ in range(rng.randint(1, 400))))
        return kind, True
    if kind in ("devzero", "fifo", "dir"):
        os.remove(path)
        if kind == "devzero":
            os.symlink("/dev/zero", path)
        elif kind == "fifo":
            os.mkfifo(path)
        else:
            os.mkdir(path)
        return kind, True
    if kind == "deep":
        with open(path, "w") as f:
            n = rng.choice([2000, 100_000])
            f.write('{"data": ' + "[" * n + "]" * n + "}")
        return kind, True
    with open(path) as f:
        doc = json.load(f)
    if kind == "toplevel":
        doc = rng.choice([None, [], "x", 3])
        damaged = True
    elif kind == "stat":  # a statistic that is not a number
        damaged = False
        for _ in range(50):
            cont, key = _walk_json(doc, rng)
            if isinstance(cont, dict) and key in ("Max", "Min", "Mean", "Norm"):
                cont[key] = rng.choice([{}, [], [1], {"a": 1}])
                damaged = True
                break
    elif kind == "huge_shape":
        damaged = False
        for _ in range(50):
            cont, key = _walk_json(doc, rng)
            if isinstance(cont, dict) and key == "shape":
                cont[key] = rng.choice([[-1], [2**62, 2**62], "x", [[1]], [1.5]])
                damaged = True
                break
    else:
        cont, key = _walk_json(doc, rng)
        if cont is not None:
            if kind == "delete_key" and isinstance(cont, dict):
                del cont[key]
            else:
                cont[key] = rng.choice(WEIRD)
        damaged = False  # may or may not matter
    with open(path, "w") as f:
        json.dump(doc, f)
    return kind, damaged


def _named(target: str, off) -> bool:
    target = os.path.abspath(target)
    for p in off.problems:
        f = os.path.abspath(p.file)
        if f == target or target in p.message or os.path.basename(target) in p.message:
            return True
        if f == os.path.dirname(target) and os.path.basename(target) in str(p):
            return True
    return False


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    ours = _our_dump(str(tmp_path_factory.mktemp("ours") / "dump"))
    return {"nbdebug": ours, "msprobe-torch": os.path.join(torch_dump("statistics", "mix"), "dump"),
            "msprobe-mindspore": os.path.join(mindspore_dump(), "dump")}


def _files(root: str) -> list[str]:
    out = []
    for d, _, files in os.walk(root):
        out += [os.path.join(d, f) for f in sorted(files)]
    return sorted(out)


def test_corruption_fuzz(bases, tmp_path):
    rng = random.Random(int(os.environ.get("NBDEBUG_FUZZ_SEED", "12")))  # other seeds: explore more
    golden = {name: nbdebug.load(path, warn=False) for name, path in bases.items()}
    old = signal.signal(signal.SIGALRM, _alarm)
    seen: dict[str, int] = {}
    try:
        for case in range(CASES):
            name = rng.choice(sorted(bases))
            work = str(tmp_path / f"c{case}")
            shutil.copytree(bases[name], work)
            files = _files(work)
            target = rng.choice(files)
            kind, damaged = _mutate(target, rng)
            seen[kind] = seen.get(kind, 0) + 1
            where = f"case {case}: {kind} of {os.path.relpath(target, work)} in the {name} dump"
            signal.setitimer(signal.ITIMER_REAL, 20)
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    try:
                        off = nbdebug.load(work)
                    except DOCUMENTED as e:
                        assert os.path.basename(target) in str(e) or work in str(e), f"{where}: {e}"
                        continue
                    if damaged:
                        assert _named(target, off), f"{where}: not named in {[str(p) for p in off.problems]}"
                    if case % 3 == 0 and off.steps:
                        try:
                            nbdebug.compare(off, golden[name])
                        except DOCUMENTED:
                            pass
            except Hang:
                pytest.fail(f"{where}: hung")
            except DOCUMENTED:
                raise
            except Exception as e:
                raise AssertionError(f"{where}: {type(e).__name__}: {e}") from e
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            shutil.rmtree(work, ignore_errors=True)
    finally:
        signal.signal(signal.SIGALRM, old)
    assert len(seen) >= 10, seen
