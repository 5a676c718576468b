"""The kernel dump's files read in bulk (nbdebug.frameworks.mindspore.kernel_files.files_stats): the native batch
reader (_fastats.read_npy_stats) gives what numpy's reading gives, bit for bit, and leaves to numpy what it does
not read; dump file names parsed once into graph runs. Needs numpy only."""

import os

import numpy as np
import pytest

from nbdebug.frameworks.core.native import fastats
from nbdebug.frameworks.mindspore import kernel_files
from nbdebug.frameworks.mindspore.kernel_files import file_stats, files_stats, parse_dump_name, split_names

ARRAYS = {
    "float32 with nan and inf": np.array([1.5, np.nan, np.inf, -np.inf, 0.0, -0.0, -3.25], np.float32),
    "float32 finite 3-d": np.random.default_rng(0).standard_normal((4, 5, 6)).astype(np.float32),
    "float64 long": np.random.default_rng(1).standard_normal(20_000),
    # larger than the native reader's buffer: read in pieces, each reduced where the whole-array pass would be
    "float32 1.2 MB, nan and inf in later pieces": np.where(
        np.arange(300_001) % 99_991 == 77, np.float32(np.nan), np.where(
            np.arange(300_001) == 250_000, np.float32(np.inf),
            np.random.default_rng(2).standard_normal(300_001).astype(np.float32))),
    "float64 0.8 MB": np.random.default_rng(3).standard_normal(100_003) * 1e3,
    "int8 0.3 MB": np.random.default_rng(4).integers(-128, 127, 300_000, dtype=np.int8),
    "float16": np.arange(-6, 6, dtype=np.float16).reshape(3, 4),
    "bfloat16 as raw 16-bit words": np.array([0x3F80, 0xC000, 0x7FC0, 0x7F80, 0], np.uint16).view("V2"),
    "int8": np.arange(-5, 5, dtype=np.int8),
    "uint8": np.arange(9, dtype=np.uint8),
    "int16": np.arange(-7, 7, dtype=np.int16),
    "int32 scalar": np.array(-42, np.int32),
    "int64": np.arange(-3, 30, dtype=np.int64),
    "bool": np.array([True, False, True, True]),
    "empty": np.zeros((0, 4), np.float32),
    # left to numpy by the native reader
    "fortran order": np.asfortranarray(np.arange(6, dtype=np.float32).reshape(2, 3)),
    "big-endian": np.arange(4, dtype=">f8"),
    "uint16": np.arange(4, dtype=np.uint16),
    "complex": np.ones(3, np.complex64),
    "structured": np.zeros(3, dtype=[("a", "<f4"), ("b", "<i2")]),
}
NATIVE = [k for k in ARRAYS if k not in ("fortran order", "big-endian", "uint16", "complex", "structured")]


def _same(a, b):
    ra, *rest_a = a
    rb, *rest_b = b
    return ra.tobytes() == rb.tobytes() and rest_a == rest_b


@pytest.fixture
def files(tmp_path):
    paths = {}
    for name, arr in ARRAYS.items():
        paths[name] = str(tmp_path / f"{len(paths)}.npy")
        np.save(paths[name], arr)
    return paths


def test_bulk_stats_equal_numpy_reading_bit_for_bit(files):
    got = files_stats(list(files.values()))
    for (name, path), stats in zip(files.items(), got, strict=True):
        ref = file_stats(path)
        assert _same(stats, ref), name
        arr = np.load(path)
        assert stats[2] == arr.shape and stats[3] == arr.size and stats[4] == arr.nbytes, name
    assert got[list(files).index("complex")][5].startswith("unsupported: complex")
    assert got[list(files).index("bfloat16 as raw 16-bit words")][1] == "bfloat16"


@pytest.mark.skipif(fastats is None, reason="the native kernel is not built here: nothing native to check")
def test_native_reader_reads_what_it_can_and_leaves_the_rest_to_numpy(files):
    rows = np.full((len(files), 9), -1.0)
    got = fastats.read_npy_stats(list(files.values()), rows)
    for (name, path), item, row in zip(files.items(), got, rows, strict=True):
        if name not in NATIVE:
            assert item is None, name
            continue
        ref = file_stats(path)
        assert item == (ref[1], ref[2], ref[3], ref[4]), name
        assert row.tobytes() == ref[0].tobytes(), name


def test_without_the_native_reader_every_file_is_read_with_numpy(files, monkeypatch):
    native = files_stats(list(files.values()))
    monkeypatch.setattr(kernel_files, "_read_batch", None)
    plain = files_stats(list(files.values()))
    assert all(_same(a, b) for a, b in zip(native, plain, strict=True))


@pytest.mark.parametrize("native", [True, False])
def test_unreadable_files_are_named_and_the_others_still_read(tmp_path, files, monkeypatch, native):
    if not native:
        monkeypatch.setattr(kernel_files, "_read_batch", None)
    truncated = str(tmp_path / "truncated.npy")
    np.save(truncated, np.arange(100, dtype=np.float32))
    with open(truncated, "r+b") as f:
        f.truncate(200)
    truncated_large = str(tmp_path / "truncated_large.npy")  # cut after the first piece the native reader reads
    np.save(truncated_large, np.arange(200_000, dtype=np.float32))
    with open(truncated_large, "r+b") as f:
        f.truncate(500_000)
    missing = str(tmp_path / "missing.npy")
    junk = str(tmp_path / "junk.npy")
    with open(junk, "wb") as f:
        f.write(b"PK\x03\x04 not numpy")
    ok = files["float32 with nan and inf"]
    got = files_stats([truncated, ok, missing, junk, truncated_large])
    assert isinstance(got[0], ValueError) and f"cannot read dump file {truncated}: truncated" in str(got[0])
    assert _same(got[1], file_stats(ok))
    assert isinstance(got[2], ValueError) and missing in str(got[2])
    assert isinstance(got[3], ValueError) and "not a .npy file" in str(got[3])
    assert isinstance(got[4], ValueError) and f"{truncated_large}: truncated: 124968 of 200000" in str(got[4])


@pytest.mark.skipif(fastats is None, reason="the native kernel is not built here: nothing native to check")
def test_native_reader_checks_its_output_buffer(files):
    with pytest.raises(ValueError, match="out holds"):
        fastats.read_npy_stats(list(files.values()), np.empty((1, 9)))
    with pytest.raises(TypeError):
        fastats.read_npy_stats(tuple(files.values()), np.empty((len(files), 9)))


def _name(op, n, ts, io, i, dtype="Float32"):
    return f"{op}.Default_net_{op}-op{n}.0.0.{ts}.{io}.{i}.DefaultFormat.{dtype}.npy"


def test_names_parsed_once_into_runs_as_before(tmp_path):
    """One run per directory; a loop body's repetitions (a kernel's slot dumped twice) in time order."""
    one = [_name("MatMul", 0, 100, "input", 0), _name("MatMul", 0, 100, "output", 0),
           _name("Add", 1, 105, "output", 0, "Float16"), "mapping.csv",
           "Parameter.w.0.0.90.output.0.Default.Float32.npy"]
    runs = split_names(str(tmp_path), one)
    assert len(runs) == 1 and runs[0][0] == 90
    index = runs[0][1]
    prefix = os.path.join(str(tmp_path), "")
    assert index["MatMul.Default_net_MatMul-op0"] == {
        "input.0": prefix + one[0], "__dtype__.input.0": "float32", "__ts__": "100",
        "output.0": prefix + one[1], "__dtype__.output.0": "float32"}
    assert index["Add.Default_net_Add-op1"]["__dtype__.output.0"] == "float16"
    for name in one:
        parsed = parse_dump_name(name)
        if parsed is not None:
            key, slot, ts, dtype = parsed
            assert index[key][slot] == prefix + name and index[key][f"__dtype__.{slot}"] == dtype
    loop = [_name("Mul", 0, 300, "output", 0), _name("Mul", 0, 200, "output", 0), _name("Mul", 0, 200, "input", 0),
            _name("Mul", 0, 310, "input", 0), _name("Sub", 1, 205, "output", 0)]
    runs = split_names(str(tmp_path), loop)
    assert [ts for ts, _ in runs] == [200, 300]
    assert runs[0][1]["Mul.Default_net_Mul-op0"]["output.0"] == prefix + loop[1]
    assert runs[1][1]["Mul.Default_net_Mul-op0"]["input.0"] == prefix + loop[3]
    assert "Sub.Default_net_Sub-op1" in runs[0][1] and "Sub.Default_net_Sub-op1" not in runs[1][1]
