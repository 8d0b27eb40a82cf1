"""The export reads each image once: bad images found while writing are skipped (or
refuse the export, which then undoes its own files and no others) and shards stay exactly
filled, whatever the worker count."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

import shardex
from helpers import assert_skipped_as_if_absent, files_of, folder_with_bad_images, image_keys
from shardex.errors import BadSampleError
from shardex.testing import make_image


@pytest.mark.parametrize("cap", [None, 10_000], ids=["by-count", "by-bytes"])
def test_skipped_images_leave_every_shard_but_the_last_full(
    tmp_path: Path, cap: int | None
) -> None:
    bad = {1, 2, 7, 8, 9, 15, 30, 31}
    folder_with_bad_images(tmp_path / "src", 40, bad)
    opts = {"samples_per_shard": 4, "max_shard_bytes": cap, "on_error": "skip"}
    one = shardex.export(tmp_path / "src", tmp_path / "w1", workers=1, **opts)
    two = shardex.export(tmp_path / "src", tmp_path / "w2", workers=2, **opts)
    assert files_of(tmp_path / "w1") == files_of(tmp_path / "w2")  # no stray speculative shard
    assert one.num_samples == two.num_samples == 32
    assert one.num_skipped == 8
    shards = one.splits["train"].shards
    if cap is None:
        assert [s.num_samples for s in shards] == [4] * 8
    assert_skipped_as_if_absent(tmp_path / "src", bad, tmp_path / "w1", workers=1, **opts)
    ds = shardex.open_dataset(tmp_path / "w2")
    assert len(ds) == 32
    assert sorted(ds.keys()) == image_keys(set(range(40)) - bad)  # type: ignore[attr-defined]
    assert shardex.verify(tmp_path / "w2").ok


def test_a_bad_image_found_while_writing_refuses_and_leaves_nothing(tmp_path: Path) -> None:
    folder_with_bad_images(tmp_path / "src", 30, {25})
    with pytest.raises(BadSampleError, match=r"0025\.jpg': truncated JPEG"):
        shardex.export(tmp_path / "src", tmp_path / "out", workers=2, samples_per_shard=4)
    assert not [p for p in (tmp_path / "out").rglob("*") if p.is_file()]
    done = shardex.export(tmp_path / "src", tmp_path / "out", on_error="skip", samples_per_shard=4)
    assert done.num_samples == 29  # the refused run left nothing in the way


def test_an_undone_export_leaves_an_export_inside_its_output_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sample refused while writing undoes the run's files, and only the run's: an
    export made meanwhile into a folder inside the output keeps its file being written
    and the files it completed (as the commit leaves them, see test_ray_faults)."""
    import shardex.engine.run as run
    from shardex.storage.local import LocalObjectWriter

    folder_with_bad_images(tmp_path / "src", 30, {25})
    out = tmp_path / "out"
    name = "images-0123456789abcdef-000000.tar"
    writers: list[LocalObjectWriter] = []
    plain = run.write_splits

    def meanwhile(*args: object, **kwargs: object) -> object:
        done = out / "nested" / "train" / name.replace("0000.tar", "0001.tar")
        done.parent.mkdir(parents=True)
        done.write_bytes(b"another export's shard, complete")
        nested = LocalObjectWriter(out, f"nested/train/{name}")
        nested.write(b"another export's shard, still being written")
        writers.append(nested)
        return plain(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(run, "write_splits", meanwhile)
    with pytest.raises(BadSampleError):
        shardex.export(tmp_path / "src", out, samples_per_shard=4, workers=1)
    writers[0].commit()  # the nested export's write completes
    nested = out / "nested" / "train"
    assert sorted(p.name for p in nested.iterdir()) == [
        name,
        name.replace("0000.tar", "0001.tar"),
    ]


def test_in_memory_bytes_are_checked_too(tmp_path: Path) -> None:
    images = [make_image(i) for i in range(10)]
    images[3] = images[3][:100]
    with pytest.raises(BadSampleError, match=r"arrays\[3\]"):
        shardex.export({"jpg": images}, tmp_path / "a", workers=1)
    config = shardex.export({"jpg": images}, tmp_path / "b", on_error="skip", samples_per_shard=3)
    assert [s.num_samples for s in config.splits["train"].shards] == [3, 3, 3]


@pytest.mark.parametrize("workers", [1, 2])
def test_bad_images_at_the_end_of_a_split_are_recorded(tmp_path: Path, workers: int) -> None:
    # the last shard's candidates are all bad: no shard holds them, errors.parquet must
    bad = {5, 7, 9, 11}  # c1/0005 ... c1/0011: the split's last four samples
    folder_with_bad_images(tmp_path / "src", 12, bad)
    done = shardex.export(
        tmp_path / "src", tmp_path / "out", samples_per_shard=4, on_error="skip", workers=workers
    )
    assert done.num_samples == 8
    assert done.num_skipped == 4
    errors = pq.read_table(tmp_path / "out" / "errors.parquet")
    assert sorted(errors.column("key").to_pylist()) == sorted(f"c1/{i:04d}" for i in bad)
    assert len(list((tmp_path / "out").rglob("*.tar"))) == 2  # no empty shard left
    assert shardex.verify(tmp_path / "out").ok


def test_a_split_whose_images_are_all_bad_leaves_no_files(tmp_path: Path) -> None:
    for split, bad in (("train", False), ("val", True)):
        for i in range(3):
            path = tmp_path / "src" / split / "c0" / f"{i}.jpg"
            path.parent.mkdir(parents=True, exist_ok=True)
            data = make_image(i)
            path.write_bytes(data[: len(data) // 2] if bad else data)
    done = shardex.export(tmp_path / "src", tmp_path / "out", on_error="skip", workers=1)
    assert list(done.splits) == ["train"]
    assert done.num_skipped == 3
    assert not (tmp_path / "out" / "val").exists()  # no index of a split not exported
