"""An image folder: ``[split/][class/]name.ext``.

Top-level folders named ``train``, ``val``, ``validation``, ``valid`` or ``test`` become
splits. Below them (or below the root), first-level folders become classes: their sorted
names are ``label_names`` and a sample's label is its folder's position there.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar, Final

from shardex.codecs.images import IMAGE_EXTENSIONS
from shardex.errors import EmptySourceError, SourceError, SourceNotFoundError
from shardex.sources.base import ScanResult, Source, build_table, file_member, key_from_relpath

SPLIT_DIRS: Final = frozenset({"train", "val", "validation", "valid", "test"})


def _walk(root: Path) -> list[tuple[str, int, str | None]]:
    """(relative posix path, size, problem) of every image file under root, sorted.

    Symlinked folders are not followed; a symlinked file is a problem when it points
    outside the source folder (an export must not leak files from elsewhere).
    """
    found: list[tuple[str, int, str | None]] = []
    prefix = len(str(root)) + 1  # entry paths all start with "root/"
    real_root = os.path.realpath(root)
    stack = [root]
    while stack:
        top = stack.pop()
        with os.scandir(top) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(Path(entry.path))
                    continue
                ext = entry.name.rpartition(".")[2].lower()
                if "." in entry.name and ext in IMAGE_EXTENSIONS and entry.is_file():
                    rel = entry.path[prefix:].replace(os.sep, "/")
                    problem = None
                    if entry.is_symlink():
                        target = os.path.realpath(entry.path)
                        if os.path.commonpath([real_root, target]) != real_root:
                            problem = f"symlink to {target}, outside the source folder"
                    found.append((rel, entry.stat().st_size, problem))
    found.sort()
    return found


class FolderSource(Source):
    """Images in a directory tree (see the module docstring for the layout)."""

    kind: ClassVar[str] = "folder"

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).expanduser().absolute()
        self.uri = str(self.root)

    def scan(self) -> ScanResult:
        if not self.root.is_dir():
            raise SourceNotFoundError(f"source folder {self.uri} does not exist")
        files = _walk(self.root)
        if not files:
            raise EmptySourceError(f"source folder {self.uri} holds no image files")
        top = {rel.split("/", 1)[0] for rel, _, _ in files if "/" in rel}
        split_dirs = top & SPLIT_DIRS
        if split_dirs and (top - SPLIT_DIRS or any("/" not in rel for rel, _, _ in files)):
            others = sorted(top - SPLIT_DIRS) or ["(files at the top level)"]
            raise SourceError(
                f"source folder {self.uri} mixes split folders ({', '.join(sorted(split_dirs))}) "
                f"with other entries ({', '.join(others)}); put every image under a split"
            )
        keys, paths, splits, classes = [], [], [], []
        root = str(self.root)
        members: list[list[dict[str, Any]]] = []
        for rel, size, _problem in files:
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
            keys,
            paths,
            members,
            splits=splits if split_dirs else None,
            labels=labels,
            invalid=[problem for _, _, problem in files],
        )
        return ScanResult(table, tuple(names) if names else None)
