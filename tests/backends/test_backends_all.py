"""Every backend against the others: the demo data, conversions, keys, and the config-driven
ExportedDataset."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import shardex
from shardex.backends.registry import REGISTRY
from shardex.cli import main
from shardex.errors import ConfigError

BACKENDS = [e.name for e in REGISTRY.entries() if e.available]


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("demo") / "wds"
    shardex.export("demo:60", out, samples_per_shard=16, split_fractions={"train": 0.8, "val": 0.2})
    return out


@pytest.mark.parametrize("backend", BACKENDS)
def test_demo_reads_back_identical_from_every_backend(
    backend: str, demo: Path, tmp_path: Path
) -> None:
    out = tmp_path / backend
    result = CliRunner().invoke(
        main, ["export-dataset", str(demo), "-o", str(out), "--backend", backend, "-q"]
    )
    assert result.exit_code == 0, result.output
    config = shardex.read_config(out)
    assert config.backend == backend
    assert list(config.splits) == ["train", "val"]  # kept as exported, never re-split
    for split in ("train", "val"):
        ref = shardex.open_dataset(demo, split=split)
        ours = shardex.open_dataset(out, split=split)
        assert list(ours) == list(ref)
        assert ours.metadata.column("key").equals(ref.metadata.column("key"))
        assert ours.metadata.column("label").equals(ref.metadata.column("label"))
        decoded = shardex.open_dataset(out, split=split, decode=True)[3]
        want = shardex.open_dataset(demo, split=split, decode=True)[3]
        np.testing.assert_array_equal(decoded["jpg"], want["jpg"])
    assert config.label_names == shardex.read_config(demo).label_names


@pytest.mark.parametrize("backend", BACKENDS)
def test_metadata_column_as_key_is_stored_with_its_dtype(backend: str, tmp_path: Path) -> None:
    import pyarrow as pa

    n = 6
    meta = pa.table(
        {
            "embedding": pa.array(
                [[float(i), 1.0, 2.0] for i in range(n)], pa.list_(pa.float32(), 3)
            ),
            "aesthetic": pa.array([i / 2 for i in range(n)], pa.float64()),
        }
    )
    source = shardex.sources.ArraySource(
        {"jpg": [b"\xff\xd8" + bytes([i]) + b"\xff\xd9" for i in range(n)], "label": [0] * n},
        metadata=meta,
    )
    config = shardex.export(
        source,
        tmp_path / "o",
        backend=backend,
        x_keys=("embedding",),
        y_keys=("aesthetic",),
        validate="none",
    )
    spec = config.key_spec("embedding")
    assert spec is not None
    assert (spec.role, spec.dtype, spec.shape) == ("x", "float32", (3,))
    ds = shardex.open_dataset(tmp_path / "o", split="train", decode=True)
    sample = ds[2]
    assert "jpg" not in sample  # not selected
    assert sample["embedding.npy"].dtype == np.float32
    np.testing.assert_array_equal(sample["embedding.npy"], [2.0, 1.0, 2.0])
    assert float(sample["aesthetic.npy"]) == 1.0
    columns = {f.name: f.column for f in config.fields}
    assert columns["aesthetic.npy"] == "label__aesthetic"  # y keys carry the label prefix


def test_no_labels_omits_them(tmp_path: Path) -> None:
    config = shardex.export("demo:12", tmp_path / "o", backend="numpy_mmap", labels=False)
    assert all(f.kind != "label" for f in config.fields)
    assert "cls" not in shardex.open_dataset(tmp_path / "o")[0]


def test_dtype_flag_on_the_cli(tmp_path: Path) -> None:
    data = {"x": np.linspace(0, 1, 12, dtype=np.float64).reshape(4, 3)}
    shardex.export(data, tmp_path / "a", backend="numpy_mmap")
    result = CliRunner().invoke(
        main,
        ["export-dataset", str(tmp_path / "a"), "-o", str(tmp_path / "b"), "--dtype", "float32"],
    )
    assert result.exit_code == 0, result.output
    config = shardex.read_config(tmp_path / "b")
    assert [f.dtype for f in config.fields] == ["float32"]
    assert config.shard_options["dtype"] == "float32"
    bad = CliRunner().invoke(
        main, ["export-dataset", "demo:5", "-o", str(tmp_path / "c"), "--dtype", "int8"]
    )
    assert bad.exit_code != 0
    assert "int8" in bad.output


def test_unknown_backend_option_is_refused(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main,
        ["export-dataset", "demo:5", "-o", str(tmp_path / "o"), "--backend-option", "nope=1"],
    )
    assert result.exit_code != 0
    assert "no option 'nope'" in result.output
    assert not (tmp_path / "o" / "config.yaml").exists()


def test_append_is_refused_by_array_backends(tmp_path: Path) -> None:
    shardex.export("demo:8", tmp_path / "o", backend="numpy_mmap")
    with pytest.raises(ConfigError, match="cannot append"):
        shardex.export("demo:12", tmp_path / "o", backend="numpy_mmap", mode="append")


def test_exported_dataset_by_key_names(demo: Path, tmp_path: Path) -> None:
    shardex.export(demo, tmp_path / "mm", backend="numpy_mmap")
    ds = shardex.ExportedDataset(
        tmp_path / "mm",
        split="val",
        feature_keys=("image",),
        label_keys=("label", "aesthetic_score"),
    )
    ref = shardex.open_dataset(demo, split="val", decode=True)
    assert len(ds) == len(ref)
    item = ds[1]
    np.testing.assert_array_equal(item["features"]["image"], ref[1]["jpg"])
    assert item["labels"]["label"] == ref[1]["cls"]
    assert item["labels"]["aesthetic_score"] == ref.metadata.column("aesthetic_score")[1].as_py()
    clone = pickle.loads(pickle.dumps(ds))
    assert clone[1]["key"] == item["key"]
    with pytest.raises(ConfigError, match="no_such_key"):
        _ = shardex.ExportedDataset(tmp_path / "mm", "train", feature_keys=("no_such_key",)).dataset


def test_conversion_keeps_metadata_columns(demo: Path, tmp_path: Path) -> None:
    shardex.export(demo, tmp_path / "t", backend="tensor_shards", samples_per_shard=7)
    shardex.export(tmp_path / "t", tmp_path / "back", workers=1)
    for split in ("train", "val"):
        a = shardex.open_dataset(demo, split=split).metadata
        b = shardex.open_dataset(tmp_path / "back", split=split).metadata
        for column in ("key", "label", "original_path", "caption", "embedding", "split"):
            assert a.column(column).equals(b.column(column)), column


@pytest.mark.parametrize("backend", ["numpy", "numpy_mmap", "torch", "tensor_shards"])
def test_verify_finds_a_damaged_array_export(backend: str, tmp_path: Path) -> None:
    out = tmp_path / "o"
    shardex.export("demo:20", out, backend=backend, samples_per_shard=8)
    report = shardex.verify(out, deep=True)
    assert report.ok, report.problems
    assert report.samples == 20
    victim = max(
        (p for p in out.rglob("*") if p.is_file() and "keys" not in p.name),
        key=lambda p: p.stat().st_size,
    )
    data = bytearray(victim.read_bytes())
    data[-1] ^= 0xFF
    victim.write_bytes(bytes(data))
    damaged = shardex.verify(out)
    assert not damaged.ok


def test_unstorable_array_fields_are_refused_before_writing(tmp_path: Path) -> None:
    for data, match in [
        ({"names": np.array([["ab"], ["cd"]])}, "booleans or numbers"),
        ({"when": np.array(["2026-01-01", "2026-01-02"], dtype="datetime64[D]")}, "numbers"),
        ({"a/b": np.zeros((2, 3))}, "cannot name files"),
    ]:
        with pytest.raises(ConfigError, match=match):
            shardex.export(data, tmp_path / "o", backend="numpy_mmap", workers=1)
        assert not (tmp_path / "o" / "config.yaml").exists()


def test_big_endian_arrays_are_stored_natively_with_their_values(tmp_path: Path) -> None:
    values = np.arange(6, dtype=">f4").reshape(2, 3)
    for backend in ("numpy_mmap", "tensor_shards"):
        shardex.export({"x": values}, tmp_path / backend, backend=backend, workers=1)
        got = shardex.open_dataset(tmp_path / backend, decode=True)[1]["x.npy"]
        assert got.dtype == np.dtype("float32")
        np.testing.assert_array_equal(got, values[1])


def test_exported_dataset_refuses_out_of_range_indices(tmp_path: Path) -> None:
    shardex.export({"x": np.zeros((3, 2))}, tmp_path / "o", backend="numpy_mmap", workers=1)
    ds = shardex.ExportedDataset(tmp_path / "o", feature_keys=("x",), label_keys=())
    assert ds[-3]["key"] == ds[0]["key"]
    with pytest.raises(IndexError):
        ds[-4]
    with pytest.raises(IndexError):
        ds[3]
