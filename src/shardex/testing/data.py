"""Small, deterministic image datasets for tests."""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


def make_image(
    seed: int, *, fmt: str = "JPEG", size: tuple[int, int] = (24, 20), mode: str = "RGB"
) -> bytes:
    """Encoded bytes of a small noisy image; the same seed gives the same bytes."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    channels = {"RGB": 3, "RGBA": 4, "L": 1}[mode]
    arr = rng.integers(0, 256, size=(size[1], size[0], channels), dtype=np.uint8)
    img = Image.fromarray(arr[..., 0] if channels == 1 else arr, mode=mode)
    out = io.BytesIO()
    img.save(out, format=fmt)
    return out.getvalue()


@dataclass(frozen=True)
class SampleFolder:
    """What :func:`make_sample_folder` wrote: the folder, a metadata table, and the bytes."""

    root: Path
    table: Path
    images: dict[str, bytes]  # key -> encoded bytes
    labels: dict[str, int]
    label_names: tuple[str, ...]


def make_sample_folder(root: Path, n: int = 23, *, classes: int = 3) -> SampleFolder:
    """``root/images/CLASS/NNNN.{jpg,png,webp}`` and a typed ``root/table.parquet`` over it."""
    names = tuple(f"class{c}" for c in range(classes))
    images: dict[str, bytes] = {}
    labels: dict[str, int] = {}
    paths: list[str] = []
    for i in range(n):
        fmt, ext = [("JPEG", "jpg"), ("PNG", "png"), ("WEBP", "webp")][i % 3]
        label = i % classes
        rel = f"images/{names[label]}/{i:04d}.{ext}"
        data = make_image(i, fmt=fmt, size=(16 + i % 7, 12 + i % 5))
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
        key = rel.rsplit(".", 1)[0]
        images[key], labels[key] = data, label
        paths.append(rel)
    table = pa.table(
        {
            "path": pa.array(paths, pa.string()),
            "label": pa.array([names[i % classes] for i in range(n)], pa.string()),
            "rank": pa.array(list(range(n)), pa.int64()),
            "score": pa.array([i / 7 for i in range(n)], pa.float64()),
            "caption": pa.array([f"sample {i} ünïcode" for i in range(n)], pa.string()),
            "embedding": pa.array(
                [[float(i), 0.5, -1.0, i / 3] for i in range(n)], pa.list_(pa.float32())
            ),
        }
    )
    pq.write_table(table, root / "table.parquet")
    return SampleFolder(root / "images", root / "table.parquet", images, labels, names)
