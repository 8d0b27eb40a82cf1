"""Export behaviour: determinism, shard planning, splits, the contract, WebDataset reads."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

import shardex
from helpers import files_of
from shardex.errors import ConfigError, SchemaError
from shardex.planning import plan_bounds
from shardex.testing import SampleFolder, make_sample_folder
from shardex.testing.backend import image_of
from tests.support.interop import read_with_webdataset


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> SampleFolder:
    return make_sample_folder(tmp_path_factory.mktemp("src"), n=41)


def test_same_input_gives_byte_identical_exports_for_any_worker_count(
    folder: SampleFolder, tmp_path: Path
) -> None:
    opts = {"samples_per_shard": 6, "split_fractions": {"train": 0.8, "test": 0.2}, "seed": 1}
    shardex.export(folder.table, tmp_path / "w1", workers=1, **opts)
    shardex.export(folder.table, tmp_path / "w2", workers=2, **opts)
    one, two = files_of(tmp_path / "w1"), files_of(tmp_path / "w2")
    assert one == two
    assert sum(name.endswith(".tar") for name in one) == 8  # ceil(33/6) + ceil(8/6)


def test_random_naming_changes_names_only(folder: SampleFolder, tmp_path: Path) -> None:
    a = shardex.export(folder.table, tmp_path / "a", workers=1, deterministic_name=False)
    b = shardex.export(folder.table, tmp_path / "b", workers=1, deterministic_name=False)
    (sa,), (sb,) = a.splits["train"].shards, b.splits["train"].shards
    assert sa.path != sb.path
    assert sa.checksum == sb.checksum
    assert shardex.read_config(tmp_path / "a").shard_options["naming"] == "random"


def test_shards_are_filled_exactly_never_padded(folder: SampleFolder, tmp_path: Path) -> None:
    config = shardex.export(folder.table, tmp_path / "o", workers=1, images_per_tar=10)
    counts = [s.num_samples for s in config.splits["train"].shards]
    assert counts == [10, 10, 10, 10, 1]
    ds = shardex.open_dataset(tmp_path / "o")
    assert len(ds) == 41
    for shard in config.splits["train"].shards:
        size = (tmp_path / "o" / shard.path).stat().st_size
        assert size == shard.num_bytes
        table = pq.read_table(tmp_path / "o" / shard.metadata)
        assert table.num_rows == shard.num_samples


def test_max_shard_bytes_caps_every_shard(folder: SampleFolder, tmp_path: Path) -> None:
    cap = 6000
    config = shardex.export(folder.table, tmp_path / "o", workers=1, max_shard_bytes=cap)
    shards = config.splits["train"].shards
    assert len(shards) > 1
    assert all(s.num_bytes <= cap or s.num_samples == 1 for s in shards)
    ds = shardex.open_dataset(tmp_path / "o")
    assert sorted(image_of(s) for s in ds) == sorted(folder.images.values())


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=1, max_value=5000), max_size=60),
    per=st.integers(min_value=1, max_value=12),
    cap=st.one_of(st.none(), st.integers(min_value=1, max_value=20000)),
)
def test_plan_bounds_cover_rows_in_order(sizes: list[int], per: int, cap: int | None) -> None:
    bounds = plan_bounds(np.array(sizes, dtype=np.int64), per, cap)
    assert [i for a, b in bounds for i in range(a, b)] == list(range(len(sizes)))
    assert all(0 < b - a <= per for a, b in bounds)
    if cap is None:
        assert all(b - a == per for a, b in bounds[:-1])
    else:
        for a, b in bounds:
            assert b - a == 1 or sum(sizes[a:b]) + 1024 <= cap


def test_split_fractions_are_seeded_stable_and_recorded(
    folder: SampleFolder, tmp_path: Path
) -> None:
    fractions = {"train": 0.6, "val": 0.2, "test": 0.2}
    config = shardex.export(
        folder.table, tmp_path / "a", workers=1, split_fractions=fractions, seed=11
    )
    assert config.split_fractions == fractions
    assert config.split_seed == 11
    assert list(config.splits) == ["train", "val", "test"]
    raw = yaml.safe_load((tmp_path / "a" / "config.yaml").read_text())
    assert raw["split_seed"] == 11
    assert raw["split_fractions"] == fractions
    keys_a = {s: set(shardex.open_dataset(tmp_path / "a", split=s).keys()) for s in fractions}
    other = shardex.export(
        folder.table, tmp_path / "b", workers=1, split_fractions=fractions, seed=12
    )
    keys_b = {s: set(shardex.open_dataset(tmp_path / "b", split=s).keys()) for s in other.splits}
    assert keys_a != keys_b  # another seed, another split
    # the split of a key does not depend on the other keys: export a subset, same answer
    subset = folder.table.with_name("subset.parquet")
    pq.write_table(pq.read_table(folder.table).slice(0, 20), subset)
    shardex.export(subset, tmp_path / "c", workers=1, split_fractions=fractions, seed=11)
    for split in fractions:
        keys_c = set(shardex.open_dataset(tmp_path / "c", split=split).keys())
        assert keys_c <= keys_a[split]


def test_split_selection(folder: SampleFolder, tmp_path: Path) -> None:
    config = shardex.export(
        folder.table,
        tmp_path / "o",
        workers=1,
        splits=("val",),
        split_fractions={"train": 0.5, "val": 0.5},
    )
    assert list(config.splits) == ["val"]
    with pytest.raises(ConfigError, match="not in the source"):
        shardex.export(folder.table, tmp_path / "p", workers=1, splits=("nope",))


def test_metadata_parquet_has_every_sample_with_split_and_export_index(
    folder: SampleFolder, tmp_path: Path
) -> None:
    shardex.export(
        folder.table, tmp_path / "o", workers=1, split_fractions={"train": 0.5, "val": 0.5}
    )
    meta = pq.read_table(tmp_path / "o" / "metadata.parquet")
    assert meta.num_rows == 41
    assert sorted(meta.column("export_index").to_pylist()) == list(range(41))
    assert set(meta.column("split").to_pylist()) == {"train", "val"}
    for name in (
        "image_id",
        "tar_file",
        "member_name",
        "original_path",
        "metadata",
        "rank",
        "score",
        "caption",
        "embedding",
        "label",
        "sample_checksum",
    ):
        assert name in meta.column_names
    df = meta.to_pandas()
    assert str(df["rank"].dtype) == "int64"


def test_webdataset_library_reads_our_shards(folder: SampleFolder, tmp_path: Path) -> None:
    config = shardex.export(folder.table, tmp_path / "o", workers=1, samples_per_shard=7)
    urls = [str(tmp_path / "o" / s.path) for s in config.splits["train"].shards]
    ours = list(shardex.open_dataset(tmp_path / "o"))
    theirs = read_with_webdataset(urls)
    assert len(theirs) == 41
    assert theirs == ours


def test_hand_edited_config_is_refused(folder: SampleFolder, tmp_path: Path) -> None:
    shardex.export(folder.table, tmp_path / "o", workers=1)
    path = tmp_path / "o" / "config.yaml"
    raw = yaml.safe_load(path.read_text())
    raw["num_samples"] = 40
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(SchemaError, match="num_samples"):
        shardex.open_dataset(tmp_path / "o")
    raw["num_samples"] = 41
    raw["splits"]["train"]["shards"][0]["path"] = "../escape.tar"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(SchemaError, match="path"):
        shardex.open_dataset(tmp_path / "o")
    path.write_text("backend: [unclosed")
    with pytest.raises(SchemaError, match="not valid YAML"):
        shardex.open_dataset(tmp_path / "o")


def test_import_and_open_are_light(tmp_path: Path) -> None:
    shardex.export("demo:12", tmp_path / "o", samples_per_shard=4, workers=1)
    heavy = "{'torch', 'ray', 'zarr', 'tensordict', 'fastjsonschema', 'pyarrow', 'PIL', 'obstore'}"
    code = (
        f"import sys, shardex; heavy = {heavy}; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy)); "
        "before = set(sys.modules); ds = shardex.open_dataset(sys.argv[1], split='train'); "
        "ds[0]; print(sorted(set(sys.modules) - before))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "o")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert out[0] == "[]"  # import shardex: no heavy extras, no pyarrow
    # opening and reading an export: no more imports (but built-in modules: mmap, and
    # atexit, which weakref.finalize loads to close the shard descriptors at exit)
    assert set(ast.literal_eval(out[1])) <= {"mmap", "atexit"}, out[1]
