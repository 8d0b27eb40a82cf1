"""An image folder: ``[split/][class/]name.ext``, a local folder or an object-store
prefix (``s3://bucket/images``), the same samples, keys, labels and order for both.

Top-level folders named ``train``, ``val``, ``validation``, ``valid``, ``test`` or
``predict`` become splits. Below them (or below the root), first-level folders become
classes: their sorted names are ``label_names`` and a sample's label is its folder's
position there. Keys are the paths without extension, in sorted order of the paths (a
folder sorting as its name and a ``/``).

Nothing found is dropped without a word. Files whose names are not images (``.txt``,
``.csv`` ...) are not samples; everything else that cannot be exported is listed as left
out, with the reason (refused by default, recorded in errors.parquet under
``on_error="skip"``): an image format shardex does not export (``.heic``, ``.avif``,
``.jfif``), and what each scan cannot take in: a local folder is walked with ``os.scandir``
(:mod:`~shardex.sources.folderwalk`: symlinks, hostile names), a prefix's folders are
listed at once, by threads or a runner's tasks (:mod:`~shardex.sources.folderlist`).
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
    """Images in a directory tree, local or below an object-store prefix (see the module
    docstring for the layout).

    Args:
        root: the folder, or the prefix's URL (``s3://bucket/images``; a trailing ``/``
            is optional).
        storage_options: a prefix's storage options (endpoint, region, profile,
            credentials; see :class:`shardex.storage.ObjectStorage`).
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
        #: whether it is a prefix on object storage (else a local folder, ``uri`` absolute)
        self.is_url = is_url(text)
        self.uri = text.rstrip("/") if self.is_url else str(Path(text).expanduser().absolute())
        self.storage_options = storage_options
        self.batch_size = check_batch_size(batch_size)

    def stream(self) -> SampleStream:
        return self._stream(None)

    def stream_on(self, runner: MapRunner | None) -> SampleStream:
        """:meth:`stream`, with a ``runner`` a prefix's folders probed and listed by its
        tasks (the LIST answers never reach this process; the batches are the same)."""
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
        # as one list, in path order (each batch's are; a folder's may come after files)
        left_out = tuple(sorted(scan.left_out, key=lambda x: x.original_path))
        return ScanResult(scan.table, scan.label_names, left_out)

    def _in_batches(self, entries: Iterable[File | LeftOut], layout: Layout) -> Iterator[ScanBatch]:
        """The image files found (and what is left out) in batches of ``batch_size``
        files; a source in which nothing was found is an error."""
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
