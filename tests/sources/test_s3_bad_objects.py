"""One bad object in an S3 source never blocks the export: a key that is no path, or a
0- or 1-byte tar, is a one-line error naming it, and under ``on_error="skip"`` a row of
errors.parquet while the good objects are exported (the same as a local source)."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

import shardex
from helpers import image_bytes
from shardex.errors import ShardexError
from shardex.storage import ObjectStorage
from tests.support.s3data import S3Location, put_raw, tar_of

OPTS = {"samples_per_shard": 5, "workers": 1}


def _skipped(out: Path) -> list[str]:
    return [
        str(p) for p in pq.read_table(out / "errors.parquet").column("original_path").to_pylist()
    ]


@pytest.mark.parametrize("bad", ["cls/new\nline.jpg", "cls/tab\t.jpg", "cls/ctrl\x01.jpg"])
def test_a_key_with_a_control_character_is_named_or_skipped(
    s3: S3Location, tmp_path: Path, bad: str
) -> None:
    """obstore refuses a whole LIST page for a key with a newline or a tab: the rest of the
    listing is read past it. U+0001 cannot travel in the server's XML at all: it lists
    the key with U+FFFD, which no GET finds. Each is named in one line, or skipped and
    recorded while the other images are exported."""
    listed = bad.replace("\x01", "\ufffd")
    store = ObjectStorage(s3.child("imgs"), s3.direct)
    for i in range(6):
        store.put(f"cls/img{i}.jpg", image_bytes(i))
    put_raw(s3, f"imgs/{bad}", image_bytes(99))
    options = {"source_storage_options": s3.direct, **OPTS}
    with pytest.raises(ShardexError) as refused:
        shardex.export(s3.child("imgs"), tmp_path / "refused", **options)  # type: ignore[arg-type]
    message = str(refused.value)
    assert "\n" not in message and repr(listed)[1:-1] in message, message
    config = shardex.export(s3.child("imgs"), tmp_path / "out", on_error="skip", **options)  # type: ignore[arg-type]
    assert config.num_samples == 6 and config.num_skipped == 1
    assert _skipped(tmp_path / "out") == [listed]


@pytest.mark.parametrize("size", [0, 1])
def test_a_tiny_tar_is_skipped_and_the_others_exported(
    s3: S3Location, tmp_path: Path, size: int
) -> None:
    files = {
        "a.tar": tar_of([(f"k{i:03d}", image_bytes(i), i % 2) for i in range(4)]),
        "b.tar": b"\0" * size,
        "c.tar": tar_of([(f"m{i:03d}", image_bytes(i), i % 2) for i in range(3)]),
    }
    (tmp_path / "src").mkdir()
    store = ObjectStorage(s3.child("tars"), s3.direct)
    for name, data in files.items():
        (tmp_path / "src" / name).write_bytes(data)
        store.put(name, data)
    for where, options in (
        (str(tmp_path / "src"), {}),
        (s3.child("tars/"), {"source_storage_options": s3.direct}),
    ):
        out = tmp_path / ("local" if "://" not in where else "remote")
        with pytest.raises(ShardexError) as refused:
            shardex.export(where, tmp_path / "refused", **options, **OPTS)  # type: ignore[arg-type]
        assert "b.tar" in str(refused.value) and "\n" not in str(refused.value)
        config = shardex.export(where, out, on_error="skip", **options, **OPTS)  # type: ignore[arg-type]
        assert config.num_samples == 7, where
        assert any(p.endswith("b.tar") for p in _skipped(out)), where
