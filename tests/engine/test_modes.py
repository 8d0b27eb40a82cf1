"""Export modes on an output that already holds something: error, overwrite (readable at
every moment, no stale files), resume (see test_faults.py) and append; in every mode, a
file shardex did not write (named like its unfinished writes, or in a staging folder of
the user's) is refused and kept."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import shardex
from helpers import files_of
from shardex.errors import ConfigError, DuplicateKeyError, OutputExistsError, StorageError
from shardex.exporter import export_files
from shardex.storage import LocalStorage, open_storage
from shardex.testing import make_sample_folder
from tests.support.s3data import S3Location

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


@pytest.fixture
def exported(tables: tuple[Path, Path, Path], tmp_path: Path) -> Path:
    """The first table's export, in shards of 5, at ``tmp_path / "out"``."""
    out = tmp_path / "out"
    shardex.export(tables[1], out, workers=1, samples_per_shard=5)
    return out


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
    meta = pq.read_table(out / str(after.metadata_file))
    assert after.metadata_file == "metadata.2.parquet"  # the committed one is never rewritten
    assert sorted(meta.column("export_index").to_pylist()) == list(range(40))
    for split, info in after.splits.items():
        ds = shardex.open_dataset(out, split=split)
        assert len(ds) == info.num_samples
        keys = list(ds.keys())  # type: ignore[attr-defined]
        assert [ds.get(k)["__key__"] for k in keys] == keys
        assert ds.metadata.column("sample_index").to_pylist() == list(range(len(ds)))
    assert sorted(p.name for p in out.iterdir()) == [
        "config.yaml",
        "metadata.2.parquet",
        "train",
        "val",
    ]
    listed = {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()}
    assert listed == {"config.yaml", *export_files(after)}  # the old index files are gone


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


def test_overwrite_never_writes_a_file_the_committed_export_names(
    tables: tuple[Path, Path, Path], exported: Path
) -> None:
    whole, out = tables[0], exported
    before = files_of(out)
    seen: list[str] = []

    class Watching(LocalStorage):
        def open_writer(self, path: str) -> Any:
            seen.append(path)
            return super().open_writer(path)

        def rename(self, source: str, target: str) -> None:
            raise AssertionError(f"renamed {source} to {target}")

    config = shardex.export(whole, Watching(out), mode="overwrite", workers=1, samples_per_shard=7)
    assert seen
    # the shard lists follow from config.yaml alone: replaced only after it commits
    lists = {p for p in before if p.endswith(("/shards.txt", "/shards.wids.json"))}
    assert lists
    assert all(seen.index(p) > seen.index("config.yaml") for p in lists)
    assert not set(seen) & (set(before) - {"config.yaml", ".shardex-intent.json"} - lists)
    assert config.metadata_file == "metadata.2.parquet"
    assert shardex.verify(out).ok
    after = files_of(out)
    assert after.keys() == {"config.yaml", *export_files(config)}
    # an overwrite of the same samples keeps every shard and the index, and alternates
    # the names of the files it rewrites
    again = shardex.export(whole, out, mode="overwrite", workers=1, samples_per_shard=7)
    assert again.metadata_file == "metadata.parquet"
    assert [s.path for s in again.splits["train"].shards] == [
        s.path for s in config.splits["train"].shards
    ]
    assert shardex.verify(out).ok


def test_overwrite_with_changed_bytes_under_the_same_names_writes_second_names(
    tmp_path: Path,
) -> None:
    """Labels change the bytes of a shard but not its name (the name hashes keys and
    sizes): the committed shard is kept as it is until the new config.yaml commits."""
    folder = make_sample_folder(tmp_path / "src", n=12, classes=3)
    table = pq.read_table(folder.table)
    rotate = {"class0": "class1", "class1": "class2", "class2": "class0"}
    relabelled = table.set_column(
        table.column_names.index("label"),
        "label",
        pa.array([rotate[v] for v in table.column("label").to_pylist()], pa.string()),
    )
    pq.write_table(relabelled, folder.table.with_name("relabelled.parquet"))
    out = tmp_path / "out"
    old = shardex.export(folder.table, out, workers=1, samples_per_shard=5)
    old_bytes = {s.path: (out / s.path).read_bytes() for s in old.splits["train"].shards}
    expected = list(shardex.open_dataset(out))
    seen: list[str] = []

    class Watching(LocalStorage):
        def open_writer(self, path: str) -> Any:
            seen.append(path)
            assert path not in old_bytes, f"{path} is named by the committed export"
            return super().open_writer(path)

        def put(self, path: str, data: bytes | bytearray | memoryview) -> None:
            if path == "config.yaml":  # just before the commit: the old export is whole
                assert list(shardex.open_dataset(out)) == expected
                for name, data_before in old_bytes.items():
                    assert (out / name).read_bytes() == data_before
            super().put(path, data)

    new = shardex.export(
        folder.table.with_name("relabelled.parquet"),
        Watching(out),
        mode="overwrite",
        workers=1,
        samples_per_shard=5,
    )
    new_paths = [s.path for s in new.splits["train"].shards]
    assert len(new_paths) == len(old_bytes)
    assert not set(new_paths) & set(old_bytes)
    assert all(not (out / p).exists() for p in old_bytes)  # removed after the commit
    assert shardex.verify(out).ok
    assert sorted(int(s["cls"]) for s in shardex.open_dataset(out)) == sorted(
        (int(s["cls"]) + 1) % 3 for s in expected
    )


def test_failed_overwrite_leaves_the_old_export_readable(
    tables: tuple[Path, Path, Path], exported: Path
) -> None:
    whole, out = tables[0], exported
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
    assert config.errors_file == "errors.2.parquet"
    errors = pq.read_table(tmp_path / "out" / config.errors_file).column("key").to_pylist()
    assert errors == ["bad-a", "bad-b"]


def test_an_export_left_mid_promotion_by_an_older_shardex_is_repaired(
    tables: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    """Older shardex versions renamed .pending files after committing; killed between the
    renames it left a committed config.yaml naming files already renamed."""
    _whole, first, second = tables
    out = tmp_path / "out"
    shardex.export(first, out, workers=1, samples_per_shard=5)
    (out / "train" / "index-keys.npy").rename(out / "train" / "index-keys.pending.npy")
    text = (out / "config.yaml").read_text()
    for name in ("index-samples", "index-keys"):
        text = text.replace(f"train/{name}.npy", f"train/{name}.pending.npy")
    (out / "config.yaml").write_text(text.replace("metadata.parquet", "metadata.pending.parquet"))
    report = shardex.verify(out)
    assert not report.ok
    assert "index-samples.pending.npy" in str(report.problems)
    config = shardex.export(first, out, workers=1, samples_per_shard=5, mode="resume")
    assert config.splits["train"].index is not None
    assert config.splits["train"].index.samples == "train/index-samples.npy"
    assert config.splits["train"].index.keys == "train/index-keys.pending.npy"  # it exists
    assert shardex.verify(out).ok
    shardex.export(second, out, workers=1, samples_per_shard=5, mode="append")
    assert shardex.read_config(out).num_samples == 40
    assert shardex.verify(out).ok


def test_overwrite_rewrites_a_damaged_shard_instead_of_keeping_it(tmp_path: Path) -> None:
    """A shard whose sidecar matches the samples it should hold is kept by an overwrite
    only if its own bytes do too: overwriting is how a damaged export is repaired."""
    src = make_sample_folder(tmp_path / "src", n=12)
    out = tmp_path / "out"
    shardex.export(src.table, out, workers=1, samples_per_shard=4)
    shard = sorted(out.glob("train/*.tar"))[1]
    data = bytearray(shard.read_bytes())
    data[700] ^= 0x01
    shard.write_bytes(bytes(data))
    assert not shardex.verify(out).ok
    shardex.export(src.table, out, workers=1, samples_per_shard=4, mode="overwrite")
    assert shardex.verify(out).ok


# -- files in the output that shardex did not write ---------------------------------------


@pytest.mark.parametrize(
    "name", [".notes.txt.tmp-1a2b", "reports/.summary.csv.tmp-77", "train/.my.json.tmp-0"]
)
@pytest.mark.parametrize("mode", ["overwrite", "resume", "error"])
def test_a_users_file_named_like_an_unfinished_write_is_refused_and_kept(
    tables: tuple[Path, Path, Path], exported: Path, name: str, mode: str
) -> None:
    """A program of the user's writing ``NAME`` the way shardex does (``.NAME.tmp-X``)
    leaves a file the old check deleted with every overwrite; now it is a foreign file."""
    src, out = tables[1], exported
    (out / name).parent.mkdir(parents=True, exist_ok=True)
    (out / name).write_bytes(b"the user's half-written file")
    before = files_of(out)
    with pytest.raises(OutputExistsError) as refused:
        shardex.export(src, out, samples_per_shard=5, workers=1, mode=mode)
    message = str(refused.value)
    assert "\n" not in message
    assert f"'{name}'" in message, message
    assert "did not write" in message, message
    assert files_of(out) == before  # the user's file and the committed export


def test_a_killed_exports_unfinished_writes_still_go(
    tables: tuple[Path, Path, Path], exported: Path
) -> None:
    src, out = tables[1], exported
    shard = sorted((out / "train").glob("images-*.tar"))[0]
    left = shard.with_name(f".{shard.name}.tmp-0badf00d")  # a write a kill cut short
    left.write_bytes(b"half a tar")
    shardex.export(src, out, samples_per_shard=5, workers=1, mode="overwrite")
    assert not left.exists()
    assert shardex.verify(out).ok


@pytest.mark.parametrize(
    "name", [".shardex-staging/notes.txt", ".shardex-staging/images-0123abcd-000000.tar"]
)
def test_a_users_own_staging_folder_is_foreign(
    tables: tuple[Path, Path, Path], tmp_path: Path, name: str
) -> None:
    _whole, first, _second = tables
    out = tmp_path / "out"
    (out / name).parent.mkdir(parents=True)
    (out / name).write_bytes(b"mine")
    with pytest.raises(OutputExistsError) as refused:
        shardex.export(first, out, samples_per_shard=5, workers=1)
    assert f"'{name}'" in str(refused.value)
    assert files_of(out) == {name: b"mine"}  # nothing written, nothing deleted


def test_a_users_staging_folder_beside_an_export_survives_an_overwrite(
    tables: tuple[Path, Path, Path], exported: Path
) -> None:
    src, out = tables[1], exported
    mine = out / ".shardex-staging" / "train" / "images-0123abcd-000000.tar"
    mine.parent.mkdir(parents=True)
    mine.write_bytes(b"mine")
    with pytest.raises(OutputExistsError, match="shardex-staging"):
        shardex.export(src, out, samples_per_shard=5, workers=1, mode="overwrite")
    assert mine.read_bytes() == b"mine"


def test_a_users_own_staging_folder_on_object_storage_is_foreign(
    tables: tuple[Path, Path, Path], s3: S3Location
) -> None:
    _whole, first, _second = tables
    out = open_storage(s3.child("out"), s3.direct)
    name = ".shardex-staging/0123456789ab/notes.txt"  # a run's folder, not a name it stages
    out.put(name, b"mine")
    with pytest.raises(OutputExistsError, match=re.escape(repr(name))):
        shardex.export(first, s3.child("out"), storage_options=s3.direct, workers=1)
    assert list(out.list()) == [name]
    assert out.get(name) == b"mine"
