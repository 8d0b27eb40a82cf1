"""Pipelines: stage chains, executors (local processes and a real local Ray cluster),
ImageWriterStage, spec files, --preprocess-until-key and materialize."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
import yaml
from click.testing import CliRunner

import shardex
from helpers import files_of, image_field
from shardex.cli import main
from shardex.errors import ConfigError, SchemaError
from shardex.pipeline import (
    ImageWriterStage,
    LocalExecutor,
    Pipeline,
    RayExecutor,
    ReaderStage,
)
from shardex.pipeline.spec import Spec, materialize, run_spec
from tests.support.raycluster import local_ray_cluster
from tests.support.stages import CountSetup, FailStage, InvertStage, TagStage, VectorStage

SOURCE = "demo:130"


def _pipeline(out: Path, *middle: object, per_tar: int = 25) -> Pipeline:
    return Pipeline(
        "test",
        [
            ReaderStage(SOURCE, batch_size=17),
            *middle,  # type: ignore[list-item]
            ImageWriterStage(
                out, images_per_tar=per_tar, split_fractions={"train": 0.8, "val": 0.2}
            ),
        ],
    )


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    pytest.importorskip("ray")
    with local_ray_cluster(num_cpus=2):
        yield


def test_tars_fill_across_batches_and_scores_stay_typed(tmp_path: Path) -> None:
    config = _pipeline(tmp_path / "o", TagStage(), VectorStage()).run(LocalExecutor(1))
    for split in config.splits.values():
        counts = [s.num_samples for s in split.shards]
        assert counts[:-1] == [25] * (len(counts) - 1)  # batches of 17, tars of exactly 25
        assert 0 < counts[-1] <= 25
    meta = shardex.open_dataset(tmp_path / "o", split="train").metadata
    assert str(meta.schema.field("tag").type) == "double"
    vector = meta.schema.field("vector").type
    assert (str(vector.value_type), vector.list_size) == ("float", 8)
    embedding = meta.schema.field("embedding").type  # the source's type, kept
    assert (str(embedding.value_type), embedding.list_size) == ("float", 16)
    assert [p["stage"] for p in config.pipeline] == ["read", "test_tag", "test_vector"]


def test_passthrough_keeps_original_bytes_and_ids(tmp_path: Path) -> None:
    shardex.export(SOURCE, tmp_path / "direct", split_fractions={"train": 0.8, "val": 0.2})
    _pipeline(tmp_path / "piped").run(LocalExecutor(1))
    for split in ("train", "val"):
        direct = shardex.open_dataset(tmp_path / "direct", split=split)
        piped = shardex.open_dataset(tmp_path / "piped", split=split)
        by_key = {s["__key__"]: image_field(s) for s in direct}
        for sample in piped:
            assert image_field(sample) == by_key[sample["__key__"]]  # ids survive, bytes exact


def test_changed_pixels_are_reencoded_losslessly(tmp_path: Path) -> None:
    from shardex.pipeline.stage import Batch, Stage

    class Decode(Stage):
        name = "test_decode"
        produces = ("pixels",)

        def process(self, batch: Batch) -> Batch:
            from shardex.codecs.images import decode

            for s in batch:
                s["pixels"] = decode(s["image"])
            return batch

    _pipeline(tmp_path / "o", Decode(), InvertStage()).run(LocalExecutor(1))
    ref = shardex.open_dataset(SOURCE_EXPORT(tmp_path), split="train", decode=True)
    ours = shardex.open_dataset(tmp_path / "o", split="train", decode=True)
    raw = shardex.open_dataset(tmp_path / "o", split="train")
    assert {n for s in raw for n in s if n not in ("__key__", "cls", "json")} == {"png"}
    sample = ours[0]  # lossless: exactly the inverted pixels
    want = next(v for k, v in ref.get(sample["__key__"]).items() if k in ("jpg", "png", "webp"))
    assert (sample["png"] == 255 - want).all()


def SOURCE_EXPORT(tmp_path: Path) -> Path:
    out = tmp_path / "ref"
    if not out.exists():
        shardex.export(SOURCE, out, split_fractions={"train": 0.8, "val": 0.2})
    return out


def test_byte_identical_on_one_two_workers_and_ray(tmp_path: Path, ray_cluster: None) -> None:
    outs = {}
    for name, executor in [
        ("local1", LocalExecutor(1)),
        ("local2", LocalExecutor(2)),
        ("ray", RayExecutor()),
    ]:
        outs[name] = (
            files_of(tmp_path / name)
            if _pipeline(tmp_path / name, TagStage(), VectorStage(), CountSetup()).run(executor)
            else {}
        )
    assert outs["local1"] == outs["local2"] == outs["ray"]
    ds = shardex.open_dataset(tmp_path / "ray", split="train")
    assert set(ds.metadata.column("setups").to_pylist()) == {1}  # set up once per worker


def test_until_key_stops_before_a_failing_stage(tmp_path: Path) -> None:
    pipeline = _pipeline(tmp_path / "o", TagStage("a"), TagStage("b"), FailStage())
    config = pipeline.run(LocalExecutor(1), until_keys=["b"])
    assert [p["stage"] for p in config.pipeline] == ["read", "test_tag", "test_tag"]
    with pytest.raises(ConfigError, match="no stage produces nope"):
        _pipeline(tmp_path / "p", TagStage("a")).run(until_keys=["nope"])
    assert not (tmp_path / "p").exists()


def test_a_key_no_stage_produces_fails_before_running(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="needs pixels"):
        _pipeline(tmp_path / "o", InvertStage()).run(LocalExecutor(1))
    with pytest.raises(ConfigError, match="first stage"):
        Pipeline("x", [TagStage()]).run()


def test_image_writer_takes_nemo_name_and_checks_every_parameter_at_construction(
    tmp_path: Path,
) -> None:
    writer = ImageWriterStage(tmp_path / "o", images_per_tar=25, name="my_writer")
    assert "stage_name='my_writer'" in repr(writer)
    config = Pipeline("named", [ReaderStage(SOURCE, batch_size=50), writer]).run(LocalExecutor(1))
    assert sum(s.num_samples for sp in config.splits.values() for s in sp.shards) == 130
    bad: list[tuple[dict[str, object], str]] = [
        ({"images_per_tar": 0}, "images_per_tar must be >= 1"),
        ({"images_per_tar": "10"}, "images_per_tar must be an int"),
        ({"images_per_tar": True}, "images_per_tar must be an int"),
        ({"verbose": "yes"}, "verbose must be True or False"),
        ({"remove_image_data": 1}, "remove_image_data must be True or False"),
        ({"deterministic_name": None}, "deterministic_name must be True or False"),
        ({"name": ""}, "name must be a non-empty one-line str"),
        ({"name": 3}, "name must be a non-empty one-line str"),
        ({"images_per_ta": 5}, "unknown parameter 'images_per_ta'"),
        ({"split_fractions": {"../x": 1.0}}, "split_fractions"),
    ]
    for kwargs, message in bad:
        with pytest.raises(ConfigError, match=message) as info:
            ImageWriterStage(tmp_path / "p", **kwargs)  # type: ignore[arg-type]
        assert "\n" not in str(info.value)
    with pytest.raises(ConfigError, match="output_dir must be"):
        ImageWriterStage(42)  # type: ignore[arg-type]
    assert not (tmp_path / "p").exists()


# ---------------------------------------------------------------- spec files


def _spec(tmp_path: Path, **more: object) -> Path:
    raw = {
        "source": SOURCE,
        "output": str(tmp_path / "out"),
        "options": {"samples_per_shard": 40, "split_fractions": {"train": 0.9, "val": 0.1}},
        "stages": [
            {"stage": "tests.support.stages:TagStage", "key": "a"},
            {"stage": "tests.support.stages:TagStage", "key": "b"},
            {"stage": "tests.support.stages:FailStage"},
        ],
        **more,
    }
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_spec_is_validated(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"source": "demo:5", "stagez": []}))
    with pytest.raises(SchemaError, match="stagez"):
        Spec.load(path)
    path.write_text(yaml.safe_dump({"source": "demo:5", "stages": [{"stage": "nope"}]}))
    with pytest.raises(ConfigError, match="unknown stage 'nope'"):
        Spec.load(path).build_stages()


def test_a_spec_that_is_not_yaml_is_refused_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("source: demo:5\nstages: [\n  {stage: resize\n")
    with pytest.raises(SchemaError, match=r"bad\.yaml: not valid YAML \(.*line \d+") as e:
        Spec.load(path)
    assert "\n" not in str(e.value)


def test_cli_preprocess_until_key_and_plain_spec_export(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    runner = CliRunner()
    result = runner.invoke(
        main,
        [
            "export-dataset",
            str(spec),
            "-o",
            str(tmp_path / "view"),
            "--preprocess-until-key",
            "b",
            "-q",
        ],
    )
    assert result.exit_code == 0, result.output
    config = shardex.read_config(tmp_path / "view")
    assert [p["stage"] for p in config.pipeline] == ["read", "test_tag", "test_tag"]
    assert config.spec_fingerprint
    meta = shardex.open_dataset(tmp_path / "view", split="train").metadata
    assert {"a", "b"} <= set(meta.column_names)
    plain = runner.invoke(main, ["export-dataset", str(spec), "-o", str(tmp_path / "plain"), "-q"])
    assert plain.exit_code == 0, plain.output
    assert [p["stage"] for p in shardex.read_config(tmp_path / "plain").pipeline] == ["read"]
    failing = runner.invoke(main, ["pipeline", "run", str(spec), "-o", str(tmp_path / "f"), "-q"])
    assert failing.exit_code == 1
    assert "FailStage ran" in failing.output
    assert not (tmp_path / "f" / "config.yaml").exists()


def test_materialize_reuses_only_a_matching_export(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    first = materialize(spec, until_keys=["a"])
    again = materialize(spec, until_keys=["a"])
    assert again == first
    stamp = (tmp_path / "out" / "config.yaml").stat().st_mtime_ns
    raw = yaml.safe_load(spec.read_text())
    raw["options"]["samples_per_shard"] = 30
    spec.write_text(yaml.safe_dump(raw))
    rebuilt = materialize(spec, until_keys=["a"])
    assert rebuilt.spec_fingerprint != first.spec_fingerprint
    assert (tmp_path / "out" / "config.yaml").stat().st_mtime_ns != stamp
    assert (
        run_spec(spec, tmp_path / "x", until_keys=["a"]).spec_fingerprint
        == rebuilt.spec_fingerprint
    )


def test_nemo_style_script_end_to_end(tmp_path: Path) -> None:
    """examples/nemo_style.py: read -> filter by score -> embed -> ImageWriterStage(1000)."""
    import runpy

    script = runpy.run_path(str(Path(__file__).parents[2] / "examples" / "nemo_style.py"))
    config = script["main"]("demo:2400", str(tmp_path / "nemo"))
    counts = [s.num_samples for s in config.split("train").shards]
    assert len(counts) >= 2
    assert counts[:-1] == [1000] * (len(counts) - 1)  # exactly 1000 but the last
    ds = shardex.open_dataset(tmp_path / "nemo")
    meta = ds.metadata
    assert pc.min(meta.column("aesthetic_score")).as_py() > 5
    embedding = meta.schema.field("clip_embedding").type
    assert (str(embedding.value_type), embedding.list_size) == ("float", 8)
    assert meta.schema.field("aesthetic_score").type == pa.float64()
    assert {"image_id", "tar_file", "member_name", "original_path", "metadata"} <= set(
        meta.column_names
    )
    assert meta.column("image_id").to_pylist() == meta.column("key").to_pylist()


def test_dedup_hashes_are_stored_unsigned(tmp_path: Path) -> None:
    from shardex.pipeline.stages import DedupStage

    config = _pipeline(tmp_path / "o", DedupStage("phash")).run(LocalExecutor(1))
    meta = shardex.open_dataset(tmp_path / "o", split="train").metadata
    assert meta.schema.field("phash").type in (pa.uint64(), pa.int64())
    assert config.num_samples <= 130


def test_cli_lists_the_built_in_stages() -> None:
    result = CliRunner().invoke(main, ["pipeline", "stages"])
    assert result.exit_code == 0, result.output
    names = {line.split()[0] for line in result.output.splitlines() if line.strip()}
    assert {"decode", "resize", "center_crop", "encode", "filter", "dedup", "embed"} <= names


def test_command_line_options_apply_on_top_of_a_spec(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    args = ["export-dataset", str(spec), "-o", str(tmp_path / "o"), "-q"]
    more = ["--backend", "tensor_shards", "--samples-per-shard", "7", "--seed", "5"]
    result = CliRunner().invoke(main, [*args, *more, "--preprocess-until-key", "a"])
    assert result.exit_code == 0, result.output
    config = shardex.read_config(tmp_path / "o")
    assert config.backend == "tensor_shards"
    assert config.split_seed == 5
    counts = [s.num_samples for s in config.split("train").shards]
    assert counts[:-1] == [7] * (len(counts) - 1)
    plain = run_spec(spec, tmp_path / "p", until_keys=["a"])
    assert plain.spec_fingerprint != config.spec_fingerprint  # the options are part of it


def test_filter_sees_null_metadata_as_none(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    from shardex.pipeline.stages import FilterStage
    from shardex.testing.data import make_image

    for name in ("a", "b", "c"):
        (tmp_path / f"{name}.png").write_bytes(make_image(1))
    table = pa.table(
        {
            "key": list("abc"),
            "path": [str(tmp_path / f"{n}.png") for n in "abc"],
            "score": pa.array([7.0, None, 2.0], pa.float64()),
        }
    )
    pq.write_table(table, tmp_path / "t.parquet")
    pipeline = Pipeline(
        "nulls",
        [
            ReaderStage(tmp_path / "t.parquet"),
            FilterStage("score is not None and score > 5"),
            ImageWriterStage(tmp_path / "o"),
        ],
    )
    config = pipeline.run(LocalExecutor(1))
    assert config.num_samples == 1


def test_the_spool_of_sample_bytes_is_removed_on_success_and_failure(tmp_path: Path) -> None:
    _pipeline(tmp_path / "ok", TagStage()).run(LocalExecutor(1))
    assert not list(tmp_path.glob(".shardex-spool-*"))

    class FailInWrite(ImageWriterStage):
        def write(self, *args: object, **kwargs: object) -> shardex.ExportConfig:
            assert list(tmp_path.glob(".shardex-spool-*"))  # the bytes wait on disk
            raise RuntimeError("disk full")

    pipeline = Pipeline("x", [ReaderStage(SOURCE, batch_size=17), FailInWrite(tmp_path / "no")])
    with pytest.raises(RuntimeError, match="disk full"):
        pipeline.run(LocalExecutor(1))
    assert not list(tmp_path.glob(".shardex-spool-*"))


@pytest.mark.parametrize("backend", ["tensor_shards", "webdataset"])
def test_preprocess_until_key_stores_that_key_without_x_key(tmp_path: Path, backend: str) -> None:
    """NexuML's command as documented (no --x-key): the view holds the requested key as a
    stored feature, beside the images, not only as a metadata column."""
    pytest.importorskip("torch")
    (tmp_path / "spec.yaml").write_text(
        "source: demo:24\n"
        "batch_size: 8\n"
        "stages:\n"
        "  - {stage: decode}\n"
        "  - {stage: embed, model: 'shardex.testing.models:tiny_embedder', key: clip_embedding, "
        "input_size: 32}\n"
        "  - {stage: resize, size: 16}\n"
        "executor: {kind: local, workers: 1}\n"
    )
    out = tmp_path / "prepared-data"
    args = ["export-dataset", str(tmp_path / "spec.yaml"), "-o", str(out), "--backend", backend]
    result = CliRunner().invoke(
        main, [*args, "--preprocess", "--preprocess-until-key", "clip_embedding"]
    )
    assert result.exit_code == 0, result.output
    config = shardex.read_config(out)
    assert config.x_keys[-1] == "clip_embedding" and "image" in config.x_keys
    assert [p["stage"] for p in config.pipeline][-1] == "embed"  # resize did not run
    (field,) = [f for f in config.fields if f.name.startswith("clip_embedding")]
    assert (field.kind, field.dtype, len(field.shape)) == ("array", "float32", 1)
    sample = shardex.open_dataset(out, split="train")[0]
    assert field.name in sample
