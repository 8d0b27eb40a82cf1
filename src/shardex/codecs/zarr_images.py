"""zarr v3 image codecs (PNG, lossless WebP, JPEG) around imagecodecs' numcodecs codecs,
named ``numcodecs.imagecodecs_*`` and declared as ``zarr.codecs`` entry points, so plain
zarr decodes them (docs/backends.md). A chunk is one image ``(1, H, W[, C])``.
"""

from __future__ import annotations

import warnings
from functools import cached_property
from typing import Any, Final

from zarr.abc.numcodec import Numcodec
from zarr.codecs.numcodecs import _NumcodecsArrayBytesCodec
from zarr.errors import ZarrUserWarning
from zarr.registry import get_numcodec

from shardex.errors import ConfigError, imported

IMAGE_CODECS: Final[tuple[str, ...]] = ("none", "png", "webp", "jpeg")
#: Channel counts each codec stores exactly as given (None: a 2-d grey image).
_CHANNELS: Final[dict[str, frozenset[int | None]]] = {
    "png": frozenset({None, 1, 3, 4}),
    "webp": frozenset({3, 4}),  # libwebp has no grey mode: it would come back RGB
    "jpeg": frozenset({None, 1, 3}),  # a 4-channel JPEG is CMYK, not RGBA
}


class _ImageCodec(_NumcodecsArrayBytesCodec):
    """A zarr v3 array -> bytes codec around one imagecodecs numcodecs codec."""

    def __init__(self, **codec_config: Any) -> None:
        # zarr warns on every instantiation (reads too) that numcodecs.* codecs are outside
        # the v3 spec; that is known and documented, and tests turn warnings into errors.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "Numcodecs codecs", ZarrUserWarning)
            super().__init__(**codec_config)

    @cached_property
    def _codec(self) -> Numcodec:
        # Loaded through zarr's entry points, nothing registered imagecodecs' numcodecs
        # codecs in this process yet (numcodecs only finds its own entry points).
        _register_numcodecs()
        return get_numcodec(self.codec_config)  # type: ignore[arg-type]


class ImagecodecsPng(_ImageCodec, codec_name="imagecodecs_png"):
    """PNG (lossless) chunks."""


class ImagecodecsWebp(_ImageCodec, codec_name="imagecodecs_webp"):
    """WebP chunks (the backend writes them lossless)."""


class ImagecodecsJpeg(_ImageCodec, codec_name="imagecodecs_jpeg"):
    """JPEG chunks (lossy)."""


_CLASSES: Final[dict[str, type[_ImageCodec]]] = {
    "png": ImagecodecsPng,
    "webp": ImagecodecsWebp,
    "jpeg": ImagecodecsJpeg,
}


def _register_numcodecs() -> None:
    """Make numcodecs know imagecodecs' image codecs (idempotent)."""
    codecs = imported(
        "imagecodecs.numcodecs", "zarr image codecs need imagecodecs: pip install 'shardex[zarr]'"
    )
    # Skips codecs numcodecs already knows (quietly), so calling again is cheap.
    codecs.register_codecs([f"imagecodecs_{n}" for n in _CLASSES], verbose=False)


def register_image_codecs() -> None:
    """Make numcodecs and zarr v3 know the image codecs (idempotent)."""
    _register_numcodecs()
    from zarr.registry import register_codec

    for name, cls in _CLASSES.items():
        # The same qualname each call: registering again replaces, never adds a rival class.
        register_codec(f"numcodecs.imagecodecs_{name}", cls, qualname=f"{__name__}.{cls.__name__}")


def image_codec(name: str, channels: int | None, *, quality: int, ndim: int) -> _ImageCodec:
    """The zarr codec for one-image chunks of ``ndim`` dimensions (the leading 1 included).

    Raises ConfigError when the codec cannot store that many channels exactly.
    """
    if name not in _CHANNELS:
        raise ConfigError(f"image codec {name!r} is not one of {', '.join(IMAGE_CODECS)}")
    if channels not in _CHANNELS[name]:
        kinds = "grey (H, W)" if channels is None else f"{channels}-channel"
        raise ConfigError(
            f"image_codec={name} cannot store {kinds} images exactly; use image_codec=png"
        )
    register_image_codecs()
    squeeze = [True] + [False] * (ndim - 1)
    if name == "webp":
        return ImagecodecsWebp(lossless=True, squeeze=squeeze)
    if name == "jpeg":
        return ImagecodecsJpeg(level=quality, squeeze=squeeze)
    return ImagecodecsPng(squeeze=squeeze)
