"""Recognise, check and decode encoded images without re-encoding them.

Two levels of checking, picked with ``validate``:

* ``"header"`` (default, cheap): the magic bytes name a known image format and the end of
  the file has the format's terminator (JPEG end-of-image marker, PNG ``IEND`` chunk,
  RIFF/BMP sizes match the file size). Catches empty, truncated and non-image files while
  reading only the first and last few KiB.
* ``"decode"``: full decode with Pillow under a pixel limit; catches damage inside the
  compressed data too, at the cost of decoding every image once.
"""

from __future__ import annotations

import io
import struct
from typing import Final, Literal

import numpy as np
import numpy.typing as npt

Validate = Literal["none", "header", "decode"]
VALIDATE_CHOICES: Final = ("none", "header", "decode")
IMAGE_EXTENSIONS: Final = frozenset({"jpg", "jpeg", "png", "webp", "gif", "bmp", "tif", "tiff"})
HEAD_BYTES: Final = 64
TAIL_BYTES: Final = 4096
#: Default pixel limit for decoding (the same order as Pillow's bomb warning).
MAX_PIXELS: Final = 178_956_970

_ENCODING_OF_EXT: Final = {
    "jpg": "jpeg",
    "jpeg": "jpeg",
    "png": "png",
    "webp": "webp",
    "gif": "gif",
    "bmp": "bmp",
    "tif": "tiff",
    "tiff": "tiff",
}


def encoding_of_extension(ext: str) -> str | None:
    """The image encoding a file extension stands for, e.g. ``jpg`` -> ``jpeg``."""
    return _ENCODING_OF_EXT.get(ext.lower())


def sniff(head: bytes) -> str | None:
    """The image format named by the first bytes, or None."""
    if head[:3] == b"\xff\xd8\xff":
        return "jpeg"
    if head[:8] == b"\x89PNG\r\n\x1a\n":
        return "png"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "webp"
    if head[:6] in (b"GIF87a", b"GIF89a"):
        return "gif"
    if head[:2] == b"BM":
        return "bmp"
    if head[:4] in (b"II*\0", b"MM\0*"):
        return "tiff"
    return None


def check_header(head: bytes, tail: bytes, size: int) -> str | None:
    """Cheap structural check; returns the reason the bytes are not a whole image, or None.

    Args:
        head: the first :data:`HEAD_BYTES` (or all) bytes.
        tail: the last :data:`TAIL_BYTES` (or all) bytes.
        size: the total size in bytes.
    """
    if size == 0:
        return "empty file (0 bytes)"
    fmt = sniff(head)
    if fmt is None:
        return f"not a recognised image (starts with {head[:8]!r})"
    if fmt == "jpeg" and b"\xff\xd9" not in tail:
        return "truncated JPEG (no end-of-image marker)"
    if fmt == "png" and b"IEND" not in tail[-64:]:
        return "truncated PNG (no IEND chunk)"
    if fmt == "webp" and size < struct.unpack_from("<I", head, 4)[0] + 8:
        return "truncated WebP (file shorter than its RIFF size)"
    if fmt == "bmp" and len(head) >= 6 and size < struct.unpack_from("<I", head, 2)[0]:
        return "truncated BMP (file shorter than its header size)"
    if fmt == "gif" and not tail.rstrip(b"\0").endswith(b";"):
        return "truncated GIF (no trailer)"
    return None


def check_decode(data: bytes, *, max_pixels: int = MAX_PIXELS) -> str | None:
    """Decode fully; returns the reason decoding failed, or None."""
    reason = check_header(data[:HEAD_BYTES], data[-TAIL_BYTES:], len(data))
    if reason:
        return reason
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as img:
            w, h = img.size
            if w * h > max_pixels:
                return f"image too large ({w}x{h} = {w * h} pixels > limit {max_pixels})"
            img.load()
    except UnidentifiedImageError:
        return "cannot decode: not an image Pillow can read"
    except Exception as exc:  # Pillow raises many types for bad data
        return f"cannot decode: {exc}"
    return None


def decode(data: bytes, *, max_pixels: int = MAX_PIXELS) -> npt.NDArray[np.generic]:
    """Decode an encoded image to an array (H, W) or (H, W, C).

    Conversion policy: palette images become RGB (RGBA if they carry transparency), CMYK
    and YCbCr become RGB, 1-bit becomes 8-bit L; every other mode (L, LA, RGB, RGBA, I;16)
    is kept as stored.
    """
    from PIL import Image

    with Image.open(io.BytesIO(data)) as opened:
        w, h = opened.size
        if w * h > max_pixels:
            raise ValueError(f"image too large ({w}x{h} pixels > limit {max_pixels})")
        img: Image.Image = opened
        if img.mode == "P":
            img = img.convert("RGBA" if "transparency" in img.info else "RGB")
        elif img.mode in ("CMYK", "YCbCr"):
            img = img.convert("RGB")
        elif img.mode == "1":
            img = img.convert("L")
        return np.asarray(img)
