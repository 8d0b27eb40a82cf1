"""shardex.spec: DataSpec / LoaderSpec / TorchLoader / TensorShardsLoader over exports of
every backend, local and on S3; preprocessing stages in the loader's workers; exports that
ran some of them (skip_pipeline_stages); ExportedDataset over every split."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shardex
from shardex.backends.registry import REGISTRY
from shardex.errors import ConfigError
from shardex.pipeline.stages import CenterCropStage, DecodeStage, ResizeStage
from shardex.spec import DataSpec, ExportedDataset, LoaderSpec, TensorShardsLoader, TorchLoader
from tests.support.s3data import S3Location

torch = pytest.importorskip("torch")

BACKENDS = sorted(e.name for e in REGISTRY.entries() if e.origin == "built-in")
_TWO = {"train": 0.5, "val": 0.5}


def _arrays(count: int = 10) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    return {
        "x": rng.standard_normal((count, 3, 4)).astype(np.float32),
        "y": np.arange(count, dtype=np.int64) % 3,
    }


def _by_export_index(root: Path | str, options: dict[str, Any] | None = None) -> list[Any]:
    """Every sample of every split, decoded, in export_index order: (number, split, sample)."""
    out = []
    for split in shardex.read_config(root, options).splits:
        ds = shardex.open_dataset(root, split, decode=True, storage_options=options)
        numbers = ds.metadata.column("export_index").to_pylist()
        out += [(n, split, ds[i]) for i, n in enumerate(numbers)]
    return sorted(out, key=lambda t: t[0])


def _unbatched(spec: DataSpec) -> list[tuple[str, str, dict[str, Any], dict[str, Any]]]:
    """(key, split, features, labels) of every sample the spec's loader gave, in order."""
    out = []
    for batch in spec.dataloader():
        for row, key in enumerate(batch["key"]):
            split = batch["split"][row] if "split" in batch else None
            feats = {k: v[row].numpy() for k, v in batch["features"].items()}
            labels = {k: v[row].numpy() for k, v in batch["labels"].items()}
            out.append((key, split, feats, labels))
    return out


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_data_spec_over_every_backend_gives_what_open_dataset_reads(
    backend: str, tmp_path: Path
) -> None:
    """Arrays (float32 inputs, int64 targets) and demo images with their labels, every
    split, in export_index order, as open_dataset decodes them."""
    assert len(BACKENDS) == 7
    arrays, demo = tmp_path / "arrays", tmp_path / "demo"
    shardex.export(_arrays(), arrays, backend=backend, split_fractions=_TWO, workers=1)
    shardex.export("demo:6", demo, backend=backend, split_fractions=_TWO, workers=1)
    unshuffled = LoaderSpec(backend=TorchLoader(batch_size=4, shuffle=False))
    spec = DataSpec(ExportedDataset(arrays, feature_keys=["x"], label_keys=["y"]), unshuffled)
    got = _unbatched(spec)
    want = _by_export_index(arrays)
    assert [(key, split) for key, split, _, _ in got] == [(s["__key__"], n) for _, n, s in want]
    for (_, _, feats, labels), (_, _, sample) in zip(got, want, strict=True):
        assert feats["x"].dtype == np.float32
        assert feats["x"].shape == (3, 4)
        np.testing.assert_array_equal(feats["x"], sample["x.npy"])
        assert labels["y"].dtype == np.int64
        assert labels["y"] == sample["y.npy"]
    # images differ in size: one per batch
    one = LoaderSpec(backend=TorchLoader(batch_size=1, shuffle=False))
    images = DataSpec(ExportedDataset(demo, feature_keys=["image"], label_keys=["label"]), one)
    pairs = list(images)
    want = _by_export_index(demo)
    assert len(pairs) == len(want) == 6
    for (inputs, targets), (_, _, sample) in zip(pairs, want, strict=True):
        assert inputs["image"].dtype == torch.uint8
        np.testing.assert_array_equal(inputs["image"][0].numpy(), sample["jpg"])
        assert targets["label"].tolist() == [sample["cls"]]


def test_the_reuse_snippet_runs_as_a_script_over_a_two_split_export(tmp_path: Path) -> None:
    """NexuML's snippet, as written, with the keys of this export; every split."""
    shardex.export(_arrays(8), tmp_path / "exported-data", split_fractions=_TWO, workers=1)
    script = textwrap.dedent(
        """
        from shardex.spec import DataSpec, ExportedDataset, LoaderSpec, TorchLoader

        spec = DataSpec(
            source=ExportedDataset(root="./exported-data", feature_keys=["x"], label_keys=["y"]),
            loader=LoaderSpec(backend=TorchLoader()),
        )
        for inputs, targets in spec:
            print(tuple(inputs["x"].shape), inputs["x"].dtype, tuple(targets["y"].shape))
        loader = spec.dataloader()
        print(sorted(set(split for batch in loader for split in batch["split"])))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["(8, 3, 4) torch.float32 (8,)", "['train', 'val']"]


def test_a_data_spec_on_s3_shuffles_resumes_and_reads_one_split(
    s3: S3Location, tmp_path: Path
) -> None:
    url = s3.child("exported-data")
    shardex.export(
        "demo:12", url, split_fractions=_TWO, samples_per_shard=3, storage_options=s3.direct
    )
    source = ExportedDataset(
        url, feature_keys=["embedding", "aesthetic_score"], label_keys=["label"],
        storage_options=s3.direct,
    )  # fmt: skip
    loader = TorchLoader(batch_size=4, num_workers=2, seed=3)
    spec = DataSpec(source, LoaderSpec(loader))
    first = spec.dataloader()
    seen: list[str] = []
    for step, batch in enumerate(first):
        assert batch["features"]["embedding"].shape == (4, 16)
        assert batch["features"]["embedding"].dtype == torch.float32
        assert batch["features"]["aesthetic_score"].dtype == torch.float64
        assert batch["labels"]["label"].dtype == torch.int64
        first.sampler.advance(4)
        seen += batch["key"]
        if step == 0:
            state = first.sampler.state_dict()
    assert sorted(seen) == sorted(s["__key__"] for _, _, s in _by_export_index(url, s3.direct))
    resumed = DataSpec(source, LoaderSpec(TorchLoader(batch_size=4, seed=3, state=state)))
    assert [k for b in resumed.dataloader() for k in b["key"]] == seen[4:]
    val = DataSpec(dataclasses.replace(source, split="val"), LoaderSpec(loader))
    assert {s for b in val.dataloader() for s in b["split"]} == {"val"}


def test_the_tensor_shards_window_loader_as_a_spec_backend(tmp_path: Path) -> None:
    out = tmp_path / "t"
    shardex.export(_arrays(12), out, backend="tensor_shards", samples_per_shard=4, workers=1)
    windows = LoaderSpec(TensorShardsLoader(batch_size=5, shards_per_window=2, seed=1))
    spec = DataSpec(ExportedDataset(out, feature_keys=["x"], label_keys=["y"]), windows)
    ds = shardex.open_dataset(out, decode=True)
    by_key = {ds[i]["__key__"]: ds[i] for i in range(len(ds))}
    sizes = []
    for batch in spec.dataloader():
        sizes.append(len(batch["key"]))
        for row, key in enumerate(batch["key"]):
            np.testing.assert_array_equal(batch["features"]["x"][row].numpy(), by_key[key]["x.npy"])
            assert batch["labels"]["y"][row].item() == by_key[key]["y.npy"]
    assert sizes == [5, 5, 2]
    two = tmp_path / "two"
    shardex.export(_arrays(), two, backend="tensor_shards", split_fractions=_TWO, workers=1)
    with pytest.raises(ConfigError, match=r"one split .* train, val: name one"):
        DataSpec(ExportedDataset(two), windows).dataloader()
    staged = DataSpec(ExportedDataset(out), windows, preprocessing=[{"stage": "decode"}])
    with pytest.raises(ConfigError, match="runs no preprocessing stages"):
        staged.dataloader()


def _pixels_spec(root: Path, stages: list[Any], skip: bool = False, workers: int = 0) -> DataSpec:
    return DataSpec(
        ExportedDataset(root, feature_keys=["pixels", "pid"], label_keys=["label"]),
        LoaderSpec(TorchLoader(batch_size=4, shuffle=False, num_workers=workers)),
        preprocessing=stages,
        skip_pipeline_stages=skip,
    )


def test_preprocessing_runs_in_the_workers_and_a_materialized_export_skips_what_it_ran(
    tmp_path: Path,
) -> None:
    shardex.export("demo:8", tmp_path / "src", split_fractions=_TWO, workers=1)
    declared = [
        {"stage": "decode"},
        {"stage": "resize", "size": 20, "mode": "exact"},
        {"stage": "tests.support.stages:PidStage"},
        CenterCropStage(12),
    ]
    on_load = _unbatched(_pixels_spec(tmp_path / "src", declared, workers=2))
    assert len(on_load) == 8
    assert {labels["label"].dtype for *_, labels in on_load} == {np.dtype("int64")}
    assert os.getpid() not in {int(feats["pid"]) for _, _, feats, _ in on_load}
    reference = [DecodeStage(), ResizeStage(20, mode="exact"), CenterCropStage(12)]
    for (key, split, feats, _), (_, want_split, sample) in zip(
        on_load, _by_export_index(tmp_path / "src"), strict=True
    ):
        assert (key, split) == (sample["__key__"], want_split)
        raw = shardex.open_dataset(tmp_path / "src", split).get(key)
        batch = [{"key": key, "image": raw["jpg"]}]
        for stage in reference:
            batch = stage.process(batch)
        assert feats["pixels"].shape == (12, 12, 3)
        np.testing.assert_array_equal(feats["pixels"], batch[0]["pixels"])

    # the first three stages in an export; the loader runs the crop only (and decodes the
    # stored image again: the resized pixels, kept losslessly)
    spec = _pixels_spec(tmp_path / "src", declared)
    config = spec.materialize(tmp_path / "made", samples_per_shard=3, until_keys=["pid"])
    assert [p["stage"] for p in config.pipeline] == ["read", "decode", "resize", "test_pid"]
    assert set(config.splits) == {"train", "val"}
    skipping = _pixels_spec(tmp_path / "made", declared, skip=True)
    assert [s.name for s in skipping.stages] == ["decode", "center_crop"]
    again = {key: (split, feats) for key, split, feats, _ in _unbatched(skipping)}
    assert sorted(again) == sorted(key for key, *_ in on_load)
    for key, split, want, _ in on_load:
        assert again[key][0] == split
        np.testing.assert_array_equal(again[key][1]["pixels"], want["pixels"])


def test_stages_that_cannot_be_skipped_or_run_on_load_are_refused_in_one_line(
    tmp_path: Path,
) -> None:
    made = tmp_path / "made"
    base = _pixels_spec(tmp_path / "src", [{"stage": "decode"}, {"stage": "resize", "size": 9}])
    shardex.export("demo:4", tmp_path / "src", workers=1)
    base.materialize(made)
    cases = [
        ([{"stage": "decode"}, {"stage": "resize", "size": 10}], r"stage 'resize' \(number 2\)"),
        ([{"stage": "decode"}], r"made by stage 'resize'.* does not declare"),
        ([{"stage": "resize", "size": 9}], r"ran stage 'decode' where .* declares 'resize'"),
        ([{"stage": "dedup"}], r"stage 'dedup' needs to see every sample"),
        ([{"stage": "nope"}], r"unknown stage 'nope'"),
    ]
    for stages, match in cases:
        with pytest.raises(ConfigError, match=match) as caught:
            _ = _pixels_spec(made, stages, skip=True).stages
        assert "\n" not in str(caught.value)
    missing = DataSpec(
        ExportedDataset(made, feature_keys=["nothing"]), preprocessing=[{"stage": "decode"}]
    )
    with pytest.raises(ConfigError, match=r"key 'nothing' is neither in the export"):
        missing.dataloader()


def test_exported_dataset_reads_every_split_or_one(tmp_path: Path) -> None:
    shardex.export("demo:10", tmp_path / "two", split_fractions=_TWO, workers=1)
    both = ExportedDataset(tmp_path / "two", feature_keys=["embedding"], label_keys=["label"])
    want = _by_export_index(tmp_path / "two")
    assert [(i["key"], i["split"]) for i in both] == [(s["__key__"], n) for _, n, s in want]
    assert [i["labels"]["label"] for i in both] == [s["cls"] for *_, s in want]
    val = ExportedDataset(tmp_path / "two", split="val")
    assert len(val) + len(ExportedDataset(tmp_path / "two", split="train")) == len(both) == 10
    assert {i["split"] for i in val} == {"val"}
    assert set(val.datasets) == {"val"}
    assert set(both.datasets) == {"train", "val"}


def test_the_dali_loader_as_a_spec_backend(tmp_path: Path) -> None:
    pytest.importorskip("nvidia.dali", reason="NVIDIA DALI is not installed (shardex[dali])")
    from shardex.spec import DALILoader

    shardex.export("demo:10", tmp_path / "two", split_fractions=_TWO, samples_per_shard=2)
    source = ExportedDataset(tmp_path / "two", "val", feature_keys=["image"], label_keys=["label"])
    spec = DataSpec(source, LoaderSpec(DALILoader(batch_size=3, image_size=(8, 6))))
    labels = []
    for inputs, targets in spec:
        assert inputs["image"].dtype == torch.uint8
        assert tuple(inputs["image"].shape[1:]) == (8, 6, 3)
        assert targets["label"].dtype == torch.int64
        labels += targets["label"].tolist()
    assert labels == [s["cls"] for s in shardex.open_dataset(tmp_path / "two", "val", decode=True)]
    for keys, match in [
        ({"feature_keys": ["embedding"]}, "'embedding' is not stored in the export's tars"),
        ({"split": None}, "one split"),
    ]:
        other = DataSpec(dataclasses.replace(source, **keys), spec.loader)
        with pytest.raises(ConfigError, match=match):
            list(other)


def test_a_spec_over_images_of_several_sizes_is_one_line_naming_the_field(
    tmp_path: Path,
) -> None:
    """The demo's images differ in size: batching them without a resize is a one-line
    error naming the field (torch's own is a traceback naming none)."""
    shardex.export("demo:8", tmp_path / "e", backend="numpy")
    source = ExportedDataset(root=tmp_path / "e", feature_keys=["image"], label_keys=["label"])
    spec = DataSpec(source=source, loader=LoaderSpec(backend=TorchLoader(batch_size=4)))
    with pytest.raises(ConfigError, match=r"^cannot batch the field 'features\.image': "):
        next(iter(spec))


_ITERATE_PIXELS = """
import sys
from shardex.spec import DataSpec, ExportedDataset, LoaderSpec, TorchLoader
source = ExportedDataset(root=sys.argv[1], feature_keys=["image"], label_keys=["label"])
for workers in (0, 2):
    loader = LoaderSpec(backend=TorchLoader(batch_size=4, num_workers=workers))
    shapes = [tuple(x["image"].shape) for x, _ in DataSpec(source=source, loader=loader)]
    print(shapes)
"""


def test_a_spec_over_stored_pixels_batches_without_a_warning(tmp_path: Path) -> None:
    """Pixels an export stored (a scenario's decode and resize, --preprocess) come back as
    read-only arrays mapped from its files: batched with no "not writable" warning from
    torch (a fresh process: torch gives that warning once a process)."""
    (tmp_path / "scenario.yaml").write_text(
        "source: demo:8\nstages:\n  - {stage: decode}\n  - {stage: resize, size: 16, mode: exact}\n"
    )
    cli = [sys.executable, "-m", "shardex.cli", "export-dataset", "scenario", "-o", "e", "-q"]
    subprocess.run([*cli, "--backend", "numpy", "--preprocess"], cwd=tmp_path, check=True)
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", _ITERATE_PIXELS, str(tmp_path / "e")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[:2] == [str([(4, 16, 16, 3)] * 2)] * 2
