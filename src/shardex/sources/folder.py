"""An image folder: ``[split/][class/]name.ext``.

Top-level folders named ``train``, ``val``, ``validation``, ``valid``, ``test`` or
``predict`` become splits. Below them (or below the root), first-level folders become
classes: their sorted names are ``label_names`` and a sample's label is its folder's
position there.

Nothing found is dropped without a word. Files whose names are not images (``.txt``,
``.csv`` ...) are not samples; everything else that cannot be exported is listed as left
out, with the reason (refused by default, recorded in errors.parquet under
``on_error="skip"``):

* a file with an image extension shardex does not export (``.heic``, ``.avif``, ``.jfif``);
* a symlink (to a file or a folder) that leads outside the source folder: an export must
  not take in files from elsewhere; symlinks inside the source folder are followed;
* a symlinked folder that leads back to a folder above it (a loop), a symlink loop, a
  broken symlink (when its name is an image's or has no extension, as a folder's);
* a folder that cannot be read, a name that is not valid UTF-8 (keys are UTF-8 text),
  something that is not a regular file (a FIFO or a device named ``x.jpg``).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Final

import numpy as np

from shardex.codecs.images import IMAGE_EXTENSIONS, unexported_image_reason
from shardex.errors import EmptySourceError, SourceError, SourceNotFoundError
from shardex.refs.scan import (
    LeftOut,
    SampleStream,
    ScanBatch,
    ScanResult,
    batch_table,
    members_array,
)
from shardex.sources.base import (
    DEFAULT_BATCH_SIZE,
    Source,
    check_batch_size,
    check_utf8_path,
    key_from_relpath,
    printable,
    quoted,
)
from shardex.sources.probe import SourceSpec

SPLIT_DIRS: Final = frozenset({"train", "val", "validation", "valid", "test", "predict"})


@dataclass(frozen=True, slots=True)
class _Folder:
    """A folder to walk: its path, its path relative to the root (with a trailing "/"),
    its real path, and the real paths of it and the folders above it (a symlink to one
    of them is a loop)."""

    path: str
    rel: str
    real: str
    above: frozenset[str]


#: An image file found: its path relative to the root, and its size.
_File = tuple[str, int]
_Found = _File | _Folder | LeftOut


def _left_out(rel: str, reason: str) -> LeftOut:
    shown = printable(rel)
    return LeftOut(shown, reason, key_from_relpath(shown))


def _inside(real_root: str, target: str) -> bool:
    return os.path.commonpath([real_root, target]) == real_root


def _matters(name: str) -> bool:
    """Whether an entry that cannot be looked at matters: an image's name, or a folder's
    (no extension)."""
    ext = _extension(name)
    return not ext or ext in IMAGE_EXTENSIONS or unexported_image_reason(ext) is not None


def _extension(name: str) -> str:
    return name.rpartition(".")[2].lower() if "." in name else ""


def _unfollowable(path: str, exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return "symlink loop (it leads back to itself)"
    if exc.errno == errno.ENOENT and os.path.islink(path):
        return f"broken symlink: its target {quoted(os.readlink(path))} does not exist"
    return f"cannot read: {exc.strerror}"


def _order(entry: os.DirEntry[str]) -> str:
    """An entry's place among its siblings such that a depth-first walk yields paths in
    sorted order: a folder sorts as its name plus "/", as the paths below it do."""
    try:
        return f"{entry.name}/" if entry.is_dir() else entry.name
    except OSError:  # (is_dir reports most failures as False)
        return entry.name


def _entries(folder: _Folder) -> list[os.DirEntry[str]] | OSError:
    """A folder's entries in walk order, or why it cannot be read (the source's own folder
    unreadable is a SourceError)."""
    try:
        with os.scandir(folder.path) as listing:
            return sorted(listing, key=_order)
    except OSError as exc:
        if not folder.rel:
            raise SourceError(
                f"cannot read source folder {quoted(folder.path)}: {exc.strerror}"
            ) from exc
        return exc


def _listing(real_root: str, folder: _Folder) -> Iterator[_Found]:
    """The entries of one folder, in sorted order, each looked at only when reached (a
    caller that stops early does not stat the rest)."""
    entries = _entries(folder)
    if isinstance(entries, OSError):
        yield _left_out(folder.rel.rstrip("/"), f"cannot read folder: {entries.strerror}")
        return
    for entry in entries:
        found = _visit(real_root, entry, f"{folder.rel}{entry.name}", folder)
        if found is not None:
            yield found


def _walk(real_root: str, top: _Folder) -> Iterator[_File | LeftOut]:
    """Every image file under ``top`` in sorted order of their paths, and what is left
    out (see the module docstring), holding one listing per folder level."""
    stack = [_listing(real_root, top)]
    while stack:
        found = next(stack[-1], None)
        if found is None:
            stack.pop()
        elif isinstance(found, _Folder):
            stack.append(_listing(real_root, found))
        else:
            yield found


def _holds_images(real_root: str, folder: _Folder) -> bool:
    """Whether a folder holds an image file somewhere below it (stops at the first)."""
    return any(not isinstance(found, LeftOut) for found in _walk(real_root, folder))


def _visit(real_root: str, entry: os.DirEntry[str], rel: str, parent: _Folder) -> _Found | None:
    """Sort one folder entry: an image, a folder to walk, left out, or not an image
    (None)."""
    name = entry.name
    link = entry.is_symlink()
    try:
        st = os.stat(entry.path) if link else entry.stat(follow_symlinks=False)
    except OSError as exc:  # a broken symlink or a loop; or the entry went away
        return _left_out(rel, _unfollowable(entry.path, exc)) if _matters(name) else None
    is_dir = stat.S_ISDIR(st.st_mode)
    ext = _extension(name)
    if not is_dir and ext not in IMAGE_EXTENSIONS:
        why = unexported_image_reason(ext) if ext else None
        return None if why is None else _left_out(rel, why)
    if printable(name) != name:
        return _left_out(rel, "its name is not valid UTF-8 (keys are UTF-8): rename it")
    real = os.path.realpath(entry.path) if link else os.path.join(parent.real, name)
    if link and not _inside(real_root, real):
        kind = "folder" if is_dir else "file"
        return _left_out(
            rel,
            f"symlink to the {kind} {quoted(real)}, outside the source folder "
            f"(export that {kind} itself, or copy it into the source)",
        )
    if is_dir:
        if real in parent.above:
            return _left_out(rel, f"symlink loop: it leads back to the folder {quoted(real)}")
        return _Folder(entry.path, f"{rel}/", real, parent.above | {real})
    if not stat.S_ISREG(st.st_mode):
        return _left_out(rel, "not a regular file (a FIFO, socket or device)")
    return rel, st.st_size


@dataclass(frozen=True, slots=True)
class _Layout:
    """What a folder's first levels say: whether its top folders are splits, and the
    class names (sorted), known before any sample is yielded."""

    splits: bool
    classes: tuple[str, ...]


def check_splits(uri: str, top: set[str], top_files: bool) -> None:
    """Refuse split folders beside other folders (``top``: the top-level folder names) or
    beside images at the top level (``top_files``)."""
    split_dirs = top & SPLIT_DIRS
    if split_dirs and (top - SPLIT_DIRS or top_files):
        others = sorted(top - SPLIT_DIRS) or ["(files at the top level)"]
        raise SourceError(
            f"source folder {uri} mixes split folders ({', '.join(sorted(split_dirs))}) "
            f"with other entries ({', '.join(others)}); put every image under a split"
        )


def _subfolders(real_root: str, folder: _Folder) -> tuple[list[_Folder], bool]:
    """The folders in ``folder`` that hold images, and whether it holds an image file
    itself; only folders and the first image file are looked at."""
    holding: list[_Folder] = []
    has_file = False
    entries = _entries(folder)
    if isinstance(entries, OSError):
        return holding, has_file
    for entry in entries:
        if has_file and not _order(entry).endswith("/"):
            continue
        found = _visit(real_root, entry, f"{folder.rel}{entry.name}", folder)
        if isinstance(found, _Folder):
            if _holds_images(real_root, found):
                holding.append(found)
        elif isinstance(found, tuple):
            has_file = True
    return holding, has_file


def _layout(uri: str, real_root: str, root: _Folder) -> _Layout:
    """Split folders and class names from the first levels (see the module docstring).

    Raises:
        SourceError: split folders are mixed with other folders or files.
    """
    top, top_files = _subfolders(real_root, root)
    names = {f.rel.rstrip("/") for f in top}
    check_splits(uri, names, top_files)
    split_dirs = names & SPLIT_DIRS
    if not split_dirs:
        return _Layout(False, tuple(sorted(names)))
    classes = {sub.rel.split("/")[1] for split in top for sub in _subfolders(real_root, split)[0]}
    return _Layout(True, tuple(sorted(classes)))


class FolderSource(Source):
    """Images in a directory tree (see the module docstring for the layout)."""

    kind: ClassVar[str] = "folder"

    @classmethod
    def from_spec(cls, spec: SourceSpec) -> Source:
        return cls(spec.path)

    def __init__(
        self, root: str | os.PathLike[str], *, batch_size: int = DEFAULT_BATCH_SIZE
    ) -> None:
        self.root = Path(root).expanduser().absolute()
        self.uri = str(self.root)
        self.batch_size = check_batch_size(batch_size)

    def stream(self) -> SampleStream:
        if not self.root.is_dir():
            raise SourceNotFoundError(f"source folder {self.uri} does not exist")
        check_utf8_path(self.uri)
        real_root = os.path.realpath(self.root)
        top = _Folder(str(self.root), "", real_root, frozenset({real_root}))
        layout = _layout(self.uri, real_root, top)
        return SampleStream(
            self._batches(real_root, top, layout), layout.classes if layout.classes else None
        )

    def scan(self) -> ScanResult:
        scan = super().scan()
        # as one list, in path order (each batch's are; a folder's may come after files)
        left_out = tuple(sorted(scan.left_out, key=lambda x: x.original_path))
        return ScanResult(scan.table, scan.label_names, left_out)

    def _batches(self, real_root: str, top: _Folder, layout: _Layout) -> Iterator[ScanBatch]:
        return self._in_batches(_walk(real_root, top), layout)

    def _in_batches(
        self, entries: Iterable[_File | LeftOut], layout: _Layout
    ) -> Iterator[ScanBatch]:
        """The image files found (and what is left out) in batches of ``batch_size``
        files; a source in which nothing was found is an error."""
        files: list[_File] = []
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

    def _batch(self, files: list[_File], left_out: list[LeftOut], layout: _Layout) -> ScanBatch:
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
        root = self.member_root()
        table = batch_table(
            keys,
            paths,
            members_array(
                np.arange(len(files) + 1, dtype=np.int32),
                [rel.rpartition(".")[2].lower() for rel in paths],
                [f"{root}/{rel}" for rel in paths],
                np.full(len(files), -1, np.int64),
                [size for _, size in files],
            ),
            splits=splits if layout.splits else None,
            labels=labels if layout.classes else None,
        )
        left_out.sort(key=lambda x: x.original_path)
        return ScanBatch(table, tuple(left_out))

    def member_root(self) -> str:
        """What a member's path is relative to (its path is ``ROOT/rel``)."""
        return str(self.root)

    def _changed(self, rel: str) -> SourceError:
        return SourceError(
            f"source folder {self.uri} changed while it was read ({quoted(rel)} is not under "
            "the folders found first); export it again once it stays still"
        )
