"""The in-memory write path: a source's bytes reach the shard without copies that would
change anything a user sees (same files whatever the bytes-like type, the caller's
objects untouched, several source batches read in place), and the local writer's
``writev`` of many parts."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import shardex
from helpers import files_of
from shardex.errors import BadSampleError, StorageError
from shardex.refs.members import Members
from shardex.refs.scan import MEMBER_TYPE, MEMBERS
from shardex.sources.arrays import ArraySource
from shardex.sources.base import DEFAULT_BATCH_SIZE
from shardex.storage.fetch.bytes import ByteSource
from shardex.storage.local import LocalObjectWriter


def _blobs(n: int) -> list[bytes]:
    """Byte strings of varied sizes (some a multiple of the tar block, some empty)."""
    return [bytes([i % 251]) * (i * 37 % 1500) for i in range(n)]


def test_bytes_bytearray_and_memoryview_give_the_same_export(tmp_path: Path) -> None:
    blobs = _blobs(300)
    labels = [i % 4 for i in range(300)]
    kinds = {
        "bytes": list(blobs),
        "bytearray": [bytearray(b) for b in blobs],
        "memoryview": [memoryview(b) for b in blobs],
    }
    before = {name: [bytes(v) for v in values] for name, values in kinds.items()}
    exports = {}
    for name, values in kinds.items():
        out = tmp_path / name
        shardex.export({"bin": values, "label": labels}, out, samples_per_shard=70)
        exports[name] = files_of(out)
    assert exports["bytearray"] == exports["bytes"]
    assert exports["memoryview"] == exports["bytes"]
    # the caller's objects are not modified, nor replaced in their lists
    for name, values in kinds.items():
        assert [bytes(v) for v in values] == before[name]
    ds = shardex.open_dataset(tmp_path / "bytes", split="train")
    assert [ds[i]["bin"] for i in (0, 1, 150, 299)] == [blobs[i] for i in (0, 1, 150, 299)]


def test_an_export_of_several_source_batches_holds_every_sample(tmp_path: Path) -> None:
    n = DEFAULT_BATCH_SIZE * 2 + 123  # three batches: their bytes are read where they lie
    blobs = [i.to_bytes(4, "little") * (1 + i % 9) for i in range(n)]
    out = tmp_path / "out"
    shardex.export({"bin": blobs}, out, samples_per_shard=5000)
    assert shardex.verify(out).ok
    ds = shardex.open_dataset(out, split="train")
    assert len(ds) == n
    for i in range(0, n, 97):
        assert ds[i]["bin"] == blobs[i]
    # the samples at the batches' borders
    for i in (DEFAULT_BATCH_SIZE - 1, DEFAULT_BATCH_SIZE, 2 * DEFAULT_BATCH_SIZE, n - 1):
        assert ds[i]["bin"] == blobs[i]


def test_members_of_a_chunked_column_copies_no_bytes() -> None:
    n = DEFAULT_BATCH_SIZE + 500
    blobs = [os.urandom(2000) for _ in range(n)]
    table = ArraySource({"bin": blobs}).scan().table
    column = table.column(MEMBERS)
    assert column.num_chunks == 2
    before = pa.total_allocated_bytes()
    members = Members.of(column)
    grew = pa.total_allocated_bytes() - before
    assert grew < sum(map(len, blobs)) // 10  # references read, the bytes left in place
    source = ByteSource(members)
    for j in (0, DEFAULT_BATCH_SIZE - 1, DEFAULT_BATCH_SIZE, n - 1):
        assert bytes(source.read(j)) == blobs[j]
    assert members.inline.all()
    assert members.mostly_inline()


def test_write_parts_writes_every_part_in_order(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    # more parts than one writev takes, empty ones, views of a larger buffer
    big = rng.integers(0, 256, 1 << 16, np.uint8).tobytes()
    parts: list[bytes | bytearray | memoryview] = []
    for k in range(3000):
        size = int(rng.integers(0, 700))
        at = int(rng.integers(0, len(big) - size))
        kind = k % 3
        piece = big[at : at + size]
        parts.append(
            piece
            if kind == 0
            else bytearray(piece)
            if kind == 1
            else memoryview(big)[at : at + size]
        )
    writer = LocalObjectWriter(tmp_path, "x.bin")
    writer.write(b"head")  # buffered bytes go before the parts
    writer.write_parts(parts)
    writer.write(b"tail")
    expected = b"head" + b"".join(parts) + b"tail"
    assert writer.tell == len(expected)
    writer.commit()
    assert (tmp_path / "x.bin").read_bytes() == expected


def test_write_parts_on_a_full_disk_is_a_clear_error(tmp_path: Path) -> None:
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    writer = LocalObjectWriter(tmp_path, "x.bin")
    writer._file.close()
    # /dev/full: every write fails with ENOSPC, as a full disk's
    writer._file = open("/dev/full", "wb")  # noqa: SIM115
    with pytest.raises(StorageError, match=os.strerror(errno.ENOSPC)):
        writer.write_parts([b"abc", b"def"])
    assert list(tmp_path.iterdir()) == []  # the temporary file is gone


def test_file_bytes_read_into_reused_memory_never_change_while_held(tmp_path: Path) -> None:
    # ByteSource reads files into reused buffers: a view still held keeps its bytes, and
    # memory comes back for reuse only once every view of it is gone
    blobs = [bytes([i % 251]) * (300_000 + i * 4099 % 70_000) for i in range(120)]
    paths = []
    for i, blob in enumerate(blobs):
        path = tmp_path / f"{i}.bin"
        path.write_bytes(blob)
        paths.append(str(path))
    sizes = [len(b) for b in blobs]
    members = Members.of(
        pa.array(
            [
                [{"ext": "bin", "path": p, "offset": -1, "size": n}]
                for p, n in zip(paths, sizes, strict=True)
            ],
            pa.list_(MEMBER_TYPE),
        )
    )
    source = ByteSource(members)
    held = [source.read(j) for j in range(60)]  # 60 views held (past several buffers)
    for _ in range(3):  # read the rest again and again, dropping each view at once
        for j in range(60, 120):
            assert source.read(j) == blobs[j]
    assert [bytes(v) for v in held] == blobs[:60]
    del held
    reads = [bytes(source.read(j)) for j in range(120)]
    assert reads == blobs
    buffers = source._files._arena._buffers  # type: ignore[union-attr]
    assert len(buffers) <= 1 + sum(sizes[:60]) // (8 << 20) + 2
    source.close()


def test_a_file_that_grew_or_shrank_is_refused_with_reused_memory(tmp_path: Path) -> None:
    path = tmp_path / "a.jpg"
    path.write_bytes(b"x" * 1000)
    for now in (999, 1001):
        path.write_bytes(b"x" * now)
        members = Members.of(
            pa.array(
                [[{"ext": "jpg", "path": str(path), "offset": -1, "size": 1000}]],
                pa.list_(MEMBER_TYPE),
            )
        )
        source = ByteSource(members)
        with pytest.raises(BadSampleError, match="changed while exporting"):
            source.read(0)
        source.close()


def test_in_memory_exports_in_one_process_give_the_same_files(tmp_path: Path) -> None:
    blobs = _blobs(400)
    first = {"jpg_like": [b"x" + b for b in blobs], "label": [i % 3 for i in range(400)]}
    second = {"jpg_like": [b"y" + b for b in blobs], "label": [i % 3 for i in range(400)]}
    shardex.export(first, tmp_path / "a1")
    shardex.export(second, tmp_path / "b1")  # may reuse the memory of the first's copy
    shardex.export(first, tmp_path / "a2")
    assert files_of(tmp_path / "a1") == files_of(tmp_path / "a2")
    assert files_of(tmp_path / "a1") != files_of(tmp_path / "b1")
    ds = shardex.open_dataset(tmp_path / "b1", split="train")
    assert [ds[i]["jpg_like"] for i in (0, 199, 399)] == [
        second["jpg_like"][i] for i in (0, 199, 399)
    ]


def test_tiny_batches_of_an_in_memory_source_take_no_page_each() -> None:
    # each batch's bytes went to a mapping of its own, a 4 KiB page at least: 20,000
    # one-sample batches of 100 bytes held 239 MB here, 83 MB of it in those pages (156 MB
    # without them: the tables themselves). A child process, so that its peak memory is
    # the source's alone.
    code = textwrap.dedent(
        """
        import resource
        from shardex.sources.arrays import ArraySource
        n = 20_000
        source = ArraySource({"bin": [bytes([i % 251]) * 100 for i in range(n)]}, batch_size=1)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        batches = [batch.table for batch in source.stream().batches]
        grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
        assert sum(t.num_rows for t in batches) == n
        print(grown // 1024)
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout) < 200, f"{done.stdout.strip()} MB held for 2 MB of bytes"
