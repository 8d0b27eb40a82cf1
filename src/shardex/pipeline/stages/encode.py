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

ENCODE_FORMATS: Final = ("webp", "jpeg", "png")
Subsampling = Literal["4:4:4", "4:2:2", "4:2:0"]
SUBSAMPLINGS: Final = ("4:4:4", "4:2:2", "4:2:0")
EXTENSIONS: Final = {"webp": "webp", "jpeg": "jpg", "png": "png"}
_PIL_FORMATS: Final = {"webp": "WEBP", "jpeg": "JPEG", "png": "PNG"}


class EncodeStage(Stage):
    """Encode ``pixels`` into ``image`` bytes, keeping original bytes where possible.

    With ``passthrough``, unchanged pixels whose ``image`` is already in ``format`` (and,
    for WebP, as lossless as asked) keep their bytes. Encoding is deterministic. See
    docs/pipeline.md, "Encoding and passthrough", for the channels each format takes.

    Args:
        format: ``"webp"``, ``"jpeg"`` (``"jpg"`` accepted) or ``"png"``.
        quality: 0-100; for lossless WebP the compression effort; ignored for PNG.
        lossless: WebP only: lossless (VP8L) or lossy (VP8); a ConfigError with JPEG.
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
        options: dict[str, Any]
        if self.format == "jpeg":
            options = {
                "subsampling": self.jpeg_subsampling,
                "progressive": False,
                "optimize": False,
            }
        elif self.format == "webp":
            # exact: lossless keeps the colour under fully transparent pixels too
            options = {
                "lossless": self.lossless,
                "method": self.webp_method,
                "exact": self.lossless,
            }
        else:
            options = {"compress_level": self.png_compress_level, "optimize": False}
        if self.format != "png":
            options["quality"] = self.quality
        Image.fromarray(np.ascontiguousarray(pixels)).save(
            out, _PIL_FORMATS[self.format], **options
        )
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
    """True for a lossless (VP8L) WebP, False for lossy (VP8), None if not in ``head``.

    Walks the RIFF chunks (VP8X, ICCP, ALPH ... come first); animated WebP gives None.
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
