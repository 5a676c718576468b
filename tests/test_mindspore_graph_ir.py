"""MindSpore GRAPH mode on real training cells (issue 13): IR statements that span several lines (constant
tensors printed in full), in fresh processes, live and offline."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import mindspore  # noqa: F401  (the scripts below train with it in fresh processes)
import pytest

import nbdebug
from nbdebug.frameworks.mindspore import graph as kd

pytestmark = pytest.mark.timeout(300)

# As MindSpore 2.10 prints MSELoss's gradient for a batch of 16: the constant's rows on their own lines.
MULTILINE_IR = """\
subgraph @kernel_graph_0() {
  %7(CNode_35) = PrimFunc_RealDiv(Tensor(shape=[16, 1], dtype=Float32, value=
[[ 1.00000000e+00]
 [ 1.00000000e+00]
 ...
 [ 1.00000000e+00]]), Tensor(shape=[], dtype=Float32, value=16)) primitive_attrs: {IsFeatureMapOutput: Bool(1)}
      : (<Tensor[Float32], (16, 1), value=...>, <Tensor[Float32], (), value=...>) -> (<Tensor[Float32], (16, 1)>)
      # Fullname with scope: (Gradients/Default/network-WithLossCell/_loss_fn-MSELoss/Grad_ReduceMean/RealDiv-op0)
  %8(CNode_36) = PrimFunc_Mul(%7, %7) primitive_attrs: {}
      # Fullname with scope: (Gradients/Default/network-WithLossCell/_loss_fn-MSELoss/Mul-op1)
  Return(%8)
}
"""


def test_constant_tensor_over_several_lines_parses():
    ir = kd.parse_ir(MULTILINE_IR)
    div = ir.by_fullname["Gradients/Default/network-WithLossCell/_loss_fn-MSELoss/Grad_ReduceMean/RealDiv-op0"]
    assert div.op == "RealDiv" and len(div.args) == 2
    assert div.args[0].startswith("Tensor(shape=[16, 1]") and div.args[1].endswith("value=16)")
    mul = ir.by_fullname["Gradients/Default/network-WithLossCell/_loss_fn-MSELoss/Mul-op1"]
    assert mul.args == ["%7", "%7"]


def test_unterminated_statement_is_a_clear_error():
    broken = "subgraph @g() {\n  %1(CNode_1) = PrimFunc_Add(Tensor(shape=[2], value=\n[1, 2]\n      # x\n}\n"
    with pytest.raises(ValueError, match=r"<ir>:2: cannot parse MindSpore IR line \(unbalanced parentheses\)"):
        kd.parse_ir(broken)


def _run(tmp_path, body: str, *args: str) -> str:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(body))
    env = dict(os.environ)
    env.pop(kd.ENV, None)
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(nbdebug.__file__))
    res = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=240, env=env,
                         cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return res.stdout


HEAD = """\
    import shutil, numpy as np, mindspore as ms, nbdebug
    from mindspore import nn
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(1)
"""


def test_train_one_step_cell_with_mse_loss_batch_16_live_and_offline(tmp_path):
    out = _run(tmp_path, HEAD + """\
    net = nn.Dense(4, 1)
    train = nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), nn.SGD(net.trainable_params(), 0.01))
    dbg = nbdebug.Debugger(train)
    x = ms.Tensor(np.random.randn(16, 4).astype(np.float32))
    y = ms.Tensor(np.random.randn(16, 1).astype(np.float32))
    losses = [float(train(x, y).asnumpy()) for _ in range(3)]
    assert losses[2] < losses[0], losses
    names = [n for n in dbg.graph.nodes if n.endswith("RealDiv-op0")]
    assert names, sorted(dbg.graph.nodes)
    st = dbg.stats(names[0], "output.0")
    assert st["shape"] == (16, 1), st
    shutil.copytree(dbg._adapter.dump_dir, "copy")
    dbg.close()
    off = nbdebug.load("copy")
    assert not [p for p in off.problems if "parse" in str(p)], off.problems
    assert names[0] in off.graph.nodes
    print("OK", dbg.step_index, len(off.graph))
    """)
    assert "OK 3" in out


def test_while_loop_with_a_tensor_condition(tmp_path):
    out = _run(tmp_path, HEAD + """\
    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.fc = nn.Dense(4, 4)
        def construct(self, x):
            i = ms.Tensor(0, ms.int32)
            while i < 3:
                x = self.fc(x)
                i = i + 1
            return x
    net = Net()
    train = nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), nn.SGD(net.trainable_params(), 0.01))
    dbg = nbdebug.Debugger(train)
    x = ms.Tensor(np.random.randn(2, 4).astype(np.float32))
    y = ms.Tensor(np.zeros((2, 4), np.float32))
    for _ in range(2):
        train(x, y)
    ops = {n.op_type for n in dbg.graph.nodes.values()}
    assert {"MatMul", "BiasAdd"} <= ops, ops
    print("OK", dbg.step_index)
    dbg.close()
    """)
    assert "OK 2" in out


def test_control_flow_branch_kernels_are_recorded_and_the_nan_is_located_at_the_branch_log(tmp_path):
    """``if``/``for`` in construct: MindSpore runs the branch as its own kernel graph (no weights in it)."""
    out = _run(tmp_path, HEAD + """\
    from mindspore import ops
    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.fc = nn.Dense(4, 3)
            self.log = ops.Log()
        def construct(self, x, flag):
            h = self.fc(x)
            if flag > 0:
                h = self.log(h * 0.5)          # log of negatives: the NaN is born here
            else:
                h = h * 2.0
            for _ in range(2):
                h = h + 1.0
            return h
    class WithLoss(nn.Cell):
        def __init__(self, net):
            super().__init__()
            self.net = net
            self.loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
        def construct(self, x, flag, y):
            return self.loss(self.net(x, flag), y)
    net = Net()
    train = nn.TrainOneStepCell(WithLoss(net), nn.SGD(net.trainable_params(), 0.01))
    dbg = nbdebug.Debugger(train)
    x = ms.Tensor(np.random.randn(2, 4).astype(np.float32))
    y = ms.Tensor(np.array([0, 1], np.int32))
    for flag in (0, 1):
        train(x, ms.Tensor(flag, ms.int32), y)
    ops_seen = {n.op_type for n in dbg.graph.nodes.values()}
    assert {"MatMul", "BiasAdd", "Log", "Mul", "SparseSoftmaxCrossEntropyWithLogits"} <= ops_seen, ops_seen
    live = dbg.first_nonfinite()
    assert live is not None and live[0].endswith("/Log-op0") and live[2] == 1, live
    shutil.copytree(dbg._adapter.dump_dir, "copy")
    dbg.close()
    off = nbdebug.load("copy")
    assert sorted(off.session.steps) == [0, 1], sorted(off.session.steps)   # 2 training steps, not 10 runs
    assert off.first_nonfinite(None) == live, (off.first_nonfinite(None), live)
    print("OK")
    """)
    assert "OK" in out


def test_ms_jit_value_and_grad_kernels_get_cell_scopes(tmp_path):
    """The MindSpore 2.x idiom: a jitted function around value_and_grad. Kernels are compiled without Cell
    scopes (``Default/MatMul-op0``); the IR's call chain gives them back."""
    out = _run(tmp_path, HEAD + """\
    class Block(nn.Cell):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Dense(4, 8)
            self.act = nn.ReLU()
            self.fc2 = nn.Dense(8, 1)
        def construct(self, x):
            return self.fc2(self.act(self.fc1(x)))
    net = Block()
    opt = nn.SGD(net.trainable_params(), 0.01)
    loss_fn = nn.MSELoss()
    def forward(x, y):
        return loss_fn(net(x), y)
    grad_fn = ms.value_and_grad(forward, None, opt.parameters)
    @ms.jit
    def train_step(x, y):
        loss, grads = grad_fn(x, y)
        opt(grads)
        return loss
    dbg = nbdebug.Debugger(net)
    x = ms.Tensor(np.random.randn(16, 4).astype(np.float32))
    y = ms.Tensor(np.random.randn(16, 1).astype(np.float32))
    for _ in range(2):
        train_step(x, y)
    scope = {n.name: n.scope for n in dbg.graph.nodes.values()}
    assert scope["Default/MatMul-op0"] == "Default/fc1-Dense", scope
    assert scope["Default/MatMul-op1"] == "Default/fc2-Dense", scope
    assert scope["Default/ReLU-op0"] == "Default/act-ReLU", scope
    assert scope["Default/Sub-op0"] == "Default", scope          # the loss is outside the debugged Cell
    grads = {s for n, s in scope.items() if n.startswith("Gradients/") and "MatMul" in n}
    assert {"Gradients/Default/fc1-Dense/Grad_MatMul", "Gradients/Default/fc2-Dense/Grad_MatMul"} <= grads, grads
    tree = dbg.graph.scope_tree()
    assert {"fc1-Dense", "fc2-Dense", "act-ReLU"} <= set(tree["Default"]), tree["Default"].keys()
    print("OK")
    dbg.close()
    """)
    assert "OK" in out


AMP_O2 = """\
    import sys
    from mindspore import amp
    from nbdebug import NotRetainedError
    form = sys.argv[1]
    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Dense(32, 64)
            self.relu = nn.ReLU()
            self.fc2 = nn.Dense(64, 10)
        def construct(self, x):
            return self.fc2(self.relu(self.fc1(x)))
    net = Net()
    dbg = nbdebug.Debugger(net)
    dbg.watch("TO")
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    opt = nn.Momentum(net.trainable_params(), 0.01, 0.9)
    if form == "build_train_network":
        train = amp.build_train_network(net, opt, loss, level="O2", loss_scale_manager=None)
    else:
        train = nn.TrainOneStepCell(nn.WithLossCell(amp.auto_mixed_precision(net, "O2"), loss), opt)
    rng = np.random.default_rng(0)
    x = ms.Tensor(rng.standard_normal((8, 32)).astype(np.float32))
    y = ms.Tensor(rng.integers(0, 10, 8).astype(np.int32))
    losses = [float(train(x, y).asnumpy()) for _ in range(3)]
    assert np.isfinite(losses).all(), losses
    nodes = dbg.graph.nodes
    def one(suffix):
        found = [n for n in nodes if n.endswith(suffix) and n.startswith("Default/")]
        assert len(found) == 1, (suffix, found)
        return found[0]
    # float16 kernels between Casts ran
    relu = one("relu-ReLU/ReLU-op0")
    assert dbg.stats(relu, "output.0")["dtype"] == "float16"
    # MindSpore's CPU MatMul computes in float32 where the graph declares float16: the dump file holds the
    # float32 buffer's first half read as float16 (NaNs among them); that slot is not shown as a value
    mm = one("fc1-Dense/MatMul-op0")
    st = dbg.stats(mm, "output.0")
    assert st["unsupported"].startswith("not the value used: MindSpore's kernel dump"), st
    assert st["dtype"] == "float32" and st["nan_count"] == 0 and st["max"] is None, st
    try:
        dbg.tensor(mm, "output.0")
        raise AssertionError("tensor() of a misdumped slot must raise")
    except NotRetainedError as e:
        assert "MindSpore's kernel dump wrote this float32 tensor as float16" in str(e), e
    # no watchpoint fires on the unusable files, and nothing is non-finite
    assert not [h for h in dbg.hits if h.hits], [(h.node, h.slot) for h in dbg.hits if h.hits]
    assert dbg.first_nonfinite() is None
    # the values shown are the ones used: the Cast to float16 after fc1 holds float16(x @ W.T + b), computed
    # here from the slots that are shown (the MatMul's float32 inputs and the bias)
    xin, w = dbg.tensor(mm, "input.0"), dbg.tensor(mm, "input.1")
    bias_add = one("fc1-Dense/BiasAdd-op0")
    b = dbg.tensor(bias_add, "input.1")
    cast = one("relu-ReLU/Cast-op0")
    got = dbg.tensor(cast, "output.0")
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), (xin @ w.T + b).astype(np.float16).astype(np.float32),
                               rtol=2e-3, atol=2e-3)
    np.testing.assert_array_equal(dbg.tensor(relu, "output.0"), np.maximum(got, 0))
    shutil.copytree(dbg._adapter.dump_dir, "copy")
    # every kernel got its own files (MindSpore's -opN numbering in file names is not the graph's): each
    # slot has the shape and the dump dtype the graph declares for that kernel
    from nbdebug.frameworks.mindspore import graph as kd
    rank = kd.find_rank_dirs("copy")[0]
    (gid,) = dbg.session.kernel_graphs.values()
    checked = 0
    for k in kd.load_kernel_graph(rank, gid).kernels:
        for slot, (dtype, shape) in k.declared.items():
            if slot in nodes[k.name].shapes and shape is not None:  # (scalars have no declared shape)
                assert nodes[k.name].shapes[slot] == shape, (k.name, slot, nodes[k.name].shapes[slot], shape)
                checked += 1
    assert checked > 80, checked
    dbg.close()
    off = nbdebug.load("copy")
    ost = off.stats(mm, "output.0", off.steps[-1])
    assert ost["unsupported"].startswith("not the value used"), ost
    try:
        off.tensor(mm, "output.0", off.steps[-1])
        raise AssertionError("offline tensor() of a misdumped slot must raise")
    except NotRetainedError as e:
        assert "not the value used" in str(e), e
    print("OK", form, len([n for n in nodes if "float16" in nodes[n].dtypes.values()]))
"""


@pytest.mark.parametrize("form", ["build_train_network", "auto_mixed_precision"])
def test_amp_o2_trains_and_misdumped_float16_slots_are_not_shown(tmp_path, form):
    """Both AMP O2 forms in GRAPH mode. On CPU MindSpore runs some kernels the graph declares float16
    (MatMul, BiasAdd and their gradients) in float32, and its kernel dump names and sizes their files by
    the declared type: such files are not the values used. The IR's kernel-info line gives the real dtype."""
    out = _run(tmp_path, HEAD + AMP_O2, form)
    assert f"OK {form}" in out
