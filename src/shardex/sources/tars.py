"""Existing WebDataset tars: a folder of ``.tar`` files, a glob, or one tar.

Members are grouped into samples by key (the name up to the first dot of its last path
component), in tar order. ``.cls`` members become the ``label`` column and ``.json``
members become metadata columns; every other member is kept byte for byte, as a
reference (its tar, offset and size: read when its shard is written). Tars on object
storage are scanned by ranged GETs (see :mod:`shardex.storage.fetch.tars`), many at a
time; :meth:`TarSource.stream_on` scans each tar in a task of a runner (on Ray, the task
keeps what it read for the shards' tasks: see :mod:`shardex.storage.fetch.held`).

Hostile or damaged tars never lose samples silently. What cannot be used marks its sample
invalid (``_invalid``), so the export refuses it, or skips it and records it in
``errors.parquet`` under ``--on-error skip``:

* a member that is not a regular file (hard or symbolic link, device, fifo, sparse file);
  directory entries hold no data and are ignored;
* a tar that ends early (cut at a block boundary, inside a header or inside a member),
  holds a bad header, or has data after its end-of-archive blocks (tars joined with
  ``cat``): its last sample may be incomplete and any later ones are lost, so the last
  sample read is marked with the tar, the byte offset and what was found (a tar damaged
  before its first sample is a :class:`SourceError`);
* a member named twice in one sample, a name that is not UTF-8 or has no extension;
* a ``.json`` member that is not valid JSON, not an object, nested too deep, or holds an
  empty object somewhere (see :mod:`shardex.sources.jsonmeta`, which also makes the
  metadata columns).
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import os
import posixpath
import queue
import tarfile
import threading
import warnings
from collections import deque
from collections.abc import Generator, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, ClassVar, Final, cast

import pyarrow as pa

from shardex.errors import (
    EmptySourceError,
    ObjectNotFoundError,
    RefetchWarning,
    SourceError,
    SourceNotFoundError,
    StorageError,
)
from shardex.format.tar import BLOCK, split_name
from shardex.quoting import quoted
from shardex.refs.scan import SampleStream, ScanBatch, batch_table, members_array
from shardex.sources import tarheaders
from shardex.sources.base import (
    KeepingRunner,
    MapRunner,
    StoredSource,
    check_metadata_names,
    hand_over,
    safe_key,
)
from shardex.sources.jsonmeta import MetadataTypes, json_member, metadata_columns, printable
from shardex.storage import Storage
from shardex.storage.fetch.held import HOLD_SHARE, HeldTars, Part, TarHold, held_tars
from shardex.storage.fetch.objects import is_url, register
from shardex.storage.fetch.tars import (
    RangedTar,
    TarCopies,
    TarCopy,
    kept_copies,
    object_tars,
    open_object_tar,
)

_ZERO_BLOCK: Final = bytes(BLOCK)
_SCAN_CHUNK: Final = 1 << 20
# Types tarfile reports that hold no sample data: directories are structure, not samples.
_IGNORED_TYPES: Final = (tarfile.DIRTYPE,)
_TYPE_NAMES: Final = {
    tarfile.LNKTYPE: "a hard link",
    tarfile.SYMTYPE: "a symbolic link",
    tarfile.CHRTYPE: "a character device",
    tarfile.BLKTYPE: "a block device",
    tarfile.FIFOTYPE: "a fifo",
}


def _tar_paths(spec: str) -> list[Path]:
    path = Path(spec).expanduser()
    if path.is_dir():
        found = sorted(p for p in path.rglob("*.tar") if p.is_file())
    elif any(c in spec for c in "*?["):
        found = sorted(Path(p) for p in glob.glob(os.path.expanduser(spec), recursive=True))
    elif path.is_file():
        found = [path]
    else:
        raise SourceNotFoundError(f"no tar files at {spec!r}")
    if not found:
        raise EmptySourceError(f"no .tar files match {spec!r}")
    return [p.absolute() for p in found]


@dataclass(slots=True)
class _Sample:
    """The sample being read: consecutive members with one key."""

    key: str
    #: its members: (extension, data offset, size, copy) in its tar: their bytes stay in
    #: the tar, read when the shard is written (a scan never holds them), or in a local
    #: copy of what the scan read of a tar on object storage (``copy``: its path)
    members: list[tuple[str, int, int, str | None]] = field(default_factory=list)
    label: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    problem: str | None = None
    seen: set[str] = field(default_factory=set)  # extensions read

    def refuse(self, reason: str) -> None:
        """Mark the sample unusable (the first reason wins)."""
        self.problem = self.problem or reason

    def done(self) -> _Sample:
        """The sample read whole (what it no longer needs dropped: it may be pickled)."""
        self.seen = set()
        return self


class _Batcher:
    """Collects samples from tars into scan-table columns, a batch at a time."""

    def __init__(self, where: str, batch_size: int) -> None:
        self.where = where
        self.batch_size = batch_size
        self.types = MetadataTypes(where, batch_size)
        #: whether batches have a label column: decided by the first batch
        self.with_label: bool | None = None
        self.samples = 0
        self._clear()

    def _clear(self) -> None:
        self.keys: list[str] = []
        self.originals: list[str] = []
        self.offsets: list[int] = [0]
        self.ext: list[str] = []
        self.path: list[str | None] = []
        self.offset: list[int] = []
        self.size: list[int] = []
        self.labels: list[int | None] = []
        self.meta: list[dict[str, Any]] = []
        self.invalid: list[str | None] = []

    def add(self, sample: _Sample, path: str, original: str, key_prefix: str) -> None:
        self.keys.append(safe_key(key_prefix + sample.key))
        self.originals.append(original)
        for ext, offset, size, copy in sample.members:
            self.ext.append(ext)
            self.offset.append(offset)
            self.size.append(size)
            self.path.append(copy or path)
        self.offsets.append(len(self.ext))
        self.labels.append(sample.label)
        # an unusable sample's fields are not kept: they must not shape the schema
        self.meta.append(sample.meta if sample.problem is None else {})
        self.invalid.append(sample.problem)
        self.samples += 1

    def full(self) -> bool:
        return len(self.keys) >= self.batch_size

    def flush(self) -> pa.Table:
        """The scan table of the samples collected since the last flush."""
        meta = metadata_columns(self.meta, self.keys, self.originals, self.where)
        if meta is not None:
            check_metadata_names(meta.column_names, self.where)
            meta = self.types.fit(meta, self.keys, self.originals)
        has_labels = any(label is not None for label in self.labels)
        if self.with_label is None:
            self.with_label = has_labels
        elif has_labels and not self.with_label:
            first = next(i for i, label in enumerate(self.labels) if label is not None)
            raise SourceError(
                f"{self.where}: sample {self.keys[first]!r} ({self.originals[first]!r}) has a "
                f".cls label but the first {self.batch_size} samples have none; give every "
                "sample a .cls member, or none"
            )
        table = batch_table(
            self.keys,
            self.originals,
            members_array(
                self.offsets,
                self.ext,
                self.path,
                self.offset,
                self.size,
                None,
            ),
            labels=self.labels if self.with_label else None,
            metadata=meta,
            invalid=self.invalid,
        )
        self._clear()
        return table


@dataclass(frozen=True, slots=True)
class TarRef:
    """One tar of a source: a local file (``storage`` None, ``path`` absolute) or an
    object (``path`` below the ``storage``'s root), ``size`` bytes, named ``rel`` in
    its samples' ``original_path``. Pickles (with its storage's options) to the process
    that scans it; ``copies``: where a scan in this process keeps what it reads (see
    :mod:`shardex.storage.fetch.tars`; never for a scan by a remote task); ``hold``:
    whether a Ray task's scan keeps what it reads (see :mod:`shardex.storage.fetch.held`)."""

    path: str
    rel: str
    size: int
    storage: Storage | None = None
    copies: TarCopies | None = None
    hold: bool = False

    @property
    def where(self) -> str:
        """The local path or object URL: what its members name."""
        return self.path if self.storage is None else self.storage.join(self.path)


def tar_samples(tar: TarRef, hold: TarHold | None = None) -> Generator[_Sample, None, None]:
    """The samples of one tar, in order, as references to its members' bytes (only
    ``.cls`` and ``.json`` members are read); a damaged tar's last sample is marked.
    ``hold``: where a Ray task's scan keeps the members it read (a tar on object storage).

    A tar that cannot be opened at all is one sample named by the tar, marked unusable.

    Raises:
        SourceError: the local tar cannot be opened as a file.
    """
    where = tar.where
    raw: IO[bytes]
    if tar.storage is None:
        try:
            raw = open(where, "rb")  # noqa: SIM115 (closed below)
        except OSError as exc:
            raise SourceError(f"cannot read tar {where!r}: {exc.strerror}") from exc
    else:
        opened = open_object_tar(tar.storage, tar.path, tar.size, tar.copies, hold)
        raw = cast("IO[bytes]", opened)
    try:
        # tarfile seeks to each header itself, so the member reads may share the file
        try:
            tf = tarfile.open(fileobj=raw, mode="r:")  # noqa: SIM115 (closed in scan_members)
        except (tarfile.TarError, OSError) as exc:
            if _store_failed(exc):
                raise
            # one unreadable tar (0 or 1 byte, no tar at all) is one bad sample, named by
            # the tar: refused, or skipped and recorded while the other tars are exported
            unreadable = _Sample(tar.rel)
            unreadable.refuse(f"not a readable tar at byte 0: {printable(str(exc))}")
            yield unreadable
            return
        size = os.fstat(raw.fileno()).st_size if tar.storage is None else tar.size
        copy = raw.copy if isinstance(raw, RangedTar) else None
        for sample in scan_members(tf, raw, rel=tar.rel, size=size):
            if isinstance(copy, TarHold):
                copy.take(sample.members)
            yield _in_copy(sample, copy) if isinstance(copy, TarCopy) else sample
    finally:
        raw.close()


def _in_copy(sample: _Sample, copy: TarCopy) -> _Sample:
    """The sample, its members whose bytes the scan read named in the tar's copy (the
    scan is past them: it has read the next sample's header, or the tar's end)."""
    members = sample.members
    for i, (ext, offset, size, _) in enumerate(members):
        if copy.holds(offset, size):
            members[i] = (ext, offset, size, str(copy.path))
            copy.used = True
    if members:
        copy.forget(members[-1][1] + members[-1][2])
    return sample


def tar_sample_list(tar: TarRef) -> tuple[TarRef, list[_Sample]]:
    """Every sample of one tar (what a runner's task hands back: references only)."""
    return tar, list(tar_samples(tar))


#: What a Ray task's scan of one tar hands back last: the tar, its samples (references
#: only) and the tar range of each part it yielded before.
HeldScan = tuple[TarRef, list[_Sample], list[tuple[int, int]]]


def tar_scan_held(tar: TarRef) -> Iterator[Part | HeldScan]:
    """A task's scan of one tar that keeps, where ``tar.hold``, the members it read in
    parts (see :mod:`shardex.storage.fetch.held`): yields each part as it fills (Ray stores each
    as an object on the task's node), then the tar's :data:`HeldScan`."""
    # no ``yield from``: Ray's generator tasks send values in, which a list's iterator
    # cannot take
    hold = TarHold() if tar.hold else None
    samples: list[_Sample] = []
    with contextlib.closing(tar_samples(tar, hold)) as scan:
        for sample in scan:
            samples.append(sample)
            for part in hold.ready() if hold is not None else ():
                yield part
    for part in hold.finish() if hold is not None else ():
        yield part
    yield tar, samples, hold.spans if hold is not None else []


def scan_members(
    tf: tarfile.TarFile,
    raw: IO[bytes],
    *,
    rel: str,
    size: int,
) -> Iterator[_Sample]:
    """The samples of an open tar of ``size`` bytes (see :func:`tar_samples`)."""
    headers = tarheaders.Headers(tf, raw, fast=tarheaders.FAST)
    with tf:
        sample: _Sample | None = None
        damage: str | None = None
        while True:
            try:
                info = headers.next()
            except (tarfile.TarError, OSError, ValueError) as exc:  # e.g. a long name alone,
                # or a GNU sparse map that is not numbers (tarfile lets int() raise)
                if _store_failed(exc):
                    raise
                damage = f"bad tar header at byte {tf.offset} ({printable(str(exc))})"
                break
            if info is None:
                damage = _end_problem(raw, tf.offset, size)
                break
            if info.type in _IGNORED_TYPES:
                continue
            name = _utf8(info.name)
            key, ext = split_name(name)
            if sample is None or key != sample.key:
                if sample is not None:
                    yield sample.done()
                sample = _Sample(key)
            if info.isreg() and info.offset_data + info.size > size:
                damage = (
                    f"member {name!r} at byte {info.offset} runs past the end of the tar "
                    f"({info.offset_data + info.size} > {size} bytes)"
                )
                break
            _read_member(raw, info, name, ext, sample)
        if damage is not None:
            if sample is None:
                raise SourceError(
                    f"tar {rel!r}: {damage} before any sample; re-create or remove the tar"
                )
            sample.refuse(
                f"tar {rel!r} is damaged: {damage}; this sample may be incomplete and any "
                "later samples of the tar are lost"
            )
        if sample is not None:
            yield sample.done()


def _store_failed(exc: BaseException) -> bool:
    """Whether a tar on object storage could not be read because its store failed
    (after the storage layer's retries: down, access denied): that stops the export. A
    tar gone since it was listed reads as damaged, as any object gone before it is read."""
    return isinstance(exc, StorageError) and not isinstance(exc, ObjectNotFoundError)


def _end_problem(raw: IO[bytes], offset: int, size: int) -> str | None:
    """Why the tar does not end properly at ``offset``, or None.

    tarfile stops quietly at end of file, at a short header and at a bad header after the
    first one, so a cut tar would read as a shorter one: a well-formed tar has a zero block
    where its members end.
    """
    raw.seek(offset)
    block = raw.read(BLOCK)
    if block == _ZERO_BLOCK:
        return _data_after_end(raw, offset)
    if len(block) < BLOCK:
        return (
            f"it ends at byte {size} without its end-of-archive blocks (cut short?)"
            if not block
            else f"it ends inside the header at byte {offset} ({size} bytes)"
        )
    return f"bad tar header at byte {offset}"


def _data_after_end(raw: IO[bytes], offset: int) -> str | None:
    """Why bytes after the end-of-archive block matter (tars joined with ``cat``: tarfile
    and GNU tar stop at the first tar's end), or None when only zero padding follows."""
    raw.seek(offset)
    while chunk := raw.read(_SCAN_CHUNK):
        if chunk.count(0) != len(chunk):
            at = offset + next(i for i, b in enumerate(chunk) if b)
            return f"data follows its end-of-archive blocks at byte {at} (tars joined with cat?)"
        offset += len(chunk)
    return None


def _utf8(name: str) -> str:
    """A member name as text that Arrow can store (tarfile keeps bad UTF-8 as surrogates)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return name


def _read_member(raw: IO[bytes], info: tarfile.TarInfo, name: str, ext: str, s: _Sample) -> None:
    """Add one member to its sample, or say why the sample cannot be used."""
    problem = _member_problem(info, name, ext, s.seen)
    s.seen.add(ext)
    if problem is not None:
        s.refuse(problem)
    elif ext == "cls":
        s.label = _read_label(raw, info, name, s)
    elif ext == "json":
        s.meta, problem = json_member(_read(raw, info), name)
        if problem is not None:
            s.refuse(problem)
    else:
        s.members.append((ext, info.offset_data, info.size, None))


def _member_problem(info: tarfile.TarInfo, name: str, ext: str, seen: set[str]) -> str | None:
    """Why a member cannot be exported, or None."""
    if not info.isreg() or info.sparse is not None:
        kind = "a sparse file" if info.isreg() else _TYPE_NAMES.get(info.type)
        kind = kind or f"an entry of tar type {info.type!r}"
        target = f" to {info.linkname!r}" if info.islnk() or info.issym() else ""
        return f"member {name!r} is {kind}{target}; only regular files are exported"
    if name != info.name:
        return f"member name {name!r} is not UTF-8"
    if not ext:
        return f"member {name!r} has no extension"
    if ext in seen:  # a reader would keep one of the two: the other would vanish
        return f"member {name!r} appears twice in its sample"
    return None


def _read(raw: IO[bytes], info: tarfile.TarInfo) -> bytes:
    raw.seek(info.offset_data)
    return raw.read(info.size)


def _read_label(raw: IO[bytes], info: tarfile.TarInfo, name: str, s: _Sample) -> int | None:
    text = _read(raw, info).strip()
    try:
        return int(text)
    except ValueError:
        s.refuse(f"member {name!r} is not an integer class ({text[:40]!r})")
        return None


class TarSource(StoredSource):
    """Samples from existing WebDataset tar files."""

    kind: ClassVar[str] = "webdataset-tars"

    def stream_on(self, runner: MapRunner | None) -> SampleStream:
        """The samples in batches (see :meth:`Source.stream`); with a ``runner``, each
        tar is scanned by one of its tasks (``runner.imap``, in order), which hands back
        the tar's sample references; the batches are the same whatever the runner.
        Without one, tars on object storage are scanned by threads, a few ahead."""
        tars = self._tars()
        scanned: Iterator[tuple[TarRef, Iterable[_Sample]]]
        held = held_tars()
        if runner is not None:  # its tasks may run on other machines: no local copies
            tars = [dataclasses.replace(tar, copies=None) for tar in tars]
            if (
                held is not None
                and isinstance(runner, KeepingRunner)
                and tars[0].storage is not None
            ):
                scanned = _scanned_held(runner, held, tars)
            else:
                scanned = runner.imap(tar_sample_list, tars)
        elif tars[0].storage is not None:
            scanned = _scanned_ahead(tars, SCAN_THREADS)
        else:
            scanned = ((tar, tar_samples(tar)) for tar in tars)
        return SampleStream(self._batches(scanned))

    def _tars(self) -> list[TarRef]:
        """The source's tars, in order (a store on object storage registered to serve
        their members' bytes, see :mod:`shardex.storage.fetch.objects`)."""
        if not is_url(self.uri):
            paths = _tar_paths(self.uri)
            root = os.path.commonpath([str(p.parent) for p in paths])
            return [TarRef(str(p), os.path.relpath(p, root).replace(os.sep, "/"), 0) for p in paths]
        storage, found = object_tars(self.uri, self.storage_options)
        register(storage)
        parents = [posixpath.dirname(p) for p, _ in found]
        base = posixpath.commonpath(parents) if all(parents) else ""
        copies = kept_copies()
        if copies is not None:
            copies.expect(sum(size for _, size in found))
        return [
            TarRef(path, posixpath.relpath(path, base) if base else path, size, storage, copies)
            for path, size in found
        ]

    def _batches(self, scanned: Iterable[tuple[TarRef, Iterable[_Sample]]]) -> Iterator[ScanBatch]:
        out = _Batcher(repr(self.uri), self.batch_size)
        for tar, samples in scanned:
            where = tar.where
            for sample in samples:
                whole = not sample.members and sample.key == tar.rel  # an unreadable tar
                out.add(sample, where, tar.rel if whole else f"{tar.rel}:{sample.key}", "")
                if out.full():
                    yield ScanBatch(out.flush())
        if not out.samples:
            raise EmptySourceError(f"the tars at {self.uri!r} hold no samples")
        if out.keys:
            yield ScanBatch(out.flush())


def _scanned_held(
    runner: KeepingRunner, held: HeldTars, tars: list[TarRef]
) -> Iterator[tuple[TarRef, list[_Sample]]]:
    """Each tar and its samples, in order, scanned by the runner's tasks, which keep what
    they read for the shards' tasks (the tars that fit in :data:`HOLD_SHARE` of its
    object store memory); their parts' refs are registered in ``held``."""
    room = int(HOLD_SHARE * runner.store_bytes())
    marked = []
    for tar in tars:
        fits = tar.size <= room
        room -= tar.size if fits else 0
        marked.append(dataclasses.replace(tar, hold=fits))
    left = [tar for tar in marked if not tar.hold]
    if left and not held.warned:
        held.warned = True
        warnings.warn(
            f"{len(left)} of {len(tars)} tars ({sum(t.size for t in left):,} bytes, the "
            f"first {quoted(left[0].where)}) do not fit in the Ray cluster's object store "
            f"({runner.store_bytes():,} bytes, of which tars may take {HOLD_SHARE:.0%}): "
            "the members their scans read are fetched again when their shards are written; "
            "give the cluster's nodes more object store memory to fetch them once",
            RefetchWarning,
            stacklevel=4,
        )
    for result, parts in runner.imap_kept(tar_scan_held, marked):
        tar, samples, spans = cast("HeldScan", result)
        held.add(tar.where, parts, spans)
        yield tar, samples


#: Tars on object storage scanned at once (by threads: the scan waits on requests).
SCAN_THREADS: Final = 16
#: Samples a scanning thread hands over at a time (and holds at most twice, waiting).
_HANDOVER: Final = 1024


def _scanned_ahead(tars: list[TarRef], threads: int) -> Iterator[tuple[TarRef, Iterator[_Sample]]]:
    """Each tar and its samples, in order, while the next ``threads - 1`` tars are
    scanned by threads (each holding at most a few handovers of samples: memory does
    not grow with the tars). The caller reads each tar's samples before the next tar's."""
    stop = threading.Event()
    copies = tars[0].copies
    if copies is not None:  # their end (the export's scan over, or failed) stops the threads
        copies.watch(stop)
    started: deque[tuple[TarRef, queue.Queue[tuple[str, Any]]]] = deque()
    rest = iter(tars)

    def start_next() -> None:
        tar = next(rest, None)
        if tar is not None:
            handed: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=2)
            threading.Thread(
                target=_scan_into, args=(tar, handed, stop), name="shardex-tar-scan", daemon=True
            ).start()
            started.append((tar, handed))

    try:
        for _ in range(threads):
            start_next()
        while started:
            tar, handed = started.popleft()
            yield tar, _handed_over(handed, stop)
            start_next()
    finally:
        stop.set()  # threads still scanning stop at their next sample
        if copies is not None:
            copies.unwatch(stop)


def _scan_into(tar: TarRef, handed: queue.Queue[tuple[str, Any]], stop: threading.Event) -> None:
    """Scan one tar in a thread, handing its samples over in lists, then its end (or
    what it raised)."""

    try:
        chunk: list[_Sample] = []
        with contextlib.closing(tar_samples(tar)) as samples:  # closed: its copy too
            for sample in samples:
                if stop.is_set():  # the export is over (failed): no more requests
                    return
                chunk.append(sample)
                if len(chunk) >= _HANDOVER:
                    if not hand_over(handed, ("samples", chunk), stop):
                        return
                    chunk = []
        if hand_over(handed, ("samples", chunk), stop):
            hand_over(handed, ("end", None), stop)
    except BaseException as exc:  # raised again in the consumer
        hand_over(handed, ("error", exc), stop)


def _handed_over(handed: queue.Queue[tuple[str, Any]], stop: threading.Event) -> Iterator[_Sample]:
    """A tar's samples as its thread hands them over; an error, not a wait for good, if
    its scan was stopped (its copies closed: read after the export's scan ended)."""
    while True:
        try:
            kind, value = handed.get(timeout=0.2)
        except queue.Empty:
            if stop.is_set() and handed.empty():
                raise RuntimeError("a tar's samples were read after its scan was stopped") from None
            continue
        if kind == "error":
            raise value
        if kind == "end":
            return
        yield from value
