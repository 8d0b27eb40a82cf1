"""Writing one tar shard and its Parquet sidecar.

A sample's members are written back to back: the source members in order (the image
first), then ``KEY.cls`` (the label as ASCII digits) and ``KEY.json`` (scalar metadata).
The sample's byte range runs from its first header to the end of its last member's
padding; its checksum covers exactly that range. Beside the tar goes DALI's index file of
the members (see :mod:`shardex.format.dali_index`), computed from the same layout.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import xxhash

from shardex.errors import BadSampleError, ShardexError
from shardex.format.dali_index import Component, DaliIndex
from shardex.format.tables import arrow_reader
from shardex.format.tar import BLOCK, END_OF_ARCHIVE, encode_member, member_header, padding
from shardex.sources.base import MEMBERS
from shardex.storage.base import Storage

JSON_COLUMN: Final = "_json"
#: The field that holds the class label (ASCII digits), as WebDataset names it.
LABEL_FIELD: Final = "cls"
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
    """One shard to write: its rows (a slice of the split's table) and where to put it.

    With ``resume``, a shard whose tar and sidecar already exist is kept when the sidecar's
    keys, byte ranges and checksums equal those of the samples it should hold (the source
    is read and hashed, nothing is uploaded); otherwise it is written again.
    """

    storage: Storage
    tar_path: str
    parquet_path: str
    rows: pa.Table
    with_label: bool
    resume: bool = False
    dali_index_path: str | None = None
    #: Set when the committed export names this shard's paths: the shard is kept if it
    #: holds exactly these samples, else written under these (tar, parquet, idx) paths
    #: instead, never over a file the committed config.yaml names.
    alternate: tuple[str, str, str] | None = None
    #: Seed each sample's checksum with its sample number (``rows``' ``sample_index``),
    #: as format version 2 does; False writes format version 1's unseeded checksums.
    seeded: bool = True


@dataclass(frozen=True, slots=True)
class ShardWritten:
    """What writing (or keeping) one shard produced."""

    num_bytes: int
    checksum: str
    offsets: npt.NDArray[np.uint64]
    lengths: npt.NDArray[np.uint32]
    checksums: npt.NDArray[np.uint64]
    table: pa.Table
    dali_index: str | None = None
    tar_path: str = ""
    parquet_path: str = ""
    #: The sidecar's whole-file checksum, as config.yaml records it.
    metadata_checksum: str | None = None


def iter_fields(
    rows: pa.Table, with_label: bool, reader: MemberReader
) -> Iterator[list[tuple[str, bytes]]]:
    """Each row's fields in member order: source members, ``cls``, ``json``."""
    n = rows.num_rows
    members = rows.column(MEMBERS).to_pylist()
    labels = rows.column("label").to_pylist() if with_label else [None] * n
    has_json = JSON_COLUMN in rows.column_names
    jsons: list[bytes | None] = rows.column(JSON_COLUMN).to_pylist() if has_json else [None] * n
    for i in range(n):
        fields = [(m["ext"], reader.read(m)) for m in members[i]]
        if labels[i] is not None:
            fields.append((LABEL_FIELD, str(labels[i]).encode()))
        text = jsons[i]
        if text is not None:
            fields.append(("json", text))
        yield fields


def _samples(job: ShardJob, reader: MemberReader) -> Iterator[tuple[str, bytes, list[Component]]]:
    """(first member name, sample bytes, members' data offsets within the sample) of each
    row, as the tar holds them."""
    keys = job.rows.column("key").to_pylist()
    for key, fields in zip(keys, iter_fields(job.rows, job.with_label, reader), strict=True):
        parts: list[bytes] = []
        layout: list[Component] = []
        at = 0
        for ext, data in fields:
            name = f"{key}.{ext}"
            header = encode_member(member_header(name)[0], len(data))
            at += len(header)
            layout.append((ext, at, len(data), name))
            at += len(data) + padding(len(data))
            parts += (header, data, _ZEROS[: padding(len(data))])
        yield (f"{key}.{fields[0][0]}" if fields else ""), b"".join(parts), layout


def write_shard(job: ShardJob) -> ShardWritten:
    """Write the tar and its Parquet sidecar (each appears only when complete), or keep
    them when resuming and they verify."""
    n = job.rows.num_rows
    offsets = np.empty(n, np.uint64)
    lengths = np.empty(n, np.uint32)
    sums = np.empty(n, np.uint64)
    names: list[str] = []
    dali = DaliIndex()
    whole = xxhash.xxh3_64()
    reader = MemberReader()
    old = _existing(job) if job.resume or job.alternate else None
    if old is None and job.alternate is not None:
        return write_shard(_elsewhere(job))
    seeds = (
        job.rows.column("sample_index").to_pylist()
        if job.seeded and "sample_index" in job.rows.column_names
        else [0] * n
    )
    try:
        with contextlib.ExitStack() as stack:
            out = None if old else stack.enter_context(job.storage.open_writer(job.tar_path))
            pos = 0
            for i, (name, sample, layout) in enumerate(_samples(job, reader)):
                names.append(name)
                dali.add(pos, layout)
                offsets[i], lengths[i] = pos, len(sample)
                sums[i] = xxhash.xxh3_64_intdigest(sample, seeds[i])
                whole.update(sample)
                pos += len(sample)
                if out is not None:
                    out.write(sample)
                elif not _same_prefix(old, i, pos, int(sums[i])):
                    return write_shard(_elsewhere(job))
            whole.update(END_OF_ARCHIVE)
            size = pos + len(END_OF_ARCHIVE)
            if out is not None:
                out.write(END_OF_ARCHIVE)
    finally:
        reader.close()
    table = _sidecar(job, names, offsets, lengths, sums)
    index = dali.to_bytes() if job.dali_index_path else None
    index_path = job.dali_index_path if index is not None else None
    done = ShardWritten(
        size,
        shard_checksum(whole),
        offsets,
        lengths,
        sums,
        table,
        dali_index=index_path,
        tar_path=job.tar_path,
        parquet_path=job.parquet_path,
    )
    if old is not None:
        # the tar itself is hashed too: its sidecar may be whole while its bytes are not
        if old.size == size and old.table.equals(table) and _tar_holds(job, done.checksum):
            kept = dataclasses.replace(done, metadata_checksum=old.checksum)
            if job.alternate is None:
                _keep_index(job.storage, index_path, index)
                return kept
            if _holds(job.storage, index_path, index):
                return kept
        return write_shard(_elsewhere(job))
    # The sidecar goes last: a resumed export takes a shard whose sidecar exists as written.
    if index_path is not None and index is not None:
        job.storage.put(index_path, index)
    with job.storage.open_writer(job.parquet_path) as out_parquet:
        sidecar = _WriterFile(out_parquet)
        pq.write_table(table, sidecar, compression="zstd")
    return dataclasses.replace(done, metadata_checksum=sidecar.checksum)


def _elsewhere(job: ShardJob) -> ShardJob:
    """The job that writes the shard again: in place, or under its alternate paths when
    the committed export names its paths (keeping a shard left there if it verifies)."""
    if job.alternate is None:
        return dataclasses.replace(job, resume=False)
    tar, parquet, idx = job.alternate
    return dataclasses.replace(
        job,
        tar_path=tar,
        parquet_path=parquet,
        dali_index_path=idx if job.dali_index_path else None,
        alternate=None,
        resume=True,
    )


def _tar_holds(job: ShardJob, checksum: str) -> bool:
    """Whether the tar left at ``job.tar_path`` has this whole-file checksum."""
    whole = xxhash.xxh3_64()
    try:
        for chunk in job.storage.iter_chunks(job.tar_path):
            whole.update(chunk)
    except (ShardexError, OSError):
        return False
    return shard_checksum(whole) == checksum


def _holds(storage: Storage, path: str | None, data: bytes | None) -> bool:
    """Whether an object holds exactly ``data`` (no object asked for: True)."""
    if path is None or data is None:
        return True
    try:
        return storage.get(path) == data
    except (ShardexError, OSError):
        return False


def _keep_index(storage: Storage, path: str | None, index: bytes | None) -> None:
    """Rewrite a kept shard's index file unless it already holds these bytes (one small
    read, against an upload when it does)."""
    if not _holds(storage, path, index):
        storage.put(path, index)  # type: ignore[arg-type]  # _holds: both are set


@dataclass(frozen=True, slots=True)
class _Existing:
    size: int
    table: pa.Table
    ends: list[int]
    sums: list[int]
    checksum: str


def _existing(job: ShardJob) -> _Existing | None:
    """The shard an interrupted export left, if both of its files are there."""
    try:
        size = job.storage.size(job.tar_path)
        data = job.storage.get(job.parquet_path)
        table = pq.read_table(arrow_reader(data))
    except (ShardexError, pa.ArrowInvalid, OSError):
        return None
    if table.num_rows != job.rows.num_rows or "sample_checksum" not in table.column_names:
        return None
    ends = pc.add(table.column("sample_offset"), table.column("sample_length")).to_pylist()
    sums = table.column("sample_checksum").to_pylist()
    return _Existing(size, table, ends, sums, shard_checksum(xxhash.xxh3_64(data)))


def _same_prefix(old: _Existing | None, i: int, end: int, checksum: int) -> bool:
    """Whether sample i, ending at byte ``end``, matches the existing sidecar's record."""
    return old is not None and old.ends[i] == end and old.sums[i] == checksum


def json_text_column(rows: pa.Table) -> pa.Array | pa.ChunkedArray:
    """NeMo's ``metadata`` column: each sample's scalar metadata as JSON text (or null)."""
    if JSON_COLUMN in rows.column_names:
        return rows.column(JSON_COLUMN).cast(pa.string())
    return pa.nulls(rows.num_rows, pa.string())


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
    json_text = json_text_column(rows)
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
    """The file-like face of an ObjectWriter that pyarrow's writers need; it hashes what
    passes through, so config.yaml can record the file's checksum without reading it back."""

    def __init__(self, writer: Any) -> None:
        self._w = writer
        self._hash = xxhash.xxh3_64()
        self.closed = False

    @property
    def checksum(self) -> str:
        """The whole-file checksum of the bytes written so far (``xxh3_64:HEX``)."""
        return shard_checksum(self._hash)

    def write(self, data: Any) -> int:
        view = memoryview(data)
        self._w.write(view)
        self._hash.update(view)
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
    """Wrap an ObjectWriter for ``pq.write_table`` / ``pq.ParquetWriter`` (its
    ``checksum`` is the whole-file checksum of what was written)."""
    return _WriterFile(writer)
