"""The backend conformance suite: subclass :class:`BackendTests` and set ``backend_name``."""

from __future__ import annotations

import json
import pickle
import random
import shutil
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pytest

import shardex
import shardex.engine.transaction
from shardex.backends.registry import get_backend
from shardex.codecs.images import IMAGE_EXTENSIONS
from shardex.dataset import Dataset, Sample
from shardex.errors import ConfigError, NotAnExportError, OutputExistsError, SampleNotFoundError
from shardex.exporter import export_files
from shardex.testing.data import SampleFolder, make_sample_folder

_FRACTIONS = {"train": 0.7, "val": 0.3}


def image_of(sample: Sample) -> bytes:
    found = [v for k, v in sample.items() if k.rpartition(".")[2] in IMAGE_EXTENSIONS]
    assert len(found) == 1, f"expected one image field in {sorted(sample)}"
    return found[0]  # type: ignore[no-any-return]


class FolderBackendTests:
    """Round-trip, metadata, atomicity and pickling tests for one backend, on images."""

    backend_name: ClassVar[str]

    @pytest.fixture(scope="class")
    @classmethod
    def folder(cls, tmp_path_factory: pytest.TempPathFactory) -> SampleFolder:
        return make_sample_folder(tmp_path_factory.mktemp("src"), n=23)

    @pytest.fixture(scope="class", params=[1, 4, 23, 1000], ids=lambda n: f"shard{n}")
    @classmethod
    def exported(
        cls,
        request: pytest.FixtureRequest,
        folder: SampleFolder,
        tmp_path_factory: pytest.TempPathFactory,
    ) -> Path:
        out = tmp_path_factory.mktemp("out")
        shardex.export(
            folder.table,
            out,
            backend=cls.backend_name,
            workers=1,
            samples_per_shard=request.param,
            split_fractions=_FRACTIONS,
            seed=3,
        )
        return out

    def _check(self, folder: SampleFolder, sample: Sample) -> None:
        key = sample["__key__"]
        assert image_of(sample) == folder.images[key]
        assert int(sample["cls"]) == folder.labels[key]
        meta = json.loads(sample["json"])
        assert meta["rank"] == int(key.rsplit("/", 1)[1])
        assert meta["caption"].endswith("ünïcode")

    def _splits(self, out: Path) -> list[Dataset]:
        return [shardex.open_dataset(out, split=s) for s in _FRACTIONS]

    def test_every_sample_round_trips(self, folder: SampleFolder, exported: Path) -> None:
        seen = []
        for ds in self._splits(exported):
            for i in range(len(ds)):
                self._check(folder, ds[i])
                seen.append(ds[i]["__key__"])
        assert sorted(seen) == sorted(folder.images)

    def test_get_by_key_and_negative_index(self, folder: SampleFolder, exported: Path) -> None:
        for ds in self._splits(exported):
            for i in range(len(ds)):
                key = ds[i]["__key__"]
                assert ds.get(key) == ds[i]
            assert ds[-1] == ds[len(ds) - 1]

    def test_get_many_keeps_order(self, folder: SampleFolder, exported: Path) -> None:
        for ds in self._splits(exported):
            order = list(range(len(ds))) * 2
            random.Random(7).shuffle(order)
            assert ds.get_many(order) == [ds[i] for i in order]
            assert ds.get_many([]) == []

    def test_iteration_matches_indexing(self, folder: SampleFolder, exported: Path) -> None:
        for ds in self._splits(exported):
            assert list(ds) == [ds[i] for i in range(len(ds))]

    def test_metadata_types_kept(self, exported: Path) -> None:
        for ds in self._splits(exported):
            meta = ds.metadata
            assert meta.num_rows == len(ds)
            assert meta.schema.field("rank").type == pa.int64()
            assert meta.schema.field("score").type == pa.float64()
            assert meta.schema.field("caption").type == pa.string()
            assert meta.schema.field("embedding").type == pa.list_(pa.float32(), 4)
            assert meta.column("key").to_pylist() == [ds[i]["__key__"] for i in range(len(ds))]
        spec = shardex.read_config(exported).key_spec("embedding")
        assert spec is not None
        assert (spec.dtype, spec.shape) == ("float32", (4,))

    def test_decode_gives_arrays_and_typed_labels(
        self, folder: SampleFolder, exported: Path
    ) -> None:
        ds = shardex.open_dataset(exported, split="train", decode=True)
        sample: dict[str, Any] = ds[0]
        image = next(v for k, v in sample.items() if k in IMAGE_EXTENSIONS)
        assert image.dtype.name == "uint8"
        assert image.ndim == 3
        assert sample["cls"] == folder.labels[sample["__key__"]]
        assert isinstance(sample["json"], dict)

    def test_missing_key_and_index(self, exported: Path) -> None:
        ds = self._splits(exported)[0]
        with pytest.raises(SampleNotFoundError):
            ds.get("no/such/key")
        with pytest.raises(KeyError):
            ds.get("no/such/key")
        with pytest.raises(IndexError):
            ds[len(ds)]

    def test_pickle_round_trip(self, exported: Path) -> None:
        ds = self._splits(exported)[0]
        clone = pickle.loads(pickle.dumps(ds))
        assert len(clone) == len(ds)
        assert clone[len(ds) // 2] == ds[len(ds) // 2]

    def test_uncommitted_export_is_not_an_export(self, exported: Path, tmp_path: Path) -> None:
        copy = tmp_path / "copy"
        shutil.copytree(exported, copy)
        (copy / "config.yaml").unlink()
        with pytest.raises(NotAnExportError):
            shardex.open_dataset(copy, split="train")

    def test_capabilities_are_declared(self) -> None:
        caps = get_backend(self.backend_name).capabilities
        assert isinstance(caps.random_access, bool)
        assert caps.random_access or caps.streaming


def array_data(n: int = 11) -> dict[str, Any]:
    """An array source with every kind of field the backends must keep exactly."""
    rng = np.random.default_rng(5)
    return {
        "key": [f"a/{i:03d}" for i in range(n)],
        "label": [i % 3 for i in range(n)],
        "pixels": rng.integers(0, 256, (n, 6, 5, 3), dtype=np.uint8),
        "u16": rng.integers(0, 60000, (n, 4), dtype=np.uint16),
        "count": np.arange(n, dtype=np.int64) * 1_000_000_007,  # 0-d per sample
        "half": rng.standard_normal((n, 3)).astype(np.float16),
        "emb": rng.standard_normal((n, 2, 2)).astype(np.float32),
        "score": rng.standard_normal(n),  # float64, 0-d
        "mask": rng.integers(0, 2, (n, 5)).astype(bool),
        "ragged": [rng.standard_normal(i % 4 + 1).astype(np.float32) for i in range(n)],
        "caption": [f"sample {i} ünïcode" for i in range(n)],
        "bin": [bytes([i]) * (i + 1) for i in range(n)],
    }


class ArrayBackendTests:
    """Arrays, strings, bytes and labels round-trip exactly; re-export is atomic."""

    backend_name: ClassVar[str]
    samples_per_shard: ClassVar[int] = 4
    #: Whether files inside its shard folders are not listed one by one in config.yaml
    #: (``numpy``: a file per sample per field).
    files_inside_shard_folders: ClassVar[bool] = False

    @pytest.fixture(scope="class")
    @classmethod
    def arrays(cls, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
        data = array_data()
        out = tmp_path_factory.mktemp("arrays")
        shardex.export(
            data, out, backend=cls.backend_name, workers=1, samples_per_shard=cls.samples_per_shard
        )
        return out, data

    def test_arrays_round_trip_with_their_dtype(self, arrays: tuple[Path, dict[str, Any]]) -> None:
        out, data = arrays
        ds = shardex.open_dataset(out, split="train", decode=True)
        assert len(ds) == len(data["key"])
        by_key = {k: i for i, k in enumerate(data["key"])}
        for sample in ds:
            i = by_key[sample["__key__"]]
            assert sample["cls"] == data["label"][i]
            assert sample["caption.txt"] == data["caption"][i]
            assert sample["bin"] == data["bin"][i]
            for name in ("pixels", "u16", "count", "half", "emb", "score", "mask", "ragged"):
                got, want = sample[f"{name}.npy"], np.asarray(data[name][i])
                assert got.dtype == want.dtype, name
                assert got.shape == want.shape, name
                np.testing.assert_array_equal(got, want)

    def test_recorded_dtype_and_shape_are_what_is_read(
        self, arrays: tuple[Path, dict[str, Any]]
    ) -> None:
        out, _ = arrays
        config = shardex.read_config(out)
        sample = shardex.open_dataset(out, split="train", decode=True)[0]
        for field in config.fields:
            if field.kind != "array":
                continue
            got = sample[field.name]
            assert field.dtype == got.dtype.name
            assert len(field.shape) == got.ndim
            assert all(d is None or d == g for d, g in zip(field.shape, got.shape, strict=True))
        ragged = next(f for f in config.fields if f.name == "ragged.npy")
        assert ragged.shape == (None,)  # variable, not the first sample's shape
        spec = config.key_spec("emb")
        assert spec is not None
        assert (spec.dtype, spec.shape) == ("float32", (2, 2))

    def test_raw_samples_equal_the_webdataset_backend(
        self, arrays: tuple[Path, dict[str, Any]], tmp_path: Path
    ) -> None:
        out, data = arrays
        shardex.export(data, tmp_path / "wds", workers=1)
        ours = shardex.open_dataset(out, split="train")
        ref = shardex.open_dataset(tmp_path / "wds", split="train")
        assert list(ours) == list(ref)

    def test_shards_are_exact_and_unpadded(self, arrays: tuple[Path, dict[str, Any]]) -> None:
        out, data = arrays
        info = shardex.read_config(out).split("train")
        counts = [s.num_samples for s in info.shards]
        assert sum(counts) == len(data["key"])
        if len(counts) > 1:
            n, size = len(data["key"]), self.samples_per_shard
            assert counts == [size] * (n // size) + ([n % size] if n % size else [])

    def test_dtype_cast_is_explicit_and_recorded(self, tmp_path: Path) -> None:
        data = {"emb": np.ones((3, 2), np.float64), "ids": np.arange(3, dtype=np.int64)}
        config = shardex.export(data, tmp_path / "o", backend=self.backend_name, dtype="float16")
        fields = {f.name: f.dtype for f in config.fields}
        assert fields == {"emb.npy": "float16", "ids.npy": "int64"}  # integers never cast
        assert config.shard_options["dtype"] == "float16"
        sample = shardex.open_dataset(tmp_path / "o", split="train", decode=True)[0]
        assert sample["emb.npy"].dtype == np.float16

    def test_reexport_needs_overwrite_and_leaves_no_stale_files(
        self, arrays: tuple[Path, dict[str, Any]], tmp_path: Path
    ) -> None:
        out = tmp_path / "o"
        data = array_data(9)
        shardex.export(data, out, backend=self.backend_name, samples_per_shard=2)
        with pytest.raises(OutputExistsError):
            shardex.export(data, out, backend=self.backend_name)
        smaller = {k: v[:5] for k, v in data.items()}
        config = shardex.export(smaller, out, backend=self.backend_name, overwrite=True)
        listed = set(export_files(config)) | {"config.yaml"}
        on_disk = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
        assert all(p in listed or any(p.startswith(f"{d}/") for d in listed) for p in on_disk)
        assert len(shardex.open_dataset(out, split="train")) == 5

    def test_a_failed_overwrite_leaves_the_committed_export_intact(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        out, data = tmp_path / "o", array_data(9)
        shardex.export(data, out, backend=self.backend_name, samples_per_shard=4)
        before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
        changed = {**data, "label": [(v + 1) % 3 for v in data["label"]]}  # same keys, sizes

        def crash(*args: Any) -> None:
            raise RuntimeError("killed at the commit point")

        with monkeypatch.context() as patch:
            patch.setattr(shardex.engine.transaction, "commit", crash)
            with pytest.raises(RuntimeError, match="killed"):
                shardex.export(changed, out, backend=self.backend_name, overwrite=True)
        assert all(p.read_bytes() == b for p, b in before.items())
        ds = shardex.open_dataset(out, decode=True)
        assert sorted(int(s["cls"]) for s in ds) == sorted(data["label"])
        config = shardex.export(changed, out, backend=self.backend_name, overwrite=True)
        listed = {*export_files(config), "config.yaml"}
        on_disk = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
        unlisted = {p for p in on_disk if p not in listed}
        folders = {s.path for info in config.splits.values() for s in info.shards}
        assert all(any(p.startswith(f"{f}/") for f in folders) for p in unlisted)
        if any(info.files for info in config.splits.values()):
            assert not unlisted or self.files_inside_shard_folders, unlisted
        assert sorted(int(s["cls"]) for s in shardex.open_dataset(out, decode=True)) == sorted(
            changed["label"]
        )

    def test_no_config_until_done(self, tmp_path: Path) -> None:
        bad = array_data(5)
        bad["ragged"][3] = np.zeros(2, np.int64)  # one dtype per key: refused before writing
        with pytest.raises(ConfigError, match="dtype"):
            shardex.export(bad, tmp_path / "o", backend=self.backend_name)
        assert not (tmp_path / "o" / "config.yaml").exists()

    def test_converts_to_and_from_webdataset(
        self, arrays: tuple[Path, dict[str, Any]], tmp_path: Path
    ) -> None:
        out, _ = arrays
        shardex.export(out, tmp_path / "wds", workers=1)
        shardex.export(tmp_path / "wds", tmp_path / "back", backend=self.backend_name, workers=1)
        for path in (tmp_path / "wds", tmp_path / "back"):
            assert list(shardex.open_dataset(path, split="train")) == list(
                shardex.open_dataset(out, split="train")
            )

    def test_array_dataset_pickles(self, arrays: tuple[Path, dict[str, Any]]) -> None:
        ds = shardex.open_dataset(arrays[0], split="train", decode=True)
        clone = pickle.loads(pickle.dumps(ds))
        np.testing.assert_array_equal(clone[3]["pixels.npy"], ds[3]["pixels.npy"])


class BackendTests(FolderBackendTests, ArrayBackendTests):
    """The whole conformance suite: subclass it and set ``backend_name``."""
