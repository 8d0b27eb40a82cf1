"""The built-in pipeline stages: decode's conversion policy on every awkward image mode,
resize/crop, encode (passthrough keeps bytes, WebP lossless kept apart from lossy), filter
expressions (and refusing code), exact and near de-duplication, and the embedding stage with
a tiny model loaded from a user module."""

from __future__ import annotations

import hashlib
import io
import json
import pickle
import re
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image, ImageEnhance

from shardex.errors import BadSampleError, ConfigError, MissingDependencyError
from shardex.pipeline.stage import Batch, Sample, Stage
from shardex.pipeline.stages import (
    BUILTIN_STAGES,
    CenterCropStage,
    DecodeStage,
    DedupStage,
    EmbedStage,
    EncodeStage,
    FilterStage,
    NeighbourIndex,
    ResizeStage,
)
from shardex.pipeline.stages.encode import webp_is_lossless

ROOT = Path(__file__).resolve().parents[2]
H, W = 24, 32


# ---------------------------------------------------------------- images


def encode(image: Image.Image, fmt: str, **options: Any) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **options)
    return out.getvalue()


def gradient(seed: int = 0, height: int = H, width: int = W) -> np.ndarray[Any, Any]:
    """RGB uint8 with smooth structure plus noise (distinct per seed)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 // width, y * 255 // height, (x * y + 40 * seed) % 256], -1)
    return np.clip(base + rng.normal(0, 8, base.shape), 0, 255).astype(np.uint8)


def alpha_plane() -> np.ndarray[Any, Any]:
    """Left third transparent, middle half-transparent (128), right third opaque."""
    alpha = np.full((H, W), 255, np.uint8)
    alpha[:, : W // 3] = 0
    alpha[:, W // 3 : 2 * W // 3] = 128
    return alpha


def palette_image(transparent: bool) -> Image.Image:
    image = Image.fromarray(gradient()).quantize(16)
    if transparent:
        image.info["transparency"] = 0
    return image


def sixteen_bit() -> np.ndarray[Any, Any]:
    y, x = np.mgrid[0:H, 0:W]
    return ((x * 2000 + y * 700) % 65536).astype(np.uint16)


def inputs() -> dict[str, bytes]:
    """One encoded image per awkward stored mode."""
    rgb = gradient()
    rgba = np.dstack([rgb, alpha_plane()])
    gray = rgb[..., 0]
    return {
        "rgb_jpeg": encode(Image.fromarray(rgb), "JPEG", quality=95),
        "rgba_png": encode(Image.fromarray(rgba), "PNG"),
        "la_png": encode(Image.fromarray(np.dstack([gray, alpha_plane()])), "PNG"),
        "gray_png": encode(Image.fromarray(gray), "PNG"),
        "gray_jpeg": encode(Image.fromarray(gray), "JPEG"),
        "palette_png": encode(palette_image(False), "PNG"),
        "palette_alpha_png": encode(palette_image(True), "PNG", transparency=0),
        "cmyk_jpeg": encode(Image.fromarray(rgb).convert("CMYK"), "JPEG", quality=95),
        "png16": encode(Image.fromarray(sixteen_bit()), "PNG"),
        "tiff16": encode(Image.fromarray(sixteen_bit()), "TIFF"),
        "onebit_png": encode(Image.fromarray(gray > 128).convert("1"), "PNG"),
        "rgba_webp": encode(Image.fromarray(rgba), "WEBP", lossless=True),
        "rgb_tiff": encode(Image.fromarray(rgb), "TIFF"),
    }


INPUTS = inputs()
#: (mode, input) -> (shape after H, W; dtype) by the documented policy
KEEP_LAYOUT = {
    "rgb_jpeg": ((3,), np.uint8),
    "rgba_png": ((4,), np.uint8),
    "la_png": ((2,), np.uint8),
    "gray_png": ((), np.uint8),
    "gray_jpeg": ((), np.uint8),
    "palette_png": ((3,), np.uint8),
    "palette_alpha_png": ((4,), np.uint8),
    "cmyk_jpeg": ((3,), np.uint8),
    "png16": ((), np.uint16),
    "tiff16": ((), np.uint16),
    "onebit_png": ((), np.uint8),
    "rgba_webp": ((4,), np.uint8),
    "rgb_tiff": ((3,), np.uint8),
}
MODE_LAYOUT = {"RGB": (3,), "RGBA": (4,), "L": ()}


def sample(name: str, data: bytes | None = None, **meta: Any) -> Sample:
    data = INPUTS[name] if data is None else data
    return {"key": f"test/{name}", "original_path": f"{name}.img", "image": data, **meta}


def run(stages: list[Stage], batch: Batch, states: list[dict[str, Any]] | None = None) -> Batch:
    """What a pipeline does with one batch: each stage's process, then its reduce."""
    states = states if states is not None else [{} for _ in stages]
    for stage, state in zip(stages, states, strict=True):
        batch = stage.reduce(stage.process(batch) or [], state)
    return batch


def decoded(name: str, mode: str = "RGB", **options: Any) -> np.ndarray[Any, Any]:
    (out,) = DecodeStage(mode, **options).process([sample(name)])  # type: ignore[arg-type]
    pixels: np.ndarray[Any, Any] = out["pixels"]
    return pixels


# ---------------------------------------------------------------- decode


@pytest.mark.parametrize("name", sorted(INPUTS))
@pytest.mark.parametrize("mode", ["RGB", "RGBA", "L", "keep"])
def test_decode_gives_the_documented_layout_for_every_stored_mode(name: str, mode: str) -> None:
    (out,) = DecodeStage(mode).process([sample(name)])  # type: ignore[arg-type]
    pixels = out["pixels"]
    channels, dtype = KEEP_LAYOUT[name] if mode == "keep" else (MODE_LAYOUT[mode], np.uint8)
    assert pixels.shape == (H, W, *channels)
    assert pixels.dtype == dtype
    assert out["image"] is INPUTS[name]  # untouched
    assert "pixels_changed" not in out  # decoding is not a change


def test_rgb_composites_alpha_on_white_by_default_and_on_a_given_background() -> None:
    rgb, alpha = gradient(), alpha_plane()
    white = decoded("rgba_png").astype(int)
    assert (white[:, : W // 3] == 255).all()  # transparent -> background
    np.testing.assert_array_equal(white[:, 2 * W // 3 :], rgb[:, 2 * W // 3 :])  # opaque kept
    half = (rgb[:, W // 3 : 2 * W // 3].astype(int) * 128 + 255 * 127 + 127) // 255
    np.testing.assert_array_equal(white[:, W // 3 : 2 * W // 3], half)
    black = decoded("rgba_png", background=(0, 0, 0))
    assert (black[:, : W // 3] == 0).all()
    assert (decoded("rgba_png", "RGBA")[..., 3] == alpha).all()  # RGBA keeps alpha


def test_gray_16_bit_and_1_bit_conversions() -> None:
    gray = gradient()[..., 0]
    rgb = decoded("gray_png")
    assert (rgb == gray[..., None]).all()  # replicated into 3 equal channels
    np.testing.assert_array_equal(decoded("png16", "keep"), sixteen_bit())  # 16 bits kept
    np.testing.assert_array_equal(decoded("png16", "L"), (sixteen_bit() >> 8).astype(np.uint8))
    assert (decoded("png16")[..., 1] == sixteen_bit() >> 8).all()
    assert set(np.unique(decoded("onebit_png", "keep")).tolist()) == {0, 255}
    assert decoded("gray_png", "RGBA")[..., 3].min() == 255  # opaque alpha added


def test_palette_cmyk_and_luma_match_pillow() -> None:
    def pillow(name: str, mode: str) -> np.ndarray[Any, Any]:
        return np.asarray(Image.open(io.BytesIO(INPUTS[name])).convert(mode))

    np.testing.assert_array_equal(decoded("palette_png"), pillow("palette_png", "RGB"))
    np.testing.assert_array_equal(
        decoded("palette_alpha_png", "keep"), pillow("palette_alpha_png", "RGBA")
    )
    np.testing.assert_array_equal(decoded("cmyk_jpeg"), pillow("cmyk_jpeg", "RGB"))
    np.testing.assert_array_equal(decoded("rgb_tiff", "L"), pillow("rgb_tiff", "L"))
    transparent = decoded("palette_alpha_png", "RGBA")[..., 3] == 0
    assert transparent.any()
    assert (decoded("palette_alpha_png")[transparent] == 255).all()  # on white


def test_decode_refuses_garbage_with_the_sample_named() -> None:
    with pytest.raises(BadSampleError, match=r"'test/garbage'.*cannot decode") as info:
        DecodeStage().process([sample("garbage", b"not an image at all")])
    assert info.value.path == "garbage.img"
    with pytest.raises(ConfigError, match=r"'test/x' has no 'image'.*keys are \['key'\]"):
        DecodeStage().process([{"key": "test/x"}])
    with pytest.raises(ConfigError, match="mode='CMYK' is not supported"):
        DecodeStage("CMYK")  # type: ignore[arg-type]
    with pytest.raises(BadSampleError, match="too large"):
        DecodeStage(max_pixels=100).process([sample("rgb_tiff")])


# ---------------------------------------------------------------- resize / crop


@pytest.mark.parametrize(
    ("size", "mode", "expected"),
    [(12, "shorter", (16, 12)), (16, "longer", (16, 12)), ((10, 30), "exact", (10, 30))],
)
def test_resize_modes(size: Any, mode: Any, expected: tuple[int, int]) -> None:
    (out,) = run([DecodeStage(), ResizeStage(size, mode, "lanczos")], [sample("rgb_tiff")])
    assert out["pixels"].shape == (expected[1], expected[0], 3)
    assert out["pixels_changed"] is True


def test_resize_to_the_same_size_and_full_crop_are_no_ops() -> None:
    (out,) = run([DecodeStage(), ResizeStage(H), CenterCropStage((W, H))], [sample("rgb_tiff")])
    assert "pixels_changed" not in out
    np.testing.assert_array_equal(out["pixels"], decoded("rgb_tiff"))


def test_resize_keeps_16_bit_and_alpha_layouts() -> None:
    (out,) = run([DecodeStage("keep"), ResizeStage(12, interpolation="area")], [sample("png16")])
    assert out["pixels"].dtype == np.uint16
    assert out["pixels"].shape == (12, 16)
    (out,) = run(
        [DecodeStage("keep"), ResizeStage(12, interpolation="bilinear")], [sample("la_png")]
    )
    assert out["pixels"].shape == (12, 16, 2)


def test_center_crop_takes_the_middle_and_refuses_small_images() -> None:
    pixels = decoded("rgb_tiff")
    (out,) = run([DecodeStage(), CenterCropStage((W - 3, H - 4))], [sample("rgb_tiff")])
    np.testing.assert_array_equal(out["pixels"], pixels[2 : H - 2, 1 : W - 2])
    assert out["pixels_changed"] is True
    with pytest.raises(
        BadSampleError, match=r"'test/rgb_tiff' is 32x24, smaller than .*ResizeStage"
    ):
        run([DecodeStage(), CenterCropStage(64)], [sample("rgb_tiff")])


def test_bad_resize_options_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="interpolation='cubic'"):
        ResizeStage(10, interpolation="cubic")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="takes one int"):
        ResizeStage((10, 20), "shorter")
    with pytest.raises(ConfigError, match="positive"):
        CenterCropStage(0)


# ---------------------------------------------------------------- encode


@pytest.mark.parametrize("name", sorted(INPUTS))
@pytest.mark.parametrize("fmt", ["webp", "jpeg", "png"])
def test_decode_resize_encode_goes_through_every_mode(name: str, fmt: str) -> None:
    stages = [DecodeStage(), ResizeStage(12, "shorter"), EncodeStage(fmt)]
    (out,) = run(stages, [sample(name)])
    assert "pixels" not in out
    assert "pixels_changed" not in out
    assert out["image_ext"] == {"jpeg": "jpg"}.get(fmt, fmt)
    back = Image.open(io.BytesIO(out["image"]))
    assert back.format == fmt.upper()
    assert back.size == (16, 12)
    assert back.mode == "RGB"


@pytest.mark.parametrize("name", sorted(INPUTS))
def test_keep_mode_round_trips_exactly_through_png(name: str) -> None:
    (out,) = run([DecodeStage("keep"), EncodeStage("png", passthrough=False)], [sample(name)])
    np.testing.assert_array_equal(
        decoded(name, "keep"), DecodeStage("keep").process([{"image": out["image"]}])[0]["pixels"]
    )


def test_jpeg_refuses_alpha_naming_the_sample() -> None:
    stages = [DecodeStage("RGBA"), ResizeStage(12), EncodeStage("jpeg")]
    with pytest.raises(ConfigError, match=r"'test/rgba_png'.*JPEG cannot store alpha.*mode='RGB'"):
        run(stages, [sample("rgba_png")])
    with pytest.raises(ConfigError, match="16-bit"):
        run([DecodeStage("keep"), ResizeStage(12), EncodeStage("webp")], [sample("png16")])
    with pytest.raises(ConfigError, match="lossless=True with format='jpeg'"):
        EncodeStage("jpeg", lossless=True)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize(
    ("name", "fmt"), [("rgb_jpeg", "jpeg"), ("rgba_png", "png"), ("rgba_webp", "webp")]
)
def test_passthrough_keeps_original_bytes(name: str, fmt: str) -> None:
    lossless = fmt == "webp"  # the WebP input is lossless
    stages = [DecodeStage(), ResizeStage(H), EncodeStage(fmt, quality=50, lossless=lossless)]
    (out,) = run(stages, [sample(name, image_ext="orig")])
    assert sha256(out["image"]) == sha256(INPUTS[name])
    assert out["image_ext"] == "orig"
    assert "pixels" not in out


def test_changed_pixels_other_formats_and_passthrough_false_re_encode() -> None:
    resized = run([DecodeStage(), ResizeStage(12), EncodeStage("jpeg")], [sample("rgb_jpeg")])
    assert Image.open(io.BytesIO(resized[0]["image"])).size == (16, 12)
    other = run([DecodeStage(), EncodeStage("webp")], [sample("rgb_jpeg")])
    assert other[0]["image"][8:12] == b"WEBP"
    assert other[0]["image_ext"] == "webp"
    forced = run([DecodeStage(), EncodeStage("jpeg", passthrough=False)], [sample("rgb_jpeg")])
    assert forced[0]["image"] != INPUTS["rgb_jpeg"]


def test_webp_lossless_and_lossy_are_never_switched() -> None:
    lossless_original = sample("rgba_webp")
    assert webp_is_lossless(INPUTS["rgba_webp"]) is True
    (lossy,) = run([DecodeStage("RGBA"), EncodeStage("webp", lossless=False)], [lossless_original])
    assert webp_is_lossless(lossy["image"]) is False  # re-encoded: lossy was asked
    (again,) = run(
        [DecodeStage("RGBA"), EncodeStage("webp", lossless=False)], [sample("x", lossy["image"])]
    )
    assert again["image"] == lossy["image"]  # lossy original, lossy asked: passthrough
    (exact,) = run(
        [DecodeStage("RGBA"), EncodeStage("webp", 100, lossless=True, passthrough=False)],
        [sample("rgba_png")],
    )
    assert webp_is_lossless(exact["image"]) is True
    back = np.asarray(Image.open(io.BytesIO(exact["image"])))
    np.testing.assert_array_equal(back, decoded("rgba_png", "RGBA"))  # even under alpha 0


def test_encoding_is_deterministic() -> None:
    for fmt in ("webp", "jpeg", "png"):
        stages = [DecodeStage(), ResizeStage(20, interpolation="bicubic"), EncodeStage(fmt, 80)]
        first = run(stages, [sample(name) for name in sorted(INPUTS)])
        second = run(stages, [sample(name) for name in sorted(INPUTS)])
        assert [sha256(s["image"]) for s in first] == [sha256(s["image"]) for s in second]


# ---------------------------------------------------------------- filter


META: Batch = [
    {"key": "a", "aesthetic_score": 6.5, "width": 128, "label": 1, "caption": "a cat"},
    {"key": "b", "aesthetic_score": 4.0, "width": 512, "label": 3, "caption": None},
    {"key": "c", "aesthetic_score": np.float32(7.25), "width": 32, "label": 2, "caption": "dog"},
]


@pytest.mark.parametrize(
    ("expr", "kept"),
    [
        ("aesthetic_score > 5", "ac"),
        ("width >= 64 and label != 3", "a"),
        ("caption is not None", "ac"),
        ("caption is None or not width < 100", "ab"),
        ("label in (1, 2)", "ac"),
        ("label not in [1, 2]", "b"),
        ("4 <= aesthetic_score < 7", "ab"),
        ("width * 2 - 1 > 300 and aesthetic_score / 2 >= 2", "b"),
        ("key == 'c' or caption == 'a cat'", "ac"),
        ("True", "abc"),
    ],
)
def test_filter_keeps_samples_where_the_expression_holds(expr: str, kept: str) -> None:
    out = FilterStage(expr).process([dict(s) for s in META])
    assert "".join(s["key"] for s in out) == kept


@pytest.mark.parametrize(
    "expr",
    [
        "__import__('os').system('echo pwned')",
        "().__class__.__bases__[0].__subclasses__()",
        "open('/etc/passwd')",
        "caption.upper() == 'X'",
        "label[0] == 1",
        "(lambda: 1)() == 1",
        "[x for x in (1, 2)]",
        "2 ** 100000",
        "a if b else c",
        "label is 3",
        "b'bytes' == caption",
        "width = 3",
        "",
    ],
)
def test_filter_refuses_code_outside_the_whitelist(expr: str) -> None:
    with pytest.raises(ConfigError, match="filter expression"):
        FilterStage(expr)


def test_filter_errors_name_the_sample_and_its_keys() -> None:
    with pytest.raises(
        ConfigError, match=r"sample 'a' has no key 'score'; its keys are \['aesthetic_score'"
    ):
        FilterStage("score > 1").process([dict(META[0])])
    with pytest.raises(ConfigError, match=r"failed on sample 'b'.*TypeError"):
        FilterStage("caption > 1").process([dict(META[1])])
    with pytest.raises(ConfigError, match="numbers only"):
        FilterStage("caption * 1000000000 == ''").process([dict(META[0])])


def test_filter_declares_its_names_and_pickles() -> None:
    stage = FilterStage("width >= 64 and label != 3")
    assert stage.needs == ("label", "width")
    clone = pickle.loads(pickle.dumps(stage))
    assert [s["key"] for s in clone.process([dict(s) for s in META])] == ["a"]


# ---------------------------------------------------------------- dedup


def photo(seed: int) -> np.ndarray[Any, Any]:
    """A 160x120 picture of a few discs on a gradient: enough structure for a phash."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:120, 0:160]
    img = np.stack([x * 0.8, y * 1.0, (x + y) * 0.4], -1)
    for _ in range(6):
        cx, cy, r = rng.uniform(0, 160), rng.uniform(0, 120), rng.uniform(10, 50)
        img[(x - cx) ** 2 + (y - cy) ** 2 < r * r] = rng.uniform(0, 255, 3)
    return np.clip(img + rng.normal(0, 6, img.shape), 0, 255).astype(np.uint8)


def test_exact_dedup_keeps_the_first_copy_across_batches() -> None:
    a, b = INPUTS["rgb_jpeg"], INPUTS["gray_png"]
    stage, state = DedupStage(), {}
    first = run(
        [stage],
        [sample("x", a, key="1"), sample("x", b, key="2"), sample("x", a, key="3")],
        [state],
    )
    second = run([stage], [sample("x", b, key="4"), sample("x", INPUTS["png16"], key="5")], [state])
    assert [s["key"] for s in first + second] == ["1", "2", "5"]
    assert state["dropped"] == 2
    assert state["kept"] == 3
    assert state["duplicates"] == {"3": "1", "4": "2"}
    assert len(first[0]["content_hash"]) == 32


def test_near_dedup_drops_brightened_and_resized_copies_only() -> None:
    original = Image.fromarray(photo(1))
    copies = {
        "original": encode(original, "JPEG", quality=90),
        "brighter": encode(ImageEnhance.Brightness(original).enhance(1.08), "JPEG", quality=80),
        "smaller": encode(original.resize((120, 90), Image.Resampling.BICUBIC), "PNG"),
        "other": encode(Image.fromarray(photo(2)), "JPEG", quality=90),
    }
    stage, state = DedupStage("phash"), {}
    out = run([stage], [sample("x", data, key=k) for k, data in copies.items()], [state])
    assert [s["key"] for s in out] == ["original", "other"]
    assert state["duplicates"] == {"brighter": "original", "smaller": "original"}
    assert all(0 <= s["phash"] < 2**64 for s in out)
    again = DedupStage("phash").process([sample("x", copies["original"])])
    assert again[0]["phash"] == out[0]["phash"]  # deterministic


def test_phash_threshold_zero_only_drops_identical_hashes() -> None:
    original = Image.fromarray(photo(3))
    batch = [
        sample("x", encode(original, "PNG"), key="a"),
        sample("x", encode(original, "WEBP", lossless=True), key="b"),
        sample("x", encode(Image.fromarray(photo(4)), "PNG"), key="c"),
    ]
    assert [s["key"] for s in run([DedupStage("phash", 0)], batch)] == ["a", "c"]
    with pytest.raises(ConfigError, match="threshold"):
        DedupStage("phash", 40)
    with pytest.raises(ConfigError, match="phash' only"):
        DedupStage("exact", 3)


@pytest.mark.parametrize("threshold", [0, 2, 4, 8])
def test_multi_index_finds_exactly_the_brute_force_neighbours(threshold: int) -> None:
    rng = np.random.default_rng(threshold)
    base = [int(v) for v in rng.integers(0, 2**64, 2000, dtype=np.uint64)]
    # near copies of earlier hashes: up to threshold + 2 random bits flipped
    near = [
        base[i] ^ sum(1 << int(bit) for bit in rng.choice(64, flips, replace=False))
        for i, flips in zip(
            rng.integers(0, 2000, 500), rng.integers(0, threshold + 3, 500), strict=True
        )
    ]
    values = [*base, *near]
    index, kept = NeighbourIndex(threshold), np.zeros(0, np.uint64)
    for value in values:
        found = index.nearest(value)
        distances = np.bitwise_count(kept ^ np.uint64(value))
        expected = int(distances.min()) if (distances <= threshold).any() else None
        assert (found[1] if found else None) == expected
        if found is None:
            index.add(value)
            kept = np.append(kept, np.uint64(value))
    assert len(index) == len(kept) < len(values)


# ---------------------------------------------------------------- embed

TINY_MODEL = """
import torch
from torch import nn


def make():
    torch.manual_seed(0)
    return nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(3, 4))


def callable_model():
    return lambda x: x.mean(dim=(2, 3))


def wrong_shape():
    return lambda x: x
"""


@pytest.fixture
def tiny_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A user module ``shardex_tiny_model`` on sys.path, and trained-looking weights."""
    torch = pytest.importorskip("torch")
    (tmp_path / "shardex_tiny_model.py").write_text(TINY_MODEL)
    monkeypatch.syspath_prepend(str(tmp_path))
    linear = torch.nn.Linear(3, 4)
    with torch.no_grad():
        linear.weight.copy_(torch.arange(12, dtype=torch.float32).view(4, 3) / 10)
        linear.bias.copy_(torch.tensor([1.0, -1.0, 0.5, 0.0]))
    weights = tmp_path / "tiny.pt"
    torch.save({"2." + k: v for k, v in linear.state_dict().items()}, weights)
    yield weights
    sys.modules.pop("shardex_tiny_model", None)


def solid(color: tuple[int, int, int], size: tuple[int, int] = (40, 30)) -> Sample:
    pixels = np.empty((size[1], size[0], 3), np.uint8)
    pixels[:] = color
    return {"key": f"solid/{color}", "pixels": pixels}


def embed_all(stage: EmbedStage, batch: Batch) -> list[np.ndarray[Any, Any]]:
    try:
        return [s[stage.key] for s in stage.process(batch)]
    finally:
        stage.teardown()


def test_embed_runs_the_user_model_with_its_weights(tiny_model: Path) -> None:
    stage = EmbedStage("shardex_tiny_model:make", str(tiny_model), batch_size=2, input_size=16)
    colors = [(255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 255), (51, 102, 153)]
    vectors = embed_all(stage, [solid(c) for c in colors])
    weight = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
    for color, vector in zip(colors, vectors, strict=True):
        expected = weight @ (np.array(color, np.float32) / 255) + [1.0, -1.0, 0.5, 0.0]
        assert vector.dtype == np.float32
        assert vector.shape == (4,)
        np.testing.assert_allclose(vector, expected, rtol=1e-6)
    assert stage.produces == ("embedding",)


def test_embed_is_deterministic_whatever_the_batching(tiny_model: Path) -> None:
    batch = [{"key": f"g{i}", "pixels": gradient(i, 30, 20 + i)} for i in range(7)]
    stage = EmbedStage(
        "shardex_tiny_model:make",
        str(tiny_model),
        batch_size=4,
        input_size=24,
        mean=(0.5, 0.4, 0.3),
        std=(0.2, 0.25, 0.3),
    )
    together = embed_all(stage, [dict(s) for s in batch])
    one_by_one = [embed_all(stage, [dict(s)])[0] for s in batch]
    assert [v.tobytes() for v in together] == [v.tobytes() for v in one_by_one]
    again = embed_all(pickle.loads(pickle.dumps(stage)), [dict(s) for s in batch])
    assert [v.tobytes() for v in together] == [v.tobytes() for v in again]


def test_embed_takes_a_plain_callable_and_any_pixel_layout(tiny_model: Path) -> None:
    stage = EmbedStage("shardex_tiny_model:callable_model", input_size=8, crop=False)
    batch = run(
        [DecodeStage("keep")], [sample(n) for n in ("rgba_png", "png16", "la_png", "gray_jpeg")]
    )
    vectors = embed_all(stage, batch)
    assert all(v.shape == (3,) for v in vectors)
    assert abs(float(vectors[3][0]) - float(vectors[3][2])) < 1e-6  # gray: equal channels


def test_embed_setup_happens_in_the_worker_and_restores_threads(tiny_model: Path) -> None:
    import torch

    before = torch.get_num_threads()
    stage = EmbedStage("shardex_tiny_model:make", cpus=1)
    assert stage.resources.cpus == 1
    assert stage.resources.gpus == 0
    stage.setup()
    assert torch.get_num_threads() == 1
    shipped = pickle.loads(pickle.dumps(stage))
    assert shipped._model is None  # the model is not pickled
    stage.teardown()
    assert torch.get_num_threads() == before


def test_embed_errors_say_what_to_do(tiny_model: Path, tmp_path: Path) -> None:
    import torch

    with pytest.raises(ConfigError, match="'module:factory'"):
        EmbedStage("shardex_tiny_model.make")
    with pytest.raises(ConfigError, match=r"cannot import 'no_such_module'.*PYTHONPATH"):
        EmbedStage("no_such_module:make").setup()
    with pytest.raises(ConfigError, match="has no 'nope'"):
        EmbedStage("shardex_tiny_model:nope").setup()
    with pytest.raises(ConfigError, match=r"returned \(1, 3, 8, 8\).*\(B, D\)"):
        EmbedStage("shardex_tiny_model:wrong_shape", input_size=8, batch_size=1).process(
            [solid((1, 2, 3))]
        )
    pickled_module = tmp_path / "module.pt"
    torch.save(torch.nn.Linear(3, 4), pickled_module)
    with pytest.raises(ConfigError, match=r"(?s)weights_only=True.*state_dict"):
        EmbedStage("shardex_tiny_model:make", pickled_module).setup()
    wrong = tmp_path / "wrong.pt"
    torch.save(torch.nn.Linear(5, 4).state_dict(), wrong)
    with pytest.raises(ConfigError, match="do not fit"):
        EmbedStage("shardex_tiny_model:make", wrong).setup()
    with pytest.raises(ConfigError, match=r"mean=.*std="):
        EmbedStage("shardex_tiny_model:make", mean=(0.5, 0.5, 0.5))


def test_safetensors_weights(tiny_model: Path, tmp_path: Path) -> None:
    import torch

    path = tmp_path / "tiny.safetensors"
    state = torch.load(tiny_model, weights_only=True)
    try:
        from safetensors.torch import save_file  # type: ignore[import-not-found]
    except ImportError:
        path.write_bytes(b"{}")
        with pytest.raises(MissingDependencyError, match="pip install safetensors"):
            EmbedStage("shardex_tiny_model:make", path).setup()
        return
    save_file(state, str(path))
    vectors = embed_all(
        EmbedStage("shardex_tiny_model:make", path, input_size=8), [solid((255, 0, 0))]
    )
    np.testing.assert_allclose(vectors[0], [1.0, -0.7, 1.1, 0.9], rtol=1e-6)


def test_importing_the_stages_does_not_import_torch() -> None:
    code = "import sys, shardex.pipeline.stages; assert 'torch' not in sys.modules, 'torch'"
    subprocess.run([sys.executable, "-c", code], check=True)


# ---------------------------------------------------------------- params, docs


STAGES: list[Callable[[], Stage]] = [
    lambda: DecodeStage("RGBA", background=(0, 10, 20)),
    lambda: ResizeStage((64, 32), "exact", "area"),
    lambda: CenterCropStage((20, 10)),
    lambda: EncodeStage("jpg", 75, jpeg_subsampling="4:4:4"),
    lambda: FilterStage("a > 1"),
    lambda: DedupStage("phash", 3),
    lambda: EmbedStage(
        "m:f", "w.pt", key="clip", mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5), gpus=1
    ),
]


@pytest.mark.parametrize("make", STAGES)
def test_params_are_json_and_rebuild_the_stage(make: Callable[[], Stage]) -> None:
    stage = make()
    described = json.loads(json.dumps(stage.describe()))
    name = described.pop("stage")
    rebuilt = BUILTIN_STAGES[name](**described)
    assert rebuilt.params() == stage.params()
    assert repr(rebuilt) == repr(stage)


def test_params_record_every_choice() -> None:
    assert EncodeStage("jpg").params() == {
        "format": "jpeg",
        "quality": 90,
        "lossless": False,
        "passthrough": True,
        "webp_method": 4,
        "jpeg_subsampling": "4:2:0",
        "png_compress_level": 6,
    }
    assert DedupStage("phash").params() == {"method": "phash", "threshold": 4}
    assert EmbedStage("m:f", gpus=1).params()["device"] is None


def test_docs_example_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    text = (ROOT / "docs" / "pipeline.md").read_text()
    section = text.split("## Built-in stages", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    monkeypatch.chdir(tmp_path)
    exec(compile(textwrap.dedent(block), "docs/pipeline.md", "exec"), {})
    assert capsys.readouterr().out.splitlines()[-1] == "['cat'] webp (224, 224)"
