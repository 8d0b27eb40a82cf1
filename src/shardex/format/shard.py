"""Writing one tar shard and its Parquet sidecar.

A sample's members are written back to back: the source members in order (the image
first), then ``KEY.cls`` (the label as ASCII digits) and ``KEY.json`` (scalar metadata).
The sample's byte range runs from its first header to the end of its last member's
padding; its checksum covers exactly that range.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.parquet as pq
import xxhash

from shardex.errors import BadSampleError
from shardex.format.tar import BLOCK, END_OF_ARCHIVE, encode_member, member_header, padding
from shardex.sources.base import MEMBERS
from shardex.storage.base import Storage

JSON_COLUMN: Final = "_json"
_ZEROS: Final = bytes(BLOCK)


def shard_checksum(hasher: Any) -> str:
    """The config.yaml form of a whole-file checksum."""
    return f"xxh3_64:{hasher.hexdigest()}"


class MemberReader:
    """Reads member bytes from local files, keeping recently used files open."""

    def __init__(self) -> None:
        self._fds: dict[str, int] = {}

    def read(self, member: dict[str, Any]) -> bytes:
        data = member["data"]
        if data is not None:
            return data  # type: ignore[no-any-return]
        path, offset, size = member["path"], member["offset"], member["size"]
        try:
            if offset < 0:  # a whole file: one read of one byte more shows if it grew
                whole = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                try:
                    data = os.read(whole, size + 1)
                finally:
                    os.close(whole)
            else:
                fd = self._fds.get(path)
                if fd is None:
                    if len(self._fds) > 64:
                        self.close()
                    fd = self._fds[path] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                data = os.pread(fd, size, offset)
        except OSError as exc:
            raise BadSampleError(
                f"cannot read {path}: {exc.strerror}", path=path, reason=str(exc.strerror)
            ) from exc
        if len(data) != size:
            raise BadSampleError(
                f"{path} changed while exporting: it was {size} bytes, now {len(data)}",
                path=path,
                reason="changed during export",
            )
        return data

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds = {}


def sample_sizes(rows: pa.Table, *, with_label: bool) -> npt.NDArray[np.int64]:
    """Exact tar bytes of each sample (headers, data, padding) before it is written."""
    out = np.zeros(rows.num_rows, dtype=np.int64)
    keys = rows.column("key").to_pylist()
    members = rows.column(MEMBERS).to_pylist()
    labels = rows.column("label").to_pylist() if with_label else None
    jsons = rows.column(JSON_COLUMN).to_pylist() if JSON_COLUMN in rows.column_names else None
    for i, key in enumerate(keys):
        total = 0
        for m in members[i]:
            total += member_header(f"{key}.{m['ext']}")[1] + m["size"] + padding(m["size"])
        if labels is not None and labels[i] is not None:
            total += member_header(f"{key}.cls")[1] + BLOCK
        if jsons is not None and jsons[i] is not None:
            n = len(jsons[i])
            total += member_header(f"{key}.json")[1] + n + padding(n)
        out[i] = total
    return out


@dataclass(frozen=True, slots=True)
class ShardJob:
    """One shard to write: its rows (a slice of the split's table) and where to put it."""

    storage: Storage
    tar_path: str
    parquet_path: str
    rows: pa.Table
    with_label: bool


@dataclass(frozen=True, slots=True)
class ShardWritten:
    """What writing one shard produced."""

    num_bytes: int
    checksum: str
    offsets: npt.NDArray[np.uint64]
    lengths: npt.NDArray[np.uint32]
    checksums: npt.NDArray[np.uint64]
    table: pa.Table


def write_shard(job: ShardJob) -> ShardWritten:
    """Write the tar and its Parquet sidecar; both appear only when complete."""
    rows, n = job.rows, job.rows.num_rows
    keys = rows.column("key").to_pylist()
    members = rows.column(MEMBERS).to_pylist()
    labels = rows.column("label").to_pylist() if job.with_label else [None] * n
    has_json = JSON_COLUMN in rows.column_names
    jsons: list[bytes | None] = rows.column(JSON_COLUMN).to_pylist() if has_json else [None] * n
    offsets = np.empty(n, np.uint64)
    lengths = np.empty(n, np.uint32)
    sums = np.empty(n, np.uint64)
    member_names: list[str] = []
    whole = xxhash.xxh3_64()
    reader = MemberReader()
    try:
        with job.storage.open_writer(job.tar_path) as out:
            for i, key in enumerate(keys):
                parts: list[bytes] = []
                fields: list[tuple[str, bytes]] = [(m["ext"], reader.read(m)) for m in members[i]]
                if labels[i] is not None:
                    fields.append(("cls", str(labels[i]).encode()))
                text = jsons[i]
                if text is not None:
                    fields.append(("json", text))
                for ext, data in fields:
                    name, _ = member_header(f"{key}.{ext}")
                    parts += (encode_member(name, len(data)), data, _ZEROS[: padding(len(data))])
                member_names.append(f"{key}.{fields[0][0]}" if fields else "")
                sample = b"".join(parts)
                offsets[i], lengths[i] = out.tell, len(sample)
                sums[i] = xxhash.xxh3_64_intdigest(sample)
                whole.update(sample)
                out.write(sample)
            out.write(END_OF_ARCHIVE)
            whole.update(END_OF_ARCHIVE)
            size = out.tell
    finally:
        reader.close()
    table = _sidecar(job, member_names, offsets, lengths, sums)
    with job.storage.open_writer(job.parquet_path) as out:
        pq.write_table(table, _WriterFile(out), compression="zstd")
    return ShardWritten(size, shard_checksum(whole), offsets, lengths, sums, table)


def _sidecar(
    job: ShardJob,
    member_names: list[str],
    offsets: npt.NDArray[np.uint64],
    lengths: npt.NDArray[np.uint32],
    sums: npt.NDArray[np.uint64],
) -> pa.Table:
    """The Parquet rows of a shard: NeMo's columns, typed metadata, byte ranges."""
    rows = job.rows
    n = rows.num_rows
    internal = {MEMBERS, JSON_COLUMN, "key", "original_path"}
    json_text = (
        rows.column(JSON_COLUMN).cast(pa.string())
        if JSON_COLUMN in rows.column_names
        else pa.nulls(n, pa.string())
    )
    front = {
        "key": rows.column("key"),
        "image_id": rows.column("key"),
        "tar_file": pa.array([job.tar_path] * n, pa.string()),
        "member_name": pa.array(member_names, pa.string()),
        "original_path": rows.column("original_path"),
        "metadata": json_text,
    }
    rest = {c: rows.column(c) for c in rows.column_names if c not in internal}
    tail = {
        "sample_offset": pa.array(offsets, pa.uint64()),
        "sample_length": pa.array(lengths, pa.uint32()),
        "sample_checksum": pa.array(sums, pa.uint64()),
    }
    return pa.table({**front, **rest, **tail})


class _WriterFile:
    """The file-like face of an ObjectWriter that pyarrow's writers need."""

    def __init__(self, writer: Any) -> None:
        self._w = writer
        self.closed = False

    def write(self, data: Any) -> int:
        view = memoryview(data)
        self._w.write(view)
        return view.nbytes

    def tell(self) -> int:
        return int(self._w.tell)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False


def parquet_file(writer: Any) -> Any:
    """Wrap an ObjectWriter for ``pq.write_table`` / ``pq.ParquetWriter``."""
    return _WriterFile(writer)
