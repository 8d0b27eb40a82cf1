"""Arrays as real tensor fields in every array backend (issue 18, item 3): decoded,
resized pixels of a pipeline (``--preprocess-until-key pixels --x-key pixels``) and an
in-memory array named ``image``, read back exactly by shardex and by each format's own
library (torch, numpy, zarr, tensordict)."""

from __future__ import annotations

import io
import itertools
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from click.testing import CliRunner
from PIL import Image

import shardex
from shardex.cli import main
from shardex.pipeline.stages import CenterCropStage, DecodeStage, ResizeStage

torch = pytest.importorskip("torch")
zarr = pytest.importorskip("zarr")
tensordict = pytest.importorskip("tensordict")

ARRAY_BACKENDS = ("torch", "tensor_shards", "numpy", "numpy_mmap", "zarr", "tensordict_memmap")
SIZES = [(40, 50), (64, 48), (33, 90), (50, 50), (70, 41)]


def _sources(root: Path) -> dict[str, bytes]:
    """PNG files of different sizes under root/{a,b}/N.png; relative path -> bytes."""
    rng = np.random.default_rng(7)
    out = {}
    for i, (w, h) in enumerate(SIZES):
        rel = f"{'ab'[i % 2]}/{i}.png"
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(buf, "PNG")
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(buf.getvalue())
        out[rel] = buf.getvalue()
    return out


def _expected_pixels(files: dict[str, bytes]) -> dict[str, np.ndarray]:
    """The stages applied by hand: original path -> the (32, 32, 3) uint8 array."""
    batch: list[dict[str, Any]] = [
        {"key": rel, "image": data, "image_ext": "png"} for rel, data in files.items()
    ]
    for stage in (DecodeStage(), ResizeStage(32), CenterCropStage(32)):
        batch = stage.process(batch) or []
    return {s["key"]: s["pixels"] for s in batch}


def _spec(tmp_path: Path, source: Path) -> Path:
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "source": str(source),
                "options": {"samples_per_shard": 2},
                "stages": [
                    {"stage": "decode"},
                    {"stage": "resize", "size": 32},
                    {"stage": "center_crop", "size": 32},
                    {"stage": "encode", "format": "webp"},
                ],
            }
        )
    )
    return spec


def _by_path(out: Path) -> dict[str, str]:
    """Sample key -> original path (from metadata.parquet)."""
    meta = shardex.open_dataset(out).metadata
    return dict(
        zip(meta.column("key").to_pylist(), meta.column("original_path").to_pylist(), strict=True)
    )


def _plain_columns(out: Path, backend: str, column: str) -> dict[str, np.ndarray]:
    """Sample key -> the field's array, read with the format's own library only."""
    config = yaml.safe_load((out / "config.yaml").read_text())
    split = config["splits"]["train"]
    keys: list[str] = []
    values: list[np.ndarray] = []

    def ragged_keys(data: np.ndarray, offsets: np.ndarray) -> list[str]:
        return [bytes(data[a:b]).decode() for a, b in itertools.pairwise(offsets)]

    for shard in split["shards"]:
        path = out / shard["path"]
        if backend == "torch":
            tensors = torch.load(path, weights_only=True)
            keys += ragged_keys(tensors["__key__.data"].numpy(), tensors["__key__.offsets"].numpy())
            values += list(tensors[column].numpy())
        elif backend == "tensor_shards":
            with np.load(path) as npz:
                keys += ragged_keys(npz["__key__.data"], npz["__key__.offsets"])
                values += list(npz[column])
        elif backend == "numpy":
            key_data = np.load(path / "__key__.data.npy")
            key_offsets = np.load(path / "__key__.offsets.npy")
            found = ragged_keys(key_data, key_offsets)
            keys += found
            values += [np.load(path / f"{i:06d}.{column}.npy") for i in range(len(found))]
        elif backend == "numpy_mmap":
            keys += ragged_keys(
                np.load(path / "__key__.data.npy"), np.load(path / "__key__.offsets.npy")
            )
            values += list(np.load(path / f"{column}.npy", mmap_mode="r"))
        elif backend == "zarr":
            group = zarr.open_group(path, mode="r")
            keys += ragged_keys(group["key.data"][:], group["key.offsets"][:])
            values += list(group[column][:])
        else:
            td = tensordict.TensorDict.load_memmap(path)
            keys += ragged_keys(td["__key__", "data"].numpy(), td["__key__", "offsets"].numpy())
            values += list(td[column].numpy())
    return dict(zip(keys, values, strict=True))


@pytest.mark.parametrize("backend", ARRAY_BACKENDS)
def test_preprocessed_pixels_are_a_tensor_field(tmp_path: Path, backend: str) -> None:
    files = _sources(tmp_path / "src")
    expected = _expected_pixels(files)
    out = tmp_path / "out"
    args = [
        "export-dataset",
        str(_spec(tmp_path, tmp_path / "src")),
        "-o",
        str(out),
        "--backend",
        backend,
        "--preprocess-until-key",
        "pixels",
        "--x-key",
        "pixels",
        "-q",
    ]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    config = shardex.read_config(out)
    assert config.x_keys == ("pixels",)
    assert config.feature_shapes == {"pixels": [32, 32, 3]}
    (spec,) = [s for s in config.key_specs if s.key == "pixels"]
    assert (spec.role, spec.dtype, spec.shape, spec.layout) == ("x", "uint8", (32, 32, 3), "fixed")
    # the resize and crop ran (they only change pixels); the encode did not
    assert [s["stage"] for s in config.pipeline] == ["read", "decode", "resize", "center_crop"]
    paths = _by_path(out)
    ds = shardex.open_dataset(out, decode=True)
    assert len(ds) == len(files)
    for sample in ds:
        want = expected[paths[sample["__key__"]]]
        assert sample["pixels.npy"].dtype == np.uint8
        np.testing.assert_array_equal(sample["pixels.npy"], want)
    plain = _plain_columns(out, backend, "pixels")
    assert sorted(plain) == sorted(paths)
    for key, array in plain.items():
        np.testing.assert_array_equal(array, expected[paths[key]])


def test_preprocessed_pixels_are_npy_members_in_webdataset(tmp_path: Path) -> None:
    files = _sources(tmp_path / "src")
    expected = _expected_pixels(files)
    out = tmp_path / "out"
    spec = _spec(tmp_path, tmp_path / "src")
    shardex.pipeline.run_spec(spec, out, until_keys=["pixels"], x_keys=["pixels"])
    paths = _by_path(out)
    seen = {}
    for tar in sorted(out.glob("train/*.tar")):
        with tarfile.open(tar) as t:
            for member in t.getmembers():
                assert member.name.endswith((".pixels.npy", ".cls")), member.name
                if member.name.endswith(".pixels.npy"):
                    data = t.extractfile(member).read()  # type: ignore[union-attr]
                    key = member.name[: -len(".pixels.npy")]
                    seen[key] = np.load(io.BytesIO(data), allow_pickle=False)
    assert sorted(seen) == sorted(paths)
    for key, array in seen.items():
        np.testing.assert_array_equal(array, expected[paths[key]])
    config = shardex.read_config(out)
    assert config.feature_shapes == {"pixels": [32, 32, 3]}


def test_until_key_still_stops_before_a_stage_that_makes_new_keys(tmp_path: Path) -> None:
    """Only stages that change the wanted key in place run on: the encode does not."""
    _sources(tmp_path / "src")
    spec = shardex.pipeline.Spec.load(_spec(tmp_path, tmp_path / "src"))
    plan = spec.pipeline(tmp_path / "out").plan(("pixels",))
    assert [s.name for s in plan.stages] == ["decode", "resize", "center_crop"]


def test_until_key_stops_before_a_filter_on_the_key(tmp_path: Path) -> None:
    """A filter that needs only the wanted key adds nothing, but it drops samples: it does
    not change the key in place, so the view stops before it (as docs/pipeline.md says)."""
    _sources(tmp_path / "src")
    spec = tmp_path / "spec.yaml"
    stages = [
        {"stage": "dedup", "method": "exact"},
        {"stage": "filter", "expr": "content_hash == ''"},
    ]
    spec.write_text(yaml.safe_dump({"source": str(tmp_path / "src"), "stages": stages}))
    pipeline = shardex.pipeline.Spec.load(spec).pipeline(tmp_path / "out")
    assert [s.name for s in pipeline.plan(("content_hash",)).stages] == ["dedup"]


@pytest.mark.parametrize("backend", ARRAY_BACKENDS)
def test_in_memory_image_array_gets_its_shape_and_key_spec(tmp_path: Path, backend: str) -> None:
    n = 6
    images = np.random.default_rng(3).integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
    keys = [f"s{i}" for i in range(n)]
    out = tmp_path / "out"
    config = shardex.export(
        {"key": keys, "image": images, "label": [i % 2 for i in range(n)]},
        out,
        backend=backend,
        samples_per_shard=4,
    )
    assert config.feature_shapes == {"image": [32, 32, 3]}
    (spec,) = [s for s in config.key_specs if s.key == "image"]
    assert (spec.role, spec.dtype, spec.shape, spec.layout, spec.encoding) == (
        "x",
        "uint8",
        (32, 32, 3),
        "fixed",
        "npy",
    )
    written = yaml.safe_load((out / "config.yaml").read_text())
    assert written["feature_shapes"] == {"image": [32, 32, 3]}
    assert {s["key"] for s in written["key_specs"]} == {"image", "label"}
    ds = shardex.open_dataset(out, decode=True)
    got = {s["__key__"]: s["image.npy"] for s in ds}
    for i, key in enumerate(keys):
        np.testing.assert_array_equal(got[key], images[i])
    plain = _plain_columns(out, backend, "image")
    for i, key in enumerate(keys):
        np.testing.assert_array_equal(plain[key], images[i])


def test_pixels_of_different_sizes_are_stored_ragged(tmp_path: Path) -> None:
    """A resize without a crop keeps each aspect ratio: one shape per sample, kept."""
    files = _sources(tmp_path / "src")
    batch: list[dict[str, Any]] = [
        {"key": rel, "image": data, "image_ext": "png"} for rel, data in files.items()
    ]
    for stage in (DecodeStage(), ResizeStage(32)):
        batch = stage.process(batch) or []
    expected = {s["key"]: s["pixels"] for s in batch}
    assert len({a.shape for a in expected.values()}) > 1
    spec = _spec(tmp_path, tmp_path / "src")
    raw = yaml.safe_load(spec.read_text())
    raw["stages"] = [{"stage": "decode"}, {"stage": "resize", "size": 32}]
    spec.write_text(yaml.safe_dump(raw))
    out = tmp_path / "out"
    shardex.pipeline.run_spec(
        spec, out, until_keys=["pixels"], x_keys=["pixels"], backend="tensordict_memmap"
    )
    config = shardex.read_config(out)
    assert config.feature_shapes == {"pixels": [None, None, 3]}
    paths = _by_path(out)
    for sample in shardex.open_dataset(out, decode=True):
        np.testing.assert_array_equal(sample["pixels.npy"], expected[paths[sample["__key__"]]])
