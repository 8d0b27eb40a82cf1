"""Pixel stages: decode encoded bytes to ``pixels``, resize, center-crop."""

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

    ``pixels`` is an HWC numpy array; ``image`` stays and ``pixels_changed`` is not set,
    so an :class:`EncodeStage` to the same format keeps the original bytes. EXIF
    orientation is not applied. docs/pipeline.md, "Decoding: the conversion policy",
    tables what each ``mode`` gives.

    Args:
        mode: ``"RGB"`` (alpha composited on ``background``), ``"RGBA"``, ``"L"`` or
            ``"keep"`` (the stored mode, made representable).
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
    """Resize ``pixels``; a resized sample gets ``pixels_changed = True``.

    Args:
        size: an int side for ``"shorter"``/``"longer"``; an int (square) or
            (width, height) for ``"exact"``.
        mode: which side becomes ``size`` (aspect kept), or ``"exact"``.
        interpolation: ``"bicubic"``, ``"bilinear"``, ``"lanczos"``, ``"nearest"``,
            ``"area"`` (= ``"box"``) or ``"hamming"`` (Pillow's, antialiased).
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
    """Crop ``pixels`` to a centred window of ``size`` (an int or (width, height)).

    An odd margin's extra row/column is cut at the bottom/right; a smaller image is a
    BadSampleError. A cropped sample gets ``pixels_changed = True``.
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
