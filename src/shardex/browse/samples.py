"""Reading samples for the browser: thumbnails, full images and the sample page's details.

A thumbnail is one read and a reduced-size decode (libjpeg's draft mode, several times
faster); thumbnails sit in an LRU cache, and a sample page's bytes are kept briefly.
"""

from __future__ import annotations

import contextlib
import io
import threading
import warnings
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Final

from shardex.codecs.images import IMAGE_EXTENSIONS, MAX_PIXELS, encoding_of_extension
from shardex.dataset import Dataset, SampleRanges
from shardex.errors import FormatError, ShardexError

#: Images of more pixels than this (after JPEG's reduced-size decode) are decoded in full
#: at most two at a time: a grid of 48 such PNGs at once would need tens of GB.
_LARGE_PIXELS: Final = 16 << 20
_LARGE_DECODES: Final = threading.BoundedSemaphore(2)
#: Thumbnail sizes the grid asks for (longest side, pixels); any other is refused.
THUMB_SIZES: Final = (96, 160, 256)
THUMB_CACHE_BYTES: Final = 64 << 20
SAMPLES_KEPT: Final = 8
#: Encodings served inline as ``image/ENCODING`` (not TIFF: browsers do not show it).
_INLINE_ENCODINGS: Final = frozenset({"jpeg", "png", "webp", "gif", "bmp"})


class BadImageError(FormatError):
    """A sample's image field cannot be decoded (or it has none)."""


@dataclass(frozen=True, slots=True)
class Field:
    """One stored field of a sample, and where its bytes lie in the shard."""

    name: str
    size: int
    start: int | None  # byte offset in the shard; None when the backend does not say
    end: int | None


@dataclass(frozen=True, slots=True)
class Detail:
    """What the sample page shows of a sample's stored bytes."""

    key: str
    shard: str | None
    offset: int | None
    length: int | None
    checksum: str | None  # "xxh3_64:HEX" from the index
    verified: bool
    fields: tuple[Field, ...]


@dataclass(frozen=True, slots=True)
class _Read:
    key: str
    fields: dict[str, bytes]
    detail: Detail


class SampleReader:
    """Thumbnails, images and details of a split's samples (thread-safe)."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset
        self._lock = threading.Lock()
        self._thumbs: OrderedDict[tuple[int, int], bytes] = OrderedDict()
        self._thumb_bytes = 0
        self._recent: OrderedDict[int, _Read] = OrderedDict()

    def thumbnail(self, index: int, size: int) -> bytes:
        """A JPEG of at most ``size`` x ``size`` pixels of sample ``index``'s image.

        Raises:
            ShardexError: the sample cannot be read, or its image decoded (BadImageError).
        """
        with self._lock:
            cached = self._thumbs.get((index, size))
            if cached is not None:
                self._thumbs.move_to_end((index, size))
                return cached
        sample = self.dataset[index]
        ext, data = image_field(sample, index)
        thumb = make_thumbnail(data, size, f"sample {index} ({ext})")
        with self._lock:
            self._thumbs[(index, size)] = thumb
            self._thumb_bytes += len(thumb)
            while self._thumb_bytes > THUMB_CACHE_BYTES:
                _, dropped = self._thumbs.popitem(last=False)
                self._thumb_bytes -= len(dropped)
        return thumb

    def image(self, index: int) -> tuple[bytes, str]:
        """The stored bytes of sample ``index``'s image and their media type."""
        ext, data = image_field(self.read(index).fields, index)
        encoding = encoding_of_extension(ext.rpartition(".")[2])
        if encoding not in _INLINE_ENCODINGS:
            return data, "application/octet-stream"
        return data, f"image/{encoding}"

    def detail(self, index: int) -> Detail:
        """Key, shard, byte ranges and checksum of sample ``index`` (read and verified)."""
        return self.read(index).detail

    def read(self, index: int) -> _Read:
        with self._lock:
            if index in self._recent:
                return self._recent[index]
        if isinstance(self.dataset, SampleRanges):
            read = _read_range(self.dataset, index)
        else:
            sample = dict(self.dataset[index])
            key = str(sample.pop("__key__"))
            fields = {k: v for k, v in sample.items() if isinstance(v, bytes)}
            sizes = tuple(Field(k, len(v), None, None) for k, v in fields.items())
            read = _Read(key, fields, Detail(key, None, None, None, None, False, sizes))
        with self._lock:
            self._recent[index] = read
            while len(self._recent) > SAMPLES_KEPT:
                self._recent.popitem(last=False)
        return read


def _read_range(ds: SampleRanges, index: int) -> _Read:
    """A sample that is a byte range of its shard: one ranged read, checksum checked."""
    record = ds.records[index]
    offset, length = int(record["offset"]), int(record["length"])
    checksum, shard = int(record["checksum"]), int(record["shard"])
    shards = ds.config.split(ds.split).shards
    if shard >= len(shards) or offset + length > shards[shard].num_bytes:
        raise FormatError(
            f"index record of sample {index} points outside the shards of split "
            f"{ds.split!r} (shard {shard}, bytes {offset}+{length}): the index is damaged"
        )
    path = shards[shard].path
    buf = ds.storage.get_range(path, offset, length)
    sample = dict(ds.from_bytes(buf, checksum, shard, offset, index))  # ChecksumError
    key = str(sample.pop("__key__"))
    fields = {k: v for k, v in sample.items() if isinstance(v, bytes)}
    members = tuple(
        Field(name, size, offset + start, offset + start + size)
        for name, start, size in ds.field_spans(buf, shard)
    )
    checked = f"xxh3_64:{checksum:016x}"
    return _Read(key, fields, Detail(key, path, offset, length, checked, ds.verify, members))


def image_field(sample: dict[str, Any], index: int) -> tuple[str, bytes]:
    """``(extension, bytes)`` of a sample's first image field, or BadImageError."""
    for ext, data in sample.items():
        if ext.rpartition(".")[2].lower() in IMAGE_EXTENSIONS and isinstance(data, bytes):
            return ext, data
    names = ", ".join(k for k in sample if k != "__key__")
    raise BadImageError(f"sample {index} has no image field (its fields: {names})")


def _reduced(opened: Any, size: int, what: str) -> Any:
    """An opened image decoded at reduced size, as RGB."""
    with opened as image:
        if image.width * image.height > MAX_PIXELS:
            raise BadImageError(
                f"{what} is {image.width}x{image.height} pixels, more than the "
                f"{MAX_PIXELS} shardex decodes"
            )
        image.draft("RGB", (size, size))  # JPEG only: libjpeg's 1/2, 1/4, 1/8 scaling
        large = image.width * image.height > _LARGE_PIXELS
        with _LARGE_DECODES if large else contextlib.nullcontext():
            image.thumbnail((size, size))
            return image.convert("RGB")


def make_thumbnail(data: bytes, size: int, what: str) -> bytes:
    """A JPEG thumbnail (quality 80) of encoded image bytes, or BadImageError."""
    from PIL import Image

    try:
        with warnings.catch_warnings():
            # the size is checked below against shardex's own cap, not Pillow's warning
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            rgb = _reduced(Image.open(io.BytesIO(data)), size, what)
    except ShardexError:
        raise
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        raise BadImageError(f"{what} is not a decodable image: {exc}") from exc
    out = io.BytesIO()
    rgb.save(out, "JPEG", quality=80)
    return out.getvalue()
