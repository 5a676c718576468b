"""The native per-tensor hot path (``_fastats.slot`` and ``_fastats.measure``, nbdebug/frameworks/_recorder.c)
records exactly what the Python methods it stands for record: the same statistics rows, metadata, graph
edges, retained values and refusal reasons, step after step, on a model with views, in-place ops, BatchNorm
buffers, tied weights and an optimizer — and under a memory budget so small that most values are refused
(the path the C code hands back to Python).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from nbdebug.frameworks.core import native
from nbdebug.frameworks.core.recording import Recording
from nbdebug.frameworks.torch.adapter import TorchAdapter
from nbdebug.frameworks.torch.ops import TorchOps, version_of
from nbdebug.frameworks.torch.stats import StatsBuffer
from nbdebug.session.session import Session

pytestmark = pytest.mark.skipif(native.fastats is None or not hasattr(native.fastats, "slot"),
                                reason="the native kernel is not built here (no C compiler)")

_SEEN_FIELDS = ("version", "row", "dtype", "why", "shape", "count", "nbytes", "handle", "producer", "copy")


def _tensors() -> list[torch.Tensor]:
    x = torch.randn(3, 4)
    with torch.inference_mode():
        inf = torch.ones(2)
    return [x, x.t(), x[:, 1], torch.tensor(2.5), torch.zeros(0, 3), torch.tensor([True, False, True]),
            torch.randn(5).to(torch.bfloat16), torch.randn(5).half(), torch.arange(6).view(2, 3),
            torch.tensor([float("nan"), float("inf"), -1.0]), torch.randn(4, dtype=torch.float64),
            torch.randn(2, 2, dtype=torch.complex64), torch.eye(3).to_sparse(), inf, torch.randn(2, 3)[0]]


def test_native_measure_gives_the_python_record() -> None:
    measure = TorchOps.measure
    assert measure is native.fastats.measure
    fast, slow = StatsBuffer(capacity=4), StatsBuffer(capacity=4)  # small: the buffer grows on the way
    for k, t in enumerate(_tensors()):
        a, b = measure(fast, t, k), StatsBuffer.measure(slow, t, k)
        assert a.ref() is t and b.ref() is t
        assert [getattr(a, f) for f in _SEEN_FIELDS] == [getattr(b, f) for f in _SEEN_FIELDS], t
        assert type(a.shape) is tuple
    assert len(fast) == len(slow) == len(_tensors())
    np.testing.assert_array_equal(fast.raw(), slow.raw())
    assert fast.raw().tobytes() == slow.raw().tobytes()


def test_native_version_is_version_of() -> None:
    assert TorchOps.version is native.fastats.version
    t = torch.ones(3)
    t.add_(1)
    assert TorchOps.version(t) == version_of(t) == 1
    with torch.inference_mode():
        inf = torch.ones(2)
    a, b = TorchOps.version(inf), TorchOps.version(inf)  # no version counter: never equal to another
    assert a < 0 and b < 0 and a != b


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(16, 8)
        self.conv = nn.Conv1d(8, 8, 3, padding=1)
        self.bn = nn.BatchNorm1d(8)
        self.head = nn.Linear(8, 16, bias=False)
        self.head.weight = self.emb.weight  # tied

    def forward(self, ids):
        h = self.emb(ids).transpose(1, 2)  # a view: the conv reads a non-contiguous tensor
        h = F.relu(self.bn(self.conv(h)), inplace=True)
        h = h.transpose(1, 2).contiguous()
        h = h + 0.5 * h.mean(dim=1, keepdim=True)
        h *= 2.0  # in place
        return self.head(h)


def _record(slot, level: str, budget: int) -> tuple:
    torch.manual_seed(0)
    model = _Net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ids = torch.randint(0, 16, (2, 5))
    saved = Recording.slot
    Recording.slot = slot
    session = Session(framework="pytorch", memory_budget=budget)
    adapter = TorchAdapter(model, level, session)
    losses = []
    try:
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(ids).reshape(-1, 16), ids.reshape(-1))
            loss.backward()
            opt.step()
            losses.append(loss.item())
    finally:
        adapter.close()
        Recording.slot = saved
    tables = [(t.keys, t.dtypes, t.shapes, t.unsupported, t.values.tobytes()) for _, t in sorted(session.steps.items())]
    graph = session.graph
    nodes = [(n.name, n.kind, n.op_type, n.scope, n.section, n.pair, n.shapes, n.dtypes) for n in graph]
    store = session.store
    kept = {}
    for which in ("current", "previous"):
        for key, handle in getattr(store, which).items():
            try:
                kept[(which, key)] = handle.numpy().tobytes()
            except Exception as e:  # noqa: BLE001 - a refusal is part of what is compared
                kept[(which, key)] = str(e)
    reasons = {w: dict(store._reasons[w]) for w in ("current", "previous")}
    return losses, tables, nodes, dict(graph.edges), kept, reasons


@pytest.mark.parametrize("level", ["L1", "mix"])
@pytest.mark.parametrize("budget", [512 * 2**20, 2_000])
def test_native_slot_records_what_the_python_slot_records(level: str, budget: int) -> None:
    assert Recording.slot is native.fastats.slot and Recording.slot_py is not Recording.slot
    native_run = _record(native.fastats.slot, level, budget)
    python_run = _record(Recording.slot_py, level, budget)
    names = ("losses", "statistics tables", "nodes", "edges", "retained values", "refusals")
    for name, a, b in zip(names, native_run, python_run, strict=True):
        assert a == b, name
    assert native_run[3]  # edges were recorded
    assert native_run[5]["current"] if budget < 10_000 else native_run[4]  # refusals / values were compared


def test_native_slot_arguments_are_checked() -> None:
    session = Session(framework="pytorch")
    adapter = TorchAdapter(nn.Linear(2, 2), "L1", session)
    try:
        node = session.node("op.0", kind="op", op_type="x")
        with pytest.raises(TypeError, match="as_input"):
            adapter.slot(node, "output.0", torch.ones(2))
        with pytest.raises(TypeError, match="unexpected or repeated"):
            adapter.slot(node, "output.0", torch.ones(2), as_input=False, bogus=True)
        seen = adapter.slot(node, "output.0", torch.ones(2), as_input=False, keep=False)
        assert seen.shape == (2,) and session.recorder.keys == [("op.0", "output.0")]
    finally:
        adapter.close()
