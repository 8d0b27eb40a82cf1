"""Recognise, check and decode encoded images without re-encoding them: ``validate="header"``
checks magic bytes and terminators from the first and last few KiB; ``"decode"`` decodes
every image once under a pixel limit.
"""

from __future__ import annotations

import functools
import importlib
import io
import struct
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Final, Literal

if TYPE_CHECKING:  # numpy loads with the first decode: reading raw bytes needs none
    import numpy as np
    import numpy.typing as npt

Validate = Literal["none", "header", "decode"]
VALIDATE_CHOICES: Final = ("none", "header", "decode")
IMAGE_EXTENSIONS: Final = frozenset({"jpg", "jpeg", "png", "webp", "gif", "bmp", "tif", "tiff"})
#: Other JPEG names (exported as .jpg or .jpeg only) and formats shardex cannot decode:
#: left out with the reason, not taken for non-image files.
_JPEG_ALIASES: Final = frozenset({"jfif", "jpe", "jif", "pjpeg", "pjp"})
_UNEXPORTED_IMAGES: Final = frozenset(
    {
        *("heic", "heif", "hif", "avif", "jxl", "jp2", "j2k", "jpf", "jpx", "jpm", "qoi"),
        *("ico", "icns", "cur", "svg", "svgz", "psd", "psb", "xcf", "exr", "hdr", "dds"),
        *("tga", "pbm", "pgm", "ppm", "pnm", "pcx", "emf", "wmf", "raw"),
        *("dng", "cr2", "cr3", "crw", "nef", "nrw", "arw", "srf", "sr2", "orf", "rw2"),
        *("raf", "pef", "srw", "x3f", "erf", "kdc", "mrw", "3fr", "iiq"),
    }
)
HEAD_BYTES: Final = 4096
TAIL_BYTES: Final = 4096
#: Colour spaces simplejpeg decodes as Pillow does (RGB, or L for "Gray").
_SIMPLEJPEG_SPACES: Final = frozenset({"YCbCr", "RGB", "Gray"})
MAX_PIXELS: Final = 178_956_970  # Pillow's bomb warning's order


def unexported_image_reason(ext: str) -> str | None:
    """Why a file of an image format shardex does not export is left out; else None."""
    ext = ext.lower()
    if ext in _JPEG_ALIASES:
        return f"'.{ext}' is a JPEG name shardex does not export: rename the file .jpg"
    if ext in _UNEXPORTED_IMAGES:
        supported = ", ".join(sorted(IMAGE_EXTENSIONS))
        return f"'.{ext}' images are not supported (shardex exports {supported}): convert it"
    return None


def encoding_of_extension(ext: str) -> str | None:
    """The image encoding a file extension stands for, e.g. ``jpg`` -> ``jpeg``."""
    ext = ext.lower()
    return {"jpg": "jpeg", "tif": "tiff"}.get(ext, ext) if ext in IMAGE_EXTENSIONS else None


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


#: The member extension of each image format (others: the format's name).
EXTENSION_OF: Final = {"jpeg": "jpg", "tiff": "tif"}


def sniffed_extension(head: bytes) -> str | None:
    """The member extension of the image format named by the first bytes, or None."""
    fmt = sniff(head)
    return None if fmt is None else EXTENSION_OF.get(fmt, fmt)


ReadAt = Callable[[int, int], bytes]
#: 0xFF, kind, length; in a frame header then precision (skipped), height, width.
_MARKER: Final = struct.Struct(">BBHxHH")
_JPEG_FRAMES: Final = frozenset(
    {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
)


def jpeg_size(
    head: bytes | memoryview, read_at: ReadAt | None, size: int
) -> tuple[int, int] | None:
    """Walk the JPEG markers to the frame header; reads past ``head`` go to ``read_at``."""
    pos = 2
    held = len(head)
    for _ in range(512):  # a real file reaches its frame header in a few markers
        if pos + 9 > size:
            return None
        if pos + 9 <= held:  # the common case: unpacked in place, no slice
            mark, kind, length, height, width = _MARKER.unpack_from(head, pos)
        else:
            block = read_at(pos, 9) if read_at is not None else b""
            if len(block) < 9:
                return None
            mark, kind, length, height, width = _MARKER.unpack_from(block)
        if mark != 0xFF:
            return None
        if kind in _JPEG_FRAMES:
            return width, height
        pos += 2 + length
    return None


def pixel_size(
    fmt: str, head: bytes, size: int, read_at: ReadAt | None = None
) -> tuple[int, int] | None:
    """(width, height) from the header of an encoded image, or None if not found."""
    try:
        if fmt == "jpeg":
            return jpeg_size(head, read_at, size)
        if fmt == "png":
            return struct.unpack_from(">II", head, 16)
        if fmt == "gif":
            return struct.unpack_from("<HH", head, 6)
        if fmt == "bmp":
            w, h = struct.unpack_from("<ii", head, 18)
            return abs(w), abs(h)
        if fmt == "webp":
            chunk = head[12:16]
            if chunk == b"VP8 ":
                w, h = struct.unpack_from("<HH", head, 26)
                return w & 0x3FFF, h & 0x3FFF
            if chunk == b"VP8L":
                bits = int.from_bytes(head[21:25], "little")
                return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
            if chunk == b"VP8X":
                return (
                    int.from_bytes(head[24:27], "little") + 1,
                    int.from_bytes(head[27:30], "little") + 1,
                )
    except struct.error:
        return None
    return None


def check_header(
    head: bytes,
    tail: bytes,
    size: int,
    *,
    read_at: ReadAt | None = None,
    max_pixels: int = MAX_PIXELS,
) -> str | None:
    """Cheap structural check: why the bytes are not a whole image, or None; also refuses
    decompression bombs by the header's pixel size.

    Args:
        head: the first :data:`HEAD_BYTES` (or all) bytes.
        tail: the last :data:`TAIL_BYTES` (or all) bytes.
        size: the total size in bytes.
        read_at: ``read_at(offset, n)`` reads more of the file when the header needs it.
        max_pixels: the largest width x height accepted.
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
    dims = pixel_size(fmt, head, size, read_at)
    if dims is not None and dims[0] * dims[1] > max_pixels:
        return _too_large(*dims, max_pixels)
    return None


def _too_large(width: int, height: int, max_pixels: int) -> str:
    return (
        f"image too large ({width}x{height} = {width * height} pixels > limit "
        f"{max_pixels}; a decompression bomb? raise max_pixels to accept it)"
    )


def check_decode(data: bytes, *, max_pixels: int = MAX_PIXELS) -> str | None:
    """Decode fully; returns the reason decoding failed, or None."""
    reason = check_header(
        data[:HEAD_BYTES],
        data[-TAIL_BYTES:],
        len(data),
        read_at=lambda o, n: data[o : o + n],
        max_pixels=max_pixels,
    )
    if reason:
        return reason
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as img:
            w, h = img.size
            if w * h > max_pixels:
                return _too_large(w, h, max_pixels)
            img.load()
    except UnidentifiedImageError:
        return "cannot decode: not an image Pillow can read"
    except Exception as exc:  # Pillow raises many types for bad data
        return f"cannot decode: {exc}"
    return None


def decode(
    data: bytes, *, max_pixels: int = MAX_PIXELS, size_hint: tuple[int, int] | None = None
) -> npt.NDArray[np.generic]:
    """Decode an encoded image to an array (H, W) or (H, W, C).

    Palette images become RGB (RGBA with transparency), CMYK and YCbCr RGB, 1-bit L; other
    modes are kept. JPEGs go through simplejpeg when installed (``fast-jpeg`` extra: the same
    pixels, less overhead), falling back to Pillow for anything it refuses, so output and
    errors are the same either way.

    Args:
        size_hint: ``(width, height)`` the caller will resize to: JPEGs then decode at the
            smallest 1/2, 1/4 or 1/8 scale at least that large (several times faster).
    """
    if data[:3] == b"\xff\xd8\xff":
        pixels = _decode_jpeg_fast(data, max_pixels, size_hint)
        if pixels is not None:
            return pixels
    from PIL import Image

    with Image.open(io.BytesIO(data)) as opened:
        w, h = opened.size
        if w * h > max_pixels:
            raise ValueError(f"image too large ({w}x{h} pixels > limit {max_pixels})")
        if size_hint is not None and opened.format == "JPEG":
            opened.draft(opened.mode, size_hint)
        img: Image.Image = opened
        if img.mode == "P":
            img = img.convert("RGBA" if "transparency" in img.info else "RGB")
        elif img.mode in ("CMYK", "YCbCr"):
            img = img.convert("RGB")
        elif img.mode == "1":
            img = img.convert("L")
        import numpy as np

        return np.asarray(img)


@functools.cache
def _simplejpeg() -> ModuleType | None:
    """The simplejpeg module, or None; looked up once (a failed import searches sys.path)."""
    try:
        return importlib.import_module("simplejpeg")  # untyped: no py.typed marker
    except ImportError:
        return None


def draft_scale(width: int, height: int, size_hint: tuple[int, int] | None) -> int:
    """The reduced-size decode factor (1, 2, 4 or 8) Pillow's ``draft()`` picks."""
    if size_hint is None:
        return 1
    scale = min(width // size_hint[0], height // size_hint[1])
    return next((s for s in (8, 4, 2) if scale >= s), 1)


def _decode_jpeg_fast(
    data: bytes, max_pixels: int, size_hint: tuple[int, int] | None
) -> npt.NDArray[np.uint8] | None:
    """simplejpeg's decode with Pillow's output shape, or None to leave it to Pillow."""
    sj = _simplejpeg()
    if sj is None:
        return None
    try:
        height, width, colorspace, _ = sj.decode_jpeg_header(data)
        # CMYK and YCCK need Pillow's Adobe inversion; the limit's error message is Pillow's.
        if colorspace not in _SIMPLEJPEG_SPACES or width * height > max_pixels:
            return None
        scale = draft_scale(width, height, size_hint)
        gray = colorspace == "Gray"
        # libjpeg-turbo scales by n/8 and picks the smallest n meeting both minimums:
        # asking for exactly ceil(side / scale) gives Pillow's 1/scale, never 3/8 or 5/8.
        pixels: npt.NDArray[np.uint8] = sj.decode_jpeg(
            data,
            colorspace="GRAY" if gray else "RGB",
            min_width=-(-width // scale),
            min_height=-(-height // scale),
        )
    except ValueError:  # libjpeg-turbo refused (damaged data, unusual subsampling ...)
        return None
    return pixels.reshape(pixels.shape[:2]) if gray else pixels
