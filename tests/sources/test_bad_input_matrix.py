"""The bad-input matrix: every kind of bad input gets a clear error naming it (default) or,
with on_error="skip", a recorded skip with the reason; never a visible partial export.
Unusual but valid images (CMYK, 16-bit, palette, RGBA) export byte for byte."""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

import shardex
from helpers import image_bytes, make_tree
from shardex.errors import (
    BadSampleError,
    DuplicateKeyError,
    NotAnExportError,
    SourceError,
)


def _encoded(img: Image.Image, fmt: str, **kw: object) -> bytes:
    out = io.BytesIO()
    img.save(out, format=fmt, **kw)
    return out.getvalue()


def _folder_with(
    name: str, data: bytes | Callable[[], bytes]
) -> Callable[[Path], tuple[Path, str]]:
    """A folder of two good images and ``name`` holding ``data`` (made when the test runs,
    if a function: not at every collection)."""

    def build(root: Path) -> tuple[Path, str]:
        make_tree(root / "src", ["good0.jpg", "good1.jpg"])
        (root / "src" / name).write_bytes(data if isinstance(data, bytes) else data())
        return root / "src", name

    return build


def _bomb() -> bytes:
    return _encoded(Image.new("L", (20000, 20000)), "PNG")  # 400 Mpx, ~390 KB


def _tar_with(member: str) -> Callable[[Path], tuple[Path, str]]:
    def build(root: Path) -> tuple[Path, str]:
        path = root / "shards.tar"
        with tarfile.open(path, "w") as tf:
            for name, data in (("ok.jpg", image_bytes(1)), (member, image_bytes(2))):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
        return path, member.rsplit(".", 1)[0]

    return build


def _symlink_outside(root: Path) -> tuple[Path, str]:
    make_tree(root / "src", ["good0.jpg"])
    (root / "secret.jpg").write_bytes(image_bytes(9))
    os.symlink(root / "secret.jpg", root / "src" / "link.jpg")
    return root / "src", "link.jpg"


def _case_only(root: Path) -> tuple[Path, str]:
    make_tree(root / "src", ["Cat.jpg", "cat.png"])
    return root / "src", "cat"


def _duplicate(root: Path) -> tuple[Path, str]:
    make_tree(root / "src", ["a.jpg", "a.png"])
    return root / "src", "a"


CASES: dict[str, tuple[Callable[[Path], tuple[Path, str]], type[Exception], str]] = {
    "corrupt jpeg": (
        _folder_with("bad.jpg", image_bytes(3)[:200]),
        BadSampleError,
        "truncated JPEG",
    ),
    "truncated png": (
        _folder_with("bad.png", image_bytes(3, "png")[:-20]),
        BadSampleError,
        "truncated PNG",
    ),
    "zero-byte file": (_folder_with("empty.jpg", b""), BadSampleError, "empty file"),
    "not an image": (
        _folder_with("notes.webp", b"hello, not a picture"),
        BadSampleError,
        "not a recognised image",
    ),
    "decompression bomb": (_folder_with("bomb.png", _bomb), BadSampleError, "too large"),
    "tar member ../x": (_tar_with("../escape.jpg"), BadSampleError, "unsafe key"),
    "tar member /abs": (_tar_with("/abs/path.jpg"), BadSampleError, "unsafe key"),
    # (at the top: never made the key "abs")
    "tar member /abs.jpg": (_tar_with("/abs.jpg"), BadSampleError, "unsafe key"),
    "symlink outside the source": (_symlink_outside, BadSampleError, "outside the source"),
    "duplicate keys": (_duplicate, DuplicateKeyError, "duplicate key"),
    "keys differing only by case": (_case_only, DuplicateKeyError, "only by case"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_refused_naming_it(tmp_path: Path, case: str) -> None:
    build, error, reason = CASES[case]
    source, name = build(tmp_path)
    with pytest.raises(error) as info:
        shardex.export(source, tmp_path / "out", workers=1)
    assert name in str(info.value)
    assert reason in str(info.value)
    assert not (tmp_path / "out" / "config.yaml").exists()
    with pytest.raises(NotAnExportError):
        shardex.open_dataset(tmp_path / "out")


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_skipped_and_recorded(tmp_path: Path, case: str) -> None:
    build, _error, reason = CASES[case]
    source, name = build(tmp_path)
    config = shardex.export(source, tmp_path / "out", workers=1, on_error="skip")
    errors = pq.read_table(tmp_path / "out" / "errors.parquet").to_pylist()
    assert config.num_skipped == len(errors) >= 1
    assert any(name in e["original_path"] or name == e["key"] for e in errors)
    assert all(reason in e["reason"] for e in errors)
    assert shardex.verify(tmp_path / "out").ok


def test_pixel_limit_is_configurable(tmp_path: Path) -> None:
    source, _ = _folder_with("big.png", _encoded(Image.new("L", (300, 300)), "PNG"))(tmp_path)
    with pytest.raises(BadSampleError, match="too large"):
        shardex.export(source, tmp_path / "a", workers=1, max_pixels=50_000)
    shardex.export(source, tmp_path / "b", workers=1, max_pixels=100_000)


def test_unusual_images_export_unchanged_and_decode_by_the_policy(tmp_path: Path) -> None:
    rgb = Image.fromarray(np.random.default_rng(0).integers(0, 255, (8, 10, 3), dtype=np.uint8))
    images = {
        "cmyk.jpg": (_encoded(rgb.convert("CMYK"), "JPEG"), (8, 10, 3)),
        "gray16.png": (
            _encoded(Image.fromarray(np.full((8, 10), 4000, np.uint16)), "PNG"),
            (8, 10),
        ),
        "palette.png": (_encoded(rgb.convert("P"), "PNG"), (8, 10, 3)),
        "rgba.png": (_encoded(rgb.convert("RGBA"), "PNG"), (8, 10, 4)),
        "gray.webp": (_encoded(rgb.convert("L"), "WEBP", lossless=True), (8, 10, 3)),
    }
    for name, (data, _shape) in images.items():
        (tmp_path / "src").mkdir(exist_ok=True)
        (tmp_path / "src" / name).write_bytes(data)
    shardex.export(tmp_path / "src", tmp_path / "out", workers=1, validate="decode")
    raw = {s["__key__"]: s for s in shardex.open_dataset(tmp_path / "out")}
    decoded = {s["__key__"]: s for s in shardex.open_dataset(tmp_path / "out", decode=True)}
    for name, (data, shape) in images.items():
        key, ext = name.split(".")
        assert raw[key][ext] == data  # original bytes kept
        assert decoded[key][ext].shape == shape
    assert decoded["gray16"]["png"].dtype == np.dtype("uint16")  # 16-bit stays 16-bit


def test_tables_with_missing_or_mistyped_columns_are_refused(tmp_path: Path) -> None:
    make_tree(tmp_path, ["a.jpg"])
    pq.write_table(pa.table({"caption": ["x"]}), tmp_path / "nopath.parquet")
    with pytest.raises(SourceError, match=r"nopath\.parquet.*no image path column"):
        shardex.export(tmp_path / "nopath.parquet", tmp_path / "o1", workers=1)
    pq.write_table(pa.table({"path": ["a.jpg"], "label": [0.5]}), tmp_path / "badlabel.parquet")
    with pytest.raises(SourceError, match=r"badlabel\.parquet.*label"):
        shardex.export(tmp_path / "badlabel.parquet", tmp_path / "o2", workers=1)
    (tmp_path / "garbage.parquet").write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(SourceError, match=r"garbage\.parquet"):
        shardex.export(tmp_path / "garbage.parquet", tmp_path / "o3", workers=1)


def test_foreign_tars_with_pax_and_gnu_long_names_export(tmp_path: Path) -> None:
    long_dir = "d" * 120
    for fmt, name in ((tarfile.PAX_FORMAT, "pax.tar"), (tarfile.GNU_FORMAT, "gnu.tar")):
        with tarfile.open(
            tmp_path / "tars" / name
            if (tmp_path / "tars").exists()
            else _mkdir(tmp_path / "tars") / name,
            "w",
            format=fmt,
        ) as tf:
            data = image_bytes(len(name))
            info = tarfile.TarInfo(f"{long_dir}/{name[:3]}-ünï.jpg")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    shardex.export(tmp_path / "tars", tmp_path / "out", workers=1)
    keys = sorted(shardex.open_dataset(tmp_path / "out").keys())  # type: ignore[attr-defined]
    assert keys == [f"{long_dir}/gnu-ünï", f"{long_dir}/pax-ünï"]


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path
