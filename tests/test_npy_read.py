"""nbdebug.frameworks.npy_read: the .npy reader the GRAPH-mode dump uses (numpy only) against numpy.load."""

import numpy as np
import pytest

from nbdebug.frameworks.npy_read import read_npy, read_npy_shape

ARRAYS = {
    "float16 2-d": np.arange(6, dtype=np.float16).reshape(2, 3),
    "float32 scalar": np.array(3.5, dtype=np.float32),
    "empty": np.zeros((0, 4), dtype=np.float32),
    "fortran order": np.asfortranarray(np.arange(6, dtype=np.int64).reshape(2, 3)),
    "bool": np.array([True, False, True]),
    "int32 3-d": np.arange(24, dtype=np.int32).reshape(2, 3, 4),
    "bfloat16 as raw 16-bit words": np.arange(5, dtype=np.uint16).view("V2"),
    "structured (left to numpy.load)": np.zeros(3, dtype=[("a", "<f4"), ("b", "<i2")]),
    "big-endian": np.arange(4, dtype=">f8"),
}


@pytest.mark.parametrize("name", list(ARRAYS))
def test_read_npy_matches_numpy_load(tmp_path, name):
    path = tmp_path / "x.npy"
    np.save(path, ARRAYS[name])
    ref = np.load(path)
    got = read_npy(str(path))
    assert got.dtype == ref.dtype and got.shape == ref.shape
    assert got.tobytes(order="A") == ref.tobytes(order="A")
    assert got.flags.f_contiguous == ref.flags.f_contiguous
    assert got.flags.writeable  # the caller may modify the value it gets
    assert read_npy_shape(str(path)) == ref.shape


def test_format_version_2_header(tmp_path):
    path = tmp_path / "v2.npy"
    arr = np.arange(10, dtype=np.float32)
    with open(path, "wb") as f:
        np.lib.format.write_array(f, arr, version=(2, 0))
    np.testing.assert_array_equal(read_npy(str(path)), arr)


@pytest.mark.parametrize("content, message", [
    (b"", "not a .npy file"),
    (b"PK\x03\x04 not numpy at all", "not a .npy file"),
    (None, "truncated: 18 of 100 values"),
    ("object", "object arrays are not read"),
])
def test_unreadable_files_name_the_file_and_unpickle_nothing(tmp_path, content, message):
    path = tmp_path / "bad.npy"
    if content is None:
        np.save(path, np.arange(100, dtype=np.float32))
        with open(path, "r+b") as f:
            f.truncate(200)
    elif content == "object":
        np.save(path, np.array([1, "a"], dtype=object), allow_pickle=True)
    else:
        path.write_bytes(content)
    with pytest.raises(ValueError, match=f"cannot read dump file {path}: {message}"):
        read_npy(str(path))
