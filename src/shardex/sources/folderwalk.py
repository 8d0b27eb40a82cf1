"""An image folder's layout rules (:class:`Layout`, kept by folderlist too) and its local
scan: a sorted depth-first ``os.scandir`` walk. Symlinks out of the folder (an export must
not take in files from elsewhere), loops, unreadable or non-UTF-8 names are left out.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from shardex.codecs.images import IMAGE_EXTENSIONS, unexported_image_reason
from shardex.errors import SourceError, SourceNotFoundError
from shardex.refs.scan import LeftOut
from shardex.sources.base import check_utf8_path, key_from_relpath, printable, quoted

SPLIT_DIRS: Final = frozenset({"train", "val", "validation", "valid", "test", "predict"})

File = tuple[str, int]  # (path relative to the root, size)


@dataclass(frozen=True, slots=True)
class Layout:
    """Whether a folder's top folders are splits, and the sorted class names."""

    splits: bool
    classes: tuple[str, ...]


def check_splits(uri: str, top: set[str], top_files: bool) -> None:
    """Refuse split folders beside other folders (``top``) or beside top-level images."""
    split_dirs = top & SPLIT_DIRS
    if split_dirs and (top - SPLIT_DIRS or top_files):
        others = sorted(top - SPLIT_DIRS) or ["(files at the top level)"]
        raise SourceError(
            f"source folder {uri} mixes split folders ({', '.join(sorted(split_dirs))}) "
            f"with other entries ({', '.join(others)}); put every image under a split"
        )


def left_out(rel: str, reason: str) -> LeftOut:
    shown = printable(rel)
    return LeftOut(shown, reason, key_from_relpath(shown))


def extension(name: str) -> str:
    return name.rpartition(".")[2].lower() if "." in name else ""


def unexported(rel: str, ext: str) -> LeftOut | None:
    """A file of an image format shardex does not export, left out; else None (not a sample)."""
    why = unexported_image_reason(ext) if ext else None
    return None if why is None else left_out(rel, why)


def scan(uri: str) -> tuple[Layout, Iterator[File | LeftOut]]:
    """The layout of the local folder ``uri``; its images in path order, and what is left out."""
    if not Path(uri).is_dir():
        raise SourceNotFoundError(f"source folder {uri} does not exist")
    check_utf8_path(uri)
    real_root = os.path.realpath(uri)
    top = _Folder(uri, "", real_root, frozenset({real_root}))
    return _layout(uri, real_root, top), _walk(real_root, top)


@dataclass(frozen=True, slots=True)
class _Folder:
    """A folder to walk; ``above``: real paths of it and its parents (a link to one is a loop)."""

    path: str
    rel: str
    real: str
    above: frozenset[str]


_Found = File | _Folder | LeftOut


def _inside(real_root: str, target: str) -> bool:
    return os.path.commonpath([real_root, target]) == real_root


def _matters(name: str) -> bool:
    """Whether an entry that cannot be looked at would be an image or a folder."""
    ext = extension(name)
    return not ext or ext in IMAGE_EXTENSIONS or unexported_image_reason(ext) is not None


def _unfollowable(path: str, exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return "symlink loop (it leads back to itself)"
    if exc.errno == errno.ENOENT and os.path.islink(path):
        return f"broken symlink: its target {quoted(os.readlink(path))} does not exist"
    return f"cannot read: {exc.strerror}"


def _order(entry: os.DirEntry[str]) -> str:
    """Sort key making a depth-first walk yield sorted paths: a folder sorts as ``name/``."""
    try:
        return f"{entry.name}/" if entry.is_dir() else entry.name
    except OSError:  # (is_dir reports most failures as False)
        return entry.name


def _entries(folder: _Folder) -> list[os.DirEntry[str]] | OSError:
    """A folder's entries in walk order, or why it cannot be read (a SourceError for the root)."""
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
    """The entries of one folder, in order, each looked at only when reached."""
    entries = _entries(folder)
    if isinstance(entries, OSError):
        yield left_out(folder.rel.rstrip("/"), f"cannot read folder: {entries.strerror}")
        return
    for entry in entries:
        found = _visit(real_root, entry, f"{folder.rel}{entry.name}", folder)
        if found is not None:
            yield found


def _walk(real_root: str, top: _Folder) -> Iterator[File | LeftOut]:
    stack = [_listing(real_root, top)]
    while stack:
        found = next(stack[-1], None)
        if found is None:
            stack.pop()
        elif isinstance(found, _Folder):
            stack.append(_listing(real_root, found))
        else:
            yield found


def _visit(real_root: str, entry: os.DirEntry[str], rel: str, parent: _Folder) -> _Found | None:
    """One folder entry: an image, a folder to walk, left out, or not an image (None)."""
    name = entry.name
    link = entry.is_symlink()
    try:
        st = os.stat(entry.path) if link else entry.stat(follow_symlinks=False)
    except OSError as exc:  # a broken symlink or a loop; or the entry went away
        return left_out(rel, _unfollowable(entry.path, exc)) if _matters(name) else None
    is_dir = stat.S_ISDIR(st.st_mode)
    ext = extension(name)
    if not is_dir and ext not in IMAGE_EXTENSIONS:
        return unexported(rel, ext)
    if printable(name) != name:
        return left_out(rel, "its name is not valid UTF-8 (keys are UTF-8): rename it")
    real = os.path.realpath(entry.path) if link else None
    if real is not None and not _inside(real_root, real):
        kind = "folder" if is_dir else "file"
        return left_out(
            rel,
            f"symlink to the {kind} {quoted(real)}, outside the source folder "
            f"(export that {kind} itself, or copy it into the source)",
        )
    if is_dir:
        real = real or os.path.join(parent.real, name)  # a plain file's is never needed
        if real in parent.above:
            return left_out(rel, f"symlink loop: it leads back to the folder {quoted(real)}")
        return _Folder(entry.path, f"{rel}/", real, parent.above | {real})
    if not stat.S_ISREG(st.st_mode):
        return left_out(rel, "not a regular file (a FIFO, socket or device)")
    return rel, st.st_size


def _subfolders(real_root: str, folder: _Folder) -> tuple[list[_Folder], bool]:
    """The folders in ``folder`` holding images, and whether it holds an image file itself."""
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
            if any(not isinstance(f, LeftOut) for f in _walk(real_root, found)):
                holding.append(found)
        elif isinstance(found, tuple):
            has_file = True
    return holding, has_file


def _layout(uri: str, real_root: str, root: _Folder) -> Layout:
    """Split folders and class names from the first levels (SourceError: splits mixed in)."""
    top, top_files = _subfolders(real_root, root)
    names = {f.rel.rstrip("/") for f in top}
    check_splits(uri, names, top_files)
    split_dirs = names & SPLIT_DIRS
    if not split_dirs:
        return Layout(False, tuple(sorted(names)))
    classes = {sub.rel.split("/")[1] for split in top for sub in _subfolders(real_root, split)[0]}
    return Layout(True, tuple(sorted(classes)))
