"""MindSpore PyNative: names, statistics, graph, watchpoints, control, Model.train, detach (real MindSpore, CPU)."""

import numpy as np
import pytest
from ms_fixtures import (
    ApiNet,
    LeNet,
    assert_stats,
    batches,
    loss_fn,
    ms,
    nn,
    np_stats,
    pynative_mode,  # noqa: F401 - the fixture
    pynative_trainer,
    same_weights,
)

import nbdebug
from nbdebug.control import State
from nbdebug.frameworks.mindspore.adapter import StepCallback
from nbdebug.frameworks.mindspore.stats import StatsBuffer

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("pynative_mode")]


def _api_step(level):
    ms.set_seed(0)
    net = ApiNet()
    dbg = nbdebug.Debugger(net, level=level)
    crit = nn.MSELoss()
    opt = nn.SGD(net.trainable_params(), 0.1)

    def forward(x):
        return crit(net(x), ms.ops.zeros((3, 4), ms.float32))

    grad_fn = ms.value_and_grad(forward, None, opt.parameters)
    _, grads = grad_fn(ms.Tensor(np.linspace(-1, 1, 18, dtype=np.float32).reshape(3, 6)))
    opt(grads)
    return dbg


def test_names_follow_msprobe_at_each_level():
    dbg = _api_step("L0")
    names = set(dbg.graph.nodes)
    assert {"Cell.fc.Dense.forward.0", "Cell.fc.Dense.backward.0", "Cell.fc.Dense.parameters_grad.0",
            "Parameter.fc.weight", "Parameter.fc.bias", "Optimizer.SGD.step.0"} <= names
    assert not [n for n in names if n.startswith(("Functional.", "Mint.", "Tensor.", "Primitive."))]
    assert set(dbg.graph.nodes["Cell.fc.Dense.parameters_grad.0"].shapes) == {"weight", "bias"}
    assert dbg.graph.nodes["Cell.fc.Dense.forward.0"].shapes["parameters.weight"] == (4, 6)
    assert dbg.graph.nodes["Optimizer.SGD.step.0"].section == "optimizer"
    assert dbg.step_index == 1  # the optimizer call ended the step
    dbg.close()

    dbg = _api_step("L1")
    names = set(dbg.graph.nodes)
    expected = {"Functional.relu.0.forward", "Functional.relu.0.backward", "Mint.abs.0.forward",
                "MintFunctional.softmax.0.forward", "MintFunctional.softmax.0.backward", "Tensor.__add__.0.forward",
                "Tensor.__mul__.0.forward", "Primitive.matmul.MatMul.0.forward", "Primitive.matmul.MatMul.0.backward",
                "Primitive.bias_add.BiasAdd.0.forward", "Cell.fc.Dense.parameters_grad.0"}
    assert expected <= names, expected - names
    assert not [n for n in names if n.startswith("Cell.") and ".forward." in n]
    # backward slots: gradient of the output in, gradients of the inputs out in the order they arrive, as
    # msProbe numbers them: a trainable Parameter's included (the bias's, then x's; the weight's only —
    # the data x needs no gradient)
    bias_add = dbg.graph.nodes["Primitive.bias_add.BiasAdd.0.backward"]
    assert set(bias_add.shapes) == {"input.0", "output.0", "output.1"}
    assert bias_add.shapes["output.0"] == (4,) and bias_add.shapes["output.1"] == (3, 4)
    matmul = dbg.graph.nodes["Primitive.matmul.MatMul.0.backward"]
    assert set(matmul.shapes) == {"input.0", "output.0"} and matmul.shapes["output.0"] == (4, 6)
    dbg.close()

    dbg = _api_step("mix")
    names = set(dbg.graph.nodes)
    assert {"Cell.fc.Dense.forward.0", "Functional.relu.0.forward", "Primitive.matmul.MatMul.0.forward"} <= names
    assert dbg.graph.nodes["Primitive.matmul.MatMul.0.forward"].scope == "fc"
    dbg.close()


def test_lenet_statistics_and_graph_match_direct_computation():
    ms.set_seed(1)
    net, ref = LeNet(), LeNet()
    same_weights(net, ref)
    ref.set_train(True)  # batch statistics in BatchNorm, as in training
    (x, y), = batches(1)
    # direct computation on an identical, undebugged network
    conv = ref.conv1(x).asnumpy()
    h = ref.fc1(ref.flatten(ref.pool(ref.relu(ref.bn(ref.conv1(x)))))).asnumpy()
    crit = loss_fn()
    ref_opt = nn.SGD(ref.trainable_params(), 0.05)
    ref_loss, ref_grads = ms.value_and_grad(lambda a, b: crit(ref(a), b), None, ref_opt.parameters)(x, y)
    grads = {p.name: g.asnumpy() for p, g in zip(ref_opt.parameters, ref_grads, strict=True)}
    w0 = ref.fc1.weight.asnumpy().copy()
    ref_opt(ref_grads)

    dbg = nbdebug.Debugger(net, level="mix")
    loss = pynative_trainer(net)(x, y)
    assert loss.asnumpy() == ref_loss.asnumpy()
    assert_stats(dbg.stats("Cell.conv1.Conv2d.forward.0", "output.0", 0), conv)
    assert_stats(dbg.stats("Cell.fc1.Dense.forward.0", "output.0", 0), h)
    assert_stats(dbg.stats("Parameter.fc1.weight", "output.0", 0), w0)
    assert_stats(dbg.stats("Cell.fc2.Dense.parameters_grad.0", "weight", 0), grads["fc2.weight"])
    assert_stats(dbg.stats("Cell.conv1.Conv2d.parameters_grad.0", "weight", 0), grads["conv1.weight"])
    assert_stats(dbg.stats("Optimizer.SGD.step.0", "parameters.fc1.weight", 0), ref.fc1.weight.asnumpy())
    np.testing.assert_array_equal(dbg.tensor("Cell.fc1.Dense.forward.0", "output.0"), h)
    np.testing.assert_array_equal(dbg.tensor("Parameter.fc1.weight", "output.0", "initial"), w0)
    s = dbg.stats("Cell.relu.ReLU.forward.1", "output.0", 0)
    assert s["zero_count"] == int((h <= 0).sum()) and s["min"] == 0.0
    # sections and execution order: forward, then backward, then the optimizer
    order = dbg.graph.in_order()
    sections = [n.section for n in order if n.order >= 0]
    assert sections.index("backward") > max(i for i, s in enumerate(sections) if s == "forward")
    assert sections[-1] == "optimizer"
    assert dbg.graph.nodes["Primitive.conv2d.Conv2D.0.forward"].stack[0].startswith("File ")
    assert "ms_fixtures.py" in dbg.graph.nodes["Cell.fc1.Dense.forward.0"].stack[0]
    dbg.close()

    # L0 graph: tensor data flow between Cells, parameters, and the mirrored backward flow
    ms.set_seed(1)
    net = LeNet()
    dbg = nbdebug.Debugger(net, level="L0")
    pynative_trainer(net)(x, y)
    e = dbg.graph.edges
    assert ("Input.0", "Cell.conv1.Conv2d.forward.0") in e
    assert e[("Cell.conv1.Conv2d.forward.0", "Cell.bn.BatchNorm2d.forward.0")] == [("output.0", "input.0")]
    assert ("Cell.bn.BatchNorm2d.forward.0", "Cell.relu.ReLU.forward.0") in e
    assert ("Cell.fc1.Dense.forward.0", "Cell.relu.ReLU.forward.1") in e
    assert ("Parameter.fc1.weight", "Cell.fc1.Dense.forward.0") in e
    assert ("Cell.fc2.Dense.backward.0", "Cell.relu.ReLU.backward.1") in e
    assert ("Cell.fc1.Dense.parameters_grad.0", "Optimizer.SGD.step.0") in e
    assert "fc1" in dbg.graph.scope_tree()
    dbg.close()


def test_close_restores_everything_and_outputs_stay_bitwise_identical():
    ops, mint, Tensor, Parameter = ms.ops, ms.mint, ms.Tensor, ms.Parameter
    before = {"relu": ops.relu, "abs": mint.abs, "softmax": mint.nn.functional.softmax,
              "add": Tensor.__dict__.get("__add__"), "p_mul": Parameter.__dict__.get("__mul__"),
              "opt_call": nn.Optimizer.__dict__.get("__call__")}
    ms.set_seed(2)
    a, b = LeNet(), LeNet()
    same_weights(a, b)
    data = batches(3)
    step_a = pynative_trainer(a)
    ref = [step_a(x, y).asnumpy() for x, y in data[:2]]
    prim_cls = type(b.fc1.matmul)
    dbg = nbdebug.Debugger(b, level="mix")
    assert ops.relu is not before["relu"] and type(b.fc1.matmul) is not prim_cls  # wrapped while attached
    step_b = pynative_trainer(b)
    got = [step_b(x, y).asnumpy() for x, y in data[:2]]
    assert [r.tobytes() for r in ref] == [g.tobytes() for g in got]  # capture does not change numerics
    dbg.close()
    assert ops.relu is before["relu"] and mint.abs is before["abs"]
    assert mint.nn.functional.softmax is before["softmax"]
    assert Tensor.__dict__.get("__add__") is before["add"] and Parameter.__dict__.get("__mul__") is before["p_mul"]
    assert nn.Optimizer.__dict__.get("__call__") is before["opt_call"]
    assert type(b.fc1.matmul) is prim_cls
    for _, cell in b.cells_and_names():
        assert not cell._forward_pre_hook and not cell._forward_hook
    for pa, pb in zip(a.get_parameters(), b.get_parameters(), strict=True):
        assert pa.asnumpy().tobytes() == pb.asnumpy().tobytes()
    x, y = data[2]
    assert step_a(x, y).asnumpy().tobytes() == step_b(x, y).asnumpy().tobytes()
    assert a(x).asnumpy().tobytes() == b(x).asnumpy().tobytes()
    assert dbg.step_index == 2  # closed: nothing recorded


def test_nan_from_log_is_hit_by_to_at_the_log_node():
    ms.set_seed(3)
    net = LeNet(fault="nan")
    dbg = nbdebug.Debugger(net, level="mix")
    dbg.watch("TO")
    (x, y), = batches(1)
    pynative_trainer(net)(x, y)
    hits = [h for h in dbg.hits if h.hits]
    assert hits and hits[0].node == "Functional.log.0.forward" and hits[0].slot == "output.0"
    assert dbg.first_nonfinite() == ("Functional.log.0.forward", "output.0", 0)
    assert dbg.stats("Functional.log.0.forward", "input.0", 0)["nan_count"] == 0
    assert dbg.stats("Functional.log.0.forward", "output.0", 0)["nan_count"] > 0
    dbg.close()

    # check="node": training pauses right after the log, before anything downstream runs
    net = LeNet(fault="nan")
    dbg = nbdebug.Debugger(net, level="mix", check="node")
    dbg.watch("TO")
    step = pynative_trainer(net)
    dbg.run(step, x, y)
    assert dbg.wait(60) is State.PAUSED and dbg.current_node == "Functional.log.0.forward"
    assert "Cell.fc2.Dense.forward.0" not in dbg.graph.nodes
    assert np.isnan(dbg.tensor("Functional.log.0.forward", "output.0")).any()
    dbg.cont()
    assert dbg.wait(60) is State.PAUSED  # further hits downstream
    dbg.terminate()  # unwinds the forward pass under value_and_grad
    assert dbg.wait(60) is State.TERMINATED
    dbg.close()
    # MindSpore's gradient executor was reset: a TrainOneStepCell trains (and is captured) normally after
    pynative_trainer(LeNet())(x, y)
    net = LeNet()
    dbg = nbdebug.Debugger(net, level="L0")
    nn.TrainOneStepCell(nn.WithLossCell(net, loss_fn()), nn.SGD(net.trainable_params(), 0.05))(x, y)
    assert "Cell.fc1.Dense.backward.0" in dbg.graph.nodes and dbg.step_index == 1
    dbg.close()


def test_wnc_fires_for_a_frozen_parameter_and_ge_for_an_exploding_gradient():
    ms.set_seed(4)
    net = LeNet(fault="explode", freeze=("fc2.bias",))
    dbg = nbdebug.Debugger(net, level="L0")
    dbg.watch("WNC")
    dbg.watch("GE")
    step = pynative_trainer(net)
    for x, y in batches(2):
        step(x, y)
    wnc = {h.node for h in dbg.hits if h.condition == "WNC" and h.hits}
    assert wnc == {"Parameter.fc2.bias"}
    ge = [h for h in dbg.hits if h.condition == "GE" and h.hits and h.step == 0]
    assert ge and all(dbg.graph.nodes[h.node].section == "backward" for h in ge)
    assert any(h.node == "Cell.conv1.Conv2d.parameters_grad.0" for h in ge)
    assert dbg.stats("Cell.fc2.Dense.forward.0", "output.0", 0)["pos_inf_count"] == 0  # finite forward
    dbg.close()


def test_threaded_run_pauses_steps_and_nodes():
    ms.set_seed(5)
    net = LeNet()
    dbg = nbdebug.Debugger(net, level="mix")
    step = pynative_trainer(net)
    data = batches(3)

    def train():
        for x, y in data:
            step(x, y)
        return "done"

    dbg.run(train, steps=1)
    assert dbg.wait(60) is State.PAUSED and dbg.step_index == 1
    dbg.run_to("Cell.fc2.Dense.forward.0")
    assert dbg.wait(60) is State.PAUSED
    assert dbg.current_node == "Cell.fc2.Dense.forward.0"
    assert dbg.stats("Cell.fc2.Dense.forward.0", "output.0")["shape"] == (8, 10)  # readable while paused
    assert "Functional.flatten.0.forward" in dbg.graph.nodes  # L1 ops recorded on the worker thread
    dbg.cont()
    assert dbg.wait(60) is State.FINISHED and dbg._ctl.result == "done"
    assert dbg.step_index == 3
    dbg.close()


def test_model_train_with_step_callback_and_sink_mode_error():
    ms.set_seed(6)
    net = LeNet()
    dbg = nbdebug.Debugger(net, level="L0")
    data = batches(3)
    ds = ms.dataset.GeneratorDataset([(x.asnumpy()[0], y.asnumpy()[0]) for x, y in data], ["x", "y"]).batch(1)
    model = ms.train.Model(net, loss_fn(), nn.SGD(net.trainable_params(), 0.05))
    model.train(1, ds, callbacks=[StepCallback(dbg)], dataset_sink_mode=False)
    assert dbg.step_index == 3
    assert "Optimizer.SGD.step.0" in dbg.graph.nodes and "Cell.fc1.Dense.backward.0" in dbg.graph.nodes
    dbg.close()

    from mindspore.train.callback import RunContext
    from mindspore.train.callback._callback import InternalCallbackParam

    params = InternalCallbackParam()
    params.dataset_sink_mode = True
    with pytest.raises(ValueError, match="dataset_sink_mode=False"):
        StepCallback(dbg).on_train_begin(RunContext(params))


def test_capture_off_records_nothing_and_resumes():
    ms.set_seed(7)
    net = LeNet()
    dbg = nbdebug.Debugger(net, level="mix", capture=False)
    step = pynative_trainer(net)
    (x, y), (x2, y2) = batches(2)
    step(x, y)
    assert dbg.step_index == 0 and len(dbg.graph) == 0
    dbg.capture = True
    step(x2, y2)
    assert dbg.step_index == 1 and "Cell.fc1.Dense.forward.0" in dbg.graph.nodes
    dbg.close()


def test_stats_device_path_matches_native_kernel():
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal((30, 7)).astype(np.float32), np.array([1, np.nan, np.inf, -np.inf, 0.0], np.float32),
              rng.integers(-3, 3, 11).astype(np.int32), np.array([True, False, True]),
              rng.standard_normal(9).astype(np.float16)]
    rows = {}
    for fast in (True, False):
        buf = StatsBuffer(fast=fast)
        idx = [buf.add(ms.Tensor(a)) for a in arrays]
        rows[fast] = buf.raw()[idx]
    np.testing.assert_allclose(rows[True], rows[False], rtol=1e-5, equal_nan=True)
    x = arrays[0].astype(np.float64)
    np.testing.assert_allclose(rows[True][0, :5], [x.max(), x.min(), x.sum(), np.abs(x).sum(), (x * x).sum()],
                               rtol=1e-6)
    assert list(rows[True][1, 6:]) == [1, 1, 1] and np.isnan(rows[True][1, 0])
    assert np_stats(arrays[0])["max"] == pytest.approx(rows[False][0, 0])



@pytest.mark.parametrize("train", [True, False], ids=["training", "inference"])
def test_cpu_batchnorm_outputs_it_never_writes_are_refused(train):
    """The value shown is the value used: MindSpore's CPU BatchNorm writes ``y`` and, in training, the batch
    mean and variance (outputs 3, 4); outputs 1 and 2 (and in inference 1–4) hold whatever the buffer held —
    msProbe dumps that leftover memory. nbdebug gives them no statistics and no value, with the reason."""
    ms.set_seed(0)
    net = LeNet()
    net.set_train(train)
    dbg = nbdebug.Debugger(net, level="L1")
    for x, _y in batches(2, seed=1):
        net(x)
        dbg.step()  # forward only: the step ends here
    prim = "bn_train" if train else "bn_infer"
    name = f"Primitive.{prim}.BatchNorm.0.forward"
    table = dbg.session.table(1)
    refused = {table.keys[i]: why for i, why in table.unsupported.items()}
    unwritten = ("output.1", "output.2") if train else ("output.1", "output.2", "output.3", "output.4")
    for slot in ("output.1", "output.2", "output.3", "output.4"):
        if slot in unwritten:
            assert "does not write this output" in refused[(name, slot)], slot
            with pytest.raises(nbdebug.NotRetainedError, match="does not write this output"):
                dbg.session.tensor(name, slot, step=1)
        else:  # the batch mean and variance: computed, shown
            assert (name, slot) not in refused
            x_in = dbg.session.tensor(name, "input.0", step=1)
            want = x_in.mean(axis=(0, 2, 3)) if slot == "output.3" else x_in.var(axis=(0, 2, 3))
            np.testing.assert_allclose(dbg.session.tensor(name, slot, step=1), want, rtol=1e-4, atol=1e-6)
    assert (name, "output.0") not in refused
    dbg.close()
