"""Parquet files read from bytes, checked against their checksum, pyarrow's errors mapped
to shardex's; and checksummed Parquet writing. Reads through any :class:`Files`.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final, Protocol

import pyarrow as pa
import pyarrow.parquet as pq
import xxhash
from xxhash import xxh3_64, xxh3_64_hexdigest

from shardex.errors import ChecksumError, FormatError, ObjectNotFoundError, ShardexError


class Files(Protocol):
    """What these functions read with (a :class:`~shardex.storage.base.Storage` is one)."""

    def get(self, path: str) -> bytes: ...

    def join(self, path: str) -> str:
        """``path`` as the user knows it (for messages)."""
        ...


def read_npy(files: Files, path: str, what: str) -> Any:
    """A ``.npy`` file, not mapped; a hostile header is a one-line FormatError."""
    import numpy as np

    data = files.get(path)
    try:
        return np.load(io.BytesIO(data), allow_pickle=False)
    except Exception as exc:  # numpy raises what it meets: ValueError, TokenError, ...
        raise FormatError(f"{files.join(path)}: not a valid {what} file ({exc})") from exc


def arrow_reader(data: bytes) -> pa.BufferReader:
    """A pyarrow reader over a copy of ``data`` in Arrow-owned memory.

    ``pa.BufferReader(data)`` would hold the Python bytes, and Arrow's thread pool may drop the
    last reference while the interpreter exits: freeing them takes the GIL inside a C++
    destructor and the process aborts (SIGABRT). Arrow-owned memory needs no GIL to free.
    """
    buf = pa.allocate_buffer(len(data))
    memoryview(buf).cast("B")[:] = data
    return pa.BufferReader(buf)


def read_checked_table(
    storage: Files, name: str, checksum: str | None, columns: list[str] | None = None
) -> pa.Table:
    """A whole Parquet file of the export, checked against its config.yaml checksum if any.

    Raises:
        ObjectNotFoundError: the file is missing.
        ChecksumError: its bytes differ from what was exported.
        FormatError: it is not a Parquet file.
    """
    data = checked_file(storage, name, checksum)
    with metadata_errors(storage.join(name)):
        return pq.read_table(arrow_reader(data), columns=columns)


def checked_file(storage: Files, name: str, checksum: str | None) -> bytes:
    """The bytes of ``name``, checked against ``checksum`` (``xxh3_64:HEX``; None: not recorded).

    Raises:
        ObjectNotFoundError: the file is missing.
        ChecksumError: its bytes differ from what was exported.
    """
    data = storage.get(name)
    if checksum is not None:
        _same_checksum(f"xxh3_64:{xxh3_64_hexdigest(data)}", checksum, storage.join(name))
    return data


def check_local_file(path: Path, checksum: str | None, where: str) -> None:
    """Raise ChecksumError unless the file at ``path`` has ``checksum`` (read in chunks)."""
    if checksum is None:
        return
    whole = xxh3_64()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(4 << 20), b""):
            whole.update(chunk)
    _same_checksum(f"xxh3_64:{whole.hexdigest()}", checksum, where)


def _same_checksum(found: str, expected: str, where: str) -> None:
    if found != expected:
        raise ChecksumError(
            f"{where} is damaged: its checksum is {found}, config.yaml says {expected}"
        )


@contextlib.contextmanager
def metadata_errors(where: str) -> Iterator[None]:
    """Map pyarrow's errors for a missing or malformed table to shardex's, naming ``where``."""
    try:
        yield
    except ShardexError:
        raise
    except FileNotFoundError as exc:
        raise ObjectNotFoundError(f"{where} does not exist") from exc
    except (pa.ArrowException, OSError, KeyError) as exc:
        raise FormatError(f"{where} is not a readable metadata table: {exc}") from exc


def shard_checksum(hasher: Any) -> str:
    """The config.yaml form of a whole-file checksum."""
    return f"xxh3_64:{hasher.hexdigest()}"


#: How shard sidecars and metadata.parquet are written: zstd without dictionary pages (their
#: strings are mostly distinct; on the benchmark's 20,000 rows: 36 % smaller, written in
#: 0.64x and read in 0.71x the time of dictionary pages).
PARQUET_WRITE: Final[dict[str, Any]] = {"compression": "zstd", "use_dictionary": False}


class ParquetFile:
    """An ObjectWriter as the file ``pq.write_table`` writes, hashing what passes (its
    ``checksum``: of what was written, with no read-back)."""

    def __init__(self, writer: Any) -> None:
        self._w = writer
        self._hash = xxhash.xxh3_64()
        self.closed = False

    @property
    def checksum(self) -> str:
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


#: Spilled and carried rows are mostly repeated paths: zstd 1 makes them ~5x smaller
#: (2.3x smaller than lz4, as fast; measured on object-store references).
ZSTD_1: Final = pa.ipc.IpcWriteOptions(
    compression=pa.Codec("zstd", 1) if pa.Codec.is_available("zstd") else None
)


def ipc_bytes(data: pa.Table | pa.RecordBatch, options: pa.ipc.IpcWriteOptions) -> bytes:
    """``data`` as the bytes of an Arrow IPC stream."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, data.schema, options=options) as writer:
        writer.write(data)
    return bytes(sink.getvalue().to_pybytes())
