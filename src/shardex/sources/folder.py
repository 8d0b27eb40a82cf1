"""An image folder ``[split/][class/]name.ext``, local or below an object-store prefix, with
the same samples, keys, labels and order for both: top folders ``train``, ``val`` ... are
splits, the next level's sorted names the classes, keys the paths without extension.
Images shardex cannot export, and what a scan cannot take in, are left out with the reason.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from shardex.errors import EmptySourceError, SourceError
from shardex.refs.scan import (
    LeftOut,
    SampleStream,
    ScanBatch,
    ScanResult,
    batch_table,
    members_array,
)
from shardex.sources import folderlist, folderwalk
from shardex.sources.base import (
    DEFAULT_BATCH_SIZE,
    MapRunner,
    Source,
    check_batch_size,
    key_from_relpath,
    quoted,
)
from shardex.sources.folderwalk import SPLIT_DIRS, File, Layout
from shardex.sources.probe import SourceSpec
from shardex.storage import open_storage
from shardex.storage.fetch.objects import is_url, register


class FolderSource(Source):
    """Images in a directory tree, local or below an object-store prefix.

    Args:
        root: the folder, or the prefix's URL (``s3://bucket/images``).
        storage_options: a prefix's storage options (see :class:`shardex.storage.ObjectStorage`).
        batch_size: samples per batch of :meth:`stream`.
    """

    kind: ClassVar[str] = "folder"

    @classmethod
    def from_spec(cls, spec: SourceSpec) -> Source:
        return cls(spec.location, spec.storage_options if spec.is_url else None)

    def __init__(
        self,
        root: str | os.PathLike[str],
        storage_options: dict[str, Any] | None = None,
        *,
        batch_size: int = DEFAULT_BATCH_SIZE,
    ) -> None:
        text = os.fspath(root)
        self.is_url = is_url(text)
        self.uri = text.rstrip("/") if self.is_url else str(Path(text).expanduser().absolute())
        self.storage_options = storage_options
        self.batch_size = check_batch_size(batch_size)

    def stream(self) -> SampleStream:
        return self._stream(None)

    def stream_on(self, runner: MapRunner | None) -> SampleStream:
        """:meth:`stream`, a prefix's folders probed and listed by ``runner``'s tasks."""
        return self.stream() if runner is None else self._stream(runner)

    def _stream(self, runner: MapRunner | None) -> SampleStream:
        if self.is_url:
            storage = open_storage(self.uri, self.storage_options)
            register(storage)
            layout, found = folderlist.scan(self.uri, storage, runner)
        else:
            layout, found = folderwalk.scan(self.uri)
        return SampleStream(self._in_batches(found, layout), layout.classes or None)

    def scan(self) -> ScanResult:
        scan = super().scan()
        left_out = tuple(sorted(scan.left_out, key=lambda x: x.original_path))
        return ScanResult(scan.table, scan.label_names, left_out)

    def _in_batches(self, entries: Iterable[File | LeftOut], layout: Layout) -> Iterator[ScanBatch]:
        """The files found (and what is left out) in batches; nothing found is an error."""
        files: list[File] = []
        left_out: list[LeftOut] = []
        found_any = False
        for found in entries:
            found_any = True
            if isinstance(found, LeftOut):
                left_out.append(found)
                continue
            files.append(found)
            if len(files) >= self.batch_size:
                yield self._batch(files, left_out, layout)
                files, left_out = [], []
        if not found_any:
            raise EmptySourceError(f"source folder {self.uri} holds no image files")
        if files or left_out:
            yield self._batch(files, left_out, layout)

    def _batch(self, files: list[File], left_out: list[LeftOut], layout: Layout) -> ScanBatch:
        number = {name: i for i, name in enumerate(layout.classes)}
        keys, splits, labels = [], [], []
        for rel, _size in files:
            parts = rel.split("/")
            split = parts.pop(0) if layout.splits else None
            if layout.splits and (not parts or split not in SPLIT_DIRS):
                raise self._changed(rel)
            if len(parts) > 1 and parts[0] not in number:
                raise self._changed(rel)
            splits.append(split)
            labels.append(number[parts[0]] if len(parts) > 1 else None)
            keys.append(key_from_relpath(rel))
        paths = [rel for rel, _ in files]
        table = batch_table(
            keys,
            paths,
            members_array(
                np.arange(len(files) + 1, dtype=np.int32),
                [rel.rpartition(".")[2].lower() for rel in paths],
                [f"{self.uri}/{rel}" for rel in paths],
                np.full(len(files), -1, np.int64),
                [size for _, size in files],
            ),
            splits=splits if layout.splits else None,
            labels=labels if layout.classes else None,
        )
        left_out.sort(key=lambda x: x.original_path)
        return ScanBatch(table, tuple(left_out))

    def _changed(self, rel: str) -> SourceError:
        return SourceError(
            f"source folder {self.uri} changed while it was read ({quoted(rel)} is not under "
            "the folders found first); export it again once it stays still"
        )
