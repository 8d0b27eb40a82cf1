"""What both scans of an image folder (:mod:`~shardex.sources.folderwalk` on a local
folder, :mod:`~shardex.sources.folderlist` below a prefix) agree on: the split folders'
names, the layout the first levels give (:class:`Layout`), which names are images', and
what is left out and why."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from shardex.codecs.images import IMAGE_EXTENSIONS, unexported_image_reason
from shardex.errors import SourceError
from shardex.refs.scan import LeftOut
from shardex.sources.base import key_from_relpath, printable

__all__ = [
    "SPLIT_DIRS",
    "File",
    "Layout",
    "check_splits",
    "extension",
    "is_image",
    "left_out",
    "unexported",
]

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


def is_image(name: str) -> bool:
    return extension(name) in IMAGE_EXTENSIONS
