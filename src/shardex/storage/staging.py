"""What a writer stages inside the output (``OUT/.shardex-staging/RUN/``), never part of
an export: a remote runner's shard tasks stage metadata rows and index arrays as parts
that other tasks merge, so no per-sample byte passes through the driver. A killed run's
parts are removed by the next run (which holds the lock).
"""

from __future__ import annotations

import contextlib
import io
import re
import secrets
import threading
import zipfile
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from shardex.errors import FormatError
from shardex.format.tables import ipc_bytes
from shardex.storage.base import Storage

_TABLE: Final = "table"
_DELETES: Final = 16
_AHEAD: Final = 8
#: Parts are read once or twice, by tasks: lz4 keeps them small for little CPU.
_IPC: Final = pa.ipc.IpcWriteOptions(compression="lz4" if pa.Codec.is_available("lz4") else None)


STAGING: Final = ".shardex-staging/"

#: A staged part, or its temporary file while it is written (a local output's).
STAGED_PART: Final = re.compile(
    re.escape(STAGING) + r"[0-9a-f]{12}/\.?part-[0-9a-f]{16}\.npz(?:\.tmp-[0-9a-f]+)?"
)
#: What a ``write_shardex`` task stages (:mod:`shardex.ray.write`), or its temporary file.
STAGED_ROWS: Final = re.compile(
    re.escape(STAGING)
    + r"[0-9a-f]{12}/\.?task-[0-9]{6,}-[0-9a-f]{8}\.(bin|parquet)(\.tmp-[0-9a-f]+)?"
)


def is_staged(path: str) -> bool:
    """Whether ``path`` is a name our staging layout makes (others there are foreign)."""
    return STAGED_PART.fullmatch(path) is not None or STAGED_ROWS.fullmatch(path) is not None


def new_staging() -> str:
    return f"{STAGING}{secrets.token_hex(6)}/"


def put_part(
    storage: Storage, staging: str, table: pa.Table, arrays: dict[str, npt.NDArray[Any]]
) -> str:
    """Stage one shard's metadata rows and arrays; the part's name, new per attempt."""
    out = io.BytesIO()
    named: dict[str, Any] = {_TABLE: np.frombuffer(ipc_bytes(table, _IPC), np.uint8), **arrays}
    np.savez(out, **named)
    name = f"{staging}part-{secrets.token_hex(8)}.npz"
    storage.put(name, out.getvalue())
    return name


#: numpy parses each ``.npy`` header with ``ast.literal_eval``, which CPython 3.11 cannot
#: run in two threads at once: "SystemError: AST constructor recursion depth mismatch"
#: (CPython gh-106905), seen once in a Ray task merging a split's index.
_DECODING: Final = threading.Lock()


@dataclass(frozen=True, slots=True)
class Part:
    table: pa.Table
    arrays: dict[str, npt.NDArray[Any]]


def read_part(storage: Storage, name: str, *, table: bool = True) -> Part:
    """A part as :func:`put_part` staged it (``table=False``: its arrays only)."""
    raw_part = storage.get(name)  # a part gone, a store failing: its storage error
    try:  # fetched at once by read_parts' threads, decoded one at a time
        with _DECODING, np.load(io.BytesIO(raw_part), allow_pickle=False) as data:
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
    """The parts in order, :data:`_AHEAD` fetched at once. A context, not a generator owning
    the threads: a held error's traceback would keep the generator and its threads alive."""
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


def remove_staging(storage: Storage, staging: str) -> None:
    """Delete this run's parts (temporary files of killed writers included)."""
    _delete(storage, [p for p in _staged(storage) if p.startswith(staging)])


def remove_killed_parts(storage: Storage, *, rows: bool = True) -> None:
    """Delete the parts killed runs left (the caller holds the lock) and, with ``rows``,
    what killed ``write_shardex`` runs staged; foreign files stay."""
    wanted = (STAGED_PART, STAGED_ROWS) if rows else (STAGED_PART,)
    _delete(storage, [p for p in _staged(storage) if any(r.fullmatch(p) for r in wanted)])


def _staged(storage: Storage) -> list[str]:
    root = storage.local_path(STAGING.rstrip("/"))
    if root is not None and not root.is_dir():  # every export asks: no walk of the output
        return []
    return [p for p in (*storage.list(STAGING), *storage.leftovers()) if p.startswith(STAGING)]


def _delete(storage: Storage, paths: list[str]) -> None:
    with ThreadPoolExecutor(min(_DELETES, max(1, len(paths)))) as pool:
        list(pool.map(storage.delete, paths))
    root = storage.local_path(STAGING.rstrip("/"))
    if root is None or not root.is_dir():
        return
    for folder in {p.split("/")[1] for p in paths if p.count("/") == 2}:
        with contextlib.suppress(OSError):  # not empty: another writer's files are there
            (root / folder).rmdir()
    with contextlib.suppress(OSError):
        root.rmdir()
