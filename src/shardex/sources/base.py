"""What a source is: a :class:`Source` yields a scan table of sample references,
metadata and labels (its columns: :mod:`shardex.refs.scan`, whose builders this module
re-exports for source authors), whole (:meth:`Source.scan`) or batch by batch
(:meth:`Source.stream`). What a source finds but cannot export (a broken symlink, a
``.heic`` file, an unreadable folder, a table row naming a missing file ...) is listed as
a :class:`LeftOut`, never dropped without a word: the export refuses it, or records it in
``errors.parquet`` under ``on_error="skip"``.
"""

from __future__ import annotations

import os
import queue
import re
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from typing import Any, ClassVar, Final, Protocol, TypeVar, runtime_checkable

import pyarrow as pa

from shardex.errors import ConfigError, SourceError
from shardex.quoting import printable, quoted
from shardex.refs.scan import (
    INVALID,
    MEMBERS,
    RESERVED,
    LeftOut,
    SampleStream,
    ScanBatch,
    ScanResult,
    batch_table,
    batch_types_error,
    build_table,
    file_member,
    members_array,
)
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
_BAD_KEY_CHARS: Final = re.compile(r"[.]")


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


def check_metadata_names(names: list[str], where: str) -> None:
    """Refuse metadata columns whose names shardex uses itself."""
    clash = sorted(set(names) & (RESERVED - {"key", "original_path", "split", "label"}))
    if clash:
        raise SourceError(
            f"{where}: column(s) {', '.join(clash)} are reserved by shardex; rename them "
            "in the source"
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
