"""Image decoding: the simplejpeg fast path for JPEGs gives Pillow's shapes and pixels, and
everything it refuses (or a machine without it) goes through Pillow unchanged."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pytest
from PIL import Image

from shardex.codecs import images
from shardex.codecs.images import decode, draft_scale

simplejpeg = pytest.importorskip("simplejpeg")


def photo(width: int, height: int, mode: str = "RGB", **save: Any) -> bytes:
    """A JPEG with smooth gradients and some noise, so decoders have real work to agree on."""
    rng = np.random.default_rng(width * 7919 + height)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 // max(width, 1), y * 255 // max(height, 1), (x + y) % 256], -1)
    pixels = np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)
    image = Image.fromarray(pixels).convert(mode)
    out = io.BytesIO()
    image.save(out, "JPEG", quality=90, **save)
    return out.getvalue()


@pytest.fixture
def pillow_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on a machine without simplejpeg."""
    monkeypatch.setattr(images, "_simplejpeg", lambda: None)


def pillow_decode(data: bytes, **kw: Any) -> np.ndarray[Any, Any]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(images, "_simplejpeg", lambda: None)
        return decode(data, **kw)


@pytest.mark.parametrize(
    ("size", "mode", "save"),
    [
        ((145, 128), "RGB", {}),
        ((640, 480), "RGB", {"subsampling": 0}),  # 4:4:4
        ((333, 251), "RGB", {"progressive": True}),
        ((300, 200), "L", {}),
    ],
)
@pytest.mark.parametrize("hint", [None, (64, 64), (100, 50)])
def test_fast_decode_matches_pillow(
    size: tuple[int, int], mode: str, save: dict[str, Any], hint: tuple[int, int] | None
) -> None:
    data = photo(*size, mode, **save)
    fast, slow = decode(data, size_hint=hint), pillow_decode(data, size_hint=hint)
    assert fast.shape == slow.shape
    assert fast.dtype == slow.dtype == np.uint8
    assert np.abs(fast.astype(np.int16) - slow.astype(np.int16)).mean() < 1.0
    assert fast.flags.c_contiguous


def test_fast_decode_does_not_use_pillow(monkeypatch: pytest.MonkeyPatch) -> None:
    data = photo(320, 240)

    def refuse(*args: Any, **kw: Any) -> None:
        raise AssertionError("Pillow was used for a plain JPEG")

    monkeypatch.setattr(Image, "open", refuse)
    assert decode(data, size_hint=(100, 100)).shape == (120, 160, 3)  # 1/2 scale
    assert decode(photo(300, 200, "L")).shape == (200, 300)  # grey stays 2-d, as Pillow's L


@pytest.mark.parametrize(
    ("width", "height"), [(1600, 1200), (1601, 1199), (600, 600), (449, 900), (223, 5000)]
)
def test_reduced_size_decode_picks_pillows_scale(width: int, height: int) -> None:
    """Never libjpeg-turbo's 3/8 or 5/8 scales: 600 px at hint 224 is 1/2 (300), not 3/8."""
    data = photo(width, height)
    with Image.open(io.BytesIO(data)) as img:
        img.draft("RGB", (224, 224))
        expected = img.size
    scale = draft_scale(width, height, (224, 224))
    assert expected == (-(-width // scale), -(-height // scale))
    assert decode(data, size_hint=(224, 224)).shape == (expected[1], expected[0], 3)


def test_without_simplejpeg_pillow_decodes_the_same(pillow_only: None) -> None:
    assert images._simplejpeg() is None
    data = photo(640, 480)
    assert decode(data, size_hint=(224, 224)).shape == (240, 320, 3)
    assert decode(data).shape == (480, 640, 3)


def test_cmyk_jpeg_goes_through_pillow(monkeypatch: pytest.MonkeyPatch) -> None:
    data = photo(120, 90, "CMYK")
    assert simplejpeg.decode_jpeg_header(data)[2] == "CMYK"
    with Image.open(io.BytesIO(data)) as img:
        expected = np.asarray(img.convert("RGB"))
    calls: list[int] = []
    real = simplejpeg.decode_jpeg
    monkeypatch.setattr(simplejpeg, "decode_jpeg", lambda *a, **k: calls.append(1) or real(*a, **k))
    pixels = decode(data)
    assert pixels.shape == (90, 120, 3)
    assert np.array_equal(pixels, expected)
    assert calls == []  # refused on the header: simplejpeg would keep the 4 ink channels


def test_damaged_jpeg_fails_as_with_pillow() -> None:
    data = photo(200, 150)
    truncated = data[: len(data) // 2]
    with pytest.raises(ValueError, match="Premature end"):
        simplejpeg.decode_jpeg(truncated)
    with pytest.raises(OSError, match="truncated"):
        decode(truncated)
    with pytest.raises(OSError, match="truncated"):
        pillow_decode(truncated)
    with pytest.raises(ValueError, match="too large"):
        decode(data, max_pixels=100)


def test_other_formats_are_untouched() -> None:
    out = io.BytesIO()
    Image.new("RGBA", (40, 30), (1, 2, 3, 4)).save(out, "PNG")
    assert decode(out.getvalue(), size_hint=(10, 10)).shape == (30, 40, 4)
