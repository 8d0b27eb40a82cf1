"""The rows of a table source: what a row's path names (a local file, or an object),
looked at the same way, its key when the table has no key column, and the rows kept and
left out.

A URL is worked on as a pseudo absolute path (``s3://b/x.jpg`` -> ``/s3:/b/x.jpg``) so that
the table source's path rules (relative paths joined to the table's folder, keys relative
to the common parent folder) apply unchanged; each row's object is then looked at with
one HEAD (its size), at most :data:`~shardex.storage.fetch.objects.MAX_IN_FLIGHT` at a
time.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np
import pyarrow as pa

from shardex.codecs.images import IMAGE_EXTENSIONS, sniff, unexported_image_reason
from shardex.errors import BadSampleError, ObjectNotFoundError, SourceError
from shardex.refs.scan import LeftOut, members_array
from shardex.sources.base import key_from_relpath, printable
from shardex.storage import Storage, open_storage
from shardex.storage.fetch.objects import MAX_IN_FLIGHT, is_url, register, split_url

#: Why a row's file or object cannot be a member when it is not there.
MISSING: Final = "does not exist"


@dataclass(frozen=True, slots=True)
class Member:
    """A row's one member: a whole file, an object (``path`` its URL), or inline bytes."""

    ext: str
    size: int
    path: str | None = None
    data: bytes | None = None


def pseudo_path(url: str) -> str:
    """The absolute path that stands for a URL while keys and relative paths are worked
    out with path functions: ``s3://b/x.jpg`` -> ``/s3:/b/x.jpg``."""
    scheme, _, rest = url.partition("://")
    return f"/{scheme}:/{rest}"


def url_of(pseudo: str) -> str | None:
    """The URL a pseudo path stands for (None when a relative path climbed out of its
    bucket with ``..``)."""
    scheme, _, rest = pseudo.lstrip("/").partition(":/")
    url = f"{scheme}://{rest}"
    return url if is_url(url) and "/" in rest and "/" not in scheme else None


@dataclass
class Rows:
    """The rows of a batch a table source keeps (by row number in the batch), and the
    rows it leaves out."""

    kept: list[int] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)
    originals: list[str] = field(default_factory=list)
    ext: list[str] = field(default_factory=list)
    path: list[str | None] = field(default_factory=list)
    size: list[int] = field(default_factory=list)
    data: list[bytes] | None = None
    left_out: list[LeftOut] = field(default_factory=list)

    def add(self, row: int, key: str, original: str, member: Member) -> None:
        self.kept.append(row)
        self.keys.append(key)
        self.originals.append(original)
        self.ext.append(member.ext)
        self.path.append(member.path)
        self.size.append(member.size)
        if member.data is not None:
            self.data = self.data or []
            self.data.append(member.data)

    def members(self) -> pa.Array:
        """The ``_members`` column: one member per kept row."""
        n = len(self.kept)
        return members_array(
            np.arange(n + 1, dtype=np.int32),
            self.ext,
            self.path,
            np.full(n, -1, np.int64),
            self.size,
            self.data,
        )

    def leave_out(
        self,
        key: str,
        reason: str,
        original: str | None = None,
        error: type[SourceError] = BadSampleError,
    ) -> None:
        key = printable(key)
        self.left_out.append(LeftOut(original or key, reason, key, error))


def common_key_base(folder: Path, rels: Callable[[], Iterator[pa.Array]]) -> str | None:
    """Where keys of rows without a key column start: None when every path is relative
    and stays below the table's folder (keys are the paths as written,
    ``imgs/a.jpg`` -> ``imgs/a``), else the common parent folder of all the rows' files.

    When a path is absolute or climbs out with ``..`` (which would make an unsafe key),
    every key is the path relative to that common parent instead, as a folder source
    would name them: the same table always gives the same keys. ``rels`` starts a pass
    over the path column.
    """

    def norm() -> Iterator[str]:
        for chunk in rels():
            yield from (
                os.path.normpath(pseudo_path(r) if is_url(r) else r) for r in chunk.to_pylist() if r
            )

    if all(not os.path.isabs(n) and n.split(os.sep, 1)[0] != ".." for n in norm()):
        return None
    base: str | None = None
    for n in norm():  # pairwise, not one list: a table may have millions of rows
        parent = os.path.dirname(os.path.normpath(folder / n))
        base = parent if base is None else os.path.commonpath([base, parent])
    return base


def keys_from_paths(folder: Path, rels: list[str | None], base: str | None) -> list[str]:
    """Keys for rows without a key column (see :func:`common_key_base`)."""
    norm = [os.path.normpath(r) if r else "" for r in rels]
    if base is None:
        return [key_from_relpath(printable(n)) if n else "" for n in norm]
    full = [os.path.normpath(folder / n) if n else "" for n in norm]
    return [key_from_relpath(printable(os.path.relpath(f, base))) if f else "" for f in full]


def _member(ext: str, size: int, path: str, head: Callable[[], bytes]) -> tuple[Member | None, str]:
    """The member of a file or object named ``ext``, or None and why it cannot be one.

    A name that is not an image's is accepted when the first bytes (``head()``) are an
    image's (its format then names the member); else it would be exported as ``KEY.bin``.
    """
    if ext not in IMAGE_EXTENSIONS:
        why = unexported_image_reason(ext)
        if why is not None:
            return None, f"is not exported: {why}"
        fmt = sniff(head())
        if fmt is None:
            return None, "is not a recognised image (JPEG, PNG, WebP, GIF, BMP or TIFF)"
        ext = {"jpeg": "jpg", "tiff": "tif"}.get(fmt, fmt)
    return Member(ext, size, path=path), ""


def _head(full: Path) -> bytes:
    with full.open("rb") as f:
        return f.read(16)


def file_member(full: Path) -> tuple[Member | None, str]:
    """The member of an image file, or None and why it cannot be one."""
    try:
        st = full.stat()
    except FileNotFoundError:
        return None, MISSING
    except OSError as exc:
        return None, f"cannot be read: {exc.strerror}"
    if stat.S_ISDIR(st.st_mode):
        return None, "is a folder, not an image file"
    if not stat.S_ISREG(st.st_mode):
        return None, "is not a regular file (a FIFO, socket or device)"
    try:
        ext = full.suffix.lstrip(".").lower()
        return _member(ext, st.st_size, str(full), lambda: _head(full))
    except OSError as exc:
        return None, f"cannot be read: {exc.strerror}"


def object_members(
    urls: dict[int, str | None], options: dict[str, Any] | None
) -> dict[int, tuple[Member | None, str]]:
    """The members of rows that name objects (by row number), or why each cannot be one:
    their sizes asked concurrently (one HEAD each), the first bytes of those whose names
    are not images' read to tell their format."""
    if not urls:
        return {}
    stores: dict[str, Storage] = {}
    for url in urls.values():
        if url is not None:
            bucket = split_url(url)[0]
            if bucket not in stores:
                stores[bucket] = open_storage(bucket, options)
                register(stores[bucket])

    def one(url: str | None) -> tuple[Member | None, str]:
        if url is None:
            return None, "climbs out of its bucket with '..'"
        bucket, path = split_url(url)
        storage = stores[bucket]
        try:
            size = storage.size(path)
        except ObjectNotFoundError:
            return None, MISSING
        name = path.rpartition("/")[2]
        ext = name.rpartition(".")[2].lower() if "." in name else ""
        return _member(ext, size, url, lambda: storage.get_range(path, 0, 16) if size else b"")

    with ThreadPoolExecutor(MAX_IN_FLIGHT, "shardex-source-head") as pool:
        return dict(zip(urls, pool.map(one, urls.values()), strict=True))
