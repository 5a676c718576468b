"""Tests for the native single-pass statistics kernel ``nbdebug.frameworks._fastats``.

Every case is checked against numpy on the same data converted to float64, for each SIMD code path
the CPU supports (generic C, AVX2, AVX-512).
"""

import threading

import numpy as np
import pytest
import torch

from nbdebug.frameworks import _fastats  # `make test` builds it; its absence is a failure here

CODES = {
    torch.float32: _fastats.FLOAT32,
    torch.float64: _fastats.FLOAT64,
    torch.float16: _fastats.FLOAT16,
    torch.bfloat16: _fastats.BFLOAT16,
    torch.int8: _fastats.INT8,
    torch.uint8: _fastats.UINT8,
    torch.int16: _fastats.INT16,
    torch.int32: _fastats.INT32,
    torch.int64: _fastats.INT64,
    torch.bool: _fastats.BOOL,
}
FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64]
ALL_ISAS = ["generic", "avx2", "avx512"]
ISAS = ALL_ISAS[: ALL_ISAS.index(_fastats.BEST_ISA) + 1]


@pytest.fixture(params=ISAS)
def isa(request):
    assert _fastats._set_isa(request.param) == request.param
    yield request.param
    _fastats._set_isa(None)


def run(t: torch.Tensor) -> np.ndarray:
    assert t.is_contiguous()
    out = torch.full((9,), -12345.0, dtype=torch.float64)
    assert _fastats.reduce(t.data_ptr(), t.numel(), CODES[t.dtype], out.data_ptr()) is None
    return out.numpy().copy()


def reference(t: torch.Tensor) -> np.ndarray:
    x = t.to(torch.float64).numpy().ravel()
    if x.size == 0:
        mx = mn = np.nan
    else:
        mx, mn = np.max(x), np.min(x)
    with np.errstate(over="ignore", invalid="ignore"):
        return np.array(
            [
                mx,
                mn,
                x.sum(),
                np.abs(x).sum(),
                (x * x).sum(),
                np.count_nonzero(x == 0),
                np.count_nonzero(np.isnan(x)),
                np.count_nonzero(x == np.inf),
                np.count_nonzero(x == -np.inf),
            ]
        )


def check(t: torch.Tensor, rtol: float = 1e-12) -> np.ndarray:
    got, ref = run(t), reference(t)
    names = ["max", "min", "sum", "abs_sum", "sq_sum", "zeros", "nans", "pinf", "ninf"]
    # max/min and the counts are exact.
    for k in (0, 1, 5, 6, 7, 8):
        assert got[k] == ref[k] or (np.isnan(got[k]) and np.isnan(ref[k])), (names[k], got, ref)
    # Sums: non-finite results must match exactly (NaN vs +-Inf); finite ones up to rounding,
    # bounded relative to the magnitude that was summed (summation order differs from numpy's).
    with np.errstate(over="ignore"):
        scale = [ref[3], ref[3], ref[4]]
    for k, sc in zip((2, 3, 4), scale, strict=True):
        if not np.isfinite(ref[k]):
            assert (np.isnan(got[k]) and np.isnan(ref[k])) or got[k] == ref[k], (names[k], got, ref)
        else:
            tol = rtol * sc if np.isfinite(sc) else rtol * abs(ref[k])
            assert abs(got[k] - ref[k]) <= tol + 1e-300, (names[k], got, ref)
    return got


def rand_tensor(dtype: torch.dtype, n: int, gen: torch.Generator) -> torch.Tensor:
    if dtype.is_floating_point:
        return (torch.randn(n, generator=gen, dtype=torch.float64) * 3).to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=gen).bool()
    info = torch.iinfo(dtype)
    lo, hi = max(info.min, -(2**40)), min(info.max, 2**40)
    return torch.randint(lo, hi + 1, (n,), generator=gen, dtype=torch.int64).to(dtype)


# --------------------------------------------------------------------------------------------
# API


def test_constants():
    assert [
        _fastats.FLOAT32,
        _fastats.FLOAT64,
        _fastats.FLOAT16,
        _fastats.BFLOAT16,
        _fastats.INT8,
        _fastats.UINT8,
        _fastats.INT16,
        _fastats.INT32,
        _fastats.INT64,
        _fastats.BOOL,
    ] == list(range(10))
    assert _fastats.BEST_ISA in ALL_ISAS


def test_argument_validation():
    t = torch.ones(4)
    out = torch.empty(9, dtype=torch.float64)
    with pytest.raises(ValueError, match="numel"):
        _fastats.reduce(t.data_ptr(), -1, _fastats.FLOAT32, out.data_ptr())
    for bad in (-1, 10, 99):
        with pytest.raises(ValueError, match="dtype"):
            _fastats.reduce(t.data_ptr(), 4, bad, out.data_ptr())
    with pytest.raises(ValueError, match="out_ptr"):
        _fastats.reduce(t.data_ptr(), 4, _fastats.FLOAT32, 0)
    with pytest.raises(ValueError, match="ptr"):
        _fastats.reduce(0, 4, _fastats.FLOAT32, out.data_ptr())
    with pytest.raises(TypeError):
        _fastats.reduce(t.data_ptr(), 4.0, _fastats.FLOAT32, out.data_ptr())
    with pytest.raises(TypeError):
        _fastats.reduce(t.data_ptr(), 4, _fastats.FLOAT32)
    with pytest.raises(TypeError):
        _fastats.reduce("x", 4, _fastats.FLOAT32, out.data_ptr())
    with pytest.raises(ValueError, match="ptr"):
        _fastats.reduce(-8, 4, _fastats.FLOAT32, out.data_ptr())
    with pytest.raises(ValueError, match="out_ptr"):
        _fastats.reduce(t.data_ptr(), 4, _fastats.FLOAT32, 2**70)
    # numel == 0 with a null data pointer is fine
    _fastats.reduce(0, 0, _fastats.FLOAT32, out.data_ptr())
    assert np.isnan(out[0]) and np.isnan(out[1]) and out[2:].tolist() == [0.0] * 7


def test_set_isa():
    try:
        for name in ISAS:
            assert _fastats._set_isa(name) == name
        with pytest.raises(ValueError):
            _fastats._set_isa("sse9")
    finally:
        assert _fastats._set_isa(None) == _fastats.BEST_ISA


# --------------------------------------------------------------------------------------------
# random data, all dtypes, sizes straddling vector widths and block boundaries


@pytest.mark.parametrize("dtype", list(CODES))
@pytest.mark.parametrize("n", [1, 7, 31, 33, 100, 4095, 4096, 4097, 12345, 70000])
def test_random_matches_numpy(isa, dtype, n):
    gen = torch.Generator().manual_seed(n)
    check(rand_tensor(dtype, n, gen))


@pytest.mark.parametrize("dtype", list(CODES))
def test_every_size_1_to_67(isa, dtype):
    gen = torch.Generator().manual_seed(1)
    for n in range(1, 68):
        t = rand_tensor(dtype, n, gen)
        check(t)
        if dtype.is_floating_point:
            # a special value in the last (tail) element and in the first (vector) element
            for pos in (0, n - 1):
                for v in (float("nan"), float("inf"), float("-inf"), 0.0, -0.0):
                    u = t.clone()
                    u[pos] = v
                    check(u)


def test_empty(isa):
    for dtype in CODES:
        got = run(torch.empty(0, dtype=dtype))
        assert np.isnan(got[0]) and np.isnan(got[1])
        assert got[2:].tolist() == [0.0] * 7


@pytest.mark.parametrize("dtype", list(CODES))
def test_single_element(isa, dtype):
    for v in (0, 1, 5, -3, 100):
        t = torch.tensor([v]).to(dtype)
        got = check(t)
        assert got[0] == got[1] == t.double().item()


# --------------------------------------------------------------------------------------------
# non-finite values


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("n", [5, 64, 5000, 40000])
def test_nan_inf_mixed(isa, dtype, n):
    gen = torch.Generator().manual_seed(7)
    t = rand_tensor(dtype, n, gen)
    idx = torch.randperm(n, generator=gen)
    a, b, c = max(1, n // 50), max(1, n // 40), max(1, n // 30)
    t[idx[:a]] = float("nan")
    t[idx[a : a + b]] = float("inf")
    t[idx[a + b : a + b + c]] = float("-inf")
    got = check(t)
    assert np.isnan(got[0]) and np.isnan(got[1]) and np.isnan(got[2])
    assert got[6] > 0 and got[7] > 0 and got[8] > 0


@pytest.mark.parametrize("dtype", FLOATS)
def test_inf_without_nan(isa, dtype):
    for n in (3, 40, 9000):
        t = rand_tensor(dtype, n, torch.Generator().manual_seed(n))
        t[n // 2] = float("inf")
        got = check(t)
        assert got[0] == np.inf and np.isfinite(got[1]) and got[2] == np.inf and got[7] == 1
        t[n - 1] = float("-inf")
        got = check(t)
        assert got[0] == np.inf and got[1] == -np.inf and np.isnan(got[2]) and got[3] == np.inf
        assert (got[7], got[8], got[6]) == (1, 1, 0)


@pytest.mark.parametrize("dtype", FLOATS)
def test_all_nan_and_all_inf(isa, dtype):
    for n in (1, 17, 10000):
        got = check(torch.full((n,), float("nan"), dtype=dtype))
        assert got[6] == n
        got = check(torch.full((n,), float("-inf"), dtype=dtype))
        assert got[0] == got[1] == -np.inf and got[8] == n
        got = check(torch.full((n,), float("inf"), dtype=dtype))
        assert got[0] == got[1] == np.inf and got[7] == n and got[4] == np.inf


def test_nan_in_one_block_only(isa):
    # NaN/Inf handling is decided per 4096-element block: put them in the middle block only.
    t = torch.randn(3 * 4096 + 11)
    t[5000] = float("nan")
    t[6000] = float("inf")
    got = check(t)
    assert (got[6], got[7], got[8]) == (1, 1, 0)
    t[5000] = 1.0
    got = check(t)
    assert got[0] == np.inf and got[6] == 0


# --------------------------------------------------------------------------------------------
# zeros, signed zeros, large values


@pytest.mark.parametrize("dtype", list(CODES))
def test_all_zero(isa, dtype):
    for n in (1, 9, 4096, 5000):
        got = check(torch.zeros(n, dtype=dtype))
        assert got[5] == n and got[0] == got[1] == 0 and got[2:5].tolist() == [0, 0, 0]


@pytest.mark.parametrize("dtype", FLOATS)
def test_negative_zero(isa, dtype):
    for n in (1, 9, 100):
        t = torch.full((n,), -0.0, dtype=dtype)
        got = check(t)
        assert got[5] == n and got[0] == 0 and got[1] == 0
        t[::2] = 0.0
        assert check(t)[5] == n


def test_large_float_values(isa):
    fp16_max = torch.finfo(torch.float16).max
    check(torch.tensor([fp16_max, -fp16_max, fp16_max] * 11, dtype=torch.float16))
    bf_max = torch.finfo(torch.bfloat16).max
    check(torch.tensor([bf_max, -bf_max, 1.0] * 11, dtype=torch.bfloat16))
    # float32 extremes: squares are ~1e77 in float64 (finite), sums cancel
    f32_max = torch.finfo(torch.float32).max
    check(torch.tensor([f32_max, -f32_max, f32_max, 1.0] * 9, dtype=torch.float32))
    # float64: finite values whose abs/sq sums overflow (exercises the "non-finite block, but no
    # NaN/Inf" path)
    got = check(torch.tensor([1e308, 1e308, -1e308, 3.0] * 9, dtype=torch.float64))
    assert got[3] == np.inf and got[4] == np.inf and (got[6], got[7], got[8]) == (0, 0, 0)
    # subnormals
    tiny = torch.finfo(torch.float32).tiny
    check(torch.tensor([tiny / 8, -tiny / 1024, 0.0, tiny] * 10, dtype=torch.float32))
    check(torch.tensor([5e-324, -5e-324, 0.0] * 10, dtype=torch.float64))


def test_integer_extremes(isa):
    for dtype in INTS:
        info = torch.iinfo(dtype)
        for n in (3, 50, 5000):
            vals = [info.max, info.min, 0, 1, -1 if info.min < 0 else 2]
            t = torch.tensor(vals * n, dtype=torch.int64).to(dtype)
            got = check(t)
            assert got[0] == float(info.max) and got[1] == float(info.min)
    big = torch.tensor([2**62, -(2**62), 2**63 - 1, -(2**63), 2**53 + 1] * 7, dtype=torch.int64)
    check(big)


def test_bool(isa):
    gen = torch.Generator().manual_seed(3)
    for n in (1, 15, 33, 4097, 20000):
        t = torch.rand(n, generator=gen) > 0.3
        got = check(t)
        assert got[2] == t.sum().item() == got[3] == got[4]
    # non-canonical bool bytes (any nonzero byte is True)
    raw = torch.tensor([0, 1, 2, 255, 0, 128, 7] * 5, dtype=torch.uint8)
    out = torch.empty(9, dtype=torch.float64)
    _fastats.reduce(raw.data_ptr(), raw.numel(), _fastats.BOOL, out.data_ptr())
    nz = int((raw != 0).sum())
    assert out.tolist() == [1.0, 0.0, nz, nz, nz, raw.numel() - nz, 0, 0, 0]


# --------------------------------------------------------------------------------------------
# exhaustive half-precision decoding


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_all_16bit_patterns(isa, dtype):
    bits = torch.arange(65536, dtype=torch.int32).to(torch.int16)
    t = bits.view(dtype)
    ref = t.double().numpy()
    check(t)
    # every pattern on its own: exact decode (subnormals, inf, nan)
    out = torch.empty(9, dtype=torch.float64)
    o = out.numpy()
    base, code = t.data_ptr(), CODES[dtype]
    bad = []
    for i in range(65536):
        _fastats.reduce(base + 2 * i, 1, code, out.data_ptr())
        v = ref[i]
        if np.isnan(v):
            ok = np.isnan(o[0]) and o[6] == 1
        else:
            ok = o[0] == v and o[1] == v and o[2] == v and o[7] == (v == np.inf) and o[8] == (v == -np.inf)
        if not ok:
            bad.append(i)
    assert not bad, [hex(b) for b in bad[:10]]
    # finite patterns as one tensor (goes through the vector kernels, not just the tails)
    check(t[torch.from_numpy(np.isfinite(ref))].contiguous())


def test_flush_denormal_mode_does_not_change_results(isa):
    t16 = torch.tensor([2**-24, 2**-20, -(2**-15), 1.0] * 8, dtype=torch.float16)
    expected = run(t16)
    assert torch.set_flush_denormal(True), "x86-64 CPUs support flush-denormal mode"
    try:
        got = run(t16)
    finally:
        torch.set_flush_denormal(False)
    assert got.tolist() == expected.tolist()
    assert got[1] == -(2**-15)


# --------------------------------------------------------------------------------------------
# memory layout and threading


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.int32, torch.int64])
def test_unaligned_pointer(isa, dtype):
    # data starting at an odd byte address (the kernel must not assume alignment)
    n = 1000
    src = rand_tensor(dtype, n, torch.Generator().manual_seed(5))
    nbytes = n * src.element_size()
    buf = torch.zeros(nbytes + 1, dtype=torch.uint8)
    buf[1:] = src.view(torch.uint8)
    out = torch.empty(9, dtype=torch.float64)
    _fastats.reduce(buf.data_ptr() + 1, n, CODES[dtype], out.data_ptr())
    assert out.tolist() == run(src).tolist()


def test_out_buffer_inside_larger_array(isa):
    t = torch.randn(100)
    host = np.full((3, 9), 7.0)
    _fastats.reduce(t.data_ptr(), t.numel(), _fastats.FLOAT32, host.ctypes.data + 9 * 8)
    assert (host[0] == 7).all() and (host[2] == 7).all()
    assert host[1].tolist() == run(t).tolist()


def test_views_and_slices(isa):
    base = torch.randn(64, 65)
    check(base[3:9].contiguous())
    check(base[5])  # contiguous row at a storage offset
    check(base.view(-1)[1:4161])


def test_concurrent_threads_release_gil():
    tensors = [torch.randn(200_000 + i) for i in range(4)]
    expected = [run(t) for t in tensors]
    results = [None] * 4

    def work(i):
        for _ in range(5):
            results[i] = run(tensors[i])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for got, exp in zip(results, expected, strict=True):
        assert got.tolist() == exp.tolist()


def test_deterministic(isa):
    t = torch.randn(100_003)
    assert run(t).tolist() == run(t).tolist()
