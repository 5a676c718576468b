"""Reliability (issue #12): no silent loss, nothing unpickled or executed, bounded memory, clear messages."""

from __future__ import annotations

import json
import os
import pickle
import warnings

import pytest
import torch

import nbdebug

# -- security ---------------------------------------------------------------------------------------------


class _Payload:
    """Unpickling this creates a file: proof that code from the file ran."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _evil_pth(tmp_path) -> tuple[str, str]:
    marker = str(tmp_path / "PWNED")
    path = str(tmp_path / "evil.pth")
    with open(path, "wb") as f:
        pickle.dump({"fc.weight": _Payload(marker)}, f)
    return path, marker


def test_compare_weights_never_unpickles_by_default(tmp_path):
    import mindspore as ms

    path, marker = _evil_pth(tmp_path)
    ckpt = str(tmp_path / "m.ckpt")
    ms.save_checkpoint([{"name": "fc.weight", "data": ms.Tensor([1.0])}], ckpt)
    with pytest.raises(ValueError, match="trust_pickle=True") as e:
        nbdebug.compare_weights(path, ckpt)
    assert "evil.pth" in str(e.value)
    assert not os.path.exists(marker), "the pickle payload ran"
    # the explicit opt-in is the only way to the full unpickler (and it does run the file's code)
    with pytest.raises(ValueError):
        nbdebug.compare_weights(path, ckpt, trust_pickle=True)
    assert os.path.exists(marker)


def test_pickled_module_needs_the_opt_in(tmp_path):
    import mindspore as ms

    model = torch.nn.Linear(2, 1)
    torch.save(model, tmp_path / "whole.pth")
    ckpt = str(tmp_path / "m.ckpt")
    ms.save_checkpoint([{"name": "weight", "data": ms.Tensor(model.weight.detach().numpy())},
                        {"name": "bias", "data": ms.Tensor(model.bias.detach().numpy())}], ckpt)
    with pytest.raises(ValueError, match="trust_pickle"):
        nbdebug.compare_weights(tmp_path / "whole.pth", ckpt)
    res = nbdebug.compare_weights(tmp_path / "whole.pth", ckpt, trust_pickle=True)
    assert res.all_close and res.pth_counts.tensors == 2


# -- damaged and hostile dumps ----------------------------------------------------------------------------


def _stat_dump(root, data=None, step=0, **head):
    d = os.path.join(root, f"step{step}", "rank0")
    os.makedirs(d, exist_ok=True)
    t = {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2, 3], "Max": 1.0, "Min": -1.0, "Mean": 0.0,
         "Norm": 2.0}
    if data is None:
        data = {"Functional.relu.0.forward": {"input_args": [t], "input_kwargs": {}, "output": [dict(t, Min=0.0)]}}
    doc = {"task": "statistics", "level": "L1", "framework": "pytorch", "dump_data_dir": None, "data": data, **head}
    with open(os.path.join(d, "dump.json"), "w") as f:
        json.dump(doc, f)
    return d


def _load(path):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        off = nbdebug.load(path)
    return off, [str(x.message) for x in w]


@pytest.mark.parametrize("body,what", [("null", "JSON null"), ("[1, 2]", "a JSON array"), ('"x"', "a JSON string")])
def test_dump_json_that_is_not_an_object_is_a_named_problem(tmp_path, body, what):
    _stat_dump(tmp_path, step=0)
    d = _stat_dump(tmp_path, step=1)
    with open(os.path.join(d, "dump.json"), "w") as f:
        f.write(body)
    off, warned = _load(tmp_path)
    assert off.steps == [0]
    (p,) = off.problems
    assert p.file == os.path.join(d, "dump.json") and what in p.message and "skipped" in p.message
    assert warned and "dump.json" in warned[0]


def test_missing_tensor_dir_never_follows_dump_data_dir_outside(tmp_path):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    import numpy as np

    np.save(outside / "secret.npy", np.arange(6, dtype=np.float32).reshape(2, 3))
    t = {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2, 3], "Max": 5.0, "Min": 0.0, "Mean": 2.5,
         "Norm": 7.4, "data_name": "secret.npy"}
    root = tmp_path / "dump"
    d = _stat_dump(root, {"Functional.relu.0.forward": {"input_args": [], "output": [t]}}, task="tensor",
                   dump_data_dir=str(outside))
    off, _ = _load(root)
    with pytest.raises(LookupError):
        off.tensor("Functional.relu.0.forward", "output.0")
    msgs = [p for p in off.problems if p.file == os.path.join(d, "dump_tensor_data")]
    assert msgs and "is not read" in msgs[0].message and str(outside) in msgs[0].message
    assert off.stats("Functional.relu.0.forward", "output.0")["max"] == 5.0


def test_non_number_statistics_are_named_not_a_crash(tmp_path):
    t = {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2, 3], "Max": {}, "Min": [1], "Mean": 0.0,
         "Norm": 2.0}
    d = _stat_dump(tmp_path, {"Functional.relu.0.forward": {"input_args": [t], "output": [dict(t, dtype={})]},
                              "Functional.relu.1.forward": {"input_args": [dict(t, shape=[[2], 3])], "output": []}})
    off, _ = _load(tmp_path)
    s = off.stats("Functional.relu.0.forward", "output.0")
    assert s["max"] is None and s["dtype"] == "unknown"
    text = " | ".join(str(p) for p in off.problems)
    assert "Max is {}" in text and "Min is [1]" in text and "bad shape" in text
    assert all(p.file == os.path.relpath(os.path.join(d, "dump.json")) for p in off.problems)


def test_deep_nesting_is_a_named_problem(tmp_path):
    d = _stat_dump(tmp_path)
    deep = '{"task": "statistics", "data": {"Functional.relu.0.forward": {"output": ' + "[" * 100_000 + \
        "]" * 100_000 + "}}}"
    with open(os.path.join(d, "dump.json"), "w") as f:
        f.write(deep)
    off, _ = _load(tmp_path)
    assert any(p.file == os.path.join(d, "dump.json") and "nested too deeply" in p.message for p in off.problems)


@pytest.mark.timeout(60)
def test_devices_fifos_and_huge_files_are_not_read(tmp_path, monkeypatch):
    import nbdebug.dump.json_read as L

    a = _stat_dump(tmp_path, step=0)
    b = _stat_dump(tmp_path, step=1)
    c = _stat_dump(tmp_path, step=2)
    os.remove(os.path.join(a, "dump.json"))
    os.symlink("/dev/zero", os.path.join(a, "dump.json"))
    os.remove(os.path.join(b, "dump.json"))
    os.mkfifo(os.path.join(b, "dump.json"))
    os.mkfifo(os.path.join(c, "construct.json"))
    off, _ = _load(tmp_path)
    msgs = {p.file: p.message for p in off.problems}
    assert "a device" in msgs[os.path.join(a, "dump.json")]
    assert "a FIFO" in msgs[os.path.join(b, "dump.json")]
    assert "a FIFO" in msgs[os.path.join(c, "construct.json")]
    assert off.steps == [2]
    monkeypatch.setattr(L, "MAX_JSON_BYTES", 100)
    off, _ = _load(tmp_path / "step2")
    assert "over the 100-byte limit" in {p.file: p.message for p in off.problems}[os.path.join(c, "dump.json")]


# -- the debugger: construction, memory, messages ---------------------------------------------------------


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


def _train(model, dbg, steps):
    for _ in range(steps):
        model(torch.randn(3, 4)).sum().backward()
        dbg.step()


def test_failing_constructor_leaves_the_model_unhooked():
    model = _mlp()
    with pytest.raises(ValueError, match="bogus"):
        nbdebug.Debugger(model, task="bogus", dump_dir="never-written")
    assert not model._forward_hooks and not model[0]._forward_hooks and not model[0]._forward_pre_hooks
    with nbdebug.Debugger(model) as dbg:  # attaching again works
        _train(model, dbg, 1)
        assert dbg.stats("Module.0.Linear.forward.0", "output.0", 0)["shape"] == (3, 8)
    assert not os.path.exists("never-written")


def test_statistics_window_and_compact_history():
    model = _mlp()
    with nbdebug.Debugger(model, stats_window=3) as dbg:
        _train(model, dbg, 10)
        s = dbg.session
        assert sorted(s.steps) == [7, 8, 9] and sorted(s.history.steps) == list(range(7))
        node, slot = "Module.0.Linear.forward.0", "output.0"
        full = dbg.stats(node, slot, 8)
        with pytest.raises(nbdebug.NotRetainedError, match="step 2 fell out of the statistics window") as e:
            dbg.stats(node, slot, 2)
        assert "stats_window" in str(e.value)
        old = dbg.stats(node, slot, 2, fields=["max", "norm"])
        assert set(old) == {"max", "norm"} and old["norm"] > 0
        assert dbg.stats(node, slot, 8, fields="norm") == {"norm": full["norm"]}
        steps, norms = dbg.timeline(node, slot, "norm")
        assert steps == list(range(10))
        assert norms[8] == pytest.approx(full["norm"]) and norms[2] == pytest.approx(old["norm"], rel=1e-6)
        # the compact history shares one key list for steps with the same tensors: ~20 bytes a tensor
        rows = sum(1 for k in s.steps[9].keys if not k[1].startswith(("input", "parameters")))
        assert s.history.nbytes <= 7 * rows * 20 + rows * 4 + 64
        with pytest.raises(KeyError):  # table() of an old step: a KeyError (and a NotRetainedError)
            s.table(1)
    with pytest.raises(ValueError, match="stats_window must be an int >= 1"):
        nbdebug.Debugger(_mlp(), stats_window=0)


def test_value_watchpoint_keeps_only_what_it_reads():
    model = _mlp()
    with nbdebug.Debugger(model, retain=False) as dbg:
        _train(model, dbg, 1)
        dbg.watch("AR", nodes="Module.1.ReLU.forward.0", range_start_inclusive=-1, range_end_inclusive=1,
                  range_percentage_gt=50)
        _train(model, dbg, 1)
        node = "Module.1.ReLU.forward.0"
        assert dbg.tensor(node, "output.0").shape == (3, 8)
        with pytest.raises(nbdebug.NotRetainedError, match="another node's output"):
            dbg.tensor(node, "input.0")
        kept = dbg.session.store.current
        assert set(kept) == {(node, "output.0")}


def test_clear_messages_for_bad_arguments():
    model = _mlp()
    for bad, err, text in ((float("nan"), ValueError, "memory_budget must be a finite number"),
                           ("1MiB", TypeError, "memory_budget must be a number of bytes")):
        with pytest.raises(err, match=text):
            nbdebug.Debugger(model, memory_budget=bad)
    with nbdebug.Debugger(model) as dbg:
        _train(model, dbg, 1)
        wp = dbg.watch("TO")
        with pytest.raises(TypeError, match="enabled must be True or False, got 'no'"):
            dbg.update_watch(wp, enabled="no")
        assert wp.enabled
        with pytest.raises(ValueError, match="step -5 is invalid"):
            dbg.tensor("Module.0.Linear.forward.0", "output.0", step=-5)
        with pytest.raises(ValueError, match="step -5 is invalid"):
            dbg.stats("Module.0.Linear.forward.0", "output.0", step=-5)
        with pytest.raises(TypeError, match="nodes must be a node name.*got the int 123"):
            dbg.watch("TO", nodes=123)
        with pytest.raises(ValueError, match="empty name"):
            dbg.watch("TO", nodes="")
        with pytest.warns(UserWarning, match="matches nothing among the"):
            dbg.watch("TO", nodes="Modul.*")
        with pytest.raises(ValueError, match="'' is not a parameter name"):
            dbg.watch("TO", **{"": 1})
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            dbg.watch("TO", nodes="Module.*")  # matches: no warning


# -- a full disk ------------------------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB tmpfs (a real file system that fills up): ``fill()`` takes every free byte, ``free()`` gives
    them back."""
    import subprocess

    mnt = tmp_path / "disk"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"mounting a tmpfs needs root: {r.stderr.decode().strip()}")

    class Disk:
        path = str(mnt)
        filler = str(mnt / "filler")

        def fill(self):
            fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
            try:
                while True:
                    os.write(fd, b"\0" * 4096)
            except OSError:
                pass
            finally:
                os.close(fd)

        def free(self):
            os.remove(self.filler)

    yield Disk()
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def _leftovers(root):
    out = []
    for d, _, files in os.walk(root):
        out += [os.path.join(d, f) for f in files if ".tmp" in f or (f != "filler" and
                                                                     os.path.getsize(os.path.join(d, f)) == 0)]
    return out


def test_full_disk_reports_each_step_and_resumes(small_disk):
    model = _mlp()
    dump = os.path.join(small_disk.path, "dump")
    with nbdebug.Debugger(model, level="mix", dump_dir=dump, task="tensor") as dbg:
        dbg.watch("TL", nodes="Module.0.Linear.forward.0", max_gt=-1e9)  # fires every step
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            _train(model, dbg, 1)
        assert os.path.exists(os.path.join(dump, "step0", f"proc{os.getpid()}", "dump.json"))
        small_disk.fill()
        with pytest.warns(UserWarning, match=r"step 1 .*the disk holding .* is full") as w:
            _train(model, dbg, 1)
        assert len([x for x in w if "nbdebug dump" in str(x.message)]) == 1  # once per step, not per node
        assert len(dbg.dump.problems) == 1 and "step 1" in dbg.dump.problems[0].message
        assert [h.step for h in dbg.hits] == [0, 1]  # the failed step's watchpoint hits are recorded
        with pytest.warns(UserWarning, match="step 2"):
            _train(model, dbg, 1)  # still full: reported again
        assert _leftovers(dump) == []
        small_disk.free()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            _train(model, dbg, 1)
        step3 = os.path.join(dump, "step3", f"proc{os.getpid()}")
        with open(os.path.join(step3, "dump.json")) as f:
            assert "Module.0.Linear.forward.0" in json.load(f)["data"]
        assert [h.step for h in dbg.hits] == [0, 1, 2, 3]

        # under dbg.run: training finishes; the message is readable, not the serializer's
        dbg.unwatch()  # (a hit would pause the run)
        small_disk.fill()

        def train():
            _train(model, dbg, 2)

        with pytest.warns(UserWarning, match="is full"):
            dbg.run(train, block=True)
        assert dbg.state == "finished" and dbg.error is None
        assert all("disk holding" in p.message for p in dbg.dump.problems)
        assert _leftovers(dump) == []
        small_disk.free()
        _train(model, dbg, 1)
        assert os.path.exists(os.path.join(dump, "step6", f"proc{os.getpid()}", "dump.json"))
    off = nbdebug.load(dump, warn=False)
    assert {0, 3, 6} <= set(off.steps)


# -- interpreter exit while training ----------------------------------------------------------------------

EXIT_SCRIPT = r"""
import sys, time, torch, nbdebug
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
dbg = nbdebug.Debugger(model, level=sys.argv[1])

def train():
    while True:
        opt.zero_grad()
        model(torch.randn(64, 16)).pow(2).mean().backward()
        opt.step()

dbg.run(train, paused=sys.argv[2] == "paused")
deadline = time.time() + 30
while dbg.step_index < 3 and sys.argv[2] != "paused" and time.time() < deadline:
    time.sleep(0.01)
print("EXITING", dbg.state, flush=True)
"""


@pytest.mark.parametrize("level,how", [("mix", "running"), ("L0", "paused")])
def test_interpreter_exit_stops_the_training_thread(tmp_path, level, how):
    import subprocess
    import sys

    script = tmp_path / "exit_while_training.py"
    script.write_text(EXIT_SCRIPT)
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, str(script), level, how], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=repo, CUDA_VISIBLE_DEVICES=""), cwd=str(tmp_path))
    assert f"EXITING {how}" in r.stdout, r.stdout + r.stderr
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert "terminate called" not in r.stderr, r.stderr[-2000:]


def test_soak_bench_smoke(tmp_path, capsys):
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench", "soak.py")
    spec = importlib.util.spec_from_file_location("nbdebug_bench_soak", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "soak.json"
    res = mod.main(["--steps", "30", "--warmup", "10", "--window", "4", "--out", str(out)])
    assert json.loads(out.read_text())["steps"] == 30 and res["history_bytes"] > 0
    assert "RSS growth after warm-up" in capsys.readouterr().out
