"""The memory-mapped split index: records, key lookup, collisions, bad files."""

from __future__ import annotations

import io
import mmap
from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from shardex.errors import FormatError, ShardexError
from shardex.format.index import (
    SAMPLE_DTYPE,
    MemberIndex,
    SplitIndex,
    build_keys,
    build_keys_from_hashes,
    build_samples,
    key_hash,
    members_dtype,
    to_npy_bytes,
)


def _write(tmp: Path, samples: np.ndarray, keys: np.ndarray) -> tuple[Path, Path]:
    s, k = tmp / "s.npy", tmp / "k.npy"
    s.write_bytes(to_npy_bytes(samples))
    k.write_bytes(to_npy_bytes(keys))
    return s, k


def test_record_is_24_bytes_and_round_trips(tmp_path: Path) -> None:
    assert SAMPLE_DTYPE.itemsize == 24
    n = 1000
    rng = np.random.default_rng(0)
    cols = (
        rng.integers(0, 9, n),
        rng.integers(0, 2**40, n),
        rng.integers(0, 2**31, n),
        rng.integers(0, 2**63, n, dtype=np.uint64),
    )
    samples = build_samples(*cols)
    keys = [f"k/{i}" for i in range(n)]
    idx = SplitIndex(*_write(tmp_path, samples, build_keys(keys)), num_samples=n)
    for i in (0, 1, 517, n - 1):
        assert idx.record(i) == (cols[1][i], cols[3][i], cols[0][i], cols[2][i])
    for i in (0, 99, n - 1):
        assert list(idx.candidates(keys[i])) == [i]
    assert list(idx.candidates("absent")) == []


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(min_size=1, max_size=20), min_size=1, max_size=200, unique=True))
def test_every_key_is_found(tmp_path_factory: pytest.TempPathFactory, keys: list[str]) -> None:
    tmp = tmp_path_factory.mktemp("idx")
    samples = build_samples(*(np.zeros(len(keys), np.uint64) for _ in range(4)))
    idx = SplitIndex(*_write(tmp, samples, build_keys(keys)), num_samples=len(keys))
    for i, key in enumerate(keys):
        assert i in list(idx.candidates(key))


def test_hash_collisions_yield_every_candidate(tmp_path: Path) -> None:
    hashes = np.array([5, key_hash("x"), 5, 9, 5], dtype=np.uint64)
    samples = build_samples(*(np.zeros(5, np.uint64) for _ in range(4)))
    idx = SplitIndex(*_write(tmp_path, samples, build_keys_from_hashes(hashes)), num_samples=5)
    assert list(idx.candidates("x")) == [1]
    table = np.load(tmp_path / "k.npy")
    assert list(table[1][table[0] == 5]) == [0, 2, 4]


def test_opening_is_lazy_and_checks_shape(tmp_path: Path) -> None:
    samples = build_samples(*(np.zeros(3, np.uint64) for _ in range(4)))
    s, k = _write(tmp_path, samples, build_keys(["a", "b", "c"]))
    idx = SplitIndex(s, k, num_samples=3)
    assert isinstance(idx.raw.obj, mmap.mmap)  # mapped, not read
    assert idx.samples.tolist() == samples.tolist()
    assert not idx.samples.flags.writeable
    with pytest.raises(FormatError, match=r"config\.yaml says 4"):
        SplitIndex(s, k, num_samples=4)
    (tmp_path / "bad.npy").write_bytes(b"not numpy at all")
    with pytest.raises(FormatError, match="not a valid"):
        SplitIndex(tmp_path / "bad.npy", k, num_samples=3)
    wrong = SplitIndex(s, s, num_samples=3)  # keys file of the wrong kind
    with pytest.raises(FormatError, match="expected uint64"):
        list(wrong.candidates("a"))


def _npy_with_header(path: Path, header: str, data: bytes) -> Path:
    """A .npy file of version 1.0 with this header text (padded as numpy pads it)."""
    text = header + " " * (-(len(header) + 11) % 64) + "\n"
    path.write_bytes(b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text.encode() + data)
    return path


def test_index_files_numpy_writes_otherwise_read_the_same(tmp_path: Path) -> None:
    # The short way maps only headers of the form shardex writes; a version 2.0 header
    # and a Fortran-ordered key table go through numpy.load and read the same.
    n = 5
    samples = build_samples(np.arange(n), np.arange(n) * 7, np.arange(n) + 1, np.arange(n) + 9)
    keys = build_keys([f"k{i}" for i in range(n)])
    ours = SplitIndex(*_write(tmp_path, samples, keys), num_samples=n)
    v2, fortran = tmp_path / "v2.npy", tmp_path / "f.npy"
    with open(v2, "wb") as f:
        np.lib.format.write_array(f, samples, version=(2, 0))
    np.save(fortran, np.asfortranarray(keys))
    other = SplitIndex(v2, fortran, num_samples=n)
    assert isinstance(ours.raw.obj, mmap.mmap)
    assert not isinstance(other.raw.obj, mmap.mmap)  # numpy's way
    assert [other.record(i) for i in range(n)] == [ours.record(i) for i in range(n)]
    for i in range(n):
        assert list(other.candidates(f"k{i}")) == list(ours.candidates(f"k{i}")) == [i]


def test_member_index_headers_of_other_forms(tmp_path: Path) -> None:
    rows = np.zeros(2, members_dtype(["it's", "jpg"]))
    path = tmp_path / "m.npy"
    path.write_bytes(to_npy_bytes(rows))
    assert MemberIndex(path, num_samples=2).names == ("it's", "jpg")  # numpy's way
    ours = tmp_path / "ours.npy"
    ours.write_bytes(to_npy_bytes(np.zeros(2, members_dtype(["jpg", "cls"]))))
    m = MemberIndex(ours, num_samples=2)
    assert m.names == ("jpg", "cls")
    assert isinstance(m.raw.obj, mmap.mmap)
    assert m.rows.dtype == members_dtype(["jpg", "cls"])
    # a repeated column name, a truncated file: refused as numpy refuses them
    cols = "('jpg', '<u4', (2,)), ('jpg', '<u4', (2,))"
    twice = _npy_with_header(
        tmp_path / "twice.npy",
        "{'descr': [('check', '<u8'), ('key', '<u4', (2,)), ('members', ["
        + cols
        + "])], 'fortran_order': False, 'shape': (1,), }",
        bytes(32),
    )
    with pytest.raises(FormatError, match="not a valid member index file"):
        MemberIndex(twice, num_samples=1)
    short = tmp_path / "short.npy"
    short.write_bytes(ours.read_bytes()[:-1])
    with pytest.raises(FormatError, match="not a valid member index file"):
        MemberIndex(short, num_samples=2)


@settings(max_examples=150, deadline=None)
@given(at=st.integers(0, 127), value=st.integers(0, 255))
@example(at=8, value=129)  # a shorter header length: numpy reads padding as records
def test_a_changed_header_byte_gives_a_shardex_error_or_the_same_records(
    tmp_path_factory: pytest.TempPathFactory, at: int, value: int
) -> None:
    # The short way parses headers itself: one changed byte anywhere in a header of the
    # form it takes must be refused as numpy refuses it, or read as numpy reads it.
    tmp = tmp_path_factory.mktemp("hdr")
    samples = build_samples(np.arange(3), np.arange(3) * 7, np.arange(3) + 1, np.arange(3) + 9)
    rows = np.zeros(3, members_dtype(["jpg", "cls"]))
    rows["key"] = [[1, 2], [3, 4], [5, 6]]
    for kind, good in (("samples", to_npy_bytes(samples)), ("members", to_npy_bytes(rows))):
        data = bytearray(good)
        data[at] = value
        path = tmp / f"{kind}.npy"
        path.write_bytes(bytes(data))
        try:
            if kind == "samples":
                got = [SplitIndex(path, path, num_samples=3).record(i) for i in range(3)]
                want = [tuple(int(x) for x in r) for r in samples.tolist()]
                want = [(o, c, s, n) for o, c, s, n in want]
            else:
                m = MemberIndex(path, num_samples=3)
                got = [m.unpack(m.raw, i * m.row_size)[1:3] for i in range(3)]
                want = [(1, 2), (3, 4), (5, 6)]
        except ShardexError:
            continue
        try:
            expected = np.load(io.BytesIO(bytes(data)), allow_pickle=False)
        except Exception:
            pytest.fail(f"{kind}: a header numpy refuses was read: {bytes(data[:128])!r}")
        if expected.dtype == (SAMPLE_DTYPE if kind == "samples" else rows.dtype):
            # what numpy reads: the original records, or (a shorter header length) other
            # bytes taken as records, which reads refuse by their checksums
            if kind == "samples":
                want = [tuple(int(x) for x in r) for r in expected.tolist()]
            else:
                want = [tuple(int(x) for x in r[1]) for r in expected.tolist()]
            assert got == want
