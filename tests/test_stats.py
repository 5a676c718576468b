"""Statistics against numpy, on random and adversarial tensors, through both backends."""

import numpy as np
import pytest
import torch

from nbdebug.frameworks.torch import stats as torch_stats
from nbdebug.frameworks.torch.stats import StatsBuffer
from nbdebug.session.session import raw_to_fields
from nbdebug.session.stats import FIELDS, row_to_mapping

inf, nan = float("inf"), float("nan")


def oracle(a: np.ndarray) -> dict:
    a = a.astype(np.float64).ravel()
    n = a.size
    out = {"count": n, "zero_count": int((a == 0).sum()), "nan_count": int(np.isnan(a).sum()),
           "pos_inf_count": int((a == inf).sum()), "neg_inf_count": int((a == -inf).sum())}
    if n:
        with np.errstate(invalid="ignore", over="ignore"):
            out.update(max=a.max(), min=a.min(), mean=a.mean(), abs_mean=np.abs(a).mean(),
                       norm=np.sqrt((a * a).sum()))
    else:
        out.update(max=None, min=None, mean=None, abs_mean=None, norm=0.0)
    return out


def to_numpy(t: torch.Tensor) -> np.ndarray:
    if t.dtype == torch.bfloat16:
        return t.float().numpy()
    return t.numpy()


CASES = {
    "random_f32": lambda: torch.randn(37, 19),
    "random_f64": lambda: torch.randn(1000, dtype=torch.float64),
    "nan_inf_mix": lambda: torch.tensor([1.0, nan, inf, -inf, 0.0, -0.0, 2.5, nan]),
    "only_nan": lambda: torch.full((5,), nan),
    "pos_inf": lambda: torch.tensor([inf, 1.0, 3.0]),
    "neg_inf": lambda: torch.tensor([-inf, -1.0]),
    "all_zero": lambda: torch.zeros(4, 4),
    "empty": lambda: torch.zeros(0, 3),
    "scalar": lambda: torch.tensor(3.5),
    "int32": lambda: torch.randint(-100, 100, (67,), dtype=torch.int32),
    "int64": lambda: torch.tensor([-(2**40), 0, 2**40, 7], dtype=torch.int64),
    "int8": lambda: torch.tensor([-128, 127, 0, 1], dtype=torch.int8),
    "uint8": lambda: torch.tensor([0, 255, 3], dtype=torch.uint8),
    "bool": lambda: torch.tensor([True, False, True, True]),
    "fp16": lambda: torch.tensor([65504.0, -65504.0, 1e-4, 0.0, inf, nan], dtype=torch.float16),
    "fp16_random": lambda: torch.randn(333).half(),
    "bf16": lambda: torch.tensor([3e38, -1.5, 0.0, nan, -inf], dtype=torch.bfloat16),
    "bf16_random": lambda: torch.randn(129).bfloat16(),
    "non_contiguous": lambda: torch.randn(8, 6).t(),
    "strided_view": lambda: torch.arange(40.0).view(5, 8)[:, ::3],
    "offset_view": lambda: torch.randn(10, 10)[3:7, 2:],
    "expanded": lambda: torch.tensor([1.0, -2.0]).expand(3, 2),
}


@pytest.mark.parametrize("fast", [True, False], ids=["native", "torch-ops"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_stats_match_numpy(case, fast, monkeypatch):
    if fast:
        assert torch_stats._fastats is not None, "the native kernel must be built by `make test`"
    t = CASES[case]()
    buf = StatsBuffer()
    buf.fast = fast
    row, dtype, why = buf.add(t)
    assert why is None
    assert dtype == str(t.dtype).replace("torch.", "")
    vals = raw_to_fields(buf.raw(), np.array([t.numel()], dtype=np.float64))[row]
    got = row_to_mapping(dtype, t.shape, vals)
    want = oracle(to_numpy(t))
    assert got["shape"] == tuple(t.shape)
    for k in ("count", "zero_count", "nan_count", "pos_inf_count", "neg_inf_count"):
        assert got[k] == want[k], k
    for k in ("max", "min", "mean", "abs_mean", "norm"):
        if want[k] is None:
            assert got[k] is None, k
        else:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-6, atol=1e-9, equal_nan=True, err_msg=k)


@pytest.mark.parametrize("make", [lambda: torch.randn(3, dtype=torch.complex64),
                                  lambda: torch.randn(4, 4).to_sparse()], ids=["complex", "sparse"])
def test_unsupported_tensors_get_a_clear_statistic(make):
    buf = StatsBuffer()
    row, dtype, why = buf.add(make())
    assert why is not None and why.startswith("unsupported")
    assert buf.raw().shape == (1, 9)


def test_rows_stay_right_when_the_buffer_grows():
    """The native path writes at an address into the row matrix; growing it moves the matrix."""
    buf = StatsBuffer(capacity=1)
    tensors = [torch.randn(5 + i) for i in range(9)] + [torch.zeros(0), torch.randn(3, dtype=torch.complex64),
                                                      torch.randn(4, 3).t()]
    rows = [buf.add(t)[0] for t in tensors]
    assert rows == list(range(len(tensors)))
    raw = buf.raw()
    for t, row in zip(tensors[:9] + tensors[11:], rows[:9] + rows[11:], strict=True):
        np.testing.assert_allclose(raw[row, :2], [t.max().item(), t.min().item()])
        np.testing.assert_allclose(raw[row, 2], float(t.double().sum()), rtol=1e-9)
    assert np.isnan(raw[rows[9], 0]) and raw[rows[9], 2] == 0.0  # the empty tensor


def test_device_path_defers_transfer_until_raw():
    buf = StatsBuffer()
    buf.fast = False
    for i in range(5):
        buf.add(torch.full((10,), float(i)))
    assert len(buf._pending) == 5  # nothing moved to the host yet
    raw = buf.raw()
    assert not buf._pending
    assert raw[:, 0].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_fields_order_is_stable():
    assert FIELDS[:5] == ("max", "min", "mean", "abs_mean", "norm")
