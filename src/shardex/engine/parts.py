"""What shard tasks on other machines hand over through the output itself: each shard's
metadata rows and index arrays, staged as one object under
``OUT/.shardex-staging/RUN/part-*.npz``, and the task that merges a run's parts into
``metadata.parquet``.

A remote runner's (Ray's) shard tasks write their part there and return only a summary
(counts, sizes, checksums, the part's name); tasks merge the parts into each split's index
files and into metadata.parquet, so no per-sample byte of them passes through the driver,
and no file system needs to be shared when the output is on object storage. The driver
removes the run's staging when the run ends (committed or undone); parts a killed run
left are removed by the next run on the output (it holds the lock: no live run stages).
"""

from __future__ import annotations

import contextlib
import io
import secrets
import zipfile
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from shardex.contract import ExportConfig
from shardex.engine.commit import MetadataSink, old_metadata
from shardex.engine.output import STAGED_PART, STAGED_ROWS, STAGING
from shardex.errors import ExportError, FormatError
from shardex.storage import Storage

_TABLE: Final = "table"
#: Parts deleted at once when a run's staging goes.
_DELETES: Final = 16
#: Parts a merge task fetches ahead.
_AHEAD: Final = 8
#: Parts are read once or twice, by tasks: lz4 keeps them small for little CPU.
_IPC: Final = pa.ipc.IpcWriteOptions(compression="lz4" if pa.Codec.is_available("lz4") else None)


def new_staging() -> str:
    """A prefix of its own for this run's parts."""
    return f"{STAGING}{secrets.token_hex(6)}/"


def put_part(
    storage: Storage, staging: str, table: pa.Table, arrays: dict[str, npt.NDArray[Any]]
) -> str:
    """Stage one shard's metadata rows and named arrays; returns the part's name. Each
    attempt gets a new name, so a retried task never mixes with one that died."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema, options=_IPC) as writer:
        writer.write_table(table)
    out = io.BytesIO()
    named: dict[str, Any] = {_TABLE: np.frombuffer(sink.getvalue(), np.uint8), **arrays}
    np.savez(out, **named)
    name = f"{staging}part-{secrets.token_hex(8)}.npz"
    storage.put(name, out.getvalue())
    return name


@dataclass(frozen=True, slots=True)
class Part:
    """A staged part read back: the metadata rows and the arrays."""

    table: pa.Table
    arrays: dict[str, npt.NDArray[Any]]


def read_part(storage: Storage, name: str, *, table: bool = True) -> Part:
    """A part as :func:`put_part` staged it (``table=False``: its arrays only)."""
    raw_part = storage.get(name)  # a part gone, a store failing: its storage error
    try:
        with np.load(io.BytesIO(raw_part), allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files if k != _TABLE or table}
    except (ValueError, OSError, KeyError, zipfile.BadZipFile) as exc:
        raise FormatError(
            f"{storage.join(name)}: not a staged part this run wrote ({exc}); another "
            f"process wrote into {STAGING}: export again"
        ) from exc
    rows = pa.table({})
    if table:
        raw = arrays.pop(_TABLE)
        rows = pa.ipc.open_stream(pa.py_buffer(raw.tobytes())).read_all()
    return Part(rows, arrays)


@contextlib.contextmanager
def read_parts(
    storage: Storage, names: Iterable[str], *, table: bool = True
) -> Iterator[Iterator[Part]]:
    """The parts in order, :data:`_AHEAD` fetched at once (one GET each: a 10,000-shard
    split's merge would otherwise wait on 10,000 round trips one after the other).

    A context: its threads end when it does. (A generator that owned them kept them alive,
    idle, while a caller held the error of a merge that failed part-way: the error's
    traceback holds the frame that holds the generator.)"""
    pool = ThreadPoolExecutor(_AHEAD)
    try:
        yield _ahead(pool, storage, names, table)
    finally:  # reads in flight end (bounded by the storage's time limits); the rest never start
        pool.shutdown(wait=True, cancel_futures=True)


def _ahead(
    pool: ThreadPoolExecutor, storage: Storage, names: Iterable[str], table: bool
) -> Iterator[Part]:
    pending: deque[Future[Part]] = deque()
    for name in names:
        pending.append(pool.submit(read_part, storage, name, table=table))
        if len(pending) >= _AHEAD:
            yield pending.popleft().result()
    while pending:
        yield pending.popleft().result()


@dataclass(frozen=True, slots=True)
class MetadataJob:
    """metadata.parquet from its rows in order: a split's committed rows (``("old",
    SPLIT)``: those of ``previous``'s metadata file) or a staged part (``("part", NAME)``)."""

    storage: Storage
    name: str
    steps: tuple[tuple[str, str], ...]
    previous: ExportConfig | None = None


def write_metadata(job: MetadataJob) -> str | None:
    """Write the job's metadata.parquet (a part at a time); its whole-file checksum."""
    storage = job.storage
    old = (
        old_metadata(storage, job.previous) if any(kind == "old" for kind, _ in job.steps) else None
    )
    names = (what for kind, what in job.steps if kind == "part")
    sink = MetadataSink(storage, job.name)
    try:
        with read_parts(storage, names) as parts:
            _write_rows(job, old, parts, sink)
        sink.commit()
    except BaseException:
        sink.abort()
        raise
    return sink.checksum


def _write_rows(
    job: MetadataJob, old: pa.Table | None, parts: Iterator[Part], sink: MetadataSink
) -> None:
    import pyarrow.compute as pc

    for kind, what in job.steps:
        if kind == "old":
            assert old is not None  # a step "old" only where the export has the file
            rows = old.filter(pc.equal(old.column("split"), what))
        else:
            rows = next(parts).table
        try:
            sink(rows)
        except ValueError as exc:  # pyarrow: the schema differs from the rows before
            raise ExportError(f"the new samples' columns differ from the export's: {exc}") from exc


def remove_staging(storage: Storage, staging: str) -> None:
    """Delete this run's parts (temporary files of killed writers included)."""
    _delete(storage, [p for p in _staged(storage) if p.startswith(staging)])


def remove_killed_parts(storage: Storage, *, rows: bool = True) -> None:
    """Delete the parts that killed runs left (the caller holds the output's lock, so no
    run that is alive stages any) and, with ``rows``, what killed ``write_shardex`` runs
    staged (not when a ``write_shardex`` run that is alive calls: its rows are staged
    there). Other files under the staging folder are left alone."""
    killed = [
        p
        for p in _staged(storage)
        if STAGED_PART.fullmatch(p) or (rows and STAGED_ROWS.fullmatch(p))
    ]
    _delete(storage, killed)


def _staged(storage: Storage) -> list[str]:
    root = storage.local_path(STAGING.rstrip("/"))
    if root is not None and not root.is_dir():  # every export asks: no walk of the output
        return []
    return [p for p in (*storage.list(STAGING), *storage.leftovers()) if p.startswith(STAGING)]


def _delete(storage: Storage, paths: list[str]) -> None:
    # one request each on object storage: a 10,000-shard export's parts at 16 at once
    with ThreadPoolExecutor(min(_DELETES, max(1, len(paths)))) as pool:
        list(pool.map(storage.delete, paths))
    # a local output: the run folders left empty, and the staging folder if it is too
    root = storage.local_path(STAGING.rstrip("/"))
    if root is None or not root.is_dir():
        return
    for folder in {p.split("/")[1] for p in paths if p.count("/") == 2}:
        with contextlib.suppress(OSError):  # not empty: another writer's files are there
            (root / folder).rmdir()
    with contextlib.suppress(OSError):
        root.rmdir()
