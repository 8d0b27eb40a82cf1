"""The embedded demo dataset: labelled shape images drawn by shardex itself, no download;
generated once per (count, size, seed) into ``$SHARDEX_CACHE_DIR`` (``~/.cache/shardex``).
"""

from __future__ import annotations

import io
import math
import shutil
import tempfile
from pathlib import Path
from typing import ClassVar, Final

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from shardex.errors import ConfigError, SourceError
from shardex.refs.scan import SampleStream
from shardex.sources.base import DEFAULT_BATCH_SIZE, Source, check_batch_size
from shardex.sources.probe import SourceSpec
from shardex.sources.table import TableSource
from shardex.storage.cache import cache_dir

CLASSES: Final = (
    "circle",
    "square",
    "triangle",
    "diamond",
    "star",
    "pentagon",
    "hexagon",
    "cross",
    "ring",
    "ellipse",
)
COLOURS: Final = {
    "red": (220, 40, 40),
    "green": (40, 170, 60),
    "blue": (40, 80, 220),
    "yellow": (235, 210, 40),
    "purple": (140, 60, 190),
    "orange": (240, 140, 30),
    "white": (245, 245, 245),
    "black": (20, 20, 20),
}
DEFAULT_COUNT: Final = 5000
EMBEDDING_DIM: Final = 16


def _polygon(cx: float, cy: float, r: float, sides: int, turn: float) -> list[tuple[float, float]]:
    return [
        (
            cx + r * math.cos(turn + 2 * math.pi * k / sides),
            cy + r * math.sin(turn + 2 * math.pi * k / sides),
        )
        for k in range(sides)
    ]


def _star(cx: float, cy: float, r: float, turn: float) -> list[tuple[float, float]]:
    pts = []
    for k in range(10):
        rr = r if k % 2 == 0 else r * 0.45
        a = turn + math.pi * k / 5
        pts.append((cx + rr * math.cos(a), cy + rr * math.sin(a)))
    return pts


def draw_sample(
    i: int, *, seed: int, size_range: tuple[int, int]
) -> tuple[bytes, str, dict[str, object]]:
    """Draw image ``i``: returns (encoded bytes, extension, metadata)."""
    from PIL import Image, ImageDraw

    rng = np.random.default_rng([seed, i])
    label = i % len(CLASSES)
    w, h = (int(v) for v in rng.integers(size_range[0], size_range[1] + 1, size=2))
    names = list(COLOURS)
    fg_name, bg_name = rng.choice(len(names), size=2, replace=False)
    fg, bg = np.array(COLOURS[names[fg_name]]), np.array(COLOURS[names[bg_name]])
    ramp = np.linspace(0.6, 1.0, w)[None, :, None] * np.linspace(0.8, 1.0, h)[:, None, None]
    pixels = (bg[None, None, :] * ramp).clip(0, 255).astype(np.uint8)
    img = Image.fromarray(pixels)
    draw = ImageDraw.Draw(img)
    cx, cy = w * rng.uniform(0.35, 0.65), h * rng.uniform(0.35, 0.65)
    r = min(w, h) * rng.uniform(0.2, 0.33)
    turn = rng.uniform(0, 2 * math.pi)
    colour = tuple(int(v) for v in fg)
    shape = CLASSES[label]
    if shape == "circle":
        draw.ellipse((cx - r, cy - r, cx + r, cy + r), fill=colour)
    elif shape == "ring":
        draw.ellipse((cx - r, cy - r, cx + r, cy + r), outline=colour, width=max(3, int(r / 3)))
    elif shape == "ellipse":
        draw.ellipse((cx - r, cy - r * 0.55, cx + r, cy + r * 0.55), fill=colour)
    elif shape == "star":
        draw.polygon(_star(cx, cy, r, turn), fill=colour)
    elif shape == "cross":
        t = r * 0.35
        draw.rectangle((cx - r, cy - t, cx + r, cy + t), fill=colour)
        draw.rectangle((cx - t, cy - r, cx + t, cy + r), fill=colour)
    else:
        sides = {"square": 4, "triangle": 3, "diamond": 4, "pentagon": 5, "hexagon": 6}[shape]
        twist = math.pi / 4 if shape == "square" else (0.0 if shape == "diamond" else turn)
        draw.polygon(_polygon(cx, cy, r, sides, twist), fill=colour)
    noisy = np.asarray(img, dtype=np.int16) + rng.normal(0, 6, size=(h, w, 3)).astype(np.int16)
    arr = noisy.clip(0, 255).astype(np.uint8)
    out = io.BytesIO()
    kind = i % 10
    if kind == 8:
        Image.fromarray(arr).save(out, format="PNG")
        ext = "png"
    elif kind == 9:
        Image.fromarray(arr).save(out, format="WEBP", quality=85)
        ext = "webp"
    else:
        Image.fromarray(arr).save(out, format="JPEG", quality=int(rng.integers(80, 96)))
        ext = "jpg"
    gray = arr.mean(axis=2)
    hist = np.histogram(gray, bins=EMBEDDING_DIM, range=(0, 256))[0].astype(np.float32)
    meta: dict[str, object] = {
        "caption": f"a {names[fg_name]} {shape} on a {names[bg_name]} background",
        "aesthetic_score": round(float(4 + 6 * (r / min(w, h)) + rng.normal(0, 0.5)), 4),
        "width": w,
        "height": h,
        "embedding": (hist / np.linalg.norm(hist)).tolist(),
    }
    return out.getvalue(), ext, meta


def _draw_chunk(
    job: tuple[Path, range, int, tuple[int, int]],
) -> list[tuple[str, dict[str, object]]]:
    folder, indices, seed, size_range = job
    out = []
    for i in indices:
        data, ext, meta = draw_sample(i, seed=seed, size_range=size_range)
        rel = f"{CLASSES[i % len(CLASSES)]}/{i:06d}.{ext}"
        (folder / rel).write_bytes(data)
        out.append((rel, meta))
    return out


def generate(target: Path, *, count: int, seed: int, size_range: tuple[int, int]) -> None:
    """Write ``count`` demo images and ``metadata.parquet`` into ``target`` atomically."""
    from shardex.parallel import Runner

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        rows: dict[str, list[object]] = {"image_path": [], "label": []}
        metas: list[dict[str, object]] = []
        for cls in CLASSES:
            (tmp / cls).mkdir()
        step = 500
        jobs = (
            (tmp, range(s, min(s + step, count)), seed, size_range) for s in range(0, count, step)
        )
        with Runner(None if count > step else 1) as runner:
            for chunk in runner.imap(_draw_chunk, jobs):
                for rel, meta in chunk:
                    rows["image_path"].append(rel)
                    rows["label"].append(rel.split("/", 1)[0])
                    metas.append(meta)
        table = pa.table(
            {
                **{k: pa.array(v) for k, v in rows.items()},
                "caption": pa.array([m["caption"] for m in metas], pa.string()),
                "aesthetic_score": pa.array([m["aesthetic_score"] for m in metas], pa.float64()),
                "width": pa.array([m["width"] for m in metas], pa.int32()),
                "height": pa.array([m["height"] for m in metas], pa.int32()),
                "embedding": pa.array(
                    [m["embedding"] for m in metas], pa.list_(pa.float32(), EMBEDDING_DIM)
                ),
            }
        )
        pq.write_table(table, tmp / "metadata.parquet")
        try:
            tmp.rename(target)
        except OSError:  # another process made it first: theirs is identical
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


class DemoSource(Source):
    """The built-in demo dataset (see the module docstring)."""

    kind: ClassVar[str] = "demo"

    @classmethod
    def from_spec(cls, spec: SourceSpec) -> Source:
        text = spec.text or ""
        count = text.partition(":")[2]
        if count and not count.isdigit():
            raise SourceError(f"bad demo source {text!r}: use 'demo' or 'demo:N' (N images)")
        return cls(int(count) if count else DEFAULT_COUNT)

    def __init__(
        self,
        count: int = DEFAULT_COUNT,
        *,
        seed: int = 0,
        size_range: tuple[int, int] = (96, 160),
        batch_size: int = DEFAULT_BATCH_SIZE,
    ) -> None:
        if count < 1:
            raise ConfigError(f"demo dataset size must be at least 1, got {count}")
        self.count, self.seed, self.size_range = count, seed, size_range
        self.batch_size = check_batch_size(batch_size)
        self.uri = "demo" if count == DEFAULT_COUNT else f"demo:{count}"

    @property
    def folder(self) -> Path:
        """The cached folder of generated images."""
        lo, hi = self.size_range
        return cache_dir() / "demo" / f"shapes-v1-n{self.count}-px{lo}-{hi}-seed{self.seed}"

    def stream(self) -> SampleStream:
        if not (self.folder / "metadata.parquet").is_file():
            generate(self.folder, count=self.count, seed=self.seed, size_range=self.size_range)
        table = self.folder / "metadata.parquet"
        return TableSource(table, label_names=CLASSES, batch_size=self.batch_size).stream()
