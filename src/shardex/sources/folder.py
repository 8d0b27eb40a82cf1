"""An image folder: ``[split/][class/]name.ext``.

Top-level folders named ``train``, ``val``, ``validation``, ``valid`` or ``test`` become
splits. Below them (or below the root), first-level folders become classes: their sorted
names are ``label_names`` and a sample's label is its folder's position there.

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Final

from shardex.codecs.images import IMAGE_EXTENSIONS, unexported_image_reason
from shardex.errors import EmptySourceError, SourceError, SourceNotFoundError
from shardex.sources.base import (
    LeftOut,
    ScanResult,
    Source,
    build_table,
    check_utf8_path,
    file_member,
    key_from_relpath,
    printable,
    quoted,
)

SPLIT_DIRS: Final = frozenset({"train", "val", "validation", "valid", "test"})
#: A folder to walk: its path, its path relative to the root (with a trailing "/"), its
#: real path, and the real paths of it and the folders above it (a symlink to one of them
#: is a loop).
_Folder = tuple[str, str, str, frozenset[str]]


@dataclass
class _Walk:
    """What a walk of a source folder found."""

    real_root: str
    files: list[tuple[str, int]] = field(default_factory=list)  # (relative path, size)
    left_out: list[LeftOut] = field(default_factory=list)

    def leave_out(self, rel: str, reason: str) -> None:
        shown = printable(rel)
        self.left_out.append(LeftOut(shown, reason, key_from_relpath(shown)))


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


def _walk(root: Path) -> _Walk:
    """Every image file under root, sorted, and what was left out (see the module
    docstring)."""
    real_root = os.path.realpath(root)
    walk = _Walk(real_root)
    stack: list[_Folder] = [(str(root), "", real_root, frozenset({real_root}))]
    while stack:
        top, rel_top, real_top, above = stack.pop()
        try:
            with os.scandir(top) as listing:
                entries = list(listing)
        except OSError as exc:
            if not rel_top:
                raise SourceError(
                    f"cannot read source folder {quoted(top)}: {exc.strerror}"
                ) from exc
            walk.leave_out(rel_top.rstrip("/"), f"cannot read folder: {exc.strerror}")
            continue
        for entry in entries:
            folder = _visit(walk, entry, f"{rel_top}{entry.name}", real_top, above)
            if folder is not None:
                stack.append(folder)
    walk.files.sort()
    walk.left_out.sort(key=lambda x: x.original_path)
    return walk


def _visit(
    walk: _Walk, entry: os.DirEntry[str], rel: str, real_parent: str, above: frozenset[str]
) -> _Folder | None:
    """Sort one folder entry: an image (added to the walk), a folder to walk (returned),
    left out, or not an image (ignored)."""
    name = entry.name
    link = entry.is_symlink()
    try:
        st = os.stat(entry.path) if link else entry.stat(follow_symlinks=False)
    except OSError as exc:  # a broken symlink or a loop; or the entry went away
        if _matters(name):
            walk.leave_out(rel, _unfollowable(entry.path, exc))
        return None
    is_dir = stat.S_ISDIR(st.st_mode)
    ext = _extension(name)
    if not is_dir and ext not in IMAGE_EXTENSIONS:
        why = unexported_image_reason(ext) if ext else None
        if why is not None:
            walk.leave_out(rel, why)
        return None
    if printable(name) != name:
        walk.leave_out(rel, "its name is not valid UTF-8 (keys are UTF-8): rename it")
        return None
    real = os.path.realpath(entry.path) if link else os.path.join(real_parent, name)
    if link and not _inside(walk.real_root, real):
        kind = "folder" if is_dir else "file"
        walk.leave_out(
            rel,
            f"symlink to the {kind} {quoted(real)}, outside the source folder "
            f"(export that {kind} itself, or copy it into the source)",
        )
        return None
    if is_dir:
        if real in above:
            walk.leave_out(rel, f"symlink loop: it leads back to the folder {quoted(real)}")
            return None
        return (entry.path, f"{rel}/", real, above | {real})
    if not stat.S_ISREG(st.st_mode):
        walk.leave_out(rel, "not a regular file (a FIFO, socket or device)")
        return None
    walk.files.append((rel, st.st_size))
    return None


class FolderSource(Source):
    """Images in a directory tree (see the module docstring for the layout)."""

    kind: ClassVar[str] = "folder"

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).expanduser().absolute()
        self.uri = str(self.root)

    def scan(self) -> ScanResult:
        if not self.root.is_dir():
            raise SourceNotFoundError(f"source folder {self.uri} does not exist")
        check_utf8_path(self.uri)
        walk = _walk(self.root)
        files = walk.files
        if not files and not walk.left_out:
            raise EmptySourceError(f"source folder {self.uri} holds no image files")
        top = {rel.split("/", 1)[0] for rel, _ in files if "/" in rel}
        split_dirs = top & SPLIT_DIRS
        if split_dirs and (top - SPLIT_DIRS or any("/" not in rel for rel, _ in files)):
            others = sorted(top - SPLIT_DIRS) or ["(files at the top level)"]
            raise SourceError(
                f"source folder {self.uri} mixes split folders ({', '.join(sorted(split_dirs))}) "
                f"with other entries ({', '.join(others)}); put every image under a split"
            )
        keys, paths, splits, classes = [], [], [], []
        root = str(self.root)
        members: list[list[dict[str, Any]]] = []
        for rel, size in files:
            parts = rel.split("/")
            split = parts.pop(0) if split_dirs else None
            splits.append(split or "")
            classes.append(parts[0] if len(parts) > 1 else None)
            ext = rel.rpartition(".")[2].lower()
            keys.append(key_from_relpath(rel))
            paths.append(rel)
            members.append([file_member(f"{root}/{rel}", size, ext)])
        names = sorted({c for c in classes if c is not None})
        number = {name: i for i, name in enumerate(names)}
        labels = [None if c is None else number[c] for c in classes] if names else None
        table = build_table(
            keys, paths, members, splits=splits if split_dirs else None, labels=labels
        )
        return ScanResult(table, tuple(names) if names else None, tuple(walk.left_out))
