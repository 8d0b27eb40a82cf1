"""The backend conformance suite: subclass and set ``backend_name``."""

from __future__ import annotations

import json
import pickle
import random
from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa
import pytest

import shardex
from shardex.backends.registry import get_backend
from shardex.codecs.images import IMAGE_EXTENSIONS
from shardex.dataset import Dataset, Sample
from shardex.errors import NotAnExportError, SampleNotFoundError
from shardex.testing.data import SampleFolder, make_sample_folder

_FRACTIONS = {"train": 0.7, "val": 0.3}


def image_of(sample: Sample) -> bytes:
    """The image field of a raw sample."""
    found = [v for k, v in sample.items() if k.rpartition(".")[2] in IMAGE_EXTENSIONS]
    assert len(found) == 1, f"expected one image field in {sorted(sample)}"
    return found[0]  # type: ignore[no-any-return]


class BackendTests:
    """Round-trip, metadata, atomicity and pickling tests for one backend."""

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
        import shutil

        copy = tmp_path / "copy"
        shutil.copytree(exported, copy)
        (copy / "config.yaml").unlink()
        with pytest.raises(NotAnExportError):
            shardex.open_dataset(copy, split="train")

    def test_capabilities_are_declared(self) -> None:
        caps = get_backend(self.backend_name).capabilities
        assert isinstance(caps.random_access, bool)
        assert caps.random_access or caps.streaming
