"""DebugUnderflowOverflow: HF's report, text for text, with one host transfer per batch."""

import collections
import contextlib
import io
import re

import pytest
import torch
import torch.nn as nn

from nbdebug.frameworks.torch import overflow as torch_overflow
from nbdebug.frameworks.torch.overflow import DebugUnderflowOverflow

DETECTED = (
    "DebugUnderflowOverflow: inf/nan detected, aborting as there is no point running further. "
    "Please scroll up above this traceback to see the activation values prior to this event."
)
TITLE = re.compile(r"^ {17} (\S*) (\S+)$")  # a frame's first line: prefix, qualified name, class


class HFReference:
    """HuggingFace's algorithm done the slow way it does it: ``.item()`` checks inside every hook."""

    def __init__(self, model, max_frames_to_save=21, trace_batch_nums=(), abort_after_batch_num=None):
        self.model, self.trace, self.abort = model, list(trace_batch_nums), abort_after_batch_num
        self.frames = collections.deque([], max_frames_to_save)
        self.frame, self.batch_number, self.total_calls, self.detected_overflow = [], 0, 0, False
        self.names = {m: n for n, m in model.named_modules()}
        self.pre = " " * 17
        self.handles = []
        model.apply(lambda m: self.handles.append(m.register_forward_hook(self.hook)))

    def detach(self):
        for h in self.handles:
            h.remove()

    def var(self, v, ctx):
        if torch.is_tensor(v):
            a = v.abs()
            self.frame.append(f"{a.min():8.2e} {a.max():8.2e} {ctx}")
            for test, word in ((torch.isnan, "nans"), (torch.isinf, "infs")):
                if test(v).any().item():
                    print(f"{ctx} has {word}")
                    self.detected_overflow = True
        else:
            self.frame.append(f"{'None' if v is None else 'not a tensor':>17} {ctx}")

    def start(self):
        self.frame.append(f"\n\n{self.pre} *** Starting batch number={self.batch_number} ***")
        self.frame.append("abs min  abs max  metadata")

    def hook(self, module, inputs, output):
        trace = self.batch_number in self.trace
        if trace:
            self.frames = []
        if self.total_calls == 0:
            self.start()
        self.total_calls += 1
        last = module is self.model
        if last:
            self.batch_number += 1
        self.frame.append(f"{self.pre} {self.names[module]} {type(module).__name__}")
        for name, p in module.named_parameters(recurse=False):
            self.var(p, name)
        for i, x in enumerate(inputs):
            self.var(x, f"input[{i}]")
        if isinstance(output, tuple):
            for i, x in enumerate(output):
                for j, y in enumerate(x) if isinstance(x, tuple) else [(None, x)]:
                    self.var(y, f"output[{i}]" if j is None else f"output[{i}][{j}]")
        else:
            self.var(output, "output")
        self.frames.append("\n".join(self.frame))
        self.frame = []
        if trace:
            print("\n".join(self.frames))
            self.frames = []
        if last:
            self.start()
        if self.detected_overflow and not trace:
            print(f"\nDetected inf/nan during batch_number={self.batch_number}")
            print(f"Last {len(self.frames)} forward frames:")
            print("abs min  abs max  metadata")
            print("\n".join(self.frames))
            print("\n\n")
            self.frames = []
            raise ValueError(DETECTED)
        if self.abort is not None and self.batch_number > self.abort:
            raise ValueError(
                f"DebugUnderflowOverflow: aborting after {self.batch_number} batches due to"
                f" `abort_after_batch_num={self.abort}` arg"
            )


# ---------------------------------------------------------------------------- models


class Bomb(nn.Module):
    """Multiplies by ``factor`` on its ``at``-th call (0-based; every call when ``at`` is None)."""

    def __init__(self, factor=1e39, at=None):
        super().__init__()
        self.factor, self.at, self.calls = factor, at, 0

    def forward(self, x):
        hit = self.at is None or self.calls == self.at
        self.calls += 1
        return x * self.factor if hit else x


class NanAt(Bomb):
    def forward(self, x):
        hit = self.at is None or self.calls == self.at
        self.calls += 1
        return torch.log(x - 100.0) if hit else x


def deep(n=30, k=20, bomb=None):
    layers = []
    for i in range(n):
        layers.append(bomb if i == k and bomb is not None else (nn.Linear(8, 8) if i % 2 == 0 else nn.Tanh()))
    return nn.Sequential(*layers)


class Odd(nn.Module):
    """Non-tensor and None inputs, tuple and nested-tuple outputs."""

    def forward(self, x, none, k):
        return x, none, (x * k, "s")


class Tupled(nn.Module):
    def __init__(self):
        super().__init__()
        self.pre = nn.Linear(8, 8)
        self.odd = Odd()
        self.bomb = Bomb(at=1)

    def forward(self, x):
        a, _, (b, _) = self.odd(self.pre(x), None, 3)
        return self.bomb(a + b)


class Shared(nn.Module):
    """One Linear reachable under two parents (HF hooks it twice) and called twice."""

    def __init__(self):
        super().__init__()
        lin = nn.Linear(8, 8)
        self.left = nn.Sequential(lin, nn.ReLU())
        self.right = nn.Sequential(lin, Bomb(at=2))

    def forward(self, x):
        return self.right(self.left(x))


class RootBomb(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = deep(6, k=-1)

    def forward(self, x):
        return self.body(x) * 1e39


class IntsHalf(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 8)
        self.proj = nn.Linear(8, 8)
        self.bomb = Bomb(factor=1e5)

    def forward(self, ids):
        return self.bomb(self.proj(self.emb(ids)).half()).float()


def weight_inf():
    m = deep(8, k=-1)
    with torch.no_grad():
        m[4].weight[1, 2] = float("inf")
    return m


SCENARIOS = {
    "inf_deep": (lambda: deep(30, 20, Bomb()), 2, {}),
    "later_batch": (lambda: deep(12, 3, Bomb(at=2)), 5, {}),
    "nan": (lambda: deep(10, 5, NanAt(at=1)), 3, {}),
    "weight_inf": (weight_inf, 2, {}),
    "root": (RootBomb, 2, {}),
    "tuples": (Tupled, 3, {}),
    "shared": (Shared, 4, {}),
    "ints_half": (IntsHalf, 2, {}),
    "few_frames": (lambda: deep(12, 9, Bomb(at=1)), 3, {"max_frames_to_save": 3}),
    "trace_then_sticky": (lambda: deep(6, 3, NanAt(at=2)), 4, {"trace_batch_nums": [1, 2]}),
    "trace_abort": (lambda: deep(6, -1), 4, {"trace_batch_nums": [0, 2], "abort_after_batch_num": 1}),
    "clean": (lambda: deep(10, -1), 3, {"trace_batch_nums": [1]}),
}


def inputs_for(model, n):
    g = torch.Generator().manual_seed(1)
    if isinstance(model, IntsHalf):
        return [torch.randint(0, 10, (2, 3), generator=g) for _ in range(n)]
    return [torch.rand(4, 8, generator=g) for _ in range(n)]


def run(cls, scenario):
    build, n, kw = SCENARIOS[scenario]
    torch.manual_seed(0)
    model = build()
    dbg = cls(model, **kw)
    out, errors = io.StringIO(), []
    with contextlib.redirect_stdout(out):
        for x in inputs_for(model, n):
            try:
                model(x)
            except ValueError as e:
                errors.append(str(e))
    dbg.detach()
    state = (dbg.batch_number, dbg.total_calls, dbg.detected_overflow, [str(f) for f in dbg.frames])
    return out.getvalue(), errors, state


def report_frames(text):
    """(qualified name, class) of each frame of the first report in ``text``."""
    body = text.split("Last ", 1)[1].split("\n\n\n\n", 1)[0]
    return [TITLE.match(line).groups() for line in body.splitlines() if TITLE.match(line)]


# ---------------------------------------------------------------------------- tests


@pytest.fixture(params=["c_kernel", "torch_ops"])
def stats_path(request, monkeypatch):
    """CPU tensors go through the C kernel when it is built; ``torch_ops`` forces the on-device path."""
    if request.param == "torch_ops":
        monkeypatch.setattr(torch_overflow, "_fastats", None)
    else:
        assert torch_overflow._fastats is not None, "`make test` builds the C kernel"
    return request.param


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_same_text_as_hf_reference(scenario, stats_path):
    ours = run(DebugUnderflowOverflow, scenario)
    ref = run(HFReference, scenario)
    assert ours[0] == ref[0]
    assert ours[1] == ref[1]
    assert ours[2] == ref[2]
    if scenario not in ("clean", "trace_abort"):
        assert DETECTED in ours[1]


def test_inf_report_names_the_module(capsys):
    torch.manual_seed(0)
    model = deep(30, 20, Bomb())
    dbg = DebugUnderflowOverflow(model)
    with pytest.raises(ValueError, match="inf/nan detected"):
        model(torch.rand(4, 8))
    out = capsys.readouterr().out
    assert "Detected inf/nan during batch_number=0" in out
    assert "output has infs" in out
    frames = report_frames(out)
    assert frames[-1] == ("20", "Bomb")  # the offending module ends the report; later calls are absent
    assert len(frames) == 21 and "Last 21 forward frames:" in out
    assert frames[0] == ("0", "Linear")  # 21 calls up to and including the 21st module
    assert dbg.batch_number == 0 and dbg.detected_overflow
    dbg.detach()


def test_report_respects_max_frames(capsys):
    torch.manual_seed(0)
    model = deep(30, 20, Bomb())
    dbg = DebugUnderflowOverflow(model, max_frames_to_save=5)
    with pytest.raises(ValueError):
        model(torch.rand(4, 8))
    frames = report_frames(capsys.readouterr().out)
    assert [f[0] for f in frames] == ["16", "17", "18", "19", "20"]
    dbg.detach()


def test_clean_model_prints_nothing(capsys):
    torch.manual_seed(0)
    model = deep(10, -1)
    with DebugUnderflowOverflow(model) as dbg:
        for _ in range(4):
            model(torch.rand(4, 8))
        assert dbg.batch_number == 4 and not dbg.detected_overflow
        frames = dbg.frames
        assert len(frames) == 21 and all(isinstance(f, str) for f in frames)
        assert frames[-1].startswith(" " * 17 + "  Sequential")  # the root's frame, empty name
    assert capsys.readouterr().out == ""


def test_trace_prints_listed_batches_only(capsys):
    torch.manual_seed(0)
    model = deep(6, -1)
    with DebugUnderflowOverflow(model, trace_batch_nums=[1, 3]):
        for _ in range(5):
            model(torch.rand(4, 8))
    out = capsys.readouterr().out
    starts = re.findall(r"\*\*\* Starting batch number=(\d+) \*\*\*", out)
    assert starts == ["1", "3"]
    assert len([line for line in out.splitlines() if TITLE.match(line)]) == 2 * 7  # 6 layers + root
    assert "Detected" not in out


def test_trace_batch_does_not_raise_then_next_batch_does(capsys):
    torch.manual_seed(0)
    model = deep(6, 3, Bomb(at=0))
    dbg = DebugUnderflowOverflow(model, trace_batch_nums=[0])
    model(torch.rand(4, 8))  # traced: reported, no exception
    out = capsys.readouterr().out
    assert "output has infs" in out and "Detected" not in out
    with pytest.raises(ValueError, match="inf/nan detected"):
        model(torch.rand(4, 8))
    assert "Detected inf/nan during batch_number=1" in capsys.readouterr().out
    dbg.detach()


def test_abort_after_batch_num():
    torch.manual_seed(0)
    model = deep(6, -1)
    dbg = DebugUnderflowOverflow(model, abort_after_batch_num=1)
    model(torch.rand(4, 8))
    msg = "aborting after 2 batches due to `abort_after_batch_num=1` arg"
    with pytest.raises(ValueError, match=re.escape(msg)):
        model(torch.rand(4, 8))
    with pytest.raises(ValueError, match=re.escape(msg)):  # as in HF, every later call aborts too
        model[0](torch.rand(4, 8))
    dbg.detach()


# the ways a tensor's value reaches the host
SYNC_METHODS = ("item", "tolist", "numpy", "cpu", "__bool__", "__float__", "__int__", "__index__", "__format__")


@contextlib.contextmanager
def count_host_reads():
    counts = collections.Counter()
    saved = {name: getattr(torch.Tensor, name) for name in SYNC_METHODS}

    def wrap(name, fn):
        def counted(self, *args, **kwargs):
            counts[name] += 1
            return fn(self, *args, **kwargs)

        return counted

    for name, fn in saved.items():
        setattr(torch.Tensor, name, wrap(name, fn))
    try:
        yield counts
    finally:
        for name, fn in saved.items():
            setattr(torch.Tensor, name, fn)


@pytest.mark.parametrize("cls", [DebugUnderflowOverflow, HFReference])
def test_host_reads_per_batch(cls, stats_path):
    torch.manual_seed(0)
    model = deep(40, -1)
    dbg = cls(model)
    xs = [torch.rand(4, 8) for _ in range(3)]
    with count_host_reads() as counts:
        for x in xs:
            model(x)
    dbg.detach()
    n_tensors = 3 * (20 * 4 + 20 * 2 + 2)  # Linear: weight, bias, input, output; Tanh and root: in, out
    if cls is HFReference:
        assert sum(counts.values()) >= 2 * n_tensors  # the counter does see per-tensor reads
    elif stats_path == "torch_ops":
        assert sum(counts.values()) <= 2 * len(xs), counts
        assert counts["tolist"] == len(xs)  # exactly one transfer per batch
    else:  # CPU tensors read by the C kernel: no tensor ever goes through a host-read method
        assert sum(counts.values()) == 0, counts


def test_submodule_calls_alone_are_checked_in_bounded_chunks(monkeypatch, capsys):
    monkeypatch.setattr(torch_overflow, "_PENDING_LIMIT", 4)
    monkeypatch.setattr(torch_overflow, "_fastats", None)  # count the transfers of the on-device path
    torch.manual_seed(0)
    model = deep(6, 3, Bomb(at=2))
    dbg = DebugUnderflowOverflow(model)
    bomb = model[3]
    with count_host_reads() as counts:
        for _ in range(3):  # 4th pending call triggers the check: nothing bad yet
            bomb(torch.rand(2, 8))
            model[0](torch.rand(2, 8))
    assert counts["tolist"] == 1 and capsys.readouterr().out == ""
    assert len(dbg._pending) == 2
    with pytest.raises(ValueError, match="inf/nan detected"):
        dbg.flush()
    out = capsys.readouterr().out
    assert report_frames(out)[-1] == ("3", "Bomb") and "batch_number=0" in out
    dbg.detach()


def test_detach_and_context_manager_remove_hooks():
    model = deep(6, -1)

    def hooks():
        return sum(len(m._forward_hooks) for m in model.modules())

    dbg = DebugUnderflowOverflow(model)
    assert hooks() == 7
    dbg.detach()
    assert hooks() == 0
    with DebugUnderflowOverflow(model):
        assert hooks() == 7
    assert hooks() == 0
    first = DebugUnderflowOverflow(model)
    second = DebugUnderflowOverflow(model)  # a re-run cell replaces the first instance's hooks
    assert hooks() == 7
    model(torch.rand(2, 8))
    assert (first.batch_number, second.batch_number) == (0, 1)
    second.detach()
    assert hooks() == 0


def test_context_manager_flushes_pending_calls(capsys):
    model = deep(6, 3, Bomb())
    with pytest.raises(ValueError, match="inf/nan detected"):
        with DebugUnderflowOverflow(model):
            model[3](torch.rand(2, 8))  # no root call: checked on exit
    assert "Detected inf/nan during batch_number=0" in capsys.readouterr().out
    assert sum(len(m._forward_hooks) for m in model.modules()) == 0


def test_empty_and_bool_tensors(capsys, stats_path):
    class Mixed(nn.Module):
        def forward(self, x):
            return x[:0], x > 0.5

    model = nn.Sequential(Mixed())
    with DebugUnderflowOverflow(model) as dbg:
        model(torch.rand(3))
        text = dbg.frames[0]
    assert f"{'empty':>17} output[0]" in text
    assert "0.00e+00 1.00e+00 output[1]" in text
    assert capsys.readouterr().out == ""


def test_report_stays_bounded_after_a_traced_batch():
    """Deviation: HF's buffer becomes an unbounded list after a traced batch; ours keeps max_frames_to_save."""
    ours = run_with(DebugUnderflowOverflow)
    ref = run_with(HFReference)
    assert "Last 21 forward frames:" in ours and len(report_frames(ours)) == 21
    assert "Last 21 forward frames:" not in ref and len(report_frames(ref)) > 21
    assert report_frames(ours) == report_frames(ref)[-21:]  # the same frames, HF's only go further back


def run_with(cls):
    torch.manual_seed(0)
    model = deep(30, 20, Bomb(at=2))
    dbg = cls(model, trace_batch_nums=[0])
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(ValueError):
        for x in inputs_for(model, 3):
            model(x)
    dbg.detach()
    return out.getvalue().split("Detected", 1)[1]
