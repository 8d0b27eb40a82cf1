"""The webdataset writer's per-shard work done over all samples at once (numpy headers,
the in-memory shard checked, hashed and written without a Python loop per sample) gives
the same bytes as the sample-by-sample writer it stands in for."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

import shardex
from helpers import files_of
from shardex.backends.webdataset import writer
from shardex.backends.webdataset.layout import zeroed
from shardex.backends.webdataset.vectorised import jpegs_good
from shardex.backends.webdataset.writer import ShardJob, write_shard
from shardex.codecs.images import MAX_PIXELS
from shardex.errors import BadSampleError
from shardex.format.dali_index import DaliIndex
from shardex.format.tar import (
    BLOCK,
    encode_member,
    header_blocks,
    iter_members,
    long_headers,
    split_name,
)
from shardex.refs.candidates import Candidates
from shardex.refs.members import Members
from shardex.refs.scan import MEMBER_TYPE
from shardex.sample_check import SampleCheck, image_problem
from shardex.storage.local import LocalObjectWriter, LocalStorage


def _jpeg(i: int, side: int = 24) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (side + i % 5, side), (i % 256, 40, 90)).save(out, "JPEG", quality=70)
    return out.getvalue()


def _counted(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Record, per shard, whether the all-at-once path wrote it."""
    taken: list[bool] = []
    fill = writer._fill_inline

    def counted(*args: object) -> object:
        got = fill(*args)  # type: ignore[arg-type]
        taken.append(got is not None)
        return got

    monkeypatch.setattr(writer, "_fill_inline", counted)
    return taken


def _sample_by_sample(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the writer take the sample-by-sample path for every shard."""
    monkeypatch.setattr(writer, "_fill_inline", lambda *args: None)


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"max_shard_bytes": 40_000, "samples_per_shard": 30},
        {"validate": "none"},
        {"samples_per_shard": 7, "split_fractions": {"train": 0.7, "val": 0.3}},
    ],
)
def test_in_memory_export_equals_the_sample_by_sample_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, options: dict[str, Any]
) -> None:
    n = 120
    # keys a reader splits oddly, with spaces (DALI v1.1) and past 100 bytes (long names)
    keys = [f"{i:04d}" if i % 9 else f"dir.{i}/k {i}" for i in range(n)]
    keys[3] = "deep/" + "k" * 120
    keys[4] = "x" * 130
    source = {
        "key": keys,
        "jpg": [_jpeg(i) for i in range(n)],
        "seg": [bytes([i % 251]) * (i * 37 % 1500) for i in range(n)],
        "txt": [f"caption {i} é" for i in range(n)],
        "label": [i % 4 for i in range(n)],
    }
    taken = _counted(monkeypatch)
    shardex.export(source, tmp_path / "fast", workers=1, **options)
    assert taken
    assert all(taken)
    _sample_by_sample(monkeypatch)
    shardex.export(source, tmp_path / "slow", workers=1, **options)
    fast, slow = files_of(tmp_path / "fast"), files_of(tmp_path / "slow")
    assert fast.keys() == slow.keys()
    assert [k for k in fast if fast[k] != slow[k]] == []
    ds = shardex.open_dataset(
        tmp_path / "fast", split="train" if "split_fractions" in options else None
    )
    assert len(ds) > 0


def test_bad_images_fall_back_and_are_skipped_as_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    jpgs = [_jpeg(i) for i in range(60)]
    jpgs[5] = jpgs[5][:100]  # truncated
    jpgs[17] = b""
    jpgs[40] = b"not an image at all"
    source = {"key": [f"{i:03d}" for i in range(60)], "jpg": jpgs, "label": [1] * 60}
    taken = _counted(monkeypatch)
    shardex.export(source, tmp_path / "fast", workers=1, on_error="skip", samples_per_shard=16)
    assert True in taken
    assert False in taken
    _sample_by_sample(monkeypatch)
    shardex.export(source, tmp_path / "slow", workers=1, on_error="skip", samples_per_shard=16)
    assert files_of(tmp_path / "fast") == files_of(tmp_path / "slow")
    assert len(shardex.open_dataset(tmp_path / "fast")) == 57


@pytest.mark.parametrize(
    "options",
    [
        {"samples_per_shard": 16},
        {"max_shard_bytes": 30_000, "samples_per_shard": 40, "on_error": "skip"},
        {"samples_per_shard": 16, "on_error": "skip", "validate": "none"},
    ],
)
def test_folder_export_read_a_shard_at_once_equals_the_sample_by_sample_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, options: dict[str, Any]
) -> None:
    """An image folder's shards are read file by file into one buffer and written at
    once: the same bytes as sample by sample; a shard with a bad image falls back."""
    src = tmp_path / "src"
    for i in range(70):
        path = src / f"c{i % 3}" / f"img{i:03d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(_jpeg(i))
    if options.get("on_error") == "skip":
        (src / "c1" / "img010.jpg").write_bytes(_jpeg(10)[:90])  # truncated
        (src / "c2" / "img050.jpg").write_bytes(b"")
    taken = _counted(monkeypatch)
    shardex.export(src, tmp_path / "fast", workers=1, **options)
    assert True in taken
    assert (False in taken) == (options.get("on_error") == "skip")
    _sample_by_sample(monkeypatch)
    shardex.export(src, tmp_path / "slow", workers=1, **options)
    fast, slow = files_of(tmp_path / "fast"), files_of(tmp_path / "slow")
    assert fast.keys() == slow.keys()
    assert [k for k in fast if fast[k] != slow[k]] == []


def _job(tmp_path: Path, name: str, counts: list[int]) -> ShardJob:
    """A job whose candidates hold different numbers of source members (0 to 3)."""
    rows = []
    for i, count in enumerate(counts):
        exts = ["jpg", "seg", "depth.png"][:count]
        rows.append(
            [
                {"ext": e, "path": None, "offset": 0, "size": len(d), "data": d}
                for e, d in zip(exts, [_jpeg(i), b"s" * (i * 91 % 700), _png(i)], strict=False)
            ]
        )
    members = Members.of(pa.array(rows, pa.list_(MEMBER_TYPE)))
    n = len(counts)
    table = pa.table(
        {
            "key": [f"s{i}" for i in range(n)],
            "original_path": [f"p{i}" for i in range(n)],
            "label": [i if i % 3 else None for i in range(n)],
        }
    )
    storage = LocalStorage(tmp_path / name)
    return ShardJob(
        storage=storage,
        tar_path="a.tar",
        parquet_path="a.parquet",
        candidates=Candidates(
            rows=table,
            members=members,
            member_rows=np.arange(n, dtype=np.int64),
            sizes=np.full(n, 10_000, np.int64),
            last=True,
        ),
        with_label=True,
        samples_per_shard=n,
        dali_index_path="a.idx",
        first_sample=5,
    )


def _png(i: int) -> bytes:
    out = io.BytesIO()
    Image.new("L", (4 + i % 3, 4), i % 256).save(out, "PNG")
    return out.getvalue()


def test_samples_with_different_member_counts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    counts = [1, 3, 0, 2, 3, 1, 1, 0, 2, 3]
    taken = _counted(monkeypatch)
    fast = write_shard(_job(tmp_path, "fast", counts))
    assert taken == [True]
    _sample_by_sample(monkeypatch)
    slow = write_shard(_job(tmp_path, "slow", counts))
    assert files_of(tmp_path / "fast") == files_of(tmp_path / "slow")
    assert fast.checksums.tolist() == slow.checksums.tolist()
    with tarfile.open(tmp_path / "fast" / "a.tar") as tar:
        names = tar.getnames()
    assert names[:4] == ["s0.jpg", "s1.jpg", "s1.seg", "s1.depth.png"]


_NAME = st.binary(min_size=1, max_size=180).filter(lambda b: b"\0" not in b)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(_NAME, st.integers(0, 8**11 - 1)), min_size=1, max_size=12))
def test_header_blocks_are_encode_member(members: list[tuple[bytes, int]]) -> None:
    names = [n for n, _ in members]
    sizes = np.array([s for _, s in members], np.int64)
    data = np.frombuffer(b"".join(names), np.uint8)
    offsets = np.zeros(len(names) + 1, np.int64)
    np.cumsum([len(n) for n in names], out=offsets[1:])
    rows = np.arange(len(names), dtype=np.int64) * 2 + 1  # not back to back
    into = np.full((2 * len(names) + 1, BLOCK), 7, np.uint8)
    header_blocks(data, offsets, sizes, into, rows)
    long = long_headers(data, offsets, sizes)
    for j, (name, size) in enumerate(members):
        want = encode_member(name, size)
        if len(name) <= 100:
            assert into[rows[j]].tobytes() == want
            assert j not in long
        else:
            assert long[j] == want
    assert (into[0] == 7).all()  # rows not named stay as they were


@settings(max_examples=80, deadline=None)
@given(
    st.integers(0, 40),
    st.lists(st.tuples(st.integers(0, 2000), st.integers(0, 255)), max_size=4),
    st.integers(0, 3000),
    st.sampled_from([MAX_PIXELS, 600, 100]),
)
def test_numpy_jpeg_check_never_passes_what_image_problem_refuses(
    seed: int, edits: list[tuple[int, int]], cut: int, limit: int
) -> None:
    data = bytearray(_jpeg(seed, side=16 + seed))
    for at, value in edits:  # damaged markers, lengths, sizes
        if at < len(data):
            data[at] = value
    blob = bytes(data[: max(len(data) - cut, 0)]) if cut % 2 else bytes(data)
    buffer = np.frombuffer(b"pre" + blob + b"post", np.uint8)
    ok = jpegs_good(buffer, np.array([3]), np.array([3 + len(blob)]), limit)
    reason = image_problem(blob, SampleCheck(max_pixels=limit))
    if ok[0]:
        assert reason is None


def test_reused_skeleton_is_never_one_a_view_still_holds() -> None:
    first = zeroed(4096)
    first[:] = 9
    held = first.data  # a view of it is still held: the next gets fresh memory
    second = zeroed(4096)
    assert not np.shares_memory(first, second)
    assert (second == 0).all()
    assert held[0] == 9


@pytest.mark.parametrize("odd", [False, True])
def test_dali_index_is_the_one_the_tar_gives(tmp_path: Path, odd: bool) -> None:
    """Each .idx file the writer builds with Arrow is the one DaliIndex makes from the
    tar's own members (v1.2 with names; v1.1 where a name holds a space)."""
    n = 40
    keys = [f"{i:03d}" if not (odd and i % 5 == 0) else f"d/k {i}" for i in range(n)]
    source = {
        "key": keys,
        "jpg": [_jpeg(i) for i in range(n)],
        "seg": [b"s" * (i * 53 % 900) for i in range(n)],
        "label": [i % 3 for i in range(n)],
    }
    shardex.export(source, tmp_path / "out", workers=1, samples_per_shard=16)
    idx_files = sorted((tmp_path / "out").rglob("*.idx"))
    assert len(idx_files) == 3
    for idx in idx_files:
        data = idx.with_suffix(".tar").read_bytes()
        want = DaliIndex()
        sample: list[tuple[str, int, int, str]] = []
        start = key = None
        for m in iter_members(data):
            k, ext = split_name(m.name)
            if k != key:
                if sample:
                    want.add(start or 0, sample)
                sample, start, key = [], m.header_offset, k
            sample.append((ext, m.data_offset - (start or 0), m.size, m.name))
        want.add(start or 0, sample)
        assert idx.read_bytes() == want.to_bytes()
        assert idx.read_bytes().startswith(b"v1.1" if odd else b"v1.2")


def test_in_memory_bytes_are_written_from_the_callers_objects(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Byte strings of an in-memory source are not copied before the write: the parts
    handed to the kernel are views of the caller's own objects."""
    jpgs: list[bytes | bytearray] = [_jpeg(i) for i in range(40)]
    jpgs[7] = bytearray(jpgs[7])
    written: set[int] = set()
    write_parts = LocalObjectWriter.write_parts

    def spied(self: LocalObjectWriter, parts: Any) -> None:
        written.update(id(p.obj) for p in parts if isinstance(p, memoryview))
        write_parts(self, parts)

    monkeypatch.setattr(LocalObjectWriter, "write_parts", spied)
    taken = _counted(monkeypatch)
    source = {"jpg": jpgs, "seg": [b"s" * i for i in range(40)], "txt": ["t"] * 40}
    shardex.export(source, tmp_path / "fast", workers=1, samples_per_shard=16)
    assert taken == [True] * 3
    assert {id(j) for j in jpgs} <= written
    _sample_by_sample(monkeypatch)
    shardex.export(source, tmp_path / "slow", workers=1, samples_per_shard=16)
    assert files_of(tmp_path / "fast") == files_of(tmp_path / "slow")


def _jpeg_far_header(i: int, side: int) -> bytes:
    """A JPEG whose frame header lies past the first few KB (a large comment before it)."""
    out = io.BytesIO()
    Image.new("RGB", (side, side), (i, 0, 0)).save(out, "JPEG", comment=b"c" * 6000)
    return out.getvalue()


def test_jpeg_headers_past_the_gathered_heads_are_checked_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the heads of in-memory images are gathered for the vectorised check: an image
    whose size lies further is still checked, with what the sample-by-sample path says."""
    jpgs = [_jpeg_far_header(i, 20) for i in range(30)]
    jpgs[12] = _jpeg_far_header(12, 40)  # 1,600 pixels: over the limit below
    source = {"key": [f"{i:03d}" for i in range(30)], "jpg": jpgs}
    options: dict[str, Any] = {"workers": 1, "samples_per_shard": 10, "on_error": "skip"}
    taken = _counted(monkeypatch)
    shardex.export(source, tmp_path / "fast", max_pixels=1_000, **options)
    assert taken.count(True) == 2  # the shard holding the large image falls back
    _sample_by_sample(monkeypatch)
    shardex.export(source, tmp_path / "slow", max_pixels=1_000, **options)
    assert files_of(tmp_path / "fast") == files_of(tmp_path / "slow")
    assert len(shardex.open_dataset(tmp_path / "fast")) == 29


@pytest.mark.parametrize("on_error", ["error", "skip"])
def test_a_bytearray_resized_during_the_export_refuses_its_sample(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, on_error: str
) -> None:
    """In-memory bytes are read where the caller holds them: one whose size changed
    between the scan and the write is refused, never written short or long."""
    import shardex.engine.run as run_module

    jpgs: list[bytes | bytearray] = [_jpeg(i) for i in range(20)]
    jpgs[6] = bytearray(jpgs[6])
    write_splits = run_module.write_splits

    def resized_first(*args: Any, **kwargs: Any) -> Any:
        jpgs[6] += b"\x00"  # type: ignore[operator]  # bytearray: resized in place
        return write_splits(*args, **kwargs)

    monkeypatch.setattr(run_module, "write_splits", resized_first)
    source = {"key": [f"{i:02d}" for i in range(20)], "jpg": jpgs}
    if on_error == "error":
        with pytest.raises(BadSampleError, match="changed size while exported"):
            shardex.export(source, tmp_path / "out", workers=1)
        return
    shardex.export(source, tmp_path / "out", workers=1, on_error="skip")
    errors = pa.parquet.read_table(tmp_path / "out" / "errors.parquet").to_pylist()
    assert [(e["key"], e["reason"].split(" (")[0]) for e in errors] == [
        ("06", "changed size while exported")
    ]
    ds = shardex.open_dataset(tmp_path / "out")
    assert len(ds) == 19
    assert ds.get("07")["jpg"] == jpgs[7]  # type: ignore[attr-defined]
