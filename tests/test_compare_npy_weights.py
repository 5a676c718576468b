"""TroubleShooter equivalents: compare_npy_dir (pairing by name, order, shape) and compare_weights
(.pth vs .ckpt with the BatchNorm/Embedding name pairs, parameter counts and a shape table)."""

import numpy as np
import pytest
import torch

import nbdebug
from nbdebug.compare.npy import align_by_shape


def _save(d, name, arr):
    d.mkdir(exist_ok=True)
    np.save(d / name, arr)


def test_pairing_by_name(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    _save(a, "0_conv.npy", np.ones((2, 3)))
    _save(b, "0_conv.npy", np.ones((2, 3)) + 5e-5)
    _save(a, "1_fc.npy", np.arange(4.0))
    _save(b, "1_fc.npy", np.arange(4.0) * 1.1)
    _save(a, "2_only_a.npy", np.zeros(2))
    res = nbdebug.compare_npy_dir(a, b)
    rows = {r.name_a or r.name_b: r for r in res.rows}
    assert rows["0_conv.npy"].allclose and rows["0_conv.npy"].close_pct == 100.0
    fc = rows["1_fc.npy"]
    assert not fc.allclose and fc.close_pct == 25.0  # only 0 == 0
    assert fc.max_abs_diff == pytest.approx(0.3) and fc.mean_abs_diff == pytest.approx(0.15)
    assert fc.cosine == pytest.approx(1.0)
    assert rows["2_only_a.npy"].name_b is None and rows["2_only_a.npy"].status == "unmatched"
    assert res.first_mismatch.name_a == "1_fc.npy" and not res.all_close
    strict = nbdebug.compare_npy_dir(a, b, rtol=0, atol=1e-6)
    assert not strict.rows[0].allclose
    path = res.to_csv(tmp_path / "npy.csv")
    assert open(path).read().count("\n") == len(res.rows) + 1


def test_pairing_by_order_and_by_shape(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for i, shape in enumerate([(2,), (3,), (4,), (5,)]):
        _save(a, f"{i}_a.npy", np.ones(shape))
    for i, shape in enumerate([(2,), (4,), (5,)]):  # b lacks the (3,) output
        _save(b, f"{i}_b.npy", np.ones(shape))
    by_order = nbdebug.compare_npy_dir(a, b, pairing="order")
    assert [(r.name_a, r.name_b) for r in by_order.rows][:2] == [("0_a.npy", "0_b.npy"), ("1_a.npy", "1_b.npy")]
    assert "shapes differ" in by_order.rows[1].message
    by_shape = nbdebug.compare_npy_dir(a, b, pairing="shape")
    assert [(r.name_a, r.name_b) for r in by_shape.rows] == [
        ("0_a.npy", "0_b.npy"), ("1_a.npy", None), ("2_a.npy", "1_b.npy"), ("3_a.npy", "2_b.npy")]
    assert by_shape.first_mismatch is None and len(by_shape.unmatched) == 1
    # an insertion (cost 1 + 1) is preferred to pairing different shapes (cost 5)
    alignment = align_by_shape([(1,), (9,)], [(1,), (8,)])
    assert alignment[0] == (0, 0) and sorted(alignment[1:], key=str) == [(1, None), (None, 1)]
    with pytest.raises(ValueError, match="pairing"):
        nbdebug.compare_npy_dir(a, b, pairing="size")
    with pytest.raises(ValueError, match="rtol"):
        nbdebug.compare_npy_dir(a, b, rtol=-1)


class TorchNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3, 2)
        self.bn = torch.nn.BatchNorm1d(2)
        self.emb = torch.nn.Embedding(5, 3)
        self.frozen = torch.nn.Linear(2, 2)
        self.frozen.requires_grad_(False)


def _ms_port(sd, bias_shift=0.0, drop=()):
    import mindspore as ms
    from mindspore import nn

    class MsNet(nn.Cell):
        def __init__(self):
            super().__init__()
            self.fc = nn.Dense(3, 2)
            self.bn = nn.BatchNorm1d(2)
            self.emb = nn.Embedding(5, 3)
            self.frozen = nn.Dense(2, 2)
            for p in self.frozen.get_parameters():
                p.requires_grad = False

    net = MsNet()
    names = {"fc.weight": "fc.weight", "fc.bias": "fc.bias", "bn.weight": "bn.gamma", "bn.bias": "bn.beta",
             "bn.running_mean": "bn.moving_mean", "bn.running_var": "bn.moving_variance",
             "emb.weight": "emb.embedding_table", "frozen.weight": "frozen.weight", "frozen.bias": "frozen.bias"}
    params = dict(net.parameters_and_names())
    for pt, msn in names.items():
        value = sd[pt].numpy() + (bias_shift if pt == "fc.bias" else 0.0)
        params[msn].set_data(ms.Tensor(value.astype(np.float32)))
    return net


def test_compare_weights_pth_vs_ckpt(tmp_path):
    import mindspore as ms

    torch.manual_seed(0)
    model = TorchNet()
    sd = model.state_dict()
    torch.save(sd, tmp_path / "model.pth")
    ms.save_checkpoint(_ms_port(sd), str(tmp_path / "same.ckpt"))
    ms.save_checkpoint(_ms_port(sd, bias_shift=0.5), str(tmp_path / "shifted.ckpt"))

    same = nbdebug.compare_weights(tmp_path / "model.pth", tmp_path / "same.ckpt")
    pairs = {r.pth: r.ckpt for r in same.rows}
    assert pairs["bn.weight"] == "bn.gamma" and pairs["bn.bias"] == "bn.beta"
    assert pairs["bn.running_mean"] == "bn.moving_mean" and pairs["bn.running_var"] == "bn.moving_variance"
    assert pairs["emb.weight"] == "emb.embedding_table"
    assert same.unmatched_pth == ["bn.num_batches_tracked"] and same.unmatched_ckpt == []
    assert same.all_close and same.mismatches == []
    # counts: a state dict has 10 entries (9 parameters/buffers + num_batches_tracked); buffers and the
    # frozen layer are not trainable — a file cannot tell frozen from trainable, the module can
    assert same.pth_counts.tensors == 10 and same.pth_counts.trainable_tensors == 7
    assert same.ckpt_counts.tensors == 9 and same.ckpt_counts.trainable_tensors == 7
    assert same.pth_counts.elements == sum(v.numel() for v in sd.values())
    exact = nbdebug.compare_weights(model, _ms_port(sd))
    assert exact.pth_counts.trainable_tensors == 5 and exact.ckpt_counts.trainable_tensors == 5
    table = same.shape_table()
    assert ("fc.weight", (2, 3), "fc.weight", (2, 3)) in table
    assert ("bn.num_batches_tracked", (), None, None) in table

    shifted = nbdebug.compare_weights(tmp_path / "model.pth", tmp_path / "shifted.ckpt")
    (bad,) = shifted.mismatches
    assert bad.pth == "fc.bias" and bad.max_abs_diff == pytest.approx(0.5, rel=1e-5)
    assert "1 differ" in shifted.summary()
    mapped = nbdebug.compare_weights(tmp_path / "model.pth", tmp_path / "same.ckpt",
                                     name_map={"fc.weight": "frozen.weight"})
    row = next(r for r in mapped.rows if r.pth == "fc.weight")
    assert row.ckpt == "frozen.weight" and "shapes differ" in row.message
    with pytest.raises(ValueError, match="cannot be read"):
        nbdebug.compare_weights(tmp_path / "model.pth", tmp_path / "model.pth")


def test_order_pairing_reads_the_number_at_the_end_of_mindspore_ts_save_files(tmp_path):
    """MindSpore's TroubleShooter ``ts.save`` numbers files at the end (``conv_float32_0.npy``); PyTorch's side
    here at the start (``0_conv.npy``): the k-th saved tensor pairs with the k-th, 10 after 9."""
    a, b = tmp_path / "ms", tmp_path / "pt"
    names = ["conv", "relu", "pool", "fc", "add", "mul", "sub", "exp", "log", "tanh", "softmax", "loss"]
    rng = np.random.default_rng(3)
    for i, name in enumerate(names):
        v = rng.standard_normal(i + 1)
        _save(a, f"{name}_float32_{i}.npy", v)
        _save(b, f"{i}_{name}.npy", v)
    res = nbdebug.compare_npy_dir(a, b, pairing="order")
    assert [(r.name_a, r.name_b) for r in res.rows] == [
        (f"{n}_float32_{i}.npy", f"{i}_{n}.npy") for i, n in enumerate(names)]
    assert res.all_close and res.first_mismatch is None


def test_compare_weights_refuses_fifo_and_directory(tmp_path):
    """A FIFO given as the .pth (or .ckpt) used to hang inside torch.load; now it is refused at once, named."""
    import os
    import threading

    import mindspore as ms

    torch.manual_seed(0)
    sd = TorchNet().state_dict()
    ms.save_checkpoint(_ms_port(sd), str(tmp_path / "same.ckpt"))
    torch.save(sd, tmp_path / "model.pth")
    fifo = tmp_path / "model_fifo.pth"
    os.mkfifo(fifo)
    outcome = {}

    def call():
        try:
            nbdebug.compare_weights(fifo, tmp_path / "same.ckpt")
        except ValueError as e:
            outcome["error"] = str(e)

    worker = threading.Thread(target=call, daemon=True)
    worker.start()
    worker.join(10)
    assert not worker.is_alive(), "compare_weights blocked on a FIFO"
    assert str(fifo) in outcome["error"] and "FIFO" in outcome["error"]
    with pytest.raises(ValueError, match="directory"):
        nbdebug.compare_weights(tmp_path / "model.pth", tmp_path)
