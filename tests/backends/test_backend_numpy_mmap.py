from __future__ import annotations

from pathlib import Path

import numpy as np

import shardex
from shardex.testing import BackendTests
from shardex.testing.backend import array_data


class TestNumpyMmapBackend(BackendTests):
    backend_name = "numpy_mmap"


def test_plain_numpy_opens_every_array_memory_mapped(tmp_path: Path) -> None:
    """Without shardex: np.load(mmap_mode="r") of the listed files gives the samples."""
    data = array_data(9)
    config = shardex.export(data, tmp_path / "o", backend="numpy_mmap")
    split = config.split("train")
    folder = tmp_path / "o" / split.shards[0].path
    arrays = {p.name[: -len(".npy")]: np.load(p, mmap_mode="r") for p in folder.glob("*.npy")}
    assert all(isinstance(a, np.memmap) for a in arrays.values())
    assert {f"{folder.relative_to(tmp_path / 'o')}/{n}.npy" for n in arrays} == {
        f for f in split.files if f != split.keys
    }
    ds = shardex.open_dataset(tmp_path / "o", decode=True)
    keys = bytes(arrays["__key__.data"]).decode()
    offsets = arrays["__key__.offsets"]
    for i in range(len(ds)):
        key = keys[offsets[i] : offsets[i + 1]]
        sample = ds[i]
        assert sample["__key__"] == key
        np.testing.assert_array_equal(arrays["pixels"][i], sample["pixels.npy"])
        assert int(arrays["label__label"][i]) == sample["cls"]
        start, end = arrays["ragged.offsets"][i : i + 2]
        np.testing.assert_array_equal(arrays["ragged.data"][start:end], sample["ragged.npy"])
