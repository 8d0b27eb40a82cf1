"""Array-level image operations behind the built-in stages (decode, convert, resize, crop).

Arrays are HWC (``(H, W)`` for one channel), ``uint8`` or ``uint16`` for 16-bit gray.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final, Literal

import numpy as np
import numpy.typing as npt

from shardex.codecs.images import MAX_PIXELS, sniff
from shardex.codecs.images import decode as decode_jpeg
from shardex.errors import ConfigError

if TYPE_CHECKING:
    from PIL import Image

Pixels = npt.NDArray[np.generic]
DecodeMode = Literal["RGB", "RGBA", "L", "keep"]
DECODE_MODES: Final = ("RGB", "RGBA", "L", "keep")
Interpolation = Literal["nearest", "bilinear", "bicubic", "lanczos", "box", "area", "hamming"]
#: Pillow's filter per name; "area" is BOX (what OpenCV's INTER_AREA does when shrinking).
INTERPOLATIONS: Final = {
    "nearest": "NEAREST",
    "bilinear": "BILINEAR",
    "bicubic": "BICUBIC",
    "lanczos": "LANCZOS",
    "box": "BOX",
    "area": "BOX",
    "hamming": "HAMMING",
}
WHITE: Final = (255, 255, 255)
_STORED_MODES: Final = frozenset({"L", "LA", "RGB", "RGBA"})
_SIXTEEN_BIT_MODES: Final = frozenset({"I;16", "I;16L", "I;16B", "I;16N"})


def check_choice(name: str, value: str, choices: Sequence[str]) -> None:
    if value not in choices:
        raise ConfigError(f"{name}={value!r} is not supported; choose one of {list(choices)}")


def check_background(background: Sequence[int]) -> tuple[int, int, int]:
    """An ``(r, g, b)`` tuple of 0-255 ints, or ConfigError."""
    values = tuple(background)
    if len(values) != 3 or not all(isinstance(v, int) and 0 <= v <= 255 for v in values):
        raise ConfigError(f"background={background!r} must be three ints 0-255 (r, g, b)")
    return values[0], values[1], values[2]


def decode_image(
    data: bytes,
    mode: DecodeMode = "RGB",
    *,
    background: tuple[int, int, int] = WHITE,
    max_pixels: int = MAX_PIXELS,
    size_hint: tuple[int, int] | None = None,
) -> Pixels:
    """Decode encoded bytes and convert them by the policy of ``mode``.

    Raises:
        ValueError: not a decodable image, or one shardex cannot represent (float, >16 bit).
    """
    return to_mode(
        decode_stored(data, max_pixels=max_pixels, size_hint=size_hint), mode, background
    )


def decode_stored(
    data: bytes, *, max_pixels: int = MAX_PIXELS, size_hint: tuple[int, int] | None = None
) -> Pixels:
    """The image as stored, made representable: L, LA, RGB, RGBA (uint8) or 16-bit L.

    Animated images give their first frame.
    """
    from PIL import Image, UnidentifiedImageError

    try:
        if sniff(data[:16]) == "jpeg":
            return decode_jpeg(data, max_pixels=max_pixels, size_hint=size_hint)
        with Image.open(io.BytesIO(data)) as img:
            width, height = img.size
            if width * height > max_pixels:
                raise ValueError(
                    f"image too large ({width}x{height} pixels > max_pixels={max_pixels})"
                )
            return _stored_array(img)
    except UnidentifiedImageError as exc:
        raise ValueError("not an image Pillow can read") from exc
    except (OSError, SyntaxError, Image.DecompressionBombError) as exc:  # damaged data
        raise ValueError(str(exc) or type(exc).__name__) from exc


def _stored_array(img: Image.Image) -> Pixels:
    mode = img.mode
    if mode in _STORED_MODES:
        return np.asarray(img)
    if mode in _SIXTEEN_BIT_MODES:
        return np.asarray(img).astype(np.uint16)  # also fixes the byte order of I;16B
    if mode == "I":
        values = np.asarray(img)
        if values.size and (values.min() < 0 or values.max() > 0xFFFF):
            raise ValueError("32-bit integer image with values outside 0-65535")
        return values.astype(np.uint16)
    if mode == "F":
        raise ValueError("floating-point images (mode F) are not supported")
    if mode == "P":
        return np.asarray(img.convert("RGBA" if img.has_transparency_data else "RGB"))
    if mode in ("PA", "RGBa", "RGBX"):
        return np.asarray(img.convert("RGBA" if mode != "RGBX" else "RGB"))
    if mode == "La":
        return np.asarray(img.convert("LA"))
    if mode == "1":
        return np.asarray(img.convert("L"))
    return np.asarray(img.convert("RGB"))  # CMYK, YCbCr, LAB, HSV


def channels(pixels: Pixels) -> int:
    return 1 if pixels.ndim == 2 else int(pixels.shape[2])


def to_mode(pixels: Pixels, mode: DecodeMode, background: tuple[int, int, int] = WHITE) -> Pixels:
    """Convert a stored array to ``mode``; see the conversion table in docs/pipeline.md."""
    if mode == "keep":
        return pixels
    if pixels.dtype == np.uint16:
        pixels = np.right_shift(pixels, 8).astype(np.uint8)
    if pixels.dtype != np.uint8:
        raise ValueError(f"pixels of dtype {pixels.dtype} (expected uint8 or uint16)")
    n = channels(pixels)
    if mode == "L":
        return pixels if n == 1 else luma(to_mode(pixels, "RGB", background))
    gray = pixels if n == 1 else pixels[..., 0] if n == 2 else None
    color = np.repeat(gray[..., None], 3, axis=2) if gray is not None else pixels[..., :3]
    alpha = pixels[..., n - 1] if n in (2, 4) else None
    if mode == "RGBA":
        if alpha is None:
            alpha = np.full(pixels.shape[:2], 255, np.uint8)
        return np.ascontiguousarray(np.dstack([color, alpha]))
    return composite(color, alpha, background) if alpha is not None else color


def composite(color: Pixels, alpha: Pixels, background: tuple[int, int, int]) -> Pixels:
    """``color`` over an opaque ``background`` by ``alpha`` (straight alpha), rounded."""
    a = alpha[..., None].astype(np.uint16)
    bg = np.asarray(background, np.uint16)
    # at most 255 * 255 + 127: fits uint16, so no wider temporaries
    out = (color.astype(np.uint16) * a + bg * (255 - a) + 127) // 255
    return out.astype(np.uint8)


def luma(rgb: Pixels) -> Pixels:
    """ITU-R 601-2 luma with Pillow's fixed-point weights (bit-identical to ``convert("L")``)."""
    r, g, b = (rgb[..., i].astype(np.uint32) for i in range(3))
    return ((r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16).astype(np.uint8)


def resize(pixels: Pixels, size: tuple[int, int], interpolation: Interpolation) -> Pixels:
    """Resize to ``size`` = (width, height) (Pillow premultiplies alpha: no colour bleed)."""
    from PIL import Image

    if (pixels.shape[1], pixels.shape[0]) == size:
        return pixels
    resample = getattr(Image.Resampling, INTERPOLATIONS[interpolation])
    return np.asarray(Image.fromarray(pixels).resize(size, resample))


def center_crop(pixels: Pixels, size: tuple[int, int]) -> Pixels:
    """The centred ``size`` = (width, height) window; the caller checks it fits."""
    height, width = pixels.shape[:2]
    top, left = (height - size[1]) // 2, (width - size[0]) // 2
    return np.ascontiguousarray(pixels[top : top + size[1], left : left + size[0]])


def scaled_size(
    width: int, height: int, target: int, side: Literal["shorter", "longer"]
) -> tuple[int, int]:
    """(width, height) with the shorter (or longer) side ``target``, aspect kept, rounded."""
    ref = min(width, height) if side == "shorter" else max(width, height)
    if width == height or ref == target:
        return (target, target) if width == height else (width, height)
    scale = target / ref
    return max(1, round(width * scale)), max(1, round(height * scale))
