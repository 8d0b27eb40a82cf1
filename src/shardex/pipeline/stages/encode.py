"""The encode stage: ``pixels`` back to ``image`` bytes, or the original bytes untouched."""

from __future__ import annotations

import io
import struct
from typing import Any, ClassVar, Final, Literal

import numpy as np

from shardex.codecs.images import sniff
from shardex.errors import ConfigError
from shardex.pipeline.stage import Batch, Sample, Stage
from shardex.pipeline.stages._common import require, sample_name
from shardex.pipeline.stages.pixels import Pixels, channels, check_choice

EncodeFormat = Literal["webp", "jpeg", "png"]
ENCODE_FORMATS: Final = ("webp", "jpeg", "png")
Subsampling = Literal["4:4:4", "4:2:2", "4:2:0"]
SUBSAMPLINGS: Final = ("4:4:4", "4:2:2", "4:2:0")
EXTENSIONS: Final = {"webp": "webp", "jpeg": "jpg", "png": "png"}
_PIL_FORMATS: Final = {"webp": "WEBP", "jpeg": "JPEG", "png": "PNG"}


class EncodeStage(Stage):
    """Encode ``pixels`` into ``image`` bytes, keeping original bytes where possible.

    **Passthrough**: when ``passthrough`` is on, the sample's pixels are unchanged
    (``pixels_changed`` is not true) and its ``image`` is already in ``format`` (for WebP:
    also lossless exactly when ``lossless`` is asked), ``image`` is kept byte for byte,
    whatever its quality. Otherwise ``pixels`` is encoded and ``image_ext`` set
    (``webp``, ``jpg``, ``png``). Either way ``pixels`` and ``pixels_changed`` are removed
    from the sample.

    Encoding is deterministic (same pixels and options, same bytes): no timestamps, no
    progressive or optimised JPEG, fixed libwebp method and PNG compression level.

    Channels: JPEG takes gray (H, W) or RGB uint8 and refuses alpha with a ConfigError
    (choose ``DecodeStage(mode="RGB")``, which composites alpha on a background, or
    another format); WebP takes uint8 gray/RGB (stored as RGB) and gray+alpha/RGBA
    (stored as RGBA); PNG takes every uint8 layout and 16-bit grayscale.

    Args:
        format: ``"webp"``, ``"jpeg"`` (``"jpg"`` accepted) or ``"png"``.
        quality: 0-100. JPEG and lossy WebP: the usual quality. Lossless WebP: the
            compression effort (0 fastest, 100 smallest file; pixels are exact either
            way). PNG: ignored (see ``png_compress_level``).
        lossless: WebP only: lossless (VP8L) when True, lossy (VP8) when False; never
            switched silently. ``lossless=True`` with JPEG is a ConfigError.
        passthrough: keep unchanged originals already in ``format``; False re-encodes all.
        webp_method: libwebp's speed/size trade-off, 0 (fast) to 6 (small).
        jpeg_subsampling: chroma subsampling of JPEG output.
        png_compress_level: zlib level 0-9 for PNG output.
    """

    name: ClassVar[str] = "encode"
    needs = ("pixels",)
    produces = ("image", "image_ext")

    def __init__(
        self,
        format: str = "webp",
        quality: int = 90,
        lossless: bool = False,
        *,
        passthrough: bool = True,
        webp_method: int = 4,
        jpeg_subsampling: Subsampling = "4:2:0",
        png_compress_level: int = 6,
    ) -> None:
        fmt = "jpeg" if format == "jpg" else format
        check_choice("format", fmt, ENCODE_FORMATS)
        check_choice("jpeg_subsampling", jpeg_subsampling, SUBSAMPLINGS)
        _check_range("quality", quality, 0, 100)
        _check_range("webp_method", webp_method, 0, 6)
        _check_range("png_compress_level", png_compress_level, 0, 9)
        if lossless and fmt == "jpeg":
            raise ConfigError("lossless=True with format='jpeg': use 'png' or 'webp'")
        self.format = fmt
        self.quality = quality
        self.lossless = lossless
        self.passthrough = passthrough
        self.webp_method = webp_method
        self.jpeg_subsampling: Subsampling = jpeg_subsampling
        self.png_compress_level = png_compress_level

    def process(self, batch: Batch) -> Batch:
        for sample in batch:
            if self.passthrough and self.keeps_original(sample):
                sample.setdefault("image_ext", EXTENSIONS[self.format])
            else:
                pixels = require(sample, "pixels", self.name, "put a DecodeStage first")
                sample["image"] = self.encode(pixels, sample)
                sample["image_ext"] = EXTENSIONS[self.format]
            sample.pop("pixels", None)
            sample.pop("pixels_changed", None)
        return batch

    def keeps_original(self, sample: Sample) -> bool:
        """Whether ``sample``'s ``image`` bytes already are what encoding would aim at."""
        data = sample.get("image")
        if sample.get("pixels_changed") or not isinstance(data, bytes | bytearray | memoryview):
            return False
        fmt = sniff(bytes(data[:16]))
        if fmt != self.format:
            return False
        return fmt != "webp" or webp_is_lossless(bytes(data[: 1 << 16])) is self.lossless

    def encode(self, pixels: Pixels, sample: Sample) -> bytes:
        """``pixels`` in this stage's format; ConfigError naming ``sample`` if impossible."""
        from PIL import Image

        self._check_layout(pixels, sample)
        out = io.BytesIO()
        image = Image.fromarray(np.ascontiguousarray(pixels))
        if self.format == "jpeg":
            image.save(
                out,
                "JPEG",
                quality=self.quality,
                subsampling=self.jpeg_subsampling,
                optimize=False,
                progressive=False,
            )
        elif self.format == "webp":
            # exact: lossless keeps the colour under fully transparent pixels too
            image.save(
                out,
                "WEBP",
                quality=self.quality,
                lossless=self.lossless,
                method=self.webp_method,
                exact=self.lossless,
            )
        else:
            image.save(out, "PNG", compress_level=self.png_compress_level, optimize=False)
        return out.getvalue()

    def _check_layout(self, pixels: Any, sample: Sample) -> None:
        if not isinstance(pixels, np.ndarray) or pixels.ndim not in (2, 3):
            raise ConfigError(
                f"encode stage: sample {sample_name(sample)}: 'pixels' must be an HWC numpy "
                f"array, got {type(pixels).__name__} of shape {getattr(pixels, 'shape', '?')}"
            )
        n = channels(pixels)
        problem = None
        if pixels.dtype == np.uint16 and (self.format != "png" or n != 1):
            problem = "16-bit pixels can only be encoded as 16-bit grayscale PNG"
        elif pixels.dtype not in (np.uint8, np.uint16) or n not in (1, 2, 3, 4):
            problem = f"unsupported pixels ({pixels.dtype}, {n} channels)"
        elif self.format == "jpeg" and n in (2, 4):
            problem = (
                "JPEG cannot store alpha; decode with DecodeStage(mode='RGB') to composite "
                "it on a background, or encode to 'png' or 'webp'"
            )
        if problem:
            raise ConfigError(
                f"encode stage: sample {sample_name(sample)} ({pixels.dtype}, shape "
                f"{pixels.shape}) cannot be encoded as {self.format}: {problem}"
            )


def webp_is_lossless(head: bytes) -> bool | None:
    """True for a lossless (VP8L) WebP, False for lossy (VP8), None if not found in ``head``.

    Walks the RIFF chunks (VP8X, ICCP, ALPH ... come before the image chunk); an animated
    WebP (frames in ANMF chunks) gives None.
    """
    pos = 12
    while pos + 8 <= len(head):
        chunk = head[pos : pos + 4]
        if chunk == b"VP8L":
            return True
        if chunk == b"VP8 ":
            return False
        (length,) = struct.unpack_from("<I", head, pos + 4)
        pos += 8 + length + (length & 1)
    return None


def _check_range(name: str, value: int, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(f"{name}={value!r} must be an int from {low} to {high}")
