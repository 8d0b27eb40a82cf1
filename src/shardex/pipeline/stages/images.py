"""Pixel stages: decode encoded bytes to ``pixels``, resize, center-crop.

See the conversion table in docs/pipeline.md for what :class:`DecodeStage` gives for
each stored image mode.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Final, Literal

from shardex.codecs.images import MAX_PIXELS
from shardex.errors import BadSampleError, ConfigError
from shardex.pipeline.stage import Batch, Stage
from shardex.pipeline.stages._common import bad_sample, positive_size, require, sample_name
from shardex.pipeline.stages.pixels import (
    DECODE_MODES,
    INTERPOLATIONS,
    WHITE,
    DecodeMode,
    Interpolation,
    center_crop,
    check_background,
    check_choice,
    decode_image,
    resize,
    scaled_size,
)

ResizeMode = Literal["shorter", "longer", "exact"]
RESIZE_MODES: Final = ("shorter", "longer", "exact")
_NEEDS_DECODE: Final = "put a DecodeStage before this stage"


class DecodeStage(Stage):
    """Decode ``image`` bytes (JPEG, PNG, WebP, TIFF, GIF, BMP) into ``pixels``.

    ``pixels`` is an HWC numpy array, converted by the policy of ``mode``:

    * ``"RGB"`` (default): ``uint8`` (H, W, 3). Alpha is composited on ``background``
      (white by default) rather than dropped, gray is replicated, 16-bit keeps its high
      byte (``v >> 8``), CMYK/YCbCr/palette/1-bit are converted by Pillow.
    * ``"RGBA"``: ``uint8`` (H, W, 4); images without alpha get an opaque alpha channel.
    * ``"L"``: ``uint8`` (H, W); colour becomes ITU-R 601-2 luma (after compositing alpha).
    * ``"keep"``: the stored mode, made representable: L (H, W), LA (H, W, 2), RGB, RGBA,
      16-bit grayscale as ``uint16`` (H, W); palette becomes RGB (RGBA if it has
      transparency), CMYK becomes RGB, 1-bit becomes L with values 0/255.

    ``image`` is left untouched and ``pixels_changed`` is not set: decoding (and the mode
    conversion, a view of the stored image) does not change the image, so an
    :class:`EncodeStage` to the same format keeps the original bytes. EXIF orientation is
    not applied (the pixels are as stored, as shardex's loaders read them).

    Args:
        mode: ``"RGB"``, ``"RGBA"``, ``"L"`` or ``"keep"``.
        background: (r, g, b) that transparent pixels are composited on for RGB and L.
        max_pixels: larger images (width x height) are refused as decompression bombs.

    Raises:
        BadSampleError: from :meth:`process`, for bytes that are not a decodable image.
    """

    name: ClassVar[str] = "decode"
    needs = ("image",)
    produces = ("pixels",)

    def __init__(
        self,
        mode: DecodeMode = "RGB",
        *,
        background: Sequence[int] = WHITE,
        max_pixels: int = MAX_PIXELS,
    ) -> None:
        check_choice("mode", mode, DECODE_MODES)
        if max_pixels < 1:
            raise ConfigError(f"max_pixels={max_pixels!r} must be a positive int")
        self.mode: DecodeMode = mode
        self.background = check_background(background)
        self.max_pixels = max_pixels

    def params(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "background": list(self.background),
            "max_pixels": self.max_pixels,
        }

    def process(self, batch: Batch) -> Batch:
        for sample in batch:
            data = require(sample, "image", self.name, "a reader stage must provide it")
            if not isinstance(data, bytes | bytearray | memoryview):
                raise ConfigError(
                    f"decode stage: sample {sample_name(sample)} has 'image' of type "
                    f"{type(data).__name__}; expected encoded bytes"
                )
            try:
                sample["pixels"] = decode_image(
                    bytes(data), self.mode, background=self.background, max_pixels=self.max_pixels
                )
            except ValueError as exc:
                raise bad_sample(sample, self.name, exc) from exc
        return batch


class ResizeStage(Stage):
    """Resize ``pixels`` with an explicit interpolation filter.

    Sizes are rounded to the nearest integer (at least 1). A sample already at the target
    size is left as it was; a resized one gets ``pixels_changed = True``.

    Args:
        size: the target: an int side for ``"shorter"``/``"longer"``; an int (square) or
            (width, height) for ``"exact"``.
        mode: ``"shorter"`` (the shorter side becomes ``size``, aspect kept), ``"longer"``
            (the longer side becomes ``size``) or ``"exact"`` (aspect not kept).
        interpolation: ``"bicubic"``, ``"bilinear"``, ``"lanczos"``, ``"nearest"``,
            ``"area"`` (= ``"box"``, pixel-area averaging) or ``"hamming"``: Pillow's filters,
            with antialiasing when shrinking.
    """

    name: ClassVar[str] = "resize"
    changes_in_place: ClassVar[bool] = True
    needs = ("pixels",)

    def __init__(
        self,
        size: int | Sequence[int],
        mode: ResizeMode = "shorter",
        interpolation: Interpolation = "bicubic",
    ) -> None:
        check_choice("mode", mode, RESIZE_MODES)
        check_choice("interpolation", interpolation, tuple(INTERPOLATIONS))
        if mode != "exact" and not isinstance(size, int):
            raise ConfigError(f"size={size!r}: mode={mode!r} takes one int (the side length)")
        width, height = positive_size("size", size)
        self.size: int | tuple[int, int] = size if isinstance(size, int) else (width, height)
        self.mode: ResizeMode = mode
        self.interpolation: Interpolation = interpolation

    def params(self) -> dict[str, Any]:
        size = self.size if isinstance(self.size, int) else list(self.size)
        return {"size": size, "mode": self.mode, "interpolation": self.interpolation}

    def target(self, width: int, height: int) -> tuple[int, int]:
        """The (width, height) an image of ``width`` x ``height`` is resized to."""
        if self.mode == "exact":
            return positive_size("size", self.size)
        assert isinstance(self.size, int)
        return scaled_size(width, height, self.size, self.mode)

    def process(self, batch: Batch) -> Batch:
        for sample in batch:
            pixels = require(sample, "pixels", self.name, _NEEDS_DECODE)
            height, width = pixels.shape[:2]
            size = self.target(width, height)
            if size != (width, height):
                sample["pixels"] = resize(pixels, size, self.interpolation)
                sample["pixels_changed"] = True
        return batch


class CenterCropStage(Stage):
    """Crop ``pixels`` to a centred window of ``size``.

    With an odd margin the extra row/column is cut at the bottom/right. An image smaller
    than ``size`` is an error (resize first, e.g. ``ResizeStage(size, "shorter")``); one
    exactly ``size`` is left as it was. A cropped sample gets ``pixels_changed = True``.

    Args:
        size: an int (square) or (width, height).
    """

    name: ClassVar[str] = "center_crop"
    changes_in_place: ClassVar[bool] = True
    needs = ("pixels",)

    def __init__(self, size: int | Sequence[int]) -> None:
        width, height = positive_size("size", size)
        self.size: int | tuple[int, int] = size if isinstance(size, int) else (width, height)

    def params(self) -> dict[str, Any]:
        return {"size": self.size if isinstance(self.size, int) else list(self.size)}

    def process(self, batch: Batch) -> Batch:
        size = positive_size("size", self.size)
        for sample in batch:
            pixels = require(sample, "pixels", self.name, _NEEDS_DECODE)
            height, width = pixels.shape[:2]
            if (width, height) == size:
                continue
            if width < size[0] or height < size[1]:
                raise BadSampleError(
                    f"center_crop stage: sample {sample_name(sample)} is {width}x{height}, "
                    f"smaller than the crop {size[0]}x{size[1]}; put "
                    f"ResizeStage({max(size)}, mode='shorter') before the crop",
                    path=str(sample.get("original_path", "")),
                    reason="smaller than the crop",
                )
            sample["pixels"] = center_crop(pixels, size)
            sample["pixels_changed"] = True
        return batch
