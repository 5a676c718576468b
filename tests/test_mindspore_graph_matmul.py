"""MindSpore GRAPH mode (issue 23 item 5), in a fresh process, live and offline: in a small Transformer whose
attention ``BatchMatMul`` kernels (MatMulExt expanded) all have one shape, every Dense/MatMul/BatchMatMul's
recorded output is numpy's product of its recorded inputs (the dump file paired with each kernel is its own),
or the slot is refused with the reason; a NaN from a ``Log`` of a negative flows through; the whole-step
invariant (every slot's statistics are those of the file it names) holds."""

from __future__ import annotations

import os
import re
import shutil

import numpy as np
import pytest
from test_mindspore_graph_control import _run

import nbdebug

pytestmark = pytest.mark.timeout(300)


def product_agrees(a, b, o, rtol=1e-3, atol=1e-4):
    """Whether ``o`` is ``a @ b`` for some transposition of ``a`` and ``b`` (``a``/``b`` may be dumped before a
    reshape the kernel does not change: a 2-D product reads them as matrices of ``o``'s rows/columns); NaN-aware.
    """
    a, b, o = (np.asarray(t, np.float64) for t in (a, b, o))
    products = []
    with np.errstate(all="ignore"):
        if o.ndim == 2:
            m, n = o.shape
            lhs = [x for x in (a.reshape(m, -1) if a.size % m == 0 else None,
                               a.reshape(-1, m).T if a.size % m == 0 else None) if x is not None]
            rhs = [x for x in (b.reshape(-1, n) if b.size % n == 0 else None,
                               b.reshape(n, -1).T if b.size % n == 0 else None) if x is not None]
            products = [x @ y for x in lhs for y in rhs if x.shape[1] == y.shape[0]]
        else:
            for x in (a, np.swapaxes(a, -1, -2)):
                for y in (b, np.swapaxes(b, -1, -2)):
                    if x.shape[-1] == y.shape[-2]:
                        products.append(x @ y)
        return any(p.shape == o.shape and np.allclose(p, o, rtol=rtol, atol=atol, equal_nan=True)
                   for p in products)


def test_product_agrees_tells_a_wrong_output():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((2, 2, 8, 8)), rng.standard_normal((2, 2, 8, 8))
    assert product_agrees(a, b, a @ b) and product_agrees(a, b, a @ np.swapaxes(b, -1, -2))
    assert not product_agrees(a, b, b @ a)
    w = rng.standard_normal((32, 16))
    assert product_agrees(a.reshape(2, 8, 16), w, a.reshape(16, 16) @ w.T)   # Dense: x @ W^T, x 3-D
    assert not product_agrees(a.reshape(2, 8, 16), w, (a.reshape(16, 16) @ w.T)[::-1])


TRANSFORMER = """\
    from mindspore import mint

    class Block(nn.Cell):
        # d=16, 2 heads of 8 over 8 tokens: q, k^T, attention and v are all (2, 2, 8, 8), so are the attention
        # BatchMatMuls' inputs and outputs, forward and backward
        def __init__(self, d=16, heads=2):
            super().__init__()
            self.heads, self.dh = heads, d // heads
            self.ln = nn.LayerNorm((d,))
            self.q, self.k, self.v, self.o = (nn.Dense(d, d) for _ in range(4))
            self.ff = nn.SequentialCell(nn.Dense(d, 2 * d), nn.GELU(), nn.Dense(2 * d, d))
            self.log = ops.Log()

        def _split(self, t):
            b, n, _ = t.shape
            return t.reshape(b, n, self.heads, self.dh).transpose(0, 2, 1, 3)

        def construct(self, x, shift):
            h = self.ln(x)
            q, k, v = self._split(self.q(h)), self._split(self.k(h)), self._split(self.v(h))
            att = ops.softmax(mint.matmul(q, k.transpose(0, 1, 3, 2)) / (self.dh ** 0.5), axis=-1)
            a = mint.matmul(att, v).transpose(0, 2, 1, 3)
            x = x + self.o(a.reshape(x.shape)) + self.log(shift)    # log of a negative shift: the NaN
            return x + self.ff(x)

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.block = Block()
            self.head = nn.Dense(16, 4)

        def construct(self, x, shift):
            return self.head(self.block(x, shift).mean(axis=1))

    class WithShift(nn.Cell):
        def __init__(self, net):
            super().__init__()
            self.net = net
            self.loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
        def construct(self, x, shift, y):
            return self.loss(self.net(x, shift), y)

    net = Net()
    train = nn.TrainOneStepCell(WithShift(net), nn.SGD(net.trainable_params(), 0.01))
    dbg = nbdebug.Debugger(net)
    rng = np.random.default_rng(0)
    y = ms.Tensor(np.array([0, 1], np.int32))
    STEPS, NAN_STEP = 10, 9      # the dump keeps steps 8 (finite) and 9 (the NaN's)

"""


def _products(src, step):
    """(Dense/MatMul/BatchMatMul kernels whose output is their inputs' product, [(kernel, why refused)])."""
    checked, refused = 0, []
    for name, node in src.graph.nodes.items():
        if node.op_type not in ("MatMul", "BatchMatMul", "MatMulExt", "Dense"):
            continue
        try:
            a, b, o = (src.tensor(name, s, step) for s in ("input.0", "input.1", "output.0"))
        except nbdebug.NotRetainedError as exc:
            refused.append((name, str(exc)))
            continue
        assert product_agrees(a, b, o), (name, step, a.shape, b.shape, o.shape)
        checked += 1
    return checked, refused


def _tamper(root, how):
    """The attention BatchMatMuls' dump files as MindSpore could have written them: ``"order"``, each kernel's
    files carry the next kernel's timestamps (the runtime ran them in another order than the csv); ``"names"``,
    each kernel's files carry the next kernel's ``-opN`` (MindSpore's numbering is not the graph's)."""
    pat = re.compile(r"^(BatchMatMul\.Expand__MatMulExt_BatchMatMul-op)(\d+)\.(\d+)\.(\d+)\.(\d+)\.(.*)$")
    for d, _dirs, names in os.walk(root):
        found = {}
        for n in names:
            m = pat.match(n)
            if m:
                found[(int(m.group(2)), m.group(6))] = m
        ops_ = sorted({op for op, _rest in found})
        nxt = dict(zip(ops_, ops_[1:] + ops_[:1], strict=True))
        moves = []
        for (op, rest), m in found.items():
            other = found[(nxt[op], rest)]
            ts, idx = (other.group(5), m.group(2)) if how == "order" else (m.group(5), other.group(2))
            moves.append((m.group(0), f"{m.group(1)}{idx}.{m.group(3)}.{m.group(4)}.{ts}.{rest}"))
        for old, new in moves:
            os.rename(os.path.join(d, old), os.path.join(d, new + ".tmp"))
        for _old, new in moves:
            os.rename(os.path.join(d, new + ".tmp"), os.path.join(d, new))
        if moves:
            yield d


def test_every_matmul_output_is_the_product_of_its_inputs_live_and_offline(tmp_path):
    import inspect
    import textwrap

    out = _run(tmp_path, TRANSFORMER + textwrap.indent(inspect.getsource(product_agrees), "    ")
               + textwrap.indent(inspect.getsource(_products), "    ") + """
    for i in range(STEPS):
        shift = np.full((2, 8, 16), -1.0 if i >= NAN_STEP else 1.0, np.float32)
        train(ms.Tensor(rng.standard_normal((2, 8, 16)).astype(np.float32)), ms.Tensor(shift), y)
        if i >= STEPS - 2:   # the dump keeps the current and previous steps' files
            assert invariant_live(dbg, i) > 100
            checked, refused = _products(dbg, i)
            assert checked >= 20 and not refused, (checked, refused)
            print("LIVE", i, checked, len(refused))
    bmm = sorted(n for n, node in dbg.graph.nodes.items() if node.op_type == "BatchMatMul")
    assert len(bmm) == 6, bmm                                  # forward 2 and backward 4, one shape
    assert dbg.stats(bmm[0], "output.0", STEPS - 2)["nan_count"] == 0
    assert dbg.first_nonfinite(STEPS - 1)[0].endswith("/Log-op0"), dbg.first_nonfinite(STEPS - 1)
    shutil.copytree(dbg._adapter.dump_dir, "copy")
    dbg.close()
    print("OK")
    """)
    assert "OK" in out, out
    off = nbdebug.load(str(tmp_path / "copy"))
    assert len(off.session.steps) == 2, sorted(off.session.steps)
    for step in off.session.steps:
        checked, refused = _products(off, step)
        assert checked >= 20 and not refused, (checked, refused)
    assert _invariant_offline(off) > 200
    # neither the order nor the names of the files tell the six same-shaped BatchMatMuls apart: the data flow
    # does, or the slot is refused with the reason
    for how in ("order", "names"):
        copy = tmp_path / how
        shutil.copytree(tmp_path / "copy", copy)
        assert len(list(_tamper(copy, how))) >= 2
        off = nbdebug.load(str(copy))
        for step in off.session.steps:
            checked, refused = _products(off, step)
            assert checked >= 20, (how, checked, refused)
            assert all("cannot be told" in why and why.startswith("not the value used") for _n, why in refused), refused
        assert _invariant_offline(off) > 200


def _invariant_offline(off):
    n = 0
    for step in off.session.steps:
        for key in off.session.table(step).keys:
            st = off.stats(key[0], key[1], step)
            if st.get("file"):
                arr = np.load(st["file"]).astype(np.float64)
                assert st["nan_count"] == int(np.isnan(arr).sum()), (key, step)
                fin = arr[np.isfinite(arr)]
                if fin.size and not st["nan_count"]:
                    assert np.isclose(st["max"], fin.max()) and np.isclose(st["min"], fin.min()), (key, step)
                n += 1
    return n
