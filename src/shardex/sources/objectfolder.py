"""An image folder on object storage: ``s3://bucket/prefix/[split/][class/]name.ext``.

The same layout, keys, labels and order as :class:`~shardex.sources.folder.FolderSource`
on a local copy: object stores list keys in sorted order, which is the order of the local
walk. The split and class folders are found before any sample is yielded, by listings
that jump past a folder once it is known to hold an image (one LIST request per class
folder; images directly in the prefix or in a split folder are listed through). Then the
prefix is listed page by page (one LIST request per 1,000 objects), each batch yielded as
its pages arrive: memory holds one batch of references and the folder names, never a
listing. No object is read while scanning:
sizes come from the listing, bytes are fetched when the shards are written (one GET
each, see :mod:`shardex.sources.remote`).

Objects whose names are not images' are not samples; an image format shardex does not
export (``.heic`` ...) and a name with an empty, ``.`` or ``..`` part are left out with
the reason.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

from shardex.codecs.images import IMAGE_EXTENSIONS, unexported_image_reason
from shardex.errors import SourceError
from shardex.sources.base import DEFAULT_BATCH_SIZE, LeftOut, SampleStream, ScanBatch
from shardex.sources.folder import SPLIT_DIRS, FolderSource, _extension, _File, _Layout, _left_out
from shardex.sources.remote import register
from shardex.storage import Storage, open_storage


def _image(name: str) -> bool:
    return _extension(name.rpartition("/")[2]) in IMAGE_EXTENSIONS


def _found(rel: str, size: int) -> _File | LeftOut | None:
    """An object as a sample file, left out (and why), or not an image (None)."""
    ext = _extension(rel.rpartition("/")[2])
    if ext not in IMAGE_EXTENSIONS:
        why = unexported_image_reason(ext) if ext else None
        return None if why is None else _left_out(rel, why)
    if any(part in ("", ".", "..") for part in rel.split("/")):
        return _left_out(rel, "its name has an empty, '.' or '..' part (not a folder path)")
    return rel, size


def _next_folder(storage: Storage, after: str | None, found: _Found) -> str | None:
    """Read the listing after ``after`` into ``found`` until a folder to jump past; return
    where to list from next (None: the listing is done)."""
    for page in storage.list_pages("", after):
        for rel, _ in page:
            parts = rel.split("/")
            if not _image(parts[-1]) or "" in parts or "." in parts or ".." in parts:
                continue
            if len(parts) == 1:
                found.top_files = True
                continue
            subfolders = found.folders.setdefault(parts[0], set())
            if parts[0] not in SPLIT_DIRS:  # a class folder: the rest of it does not matter
                return f"{parts[0]}0"  # '0' follows '/': past every key of the folder
            if len(parts) > 2:  # a split's class folder
                subfolders.add(parts[1])
                return f"{parts[0]}/{parts[1]}0"
    return None


@dataclass(slots=True)
class _Found:
    """The folders holding images (a top folder -> its subfolders holding images, known
    for split folders) and whether images lie in the prefix itself."""

    folders: dict[str, set[str]] = field(default_factory=dict)
    top_files: bool = False


class ObjectFolderSource(FolderSource):
    """Images below an object-store prefix, laid out as an image folder (see the module
    docstring).

    Args:
        url: the prefix, ``s3://bucket/images`` (a trailing ``/`` is optional).
        storage_options: its storage options (endpoint, region, profile, credentials;
            see :class:`shardex.storage.ObjectStorage`).
        batch_size: samples per batch of :meth:`stream`.
    """

    kind: ClassVar[str] = "folder"

    def __init__(
        self,
        url: str,
        storage_options: dict[str, Any] | None = None,
        *,
        batch_size: int = DEFAULT_BATCH_SIZE,
    ) -> None:
        super().__init__(".", batch_size=batch_size)
        self.uri = url.rstrip("/")
        self.storage_options = storage_options

    def member_root(self) -> str:
        return self.uri

    def stream(self) -> SampleStream:
        storage = open_storage(self.uri, self.storage_options)
        register(storage)
        layout = self._object_layout(storage)
        return SampleStream(self._listed(storage, layout), layout.classes or None)

    def _object_layout(self, storage: Storage) -> _Layout:
        """Split folders and class names, as the local folder source finds them."""
        found = _Found()
        after = _next_folder(storage, None, found)
        while after is not None:
            after = _next_folder(storage, after, found)
        top, top_files = found.folders, found.top_files
        split_dirs = set(top) & SPLIT_DIRS
        if split_dirs and (set(top) - SPLIT_DIRS or top_files):
            others = sorted(set(top) - SPLIT_DIRS) or ["(files at the top level)"]
            raise SourceError(
                f"source folder {self.uri} mixes split folders ({', '.join(sorted(split_dirs))}) "
                f"with other entries ({', '.join(others)}); put every image under a split"
            )
        if not split_dirs:
            return _Layout(False, tuple(sorted(top)))
        return _Layout(True, tuple(sorted(set().union(*top.values()))))

    def _listed(self, storage: Storage, layout: _Layout) -> Iterator[ScanBatch]:
        return self._in_batches(self._objects(storage), layout)

    def _objects(self, storage: Storage) -> Iterator[_File | LeftOut]:
        """The prefix's image files and left-out objects, page by page, in key order."""
        last = ""
        for page in storage.list_pages(""):
            for rel, size in page:
                if rel < last:  # the order of keys is the order of the samples
                    raise SourceError(
                        f"{self.uri}: the store listed {rel!r} after {last!r}; a store "
                        "that does not list keys in sorted order cannot be a source"
                    )
                last = rel
                found = _found(rel, size)
                if found is not None:
                    yield found
