"""MindSpore GRAPH mode: the kernel dump as a live session, control between steps, offline loading (CPU)."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from ms_fixtures import (
    LeNet,
    assert_stats,
    batches,
    graph_mode,  # noqa: F401 - the fixture every test here uses
    graph_trainer,
    loss_fn,
    ms,
    nn,
)

import nbdebug
from nbdebug.control import State
from nbdebug.frameworks.mindspore import graph as kd
from nbdebug.frameworks.mindspore import kernel_config
from nbdebug.frameworks.mindspore.adapter import StepCallback

pytestmark = [pytest.mark.timeout(180), pytest.mark.usefixtures("graph_mode")]
SCOPE = "Default/network-WithLossCell/_backbone-LeNet"


def _dump_files(dbg):
    return [f for r in kd.find_rank_dirs(dbg._adapter.dump_dir) for _, _, p in kd.iteration_dirs(r)
            for f in os.listdir(p) if f.endswith(".npy")]


def _kernel(dbg, suffix, section="forward"):
    found = [n for n in dbg.graph.nodes.values() if n.name.endswith(suffix) and n.section == section]
    assert len(found) == 1, (suffix, [n.name for n in found])
    return found[0].name


def test_graph_training_graph_names_stats_disk_and_offline(tmp_path):
    ms.set_seed(10)
    net = LeNet()
    dbg = nbdebug.Debugger(net)
    train = graph_trainer(net)
    data = batches(4)
    losses, per_step = [], None
    for i, (x, y) in enumerate(data):
        losses.append(float(train(x, y).asnumpy()))
        assert dbg.step_index == i + 1  # every run of the training graph is a step
        dbg._adapter.remover.flush()  # older steps' files are deleted in the background
        per_step = per_step or len(_dump_files(dbg))
        assert len(_dump_files(dbg)) <= 2 * per_step  # only the current and previous steps stay on disk
        if i == 2:
            shutil.copytree(dbg._adapter.dump_dir, tmp_path / "dump")
    g = dbg.graph
    matmul = f"{SCOPE}/fc1-Dense/MatMul-op0"
    assert matmul in g.nodes and g.nodes[matmul].op_type == "MatMul" and g.nodes[matmul].scope == f"{SCOPE}/fc1-Dense"
    assert getattr(g.nodes[matmul], "graph", "").startswith("ms_output_trace_code_graph_")
    assert set(dbg.session.kernel_graphs) == {g.nodes[matmul].graph}
    tree = g.scope_tree()
    assert "MatMul-op0" not in tree and "fc1-Dense" in tree["Default"]["network-WithLossCell"]["_backbone-LeNet"]
    # data flow from the parameters and between kernels
    assert ("Parameter.fc1.weight", matmul) in g.edges
    assert g.edges[(matmul, f"{SCOPE}/fc1-Dense/BiasAdd-op0")] == [("output.0", "input.0")]
    assert g.nodes["Parameter.fc1.weight"].kind == "parameter"
    assert g.nodes["Input.0"].kind == "input"
    sections = {n.section for n in g.nodes.values() if n.kind == "op"}
    assert sections == {"forward", "backward", "optimizer"}
    assert all(n.section == "backward" for n in g.nodes.values() if n.name.startswith("Gradients/"))
    assert g.nodes[_kernel(dbg, "SGD-op0", "optimizer")].kind == "op"
    # execution order: MindSpore's csv
    rank = kd.find_rank_dirs(str(tmp_path / "dump"))[0]
    gid = dbg.session.kernel_graphs[g.nodes[matmul].graph]
    csv_order = kd.read_execution_order(os.path.join(rank, "execution_order", f"ms_execution_order_graph_{gid}.csv"))
    ours = [n.name for n in g.in_order() if n.kind == "op"]
    assert ours == [k for k in csv_order if k in g.nodes]
    # statistics against direct computation on the step's values
    last = dbg.step_index - 1
    x_in = dbg.tensor(matmul, "input.0").reshape(8, -1)
    w = dbg.tensor("Parameter.fc1.weight", "output.0")
    out = dbg.tensor(matmul, "output.0")
    np.testing.assert_allclose(out, x_in @ w.T, rtol=1e-4, atol=1e-5)
    assert_stats(dbg.stats(matmul, "output.0", last), out)
    assert_stats(dbg.stats("Parameter.fc1.weight", "output.0", last), w)
    loss_node = "Default/network-WithLossCell/_loss_fn-SoftmaxCrossEntropyWithLogits/" \
                "SparseSoftmaxCrossEntropyWithLogits-op0"
    assert dbg.stats(loss_node, "output.0", last)["mean"] == pytest.approx(losses[-1], rel=1e-6)
    assert dbg.stats(loss_node, "output.0", 0)["mean"] == pytest.approx(losses[0], rel=1e-6)
    np.testing.assert_array_equal(dbg.tensor("Parameter.fc1.weight", "output.0", "previous"),
                                  dbg.tensor("Parameter.fc1.weight", "output.0", last - 1))
    with pytest.raises(LookupError, match="current .* and previous step only"):
        dbg.tensor(matmul, "output.0", 0)
    assert dbg.tensor("Parameter.fc1.weight", "output.0", "initial").shape == (16, 144)
    dbg.close()
    assert _dump_files(dbg) == []  # the dumped tensors are gone
    train(*data[0])  # still trains after close, and leaves nothing behind
    assert _dump_files(dbg) == []

    # offline: the copied dump opens without MindSpore
    code = ("import sys; from nbdebug.frameworks.mindspore.graph import load_kernel_dump; "
            f"s = load_kernel_dump({str(tmp_path / 'dump')!r}); "
            "assert 'mindspore' not in sys.modules; print(sorted(s.steps), len(s.graph))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         cwd=os.path.dirname(os.path.dirname(nbdebug.__file__)))
    assert res.returncode == 0, res.stderr
    s = kd.load_kernel_dump(str(tmp_path / "dump"))
    assert not s.live and s.framework == "mindspore" and s.device == "cpu" and s.problems == []
    assert sorted(s.steps) == [0, 1]  # the two runs kept on disk when the copy was made
    assert [it for _g, it in s.step_iterations.values()] == [1, 2]
    assert set(s.graph.nodes) == set(g.nodes)
    assert s.stats(loss_node, "output.0", 1)["mean"] == pytest.approx(losses[2], rel=1e-6)
    assert s.stats(loss_node, "output.0", 0)["mean"] == pytest.approx(losses[1], rel=1e-6)
    assert s.tensor(matmul, "output.0", 0).shape == (8, 16)  # any step's tensors, read from the files
    assert s.stats(matmul, "output.0", 1)["file"].endswith(".npy")
    off = nbdebug.load(str(tmp_path / "dump"))  # the generic loader recognises the layout
    assert off.layout == "kernel" and off.steps == [0, 1] and matmul in off.graph.nodes
    # without the .ir text the .pb graph (MindSpore's anf_ir protobuf) gives the same kernels and data flow
    shutil.copytree(tmp_path / "dump", tmp_path / "dump_pb")
    for ir in (tmp_path / "dump_pb").rglob("*.ir"):
        ir.unlink()
    p = kd.load_kernel_dump(str(tmp_path / "dump_pb"))
    ops_of = lambda sess: {n.name for n in sess.graph.nodes.values() if n.kind in ("op", "parameter")}  # noqa: E731
    assert ops_of(p) == ops_of(s)
    assert {e for e in p.graph.edges if not e[0].startswith("Constant.")} == \
        {e for e in s.graph.edges if not e[0].startswith("Constant.")}
    assert {k: v for k, v in p.stats(matmul, "output.0", 1).items() if k != "file"} == \
        {k: v for k, v in s.stats(matmul, "output.0", 1).items() if k != "file"}
    # a corrupted file is named
    victim = next(p for p in (tmp_path / "dump").rglob("*.npy") if "MatMul" in p.name and ".output.0." in p.name)
    victim.write_bytes(b"not a numpy file")
    damaged = kd.load_kernel_dump(str(tmp_path / "dump"))
    assert [os.path.basename(pr.file) for pr in damaged.problems] == [victim.name]
    assert len(damaged.steps) == 2 and damaged.stats(loss_node, "output.0", 1)["mean"] == s.stats(
        loss_node, "output.0", 1)["mean"]  # everything else loads
    with pytest.raises(ValueError, match="not a MindSpore kernel dump"):
        kd.load_kernel_dump(str(tmp_path))


def test_graph_nan_is_hit_by_to_at_the_log_kernel():
    ms.set_seed(11)
    net = LeNet(fault="nan")
    dbg = nbdebug.Debugger(net)
    dbg.watch("TO")
    train = graph_trainer(net)
    train(*batches(1)[0])
    log = f"{SCOPE}/Log-op0"
    first = [h for h in dbg.hits if h.hits][0]
    assert (first.node, first.slot, first.step) == (log, "output.0", 0)
    assert dbg.first_nonfinite() == (log, "output.0", 0)
    assert dbg.stats(log, "input.0", 0)["nan_count"] == 0
    dbg.close()


def test_graph_wnc_for_a_frozen_parameter_and_ge_for_an_exploding_gradient():
    ms.set_seed(12)
    net = LeNet(fault="explode", freeze=("fc2.bias",))
    dbg = nbdebug.Debugger(net)
    dbg.watch("WNC")
    dbg.watch("GE")
    train = graph_trainer(net)
    for x, y in batches(2):
        train(x, y)
    trainable = {f"Parameter.{p.name}" for p in net.get_parameters() if "moving_" not in p.name}
    wnc = {h.node for h in dbg.hits if h.condition == "WNC" and h.hits}
    assert wnc & trainable == {"Parameter.fc2.bias"}
    # (MindSpore 2.10's CPU BatchNorm kernel leaves moving_mean/moving_variance untouched in GRAPH mode;
    # WNC reports that too)
    assert wnc - trainable <= {"Parameter.bn.moving_mean", "Parameter.bn.moving_variance"}
    ge = [h for h in dbg.hits if h.condition == "GE" and h.hits and h.step == 0]
    assert ge and all(dbg.graph.nodes[h.node].section == "backward" for h in ge)
    assert any("Conv2DBackpropFilter" in h.node for h in ge)
    fwd = [n for n in dbg.graph.nodes.values() if n.section == "forward" and n.kind == "op"]
    assert not any(dbg.stats(n.name, s, 0)["pos_inf_count"] for n in fwd for s in n.shapes if s.startswith("out"))
    dbg.close()


def test_graph_step_control_on_the_worker_thread_and_model_train():
    ms.set_seed(13)
    net = LeNet()
    dbg = nbdebug.Debugger(net)
    train = graph_trainer(net)
    data = batches(5)

    def loop():
        for x, y in data:
            train(x, y)

    dbg.run(loop, steps=1)
    assert dbg.wait(60) is State.PAUSED and dbg.step_index == 1
    dbg.cont(2)
    assert dbg.wait(60) is State.PAUSED and dbg.step_index == 3
    matmul = f"{SCOPE}/fc1-Dense/MatMul-op0"
    dbg.run_to(matmul)  # while the next step's kernels are read back
    assert dbg.wait(60) is State.PAUSED and dbg.current_node == matmul
    assert dbg.stats(matmul, "output.0")["shape"] == (8, 16)
    dbg.terminate()
    assert dbg.wait(60) is State.TERMINATED
    assert dbg.step_index == 4  # the step in progress was completed, nothing more ran
    dbg.close()

    # mindspore.train.Model: the callback marks the steps
    ms.set_seed(14)
    net = LeNet()
    dbg = nbdebug.Debugger(net)
    ds = ms.dataset.GeneratorDataset([(x.asnumpy(), y.asnumpy()) for x, y in batches(3)], ["x", "y"])
    model = ms.train.Model(net, loss_fn(), nn.SGD(net.trainable_params(), 0.05))
    model.train(1, ds, callbacks=[StepCallback(dbg)], dataset_sink_mode=False)
    assert dbg.step_index == 3 and not dbg._adapter.auto_step
    assert any(n.endswith("MatMul-op0") for n in dbg.graph.nodes)
    dbg.close()


def test_dump_config_owned_by_someone_else_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(kernel_config, "_ARMED", {})
    monkeypatch.setenv(kd.ENV, "/elsewhere/dump.json")
    with pytest.raises(RuntimeError, match="already set to '/elsewhere/dump.json'"):
        kd.arm_kernel_dump()
    # a child process inherits its nbdebug parent's variable: it gets a config of its own instead
    parent = os.environ.get(kd.ENV) or "/tmp/nbdebug-msdump-parent/dump_config.json"
    monkeypatch.setenv(kd.ENV, "/tmp/nbdebug-msdump-parent/dump_config.json")
    root = kd.arm_kernel_dump()
    try:
        assert os.environ[kd.ENV] == os.path.join(root, "dump_config.json") != parent
        assert json.load(open(os.environ[kd.ENV]))["common_dump_settings"]["path"] == os.path.join(root, "dump")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_graph_compiled_before_the_debugger_is_a_clear_error(tmp_path):
    script = tmp_path / "late.py"
    script.write_text(
        "import numpy as np, mindspore as ms, nbdebug\n"
        "from mindspore import nn\n"
        "ms.set_context(mode=ms.GRAPH_MODE)\n"
        "net = nn.Dense(3, 2)\n"
        "net(ms.Tensor(np.ones((1, 3), np.float32)))\n"
        "dbg = nbdebug.Debugger(net)\n"
        "try:\n"
        "    net(ms.Tensor(np.ones((1, 3), np.float32)))\n"
        "except RuntimeError as e:\n"
        "    print('ERROR:', e)\n")
    env = dict(os.environ)
    env.pop(kd.ENV, None)
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(nbdebug.__file__))
    res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env,
                         cwd=tmp_path)
    assert "ERROR: MindSpore wrote no kernel dump" in res.stdout, res.stdout + res.stderr[-2000:]
    assert "before the first GRAPH_MODE call" in res.stdout


def test_dump_scanner_stops_listing_finished_iterations_and_remover_deletes_in_the_background(tmp_path):
    from nbdebug.frameworks.mindspore.dump_files import DumpScanner, FileRemover

    def put(g, it, name):
        d = tmp_path / "Net" / str(g) / str(it)
        d.mkdir(parents=True, exist_ok=True)
        (d / name).write_bytes(b"")
        return str(d / name)

    scanner = DumpScanner(str(tmp_path))
    put(0, 0, "a.npy")
    assert [(it, g, names) for it, g, _p, names in scanner.new_files()] == [(0, 0, ["a.npy"])]
    put(0, 0, "b.npy")  # the newest iteration of a graph stays open: MindSpore may write into it again
    put(0, 1, "c.npy")
    put(1, 0, "d.npy")  # another graph's counter is its own
    assert [(it, g, names) for it, g, _p, names in scanner.new_files()] == \
        [(0, 0, ["b.npy"]), (0, 1, ["d.npy"]), (1, 0, ["c.npy"])]
    put(0, 0, "late.npy")  # graph 0 has moved on to iteration 1: iteration 0 is no longer listed
    put(1, 0, "e.npy")
    assert [(it, g, names) for it, g, _p, names in scanner.new_files()] == [(0, 1, ["e.npy"])]
    assert str(tmp_path / "Net" / "0" / "0") not in scanner._open
    remover = FileRemover()
    paths = [put(0, 1, f"x{i}.npy") for i in range(50)]
    remover.remove(paths)
    remover.flush()
    assert not any(os.path.exists(p) for p in paths)
