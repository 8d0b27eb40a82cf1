"""An object-store listing cut at its folders into parts listed at once, read back in key
order: a LIST returns 1,000 keys and needs the last page's token, so one listing is many
requests in a row. Parts are listed by threads a few ahead, or by a runner's tasks handing
back zstd Arrow key tables (a few bytes a key, against ~250 of LIST XML).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Final

import pyarrow as pa

from shardex.format.tables import ipc_bytes
from shardex.sources.base import MapRunner, produced_ahead
from shardex.storage import Storage

__all__ = [
    "LIST_THREADS",
    "Part",
    "encode_table",
    "folder_table",
    "listed",
    "parts_in_order",
    "table_entries",
]

Entry = tuple[str, int]  # (path below the storage root, size)
LIST_THREADS: Final = 16  # each LIST waits on the store, not on this process


@dataclass(frozen=True, slots=True)
class Part:
    """A run of a listing: all objects below ``folder`` (its ``table`` if known), or ``objects``."""

    folder: str | None = None
    objects: tuple[Entry, ...] = ()
    table: bytes | None = None


def parts_in_order(
    folders: Iterable[tuple[str, Sequence[Part]]], objects: Iterable[Entry]
) -> list[Part]:
    """The parts of a folder's listing in key order (a subfolder sorts as its path and ``/``)."""
    items: list[tuple[str, Part | Entry]] = [(path, (path, size)) for path, size in objects]
    for path, parts in folders:
        items += [(f"{path}/", part) for part in parts]
    items.sort(key=lambda item: item[0])
    out: list[Part] = []
    run: list[Entry] = []
    for _, item in items:
        if isinstance(item, Part):
            if run:
                out.append(Part(objects=tuple(run)))
                run = []
            out.append(item)
        else:
            run.append(item)
    if run:
        out.append(Part(objects=tuple(run)))
    return out


def folder_table(job: tuple[Storage, str]) -> bytes:
    """Every object below a folder as a zstd Arrow stream of (name below it, size)."""
    storage, folder = job
    return encode_table(folder, [e for page in storage.list_pages(folder) for e in page])


def encode_table(folder: str, entries: Sequence[Entry]) -> bytes:
    cut = len(folder) + 1
    names = pa.array([path[cut:] for path, _ in entries], pa.string())
    table = pa.table({"name": names, "size": pa.array([n for _, n in entries], pa.int64())})
    return ipc_bytes(table, pa.ipc.IpcWriteOptions(compression="zstd"))


def table_entries(folder: str, data: bytes) -> list[Entry]:
    """The objects of a :func:`folder_table`, with paths below the storage root."""
    table = pa.ipc.open_stream(data).read_all()
    prefix = f"{folder}/"
    sizes = table.column("size").to_pylist()
    return [
        (prefix + name, size)
        for name, size in zip(table.column("name").to_pylist(), sizes, strict=True)
    ]


def listed(storage: Storage, parts: Sequence[Part], runner: MapRunner | None) -> Iterator[Entry]:
    """Every object of the parts, in order: folders listed by ``runner``'s tasks, or threads."""
    if runner is not None:
        jobs = [(storage, p.folder) for p in parts if p.folder is not None and p.table is None]
        tables = runner.imap(folder_table, jobs)
        for part in parts:
            if part.folder is None:
                yield from part.objects
            else:
                yield from table_entries(part.folder, part.table or next(tables))
        return

    def pages(part: Part) -> Iterator[list[Entry]] | None:
        if part.folder is None or part.table is not None:
            return None  # listed already
        return _pages(storage, part.folder)

    listing = produced_ahead(
        parts, pages, threading.Event(), threads=LIST_THREADS, chunk=1, name="shardex-list"
    )
    for part, part_pages in listing:
        if part_pages is not None:
            for page in part_pages:
                yield from page
        elif part.table is not None:
            assert part.folder is not None
            yield from table_entries(part.folder, part.table)
        else:
            yield from part.objects


def _pages(storage: Storage, folder: str) -> Iterator[list[Entry]]:
    """A folder's pages; a generator, so the thread that iterates it makes the requests."""
    yield from storage.list_pages(folder)
