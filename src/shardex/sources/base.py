"""What every source yields: a table of sample references, metadata and labels.

A source's :meth:`Source.scan` returns one Arrow table, one row per sample, with

* ``key`` (string): the sample key, unique in the source; WebDataset rules apply (no dot in
  its last path component, no empty key);
* ``original_path`` (string): where the sample came from, for people;
* ``split`` (string, optional): the split the source puts it in;
* ``label`` (int64, optional): the class number (``label_names`` gives the names);
* ``_members`` (list of struct ``ext, path, offset, size, data``): the sample's stored
  fields, in member order. Each is a byte range of a local file (``offset`` -1 for the whole
  file) or inline ``data``. Bytes are read only when the shard is written;
* ``_invalid`` (string, optional): why the source cannot use the sample (a symlink that
  leaves the source folder, ...); such samples are refused or skipped like corrupt ones;
* any other column: metadata, kept with its type.

What a source finds but cannot export (a broken symlink, a ``.heic`` file, an unreadable
folder, a table row naming a missing file ...) is listed in :attr:`ScanResult.left_out`,
never dropped without a word: the export refuses it, or records it in ``errors.parquet``
under ``on_error="skip"``.
"""

from __future__ import annotations

import os
import queue
import re
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any, ClassVar, Final, Protocol, TypedDict, TypeVar, runtime_checkable

import numpy as np
import pyarrow as pa

from shardex.errors import BadSampleError, ConfigError, SourceError
from shardex.quoting import printable, quoted
from shardex.sources.probe import SourceSpec, check_utf8_path

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "INVALID",
    "MEMBERS",
    "LeftOut",
    "MapRunner",
    "SampleStream",
    "ScanBatch",
    "ScanResult",
    "Source",
    "batch_table",
    "build_table",
    "check_batch_size",
    "check_metadata_names",
    "check_utf8_path",
    "file_member",
    "key_from_relpath",
    "members_array",
    "printable",
    "quoted",
    "safe_key",
]

#: Samples per batch of a source's stream (a batch's references, not its bytes, stay in
#: memory: about 100 bytes per sample).
DEFAULT_BATCH_SIZE: Final = 8192
MEMBERS: Final = "_members"
#: The most inline bytes one piece of a ``_members`` column holds, well inside the 2 GiB
#: that Arrow's 32-bit binary offsets address (a batch with more is cut into pieces of
#: whole samples).
MAX_INLINE_BYTES: Final = 1 << 30
#: Optional column: why the source could not use a sample (None when fine).
INVALID: Final = "_invalid"
MEMBER_TYPE: Final[pa.StructType] = pa.struct(
    [
        ("ext", pa.string()),
        ("path", pa.string()),
        ("offset", pa.int64()),
        ("size", pa.int64()),
        ("data", pa.binary()),
    ]
)


class MemberRow(TypedDict):
    """One member of a ``_members`` list as Arrow's ``to_pylist`` gives it
    (:data:`MEMBER_TYPE`): bytes inline (``data``), or ``size`` bytes at ``offset`` of the
    file or object ``path`` (offset -1: the whole object)."""

    ext: str
    path: str | None
    offset: int
    size: int
    data: bytes | None


#: Columns that shardex fills itself; a source's metadata may not use these names.
RESERVED: Final = frozenset(
    {
        "key",
        "image_id",
        "tar_file",
        "member_name",
        "original_path",
        "metadata",
        "split",
        "export_index",
        "label",
        "sample_index",
        "sample_offset",
        "sample_length",
        "sample_checksum",
        MEMBERS,
        INVALID,
    }
)
_BAD_KEY_CHARS: Final = re.compile(r"[.]")


@dataclass(frozen=True, slots=True)
class LeftOut:
    """A file, folder or row a source found but cannot export, and why.

    ``original_path`` and ``key`` are printable (see :func:`printable`): they go into
    errors.parquet and into one-line error messages.
    """

    original_path: str
    reason: str
    key: str = ""
    #: What refusing it raises (``on_error="error"``).
    error: type[SourceError] = BadSampleError

    def record(self) -> dict[str, str]:
        """Its errors.parquet row."""
        return {"key": self.key, "original_path": self.original_path, "reason": self.reason}


@dataclass(frozen=True, slots=True)
class ScanResult:
    """What a scan found: the sample table, the label names (if labelled), and what it
    found but cannot export."""

    table: pa.Table
    label_names: tuple[str, ...] | None = None
    left_out: tuple[LeftOut, ...] = ()


@dataclass(frozen=True, slots=True)
class ScanBatch:
    """Some of a source's samples (rows as in a scan table) and what it left out while
    finding them."""

    table: pa.Table
    left_out: tuple[LeftOut, ...] = ()


@dataclass(frozen=True, slots=True)
class SampleStream:
    """A source's samples, batch by batch, as it finds them.

    ``label_names`` is known before the first batch. Every batch has ``key``,
    ``original_path`` and ``_members``; ``split`` and ``label`` are in every batch or in
    none; ``_invalid`` may be missing (every sample usable); metadata columns may differ
    between batches (a column a batch lacks is null for its rows); a column has one type
    in every batch that has it, but for integers that a later batch widens to floats (a
    source refuses any other change in one line): consumers join batches with Arrow's
    permissive promotion, as :meth:`Source.scan` does.
    """

    batches: Iterator[ScanBatch]
    label_names: tuple[str, ...] | None = None


def batch_types_error(uri: str, exc: Exception) -> SourceError:
    """The error for batches of a source whose columns' types cannot be joined (a column
    of text in one batch and of numbers in another)."""
    why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return SourceError(
        f"source {quoted(uri)} gives a column different types in different batches "
        f"({quoted(why)}); give each column one type (or types that widen: int to float)"
    )


_T = TypeVar("_T")
_R = TypeVar("_R")


class MapRunner(Protocol):
    """Where a source may run its scan's work: ``imap(fn, items)`` is ``map(fn, items)``
    in order, each call perhaps in another process or machine (``fn`` and the items
    pickle). :class:`shardex.parallel.Runner` and the Ray executor's runner are ones."""

    def imap(self, fn: Callable[[_T], _R], items: Iterable[_T]) -> Iterator[_R]: ...


@runtime_checkable
class KeepingRunner(MapRunner, Protocol):
    """A runner whose tasks can leave objects in a store that its later tasks read, on
    any machine (Ray's object store; see :mod:`shardex.storage.fetch.held`)."""

    def store_bytes(self) -> int:
        """The store's size (all machines together)."""
        ...

    def imap_kept(
        self, fn: Callable[[_T], Iterator[object]], items: Iterable[_T]
    ) -> Iterator[tuple[object, tuple[Any, ...]]]:
        """``fn(item)`` for each item, in order, each in a task: ``fn`` yields objects to
        keep, then its result; each result comes with the handles of what its task
        kept (the objects stay in the store, not in this process)."""
        ...


class Source(ABC):
    """A dataset to export. Subclasses implement :meth:`stream` (the samples batch by
    batch, with memory that does not grow with the dataset) or :meth:`scan` (the whole
    table at once); each has a default built from the other."""

    #: Short name of the kind of source, recorded in config.yaml.
    kind: ClassVar[str]
    #: Where it is (path, glob, ``demo``).
    uri: str
    #: Samples per batch of :meth:`stream` (the last batch may be shorter; a source may
    #: cut a batch shorter to keep its inline bytes addressable).
    batch_size: int = DEFAULT_BATCH_SIZE
    #: Whether inline bytes in its batches are memory the source holds anyway (arrays in
    #: memory: an export writes them from this process), rather than bytes made batch by
    #: batch from files (an array backend's export re-exported: spilled to scratch).
    bytes_in_memory: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not getattr(cls, "__abstractmethods__", None) and (
            cls.stream is Source.stream and cls.scan is Source.scan
        ):
            raise TypeError(f"{cls.__name__} must implement stream() or scan()")

    @classmethod
    def probe(cls, spec: SourceSpec) -> bool:
        """Whether this source reads what the user named (asked of a plugin source; the
        built-ins' probes are the registry's, see :mod:`shardex.sources.registry`)."""
        return False

    @classmethod
    def from_spec(cls, spec: SourceSpec) -> Source:
        """This source, made from what the user named (once a probe took it)."""
        raise NotImplementedError(f"{cls.__name__} is not made from a spec")

    def stream(self) -> SampleStream:
        """The samples in batches, in source order (no image bytes are read)."""
        scan = self.scan()
        return SampleStream(iter([ScanBatch(scan.table, scan.left_out)]), scan.label_names)

    def stream_on(self, runner: MapRunner | None) -> SampleStream:
        """:meth:`stream`, its scan's work perhaps done by ``runner``'s tasks (a source
        that scans many files: tars); the batches are the same, in the same order,
        whatever the runner. The default ignores the runner. The caller keeps the runner
        open until the stream is read."""
        return self.stream()

    def scan(self) -> ScanResult:
        """Every sample in one table (no image bytes are read)."""
        stream = self.stream()
        tables: list[pa.Table] = []
        left_out: list[LeftOut] = []
        for batch in stream.batches:
            tables.append(batch.table)
            left_out += batch.left_out
        if not tables:
            raise SourceError(f"source {quoted(self.uri)} yielded no batch of samples")
        try:
            table = pa.concat_tables(tables, promote_options="permissive")
        except (pa.ArrowTypeError, pa.ArrowInvalid) as exc:
            raise batch_types_error(self.uri, exc) from exc
        if INVALID in table.column_names:  # first found in a later batch: back to its place
            names = [c for c in table.column_names if c != INVALID]
            names.insert(names.index(MEMBERS) + 1, INVALID)
            table = table.select(names)
        return ScanResult(table, stream.label_names, tuple(left_out))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.uri!r})"


class StoredSource(Source):
    """A source at a path, glob or URL (local or on object storage) whose scan a
    runner's tasks may share: subclasses implement :meth:`stream_on`, and
    :meth:`stream` is that without a runner."""

    @classmethod
    def from_spec(cls, spec: SourceSpec) -> Source:
        return cls(spec.location, spec.storage_options if spec.is_url else None)

    def __init__(
        self,
        spec: str | os.PathLike[str],
        storage_options: dict[str, Any] | None = None,
        *,
        batch_size: int = DEFAULT_BATCH_SIZE,
    ) -> None:
        self.uri = os.fspath(spec)
        self.storage_options = storage_options
        self.batch_size = check_batch_size(batch_size)

    def stream(self) -> SampleStream:
        return self.stream_on(None)

    @abstractmethod
    def stream_on(self, runner: MapRunner | None) -> SampleStream: ...


def check_batch_size(batch_size: int) -> int:
    """A stream's batch size, refused in one line unless a positive int."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"batch_size must be a positive int, got {batch_size!r}")
    return batch_size


def safe_key(key: str) -> str:
    """A WebDataset-safe key: dots in the last path component become '_'.

    WebDataset splits a member name at the first dot of its last component, so a key may
    not hold one there.
    """
    head, slash, name = key.replace(os.sep, "/").rpartition("/")
    # (a leading "/" stays: "/abs" is refused as an unsafe key, never made "abs")
    return f"{head}{slash}{_BAD_KEY_CHARS.sub('_', name)}"


def key_from_relpath(rel: str) -> str:
    """A key from a relative path: drop the extension; ``cat/img.v2.jpg`` -> ``cat/img_v2``.

    The original name stays in ``original_path``.
    """
    rel = rel.replace(os.sep, "/")
    stem = rel.rsplit(".", 1)[0] if "." in rel.rpartition("/")[2] else rel
    return safe_key(stem)


def file_member(path: str, size: int, ext: str) -> dict[str, Any]:
    """A member that is a whole local file."""
    return {"ext": ext, "path": path, "offset": -1, "size": size, "data": None}


def check_metadata_names(names: list[str], where: str) -> None:
    """Refuse metadata columns whose names shardex uses itself."""
    clash = sorted(set(names) & (RESERVED - {"key", "original_path", "split", "label"}))
    if clash:
        raise SourceError(
            f"{where}: column(s) {', '.join(clash)} are reserved by shardex; rename them "
            "in the source"
        )


def members_array(
    offsets: Any,
    ext: Any,
    path: Any,
    offset: Any,
    size: Any,
    data: Any = None,
) -> pa.Array | pa.ChunkedArray:
    """The ``_members`` column built column by column (no dict per member).

    ``offsets`` (n + 1 numbers) says where each sample's members start in the flat member
    columns ``ext``, ``path``, ``offset``, ``size`` and ``data`` (lists or Arrow arrays;
    ``data`` None when no member is inline). Inline bytes (a list) of more than
    :data:`MAX_INLINE_BYTES` come back as a ChunkedArray, each piece whole samples.
    """
    if isinstance(data, list):
        cuts = _inline_cuts(offsets, data)
        if len(cuts) > 2:
            at = np.asarray(offsets, np.int64)
            pieces = []
            for a, b in pairwise(cuts):
                lo, hi = int(at[a]), int(at[b])
                flat = [None if v is None else v[lo:hi] for v in (ext, path, offset, size, data)]
                pieces.append(_members(at[a : b + 1] - lo, *flat))
            return pa.chunked_array(pieces, pa.list_(MEMBER_TYPE))
    return _members(offsets, ext, path, offset, size, data)


def _inline_cuts(offsets: Any, data: list[bytes | None]) -> list[int]:
    """Sample numbers that cut a batch into pieces of at most :data:`MAX_INLINE_BYTES`
    inline bytes (first 0, last the number of samples)."""
    sizes = np.fromiter((0 if d is None else len(d) for d in data), np.int64, len(data))
    before = np.concatenate([[0], np.cumsum(sizes)])[np.asarray(offsets, np.int64)]
    samples = len(before) - 1
    cuts = [0]
    if before[-1] > MAX_INLINE_BYTES:  # rare: only then a loop over the samples
        for s in range(1, samples):
            if before[s + 1] - before[cuts[-1]] > MAX_INLINE_BYTES:
                cuts.append(s)
    return [*cuts, samples]


def _members(offsets: Any, ext: Any, path: Any, offset: Any, size: Any, data: Any) -> pa.Array:
    flat = len(ext)
    children = [
        _as_array(ext, pa.string()),
        pa.nulls(flat, pa.string()) if path is None else _as_array(path, pa.string()),
        _as_array(offset, pa.int64()),
        _as_array(size, pa.int64()),
        pa.nulls(flat, pa.binary()) if data is None else _as_array(data, pa.binary()),
    ]
    struct = pa.StructArray.from_arrays(children, fields=list(MEMBER_TYPE))
    return pa.ListArray.from_arrays(_as_array(offsets, pa.int32()), struct)


def _as_array(values: Any, type_: pa.DataType) -> pa.Array:
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if isinstance(values, pa.Array):
        return values if values.type == type_ else values.cast(type_)
    return pa.array(values, type_)


def batch_table(
    keys: Any,
    original_paths: Any,
    members: pa.Array | pa.ChunkedArray,
    *,
    splits: Any = None,
    labels: Any = None,
    metadata: pa.Table | None = None,
    invalid: Any = None,
) -> pa.Table:
    """Assemble a scan table from columns (lists or Arrow arrays) and a ``_members``
    column (see :func:`members_array`)."""
    columns: dict[str, pa.Array | pa.ChunkedArray] = {
        "key": _as_array(keys, pa.string()),
        "original_path": _as_array(original_paths, pa.string()),
    }
    if splits is not None:
        columns["split"] = _as_array(splits, pa.string())
    if labels is not None:
        columns["label"] = _as_array(labels, pa.int64())
    columns[MEMBERS] = members
    if invalid is not None:
        invalid = _as_array(invalid, pa.string())
        if invalid.null_count < len(invalid):
            columns[INVALID] = invalid
    table = pa.table(columns)
    if metadata is not None:
        for name in metadata.column_names:
            table = table.append_column(name, metadata.column(name))
    return table


def build_table(
    keys: list[str],
    original_paths: list[str],
    members: list[list[dict[str, Any]]] | pa.Array,
    *,
    splits: Sequence[str | None] | None = None,
    labels: list[int | None] | None = None,
    metadata: pa.Table | None = None,
    invalid: list[str | None] | None = None,
) -> pa.Table:
    """Assemble a scan table from per-sample lists (and optional metadata columns)."""
    return batch_table(
        keys,
        original_paths,
        members if isinstance(members, pa.Array) else pa.array(members, pa.list_(MEMBER_TYPE)),
        splits=splits,
        labels=labels,
        metadata=metadata,
        invalid=invalid,
    )


def hand_over(
    handed: queue.Queue[tuple[str, Any]], item: tuple[str, Any], stop: threading.Event
) -> bool:
    """Put a producer thread's ``item`` on ``handed``; False once ``stop`` is set (the
    reader gave up), so the thread never blocks for good on a queue nobody reads."""
    while not stop.is_set():
        try:
            handed.put(item, timeout=0.2)
            return True
        except queue.Full:
            continue
    return False


def handed_over(handed: queue.Queue[tuple[str, Any]]) -> Iterator[Any]:
    """What a producer thread hands over with :func:`hand_over`, until its end; what it
    raised is raised here."""
    while True:
        kind, value = handed.get()
        if kind == "error":
            raise value
        if kind == "end":
            return
        yield value
