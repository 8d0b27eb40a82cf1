"""Existing WebDataset tars (a folder, a glob or one tar) as a source: ``.cls`` members are
labels, ``.json`` metadata, others references (tar, offset, size) read when shards are
written. Tars on object storage are scanned by ranged GETs a few at a time, or by a
runner's tasks; damage handling: :mod:`shardex.sources.tar_scan`.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import posixpath
import threading
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, ClassVar, Final, cast

import pyarrow as pa

from shardex.errors import EmptySourceError, RefetchWarning, SourceError, SourceNotFoundError
from shardex.quoting import quoted
from shardex.refs.scan import SampleStream, ScanBatch, batch_table, members_array
from shardex.sources.base import (
    KeepingRunner,
    MapRunner,
    StoredSource,
    check_metadata_names,
    produced_ahead,
    safe_key,
)
from shardex.sources.jsonmeta import MetadataTypes, metadata_columns
from shardex.sources.tar_scan import (
    HeldScan,
    TarRef,
    TarSample,
    tar_sample_list,
    tar_samples,
    tar_scan_held,
)
from shardex.storage.fetch.held import HOLD_SHARE, HeldTars, held_tars
from shardex.storage.fetch.objects import is_url, register
from shardex.storage.fetch.tars import kept_copies, object_tars


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


class _Batcher:
    """Collects samples from tars into scan-table columns, a batch at a time."""

    def __init__(self, where: str, batch_size: int) -> None:
        self.where = where
        self.batch_size = batch_size
        self.types = MetadataTypes(where, batch_size)
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

    def add(self, sample: TarSample, path: str, original: str) -> None:
        self.keys.append(safe_key(sample.key))
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

    def flush(self) -> pa.Table:
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
            members_array(self.offsets, self.ext, self.path, self.offset, self.size, None),
            labels=self.labels if self.with_label else None,
            metadata=meta,
            invalid=self.invalid,
        )
        self._clear()
        return table


class TarSource(StoredSource):
    """Samples from existing WebDataset tar files."""

    kind: ClassVar[str] = "webdataset-tars"

    def stream_on(self, runner: MapRunner | None) -> SampleStream:
        """The samples in batches; with a ``runner`` each tar is scanned by one of its tasks."""
        tars = self._tars()
        scanned: Iterator[tuple[TarRef, Iterable[TarSample]]]
        held, remote = held_tars(), tars[0].storage is not None
        if runner is not None:  # its tasks may run on other machines: no local copies
            tars = [dataclasses.replace(tar, copies=None) for tar in tars]
            if held is not None and remote and isinstance(runner, KeepingRunner):
                scanned = _scanned_held(runner, held, tars)
            else:
                scanned = runner.imap(tar_sample_list, tars)
        elif remote:
            scanned = _scanned_ahead(tars)
        else:
            scanned = ((tar, tar_samples(tar)) for tar in tars)
        return SampleStream(self._batches(scanned))

    def _tars(self) -> list[TarRef]:
        """The source's tars, in order (an object store registered to serve their bytes)."""
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

    def _batches(
        self, scanned: Iterable[tuple[TarRef, Iterable[TarSample]]]
    ) -> Iterator[ScanBatch]:
        out = _Batcher(repr(self.uri), self.batch_size)
        for tar, samples in scanned:
            where = tar.where
            for sample in samples:
                whole = not sample.members and sample.key == tar.rel  # an unreadable tar
                out.add(sample, where, tar.rel if whole else f"{tar.rel}:{sample.key}")
                if len(out.keys) >= out.batch_size:
                    yield ScanBatch(out.flush())
        if not out.samples:
            raise EmptySourceError(f"the tars at {self.uri!r} hold no samples")
        if out.keys:
            yield ScanBatch(out.flush())


def _scanned_held(
    runner: KeepingRunner, held: HeldTars, tars: list[TarRef]
) -> Iterator[tuple[TarRef, list[TarSample]]]:
    """Each tar and its samples, scanned by tasks that keep what they read (up to HOLD_SHARE)."""
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


SCAN_THREADS: Final = 16  # tars scanned at once: a scan waits on requests
_HANDOVER: Final = 1024  # samples per handover (a thread holds two at most)


def _scanned_ahead(tars: list[TarRef]) -> Iterator[tuple[TarRef, Iterator[TarSample]]]:
    """Each tar and its samples, in order, the next tars scanned by threads."""
    stop = threading.Event()
    copies = tars[0].copies
    if copies is not None:  # their end (the export's scan over, or failed) stops the threads
        copies.watch(stop)
    try:
        scans = produced_ahead(
            tars, tar_samples, stop, threads=SCAN_THREADS, chunk=_HANDOVER, name="shardex-tar-scan"
        )
        yield from cast(Iterator[tuple[TarRef, Iterator[TarSample]]], scans)
    finally:
        stop.set()
        if copies is not None:
            copies.unwatch(stop)
