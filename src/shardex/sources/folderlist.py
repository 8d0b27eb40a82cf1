"""The scan of an image folder below an object-store prefix, with the keys, labels and order
:mod:`~shardex.sources.folderwalk` finds locally. Split and class folders are probed and
listed at once (:mod:`~shardex.sources.listing`); a prefix holding images directly is
laid out by listings that jump past each class folder, then listed from one process.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Final

from shardex.codecs.images import IMAGE_EXTENSIONS
from shardex.errors import SourceError
from shardex.refs.scan import LeftOut
from shardex.sources.base import MapRunner
from shardex.sources.folderwalk import (
    SPLIT_DIRS,
    File,
    Layout,
    check_splits,
    extension,
    left_out,
    unexported,
)
from shardex.sources.listing import LIST_THREADS, Entry, Part, encode_table, listed, parts_in_order
from shardex.storage import Storage


def scan(
    uri: str, storage: Storage, runner: MapRunner | None
) -> tuple[Layout, Iterator[File | LeftOut]]:
    """The layout of the prefix ``uri`` and its image files in key order, with what is left out."""
    plan = _plan(uri, storage, runner)
    if plan is None:
        layout = _layout_by_jumps(uri, storage)
        entries: Iterable[Entry] = (e for page in storage.list_pages("") for e in page)
    else:
        layout, parts = plan
        entries = listed(storage, parts, runner)
    return layout, _objects(uri, entries)


_PAGE: Final = 1000  # keys per LIST page (S3's limit)


def _image_path(parts: list[str]) -> bool:
    """Whether a path (split at ``/``) is an image a sample can be made of."""
    return (
        extension(parts[-1]) in IMAGE_EXTENSIONS
        and "" not in parts
        and "." not in parts
        and ".." not in parts
    )


@dataclass(frozen=True, slots=True)
class _Probe:
    """A folder's first pages: an image below it, one directly in it (not cut into subfolders),
    and its whole listing when one page held it.
    """

    holds_image: bool
    flat: bool
    table: bytes | None = None


def _probe(job: tuple[Storage, str]) -> _Probe:
    """Read the listing below a folder up to its first image (a runner's task, or a thread)."""
    storage, folder = job
    depth = folder.count("/") + 1 if folder else 0
    pages: Iterator[list[Entry]] = iter(storage.list_pages(folder))
    first = next(pages, [])
    images = [parts for rel, _ in first if _image_path(parts := rel.split("/"))]
    flat = any(len(parts) == depth + 1 for parts in images)
    table = None
    if folder and len(first) < _PAGE:
        # a short page is the last one: asking for the next costs no request (the store
        # said there is none), and the folder need not be listed again
        second = next(pages, None)
        if second is None:
            table = encode_table(folder, first)
        else:
            pages = itertools.chain([second], pages)
    holds = bool(images) or (
        table is None and any(_image_path(r.split("/")) for page in pages for r, _ in page)
    )
    return _Probe(holds, flat, table)


def _probes(storage: Storage, folders: Sequence[str], runner: MapRunner | None) -> list[_Probe]:
    jobs = [(storage, folder) for folder in folders]
    if runner is not None:
        return list(runner.imap(_probe, jobs))
    if len(jobs) < 2:
        return [_probe(job) for job in jobs]
    with ThreadPoolExecutor(min(LIST_THREADS, len(jobs)), "shardex-probe") as pool:
        return list(pool.map(_probe, jobs))


def _classes_by_jumps(storage: Storage, folder: str) -> set[str]:
    """The subfolders of ``folder`` holding images, listing past each once it is known to."""
    classes: set[str] = set()
    depth = folder.count("/") + 1
    after: str | None = None
    while True:
        jump = None
        for page in storage.list_pages(folder, after):
            for rel, _ in page:
                parts = rel.split("/")
                if len(parts) > depth + 1 and _image_path(parts):
                    classes.add(parts[depth])
                    jump = f"{folder}/{parts[depth]}0"  # '0' follows '/': past the folder
                    break
            if jump is not None:
                break
        if jump is None:
            return classes
        after = jump


_CONTROL: Final = re.compile("[\x00-\x1f\x7f]")


def _found(rel: str, size: int) -> File | LeftOut | None:
    """An object as a sample file, left out (and why), or not an image (None)."""
    ext = extension(rel.rpartition("/")[2])
    if ext not in IMAGE_EXTENSIONS:
        return unexported(rel, ext)
    if any(part in ("", ".", "..") for part in rel.split("/")):
        return left_out(rel, "its name has an empty, '.' or '..' part (not a folder path)")
    if _CONTROL.search(rel):  # listed past obstore (see storage.s3_listing): no path names it
        return left_out(rel, "its name holds a control character; rename the object")
    return rel, size


def _next_folder(storage: Storage, after: str | None, found: _Found) -> str | None:
    """Read the listing after ``after`` into ``found`` up to a folder to jump past (None: done)."""
    for page in storage.list_pages("", after):
        for rel, _ in page:
            parts = rel.split("/")
            if not _image_path(parts):
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
    """Top folders holding images (-> their class folders, for splits); images in the prefix."""

    folders: dict[str, set[str]] = field(default_factory=dict)
    top_files: bool = False


def _plan(uri: str, storage: Storage, runner: MapRunner | None) -> tuple[Layout, list[Part]] | None:
    """The layout and the parts of the listing; None for a prefix holding images directly."""
    (root,) = _probes(storage, [""], runner)
    if root.flat or not root.holds_image:
        return None
    folders, objects = storage.list_folder("")
    probes = dict(zip(folders, _probes(storage, folders, runner), strict=True))
    holding = {folder for folder in folders if probes[folder].holds_image}
    top_files = any(_image_path(rel.split("/")) for rel, _ in objects)
    check_splits(uri, set(holding), top_files)
    split_dirs = sorted(holding & SPLIT_DIRS)
    classes: set[str] = set()
    inside: dict[str, list[Part]] = {}
    for split in split_dirs:
        if probes[split].flat:
            classes |= _classes_by_jumps(storage, split)
            continue
        subfolders, own = storage.list_folder(split)
        found = _probes(storage, subfolders, runner)
        classes |= {
            f.rpartition("/")[2] for f, p in zip(subfolders, found, strict=True) if p.holds_image
        }
        inside[split] = parts_in_order(
            [(f, [Part(f, table=p.table)]) for f, p in zip(subfolders, found, strict=True)], own
        )
    parts = parts_in_order(
        [(f, inside.get(f, [Part(f, table=probes[f].table)])) for f in folders], objects
    )
    if not split_dirs:
        return Layout(False, tuple(sorted(holding))), parts
    return Layout(True, tuple(sorted(classes))), parts


def _layout_by_jumps(uri: str, storage: Storage) -> Layout:
    found = _Found()
    after = _next_folder(storage, None, found)
    while after is not None:
        after = _next_folder(storage, after, found)
    top = found.folders
    check_splits(uri, set(top), found.top_files)
    split_dirs = set(top) & SPLIT_DIRS
    if not split_dirs:
        return Layout(False, tuple(sorted(top)))
    return Layout(True, tuple(sorted(set().union(*top.values()))))


def _objects(uri: str, entries: Iterable[Entry]) -> Iterator[File | LeftOut]:
    last = ""
    for rel, size in entries:
        if rel < last:  # the order of keys is the order of the samples
            raise SourceError(
                f"{uri}: the store listed {rel!r} after {last!r}; a store "
                "that does not list keys in sorted order cannot be a source"
            )
        last = rel
        found = _found(rel, size)
        if found is not None:
            yield found
