"""Fuzzing (bounded, deterministic in CI): malformed shards, index files and config.yaml may
only raise shardex's documented errors; never hang, crash or read outside a shard."""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shardex
from helpers import small_export
from shardex.contract import ExportConfig
from shardex.errors import ShardexError
from shardex.format.index import SplitIndex

FUZZ = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


@pytest.fixture(scope="module")
def export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return small_export(tmp_path_factory.mktemp("fuzz"), 12, 5)


@FUZZ
@given(data=st.binary(max_size=600))
def test_random_index_files_raise_format_errors(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "fuzz.npy"
    path.write_bytes(data)
    for num in (0, 1, 3):
        try:
            index = SplitIndex(path, path, num_samples=num)
            list(index.candidates("k"))
        except ShardexError:
            pass


@FUZZ
@given(
    records=st.lists(
        st.tuples(st.integers(0, 2**40), st.integers(0, 2**32 - 1), st.integers(0, 5)),
        min_size=12,
        max_size=12,
    )
)
def test_any_index_records_never_read_outside_shards(
    export: Path, tmp_path: Path, records: list[tuple[int, int, int]]
) -> None:
    copy = tmp_path / "copy"
    if not copy.exists():
        shutil.copytree(export, copy)
    samples = np.load(export / "train" / "index-samples.npy")
    for i, (offset, length, shard) in enumerate(records):
        samples[i]["offset"], samples[i]["length"], samples[i]["shard"] = offset, length, shard
    np.save(copy / "train" / "index-samples.npy", samples)
    ds = shardex.open_dataset(copy)
    for i in range(len(ds)):
        with contextlib.suppress(ShardexError):
            ds[i]


@FUZZ
@given(
    edits=st.dictionaries(
        st.sampled_from(
            [
                "num_samples",
                "backend",
                "splits",
                "key_specs",
                "x_keys",
                "format_version",
                "label_names",
                "num_classes",
                "shard_options",
                "source_datasets",
            ]
        ),
        st.one_of(
            st.none(),
            st.integers(-3, 10**12),
            st.text(max_size=8),
            st.lists(st.integers(), max_size=3),
            st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
        ),
        max_size=3,
    )
)
def test_edited_configs_raise_schema_errors(export: Path, edits: dict[str, object]) -> None:
    raw = yaml.safe_load((export / "config.yaml").read_text())
    raw.update(edits)
    with contextlib.suppress(ShardexError):
        ExportConfig.from_yaml(yaml.safe_dump(raw))


@FUZZ
@given(text=st.text(max_size=300))
def test_random_yaml_text_raises_schema_errors(text: str) -> None:
    with contextlib.suppress(ShardexError):
        ExportConfig.from_yaml(text)


@FUZZ
@given(cut=st.integers(0, 6000), flip=st.integers(0, 6000))
def test_damaged_shards_raise_documented_errors(
    export: Path, tmp_path: Path, cut: int, flip: int
) -> None:
    copy = tmp_path / "copy"
    if copy.exists():
        shutil.rmtree(copy)
    shutil.copytree(export, copy)
    shard = sorted((copy / "train").glob("*.tar"))[0]
    data = bytearray(shard.read_bytes())
    data[flip % len(data)] ^= 0x5A
    shard.write_bytes(bytes(data[: max(0, len(data) - cut)]))
    for verify in (True, False):
        ds = shardex.open_dataset(copy, verify=verify)
        for i in range(len(ds)):
            with contextlib.suppress(ShardexError):
                ds[i]
