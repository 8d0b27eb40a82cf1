"""Export modes on an output that already holds something: error, overwrite (readable at
every moment, no stale files), resume (see test_faults.py) and append."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

import shardex
from shardex.errors import ConfigError, DuplicateKeyError, OutputExistsError, StorageError
from shardex.storage import LocalStorage
from shardex.testing import make_sample_folder

FRACTIONS = {"train": 0.7, "val": 0.3}


def _table_subset(src: Path, rows: slice, name: str) -> Path:
    table = pq.read_table(src)
    out = src.with_name(name)
    pq.write_table(table.slice(rows.start, rows.stop - rows.start), out)
    return out


@pytest.fixture
def tables(tmp_path: Path) -> tuple[Path, Path, Path]:
    folder = make_sample_folder(tmp_path / "src", n=40)
    return (
        folder.table,
        _table_subset(folder.table, slice(0, 25), "first.parquet"),
        _table_subset(folder.table, slice(25, 40), "second.parquet"),
    )


def _keys(root: Path) -> dict[str, set[str]]:
    config = shardex.read_config(root)
    return {s: set(shardex.open_dataset(root, split=s).keys()) for s in config.splits}  # type: ignore[attr-defined]


def test_append_adds_shards_and_keeps_everything_else(
    tables: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    whole, first, second = tables
    out = tmp_path / "out"
    opts: dict[str, Any] = {
        "workers": 1,
        "samples_per_shard": 6,
        "split_fractions": FRACTIONS,
        "seed": 4,
    }
    before = shardex.export(first, out, **opts)
    old_shards = {
        s.path: (out / s.path).read_bytes() for i in before.splits.values() for s in i.shards
    }
    after = shardex.export(second, out, mode="append", workers=1, samples_per_shard=6)
    assert after.num_samples == 40
    assert (after.split_fractions, after.split_seed) == (FRACTIONS, 4)  # the rule is kept
    assert [s.uri for s in after.source_datasets] == [str(first), str(second)]
    for path, data in old_shards.items():  # old shards untouched
        assert (out / path).read_bytes() == data
    shardex.export(whole, tmp_path / "fresh", **opts)
    assert _keys(out) == _keys(tmp_path / "fresh")  # the seeded split rule still applies
    assert shardex.verify(out).ok
    meta = pq.read_table(out / "metadata.parquet")
    assert sorted(meta.column("export_index").to_pylist()) == list(range(40))
    for split, info in after.splits.items():
        ds = shardex.open_dataset(out, split=split)
        assert len(ds) == info.num_samples
        keys = list(ds.keys())  # type: ignore[attr-defined]
        assert [ds.get(k)["__key__"] for k in keys] == keys
        assert ds.metadata.column("sample_index").to_pylist() == list(range(len(ds)))
    assert sorted(p.name for p in out.iterdir()) == [
        "config.yaml",
        "metadata.parquet",
        "train",
        "val",
    ]


def test_append_refuses_keys_already_exported(
    tables: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    _whole, first, _second = tables
    shardex.export(first, tmp_path / "out", workers=1)
    with pytest.raises(DuplicateKeyError, match="already in the export"):
        shardex.export(first, tmp_path / "out", mode="append", workers=1)
    with pytest.raises(OutputExistsError, match="no complete export"):
        shardex.export(first, tmp_path / "empty", mode="append", workers=1)


def test_append_keeps_label_numbers(tmp_path: Path) -> None:
    folder = make_sample_folder(tmp_path / "src", n=12, classes=3)
    shardex.export(folder.root, tmp_path / "out", workers=1)
    extra = tmp_path / "extra"
    shutil.copytree(folder.root / "class2", extra / "class2")  # only the last class
    for p in (extra / "class2").iterdir():
        p.rename(p.with_name("new-" + p.name))
    config = shardex.export(extra, tmp_path / "out", mode="append", workers=1)
    assert config.label_names == ("class0", "class1", "class2")
    ds = shardex.open_dataset(tmp_path / "out")
    keys = list(ds.keys())  # type: ignore[attr-defined]
    assert {int(ds.get(k)["cls"]) for k in keys if "new-" in k} == {2}
    unknown = tmp_path / "other" / "class9"
    unknown.mkdir(parents=True)
    shutil.copy(next((folder.root / "class0").iterdir()), unknown / "z.jpg")
    with pytest.raises(ConfigError, match="class9"):
        shardex.export(unknown.parent, tmp_path / "out", mode="append", workers=1)


class CrashOnRename(LocalStorage):
    """Dies between the two commits of an overwrite (after the pending config)."""

    def rename(self, source: str, target: str) -> None:
        raise StorageError("simulated crash")


def test_overwrite_is_readable_at_every_step(
    tables: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    whole, first, _second = tables
    out = tmp_path / "out"
    shardex.export(first, out, workers=1, samples_per_shard=5)
    with pytest.raises(StorageError, match="simulated"):
        shardex.export(whole, CrashOnRename(out), mode="overwrite", workers=1, samples_per_shard=7)
    middle = shardex.read_config(out)  # the new export, committed with .pending files
    assert middle.num_samples == 40
    assert middle.metadata_file == "metadata.pending.parquet"
    assert shardex.verify(out).ok
    final = shardex.export(whole, out, mode="overwrite", workers=1, samples_per_shard=7)
    assert final.metadata_file == "metadata.parquet"
    shardex.export(whole, tmp_path / "fresh", workers=1, samples_per_shard=7)
    fresh = {
        str(p.relative_to(tmp_path / "fresh")): p.read_bytes()
        for p in (tmp_path / "fresh").rglob("*")
        if p.is_file()
    }
    assert {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()} == fresh


def test_failed_overwrite_leaves_the_old_export_readable(
    tables: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    whole, first, _second = tables
    out = tmp_path / "out"
    shardex.export(first, out, workers=1, samples_per_shard=5)
    expected = list(shardex.open_dataset(out))

    class FailingWrites(LocalStorage):
        def open_writer(self, path: str) -> Any:
            if path.endswith(".tar") and "000003" in path:
                raise StorageError("simulated disk failure")
            return super().open_writer(path)

    with pytest.raises(StorageError, match="simulated"):
        shardex.export(whole, FailingWrites(out), mode="overwrite", workers=1, samples_per_shard=7)
    assert list(shardex.open_dataset(out)) == expected
    assert shardex.verify(out).ok


def test_append_keeps_the_record_of_skipped_samples(tmp_path: Path) -> None:
    from helpers import image_bytes, make_tree

    for name, first_seed in (("a", 0), ("b", 10)):
        make_tree(tmp_path / name, [f"{name}{i}.jpg" for i in range(3)], first_seed=first_seed)
        (tmp_path / name / f"bad-{name}.jpg").write_bytes(image_bytes(99)[:100])
    shardex.export(tmp_path / "a", tmp_path / "out", workers=1, on_error="skip")
    config = shardex.export(
        tmp_path / "b", tmp_path / "out", mode="append", workers=1, on_error="skip"
    )
    assert config.num_samples == 6
    assert config.num_skipped == 2
    errors = pq.read_table(tmp_path / "out" / "errors.parquet").column("key").to_pylist()
    assert errors == ["bad-a", "bad-b"]
