"""Tables whose rows name objects: ``s3://`` URLs, or paths relative to a table that is
itself on object storage.

A URL is worked on as a pseudo absolute path (``s3://b/x.jpg`` -> ``/s3:/b/x.jpg``) so that
the table source's path rules (relative paths joined to the table's folder, keys relative
to the common parent folder) apply unchanged; each row's object is then looked at with
one HEAD (its size), at most :data:`~shardex.storage.fetch.objects.MAX_IN_FLIGHT` at a time.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Final

from shardex.codecs.images import IMAGE_EXTENSIONS, sniff, unexported_image_reason
from shardex.errors import ObjectNotFoundError
from shardex.storage import Storage, open_storage
from shardex.storage.fetch.objects import MAX_IN_FLIGHT, is_url, register, split_url

__all__ = ["MISSING", "Member", "object_members", "pseudo_path", "url_of"]

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
        if ext not in IMAGE_EXTENSIONS:
            why = unexported_image_reason(ext)
            if why is not None:
                return None, f"is not exported: {why}"
            fmt = sniff(storage.get_range(path, 0, 16)) if size else None
            if fmt is None:
                return None, "is not a recognised image (JPEG, PNG, WebP, GIF, BMP or TIFF)"
            ext = {"jpeg": "jpg", "tiff": "tif"}.get(fmt, fmt)
        return Member(ext, size, path=url), ""

    with ThreadPoolExecutor(MAX_IN_FLIGHT, "shardex-source-head") as pool:
        return dict(zip(urls, pool.map(one, urls.values()), strict=True))
