"""What a source is: a :class:`Source` yields scan tables of sample references (columns:
:mod:`shardex.refs.scan`, re-exported here for source authors). What it finds but cannot
export is listed as a :class:`LeftOut`, never dropped without a word.
"""

from __future__ import annotations

import os
import queue
import re
import threading
from abc import ABC, abstractmethod
from collections import deque
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

DEFAULT_BATCH_SIZE: Final = 8192
_BAD_KEY_CHARS: Final = re.compile(r"[.]")


_T = TypeVar("_T")
_R = TypeVar("_R")


class MapRunner(Protocol):
    """Where a source may run its scan's work: ``imap(fn, items)`` is ``map`` in order, each
    call perhaps in another process (``fn`` and the items pickle).
    """

    def imap(self, fn: Callable[[_T], _R], items: Iterable[_T]) -> Iterator[_R]: ...


@runtime_checkable
class KeepingRunner(MapRunner, Protocol):
    """A runner whose tasks can leave objects in a store its later tasks read (Ray)."""

    def store_bytes(self) -> int:
        """The store's size (all machines together)."""
        ...

    def imap_kept(
        self, fn: Callable[[_T], Iterator[object]], items: Iterable[_T]
    ) -> Iterator[tuple[object, tuple[Any, ...]]]:
        """``fn(item)`` per item in tasks, in order; each result with handles of what it kept."""
        ...


class Source(ABC):
    """A dataset to export. Subclasses implement :meth:`stream` (batch by batch, bounded
    memory) or :meth:`scan` (the whole table); each defaults to the other.
    """

    kind: ClassVar[str]
    uri: str
    batch_size: int = DEFAULT_BATCH_SIZE
    #: False where inline bytes are made batch by batch from files (an export spills them)
    bytes_in_memory: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not getattr(cls, "__abstractmethods__", None) and (
            cls.stream is Source.stream and cls.scan is Source.scan
        ):
            raise TypeError(f"{cls.__name__} must implement stream() or scan()")

    @classmethod
    def probe(cls, spec: SourceSpec) -> bool:
        """Whether this plugin source reads what the user named."""
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
        """The same batches as :meth:`stream`, the scan's work perhaps done by ``runner``'s tasks.

        The default ignores the runner. The caller keeps the runner open until the stream is read.
        """
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
    """A source at a path, glob or URL: subclasses implement :meth:`stream_on`."""

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
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"batch_size must be a positive int, got {batch_size!r}")
    return batch_size


def safe_key(key: str) -> str:
    """A WebDataset-safe key: dots in its last path component become '_'."""
    head, slash, name = key.replace(os.sep, "/").rpartition("/")
    # a leading "/" stays: "/abs" is refused as an unsafe key, never made "abs"
    return f"{head}{slash}{_BAD_KEY_CHARS.sub('_', name)}"


def key_from_relpath(rel: str) -> str:
    """A key from a relative path without its extension: ``cat/img.v2.jpg`` -> ``cat/img_v2``."""
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


def produced_ahead(
    items: Iterable[_T],
    produce: Callable[[_T], Iterator[Any] | None],
    stop: threading.Event,
    *,
    threads: int,
    chunk: int,
    name: str,
) -> Iterator[tuple[_T, Iterator[Any] | None]]:
    """Each item and the values ``produce(item)`` yields, in order, while threads iterate
    the next ``threads`` items' values ahead (handed over ``chunk`` at a time, two chunks
    held at most; ``produce`` runs here, the thread iterates what it returns); an item
    ``produce`` gives None for comes with None, made by no thread.
    ``stop`` (set once this ends) stops the threads at their next value."""
    started: deque[tuple[_T, queue.Queue[tuple[str, Any]] | None]] = deque()
    rest = iter(items)

    def start_next() -> None:
        for item in rest:
            values = produce(item)
            if values is None:
                started.append((item, None))
                continue
            handed: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=2)
            work = (values, chunk, handed, stop)
            threading.Thread(target=_produce_into, args=work, name=name, daemon=True).start()
            started.append((item, handed))
            return

    try:
        for _ in range(threads):
            start_next()
        while started:
            item, handed = started.popleft()
            if handed is None:
                yield item, None
                continue
            yield item, (value for part in _handed_over(handed, stop) for value in part)
            start_next()
    finally:
        stop.set()  # threads still at work stop at their next value


def _produce_into(
    values: Iterator[Any], chunk: int, handed: queue.Queue[tuple[str, Any]], stop: threading.Event
) -> None:
    try:
        part: list[Any] = []
        for value in values:
            if stop.is_set():  # the reader gave up (the export is over): no more requests
                return
            part.append(value)
            if len(part) >= chunk:
                if not _hand_over(handed, ("part", part), stop):
                    return
                part = []
        if _hand_over(handed, ("part", part), stop):
            _hand_over(handed, ("end", None), stop)
    except BaseException as exc:  # raised again in the reader
        _hand_over(handed, ("error", exc), stop)
    finally:
        close = getattr(values, "close", None)
        if close is not None:  # a tar scan's: its local copy too
            close()


def _hand_over(
    handed: queue.Queue[tuple[str, Any]], item: tuple[str, Any], stop: threading.Event
) -> bool:
    """Put ``item`` on ``handed``; False once ``stop`` is set (the reader gave up)."""
    while not stop.is_set():
        try:
            handed.put(item, timeout=0.2)
            return True
        except queue.Full:
            continue
    return False


def _handed_over(handed: queue.Queue[tuple[str, Any]], stop: threading.Event) -> Iterator[Any]:
    """What a producer thread hands over, raising what it raised; an error, not a wait for
    good, once ``stop`` is set and nothing is left."""
    while True:
        try:
            kind, value = handed.get(timeout=0.2)
        except queue.Empty:
            if stop.is_set() and handed.empty():
                raise RuntimeError(
                    "a thread's items were read after its scan was stopped"
                ) from None
            continue
        if kind == "error":
            raise value
        if kind == "end":
            return
        yield value
