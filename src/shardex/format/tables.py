"""Parquet files read from bytes: checked against their checksum, and pyarrow's errors
mapped to shardex's, naming the file. A leaf codec: it reads through any object with
``get`` and ``join`` (a storage)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.parquet as pq
import xxhash
from xxhash import xxh3_64, xxh3_64_hexdigest

from shardex.errors import ChecksumError, FormatError, ObjectNotFoundError, ShardexError


class Files(Protocol):
    """What these functions read with (a :class:`~shardex.storage.base.Storage` is one)."""

    def get(self, path: str) -> bytes:
        """The bytes of the file at ``path``."""
        ...

    def join(self, path: str) -> str:
        """``path`` as the user knows it (for messages)."""
        ...


def arrow_reader(data: bytes) -> pa.BufferReader:
    """A reader for pyarrow over a copy of ``data`` in memory Arrow owns.

    ``pa.BufferReader(data)`` wraps the Python bytes themselves; whichever thread drops
    the last reference releases them, taking the GIL. ``pq.read_table`` hands the reader
    to Arrow's thread pool, which may drop it while the interpreter exits: the thread is
    then ended inside a C++ destructor and the process aborts ("terminate called without
    an active exception", SIGABRT, after all its work is done). Arrow-owned memory needs
    no GIL to free.
    """
    buf = pa.allocate_buffer(len(data))
    memoryview(buf).cast("B")[:] = data
    return pa.BufferReader(buf)


def read_checked_table(
    storage: Files, name: str, checksum: str | None, columns: list[str] | None = None
) -> pa.Table:
    """A whole Parquet file of the export (metadata or errors), checked against its
    checksum in config.yaml where it has one.

    Raises:
        ObjectNotFoundError: the file is missing.
        ChecksumError: its bytes differ from what was exported.
        FormatError: it is not a Parquet file.
    """
    data = checked_file(storage, name, checksum)
    with metadata_errors(storage.join(name)):
        return pq.read_table(arrow_reader(data), columns=columns)


def checked_file(storage: Files, name: str, checksum: str | None) -> bytes:
    """The bytes of ``name``, which must have ``checksum`` (``xxh3_64:HEX``; None: not
    recorded, as in older exports).

    Raises:
        ObjectNotFoundError: the file is missing.
        ChecksumError: its bytes differ from what was exported.
    """
    data = storage.get(name)
    if checksum is not None:
        _same_checksum(f"xxh3_64:{xxh3_64_hexdigest(data)}", checksum, storage.join(name))
    return data


def check_local_file(path: Path, checksum: str | None, where: str) -> None:
    """Raise ChecksumError unless the file at ``path`` (a local copy of ``where``) has
    ``checksum``; read in chunks, so a large metadata file is never held whole."""
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
    """Map what pyarrow raises for a missing or malformed metadata table to shardex's
    errors naming the file (``where``)."""
    try:
        yield
    except ShardexError:
        raise
    except FileNotFoundError as exc:
        raise ObjectNotFoundError(f"{where} does not exist") from exc
    except (pa.ArrowException, OSError, KeyError) as exc:
        raise FormatError(f"{where} is not a readable metadata table: {exc}") from exc


# ---------------------------------------------------------------- checksummed writing


def shard_checksum(hasher: Any) -> str:
    """The config.yaml form of a whole-file checksum."""
    return f"xxh3_64:{hasher.hexdigest()}"


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
