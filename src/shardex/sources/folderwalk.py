"""An image folder's layout rules (:class:`Layout`: split folders, classes; what is left
out), and its local scan: a depth-first walk with ``os.scandir``, one listing per folder
level held, each entry looked at (one ``stat``) only when reached. A local folder also
leaves out (see :mod:`shardex.sources.folder`):

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
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from shardex.codecs.images import IMAGE_EXTENSIONS, unexported_image_reason
from shardex.errors import SourceError, SourceNotFoundError
from shardex.refs.scan import LeftOut
from shardex.sources.base import check_utf8_path, key_from_relpath, printable, quoted

# The layout rules, which the listing of a prefix (folderlist) keeps too.

SPLIT_DIRS: Final = frozenset({"train", "val", "validation", "valid", "test", "predict"})

#: An image file found: its path relative to the root, and its size.
File = tuple[str, int]


@dataclass(frozen=True, slots=True)
class Layout:
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


def left_out(rel: str, reason: str) -> LeftOut:
    shown = printable(rel)
    return LeftOut(shown, reason, key_from_relpath(shown))


def extension(name: str) -> str:
    return name.rpartition(".")[2].lower() if "." in name else ""


def unexported(rel: str, ext: str) -> LeftOut | None:
    """A file whose extension ``ext`` is not an exported image's: left out when it names
    an image format shardex does not export, else None (not an image: not a sample)."""
    why = unexported_image_reason(ext) if ext else None
    return None if why is None else left_out(rel, why)


def scan(uri: str) -> tuple[Layout, Iterator[File | LeftOut]]:
    """The layout of the local folder ``uri`` (absolute) and its image files in sorted
    order of their paths, with what is left out (SourceNotFoundError: no such folder)."""
    if not Path(uri).is_dir():
        raise SourceNotFoundError(f"source folder {uri} does not exist")
    check_utf8_path(uri)
    real_root = os.path.realpath(uri)
    top = _Folder(uri, "", real_root, frozenset({real_root}))
    return _layout(uri, real_root, top), _walk(real_root, top)


@dataclass(frozen=True, slots=True)
class _Folder:
    """A folder to walk: its path, its path relative to the root (with a trailing "/"),
    its real path, and the real paths of it and the folders above it (a symlink to one
    of them is a loop)."""

    path: str
    rel: str
    real: str
    above: frozenset[str]


_Found = File | _Folder | LeftOut


def _inside(real_root: str, target: str) -> bool:
    return os.path.commonpath([real_root, target]) == real_root


def _matters(name: str) -> bool:
    """Whether an entry that cannot be looked at matters: an image's name, or a folder's
    (no extension)."""
    ext = extension(name)
    return not ext or ext in IMAGE_EXTENSIONS or unexported_image_reason(ext) is not None


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
        yield left_out(folder.rel.rstrip("/"), f"cannot read folder: {entries.strerror}")
        return
    for entry in entries:
        found = _visit(real_root, entry, f"{folder.rel}{entry.name}", folder)
        if found is not None:
            yield found


def _walk(real_root: str, top: _Folder) -> Iterator[File | LeftOut]:
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
        return left_out(rel, _unfollowable(entry.path, exc)) if _matters(name) else None
    is_dir = stat.S_ISDIR(st.st_mode)
    ext = extension(name)
    if not is_dir and ext not in IMAGE_EXTENSIONS:
        return unexported(rel, ext)
    if printable(name) != name:
        return left_out(rel, "its name is not valid UTF-8 (keys are UTF-8): rename it")
    real = os.path.realpath(entry.path) if link else os.path.join(parent.real, name)
    if link and not _inside(real_root, real):
        kind = "folder" if is_dir else "file"
        return left_out(
            rel,
            f"symlink to the {kind} {quoted(real)}, outside the source folder "
            f"(export that {kind} itself, or copy it into the source)",
        )
    if is_dir:
        if real in parent.above:
            return left_out(rel, f"symlink loop: it leads back to the folder {quoted(real)}")
        return _Folder(entry.path, f"{rel}/", real, parent.above | {real})
    if not stat.S_ISREG(st.st_mode):
        return left_out(rel, "not a regular file (a FIFO, socket or device)")
    return rel, st.st_size


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


def _layout(uri: str, real_root: str, root: _Folder) -> Layout:
    """Split folders and class names from the first levels (see :mod:`shardex.sources.folder`).

    Raises:
        SourceError: split folders are mixed with other folders or files.
    """
    top, top_files = _subfolders(real_root, root)
    names = {f.rel.rstrip("/") for f in top}
    check_splits(uri, names, top_files)
    split_dirs = names & SPLIT_DIRS
    if not split_dirs:
        return Layout(False, tuple(sorted(names)))
    classes = {sub.rel.split("/")[1] for split in top for sub in _subfolders(real_root, split)[0]}
    return Layout(True, tuple(sorted(classes)))
