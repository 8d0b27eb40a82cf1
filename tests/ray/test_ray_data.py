"""Ray Data: read_shardex and the shardex datasink on a real local Ray cluster (2 CPUs,
every Ray service on 127.0.0.1)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pytest

import shardex
from helpers import RAY_DATA_WARNINGS, assert_same_but_the_source, files_of, image_bytes
from shardex.errors import (
    BadSampleError,
    ConfigError,
    OutputExistsError,
    OutputLockedError,
    SourceError,
)
from shardex.refs.scan import ScanResult, build_table
from shardex.sources.base import Source
from shardex.storage.local import LocalStorage
from tests.support.raycluster import local_ray_cluster
from tests.support.rayrows import RowsSource, local_rows

pytestmark = RAY_DATA_WARNINGS

ray = pytest.importorskip("ray")
ray_data = pytest.importorskip("shardex.ray", exc_type=ImportError)  # no ray: skipped

LABELS = ("cat", "dog", "fox")


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    with local_ray_cluster(num_cpus=2):
        yield


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ray") / "demo"
    shardex.export("demo:60", out, samples_per_shard=16)
    return out


def _rows(dataset: Any) -> list[dict[str, Any]]:
    return list(dataset.iter_rows())


# ---------------------------------------------------------------- read_shardex


@pytest.mark.usefixtures("ray_cluster")
def test_read_gives_every_sample_once_in_order_with_shardex_bytes(demo: Path) -> None:
    ds = shardex.open_dataset(demo, split="train")
    shards = ds.config.split("train").shards
    assert len(shards) == 4
    dataset = ray_data.read_shardex(demo, parallelism=4)
    assert dataset.context.execution_options.preserve_order  # not Ray's default
    assert not ray.data.DataContext.get_current().execution_options.preserve_order
    assert dataset.count() == 60
    rows = _rows(dataset)
    assert [r["__key__"] for r in rows] == [s["__key__"] for s in ds]  # each once, in order
    fields = [f.name for f in ds.config.fields]
    for row, sample in zip(rows, ds, strict=True):
        assert {f: row[f] for f in fields} == {f: sample.get(f) for f in fields}
    tasks = ray_data.ShardexDatasource(demo).get_read_tasks(3)  # runs of whole shards
    assert [t.metadata.input_files for t in tasks] == [
        (shards[0].path, shards[1].path),
        (shards[2].path,),
        (shards[3].path,),
    ]
    assert [t.metadata.num_rows for t in tasks] == [32, 16, 12]
    assert [r["__key__"] for r in ray_data.read_shardex(demo).limit(5).take_all()] == [
        s["__key__"] for s in ds.get_many(range(5))
    ]


@pytest.mark.usefixtures("ray_cluster")
def test_metadata_columns_keep_their_types(demo: Path) -> None:
    ds = shardex.open_dataset(demo, split="train")
    columns = ["__key__", "aesthetic_score", "width", "label", "embedding"]
    dataset = ray_data.read_shardex(demo, columns=columns, parallelism=3)
    schema = dataset.schema().base_schema
    assert schema.names == columns
    assert schema.field("embedding").type == pa.list_(pa.float32(), 16)
    assert schema.field("width").type == pa.int32()
    assert schema.field("label").type == pa.int64()
    assert schema.field("aesthetic_score").type == pa.float64()
    table = pa.Table.from_pylist(_rows(dataset), schema=schema)
    expected = ds.metadata.select(columns[1:])
    assert table.drop_columns(["__key__"]).equals(expected)
    assert table.column("__key__").to_pylist() == ds.metadata.column("key").to_pylist()
    with pytest.raises(ValueError, match="unknown or repeated"):
        ray_data.read_shardex(demo, columns=["__key__", "no_such_column"])


@pytest.mark.usefixtures("ray_cluster")
def test_a_damaged_sidecar_fails_the_read_naming_it(demo: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(demo, copy)
    sidecar = sorted(copy.glob("train/*.parquet"))[0]
    data = bytearray(sidecar.read_bytes())
    data[40] ^= 0x01  # still a readable Parquet file: only its checksum tells
    sidecar.write_bytes(bytes(data))
    dataset = ray_data.read_shardex(copy, split="train", columns=["__key__", "width"])
    with pytest.raises(Exception, match=rf"{sidecar.name} is damaged: its checksum"):
        _rows(dataset)


@pytest.mark.usefixtures("ray_cluster")
def test_reads_an_array_backend(tmp_path: Path) -> None:
    out = tmp_path / "mmap"
    shardex.export("demo:40", out, backend="numpy_mmap", samples_per_shard=16)
    ds = shardex.open_dataset(out, split="train")
    rows = _rows(ray_data.read_shardex(out, parallelism=2))
    assert [r["__key__"] for r in rows] == [s["__key__"] for s in ds]
    fields = [f.name for f in ds.config.fields]
    for row, sample in zip(rows, ds, strict=True):
        assert {f: row[f] for f in fields} == {f: sample.get(f) for f in fields}
    assert [r["caption"] for r in rows] == ds.metadata.column("caption").to_pylist()


@pytest.mark.usefixtures("ray_cluster")
def test_decode_gives_pixels(demo: Path) -> None:
    ds = shardex.open_dataset(demo, split="train", decode=True)
    (row,) = ray_data.read_shardex(demo, decode=True, columns=["__key__", "jpg", "cls"]).take(1)
    assert row["__key__"] == ds[0]["__key__"]
    assert np.array_equal(np.asarray(row["jpg"]), ds[0]["jpg"])
    assert row["cls"] == ds[0]["cls"]


# ---------------------------------------------------------------- the datasink


@pytest.mark.usefixtures("ray_cluster")
def test_read_then_write_reproduces_the_export(demo: Path, tmp_path: Path) -> None:
    config = shardex.read_config(demo)
    out = tmp_path / "again"
    written = ray_data.write_shardex(
        ray_data.read_shardex(demo, parallelism=4),
        out,
        samples_per_shard=16,
        label_names=config.label_names,
    )
    assert written.num_samples == 60
    assert written.label_names == config.label_names
    before, after = (shardex.open_dataset(p, split="train") for p in (demo, out))
    assert list(after) == list(before)
    assert after.metadata.drop_columns(["split"]).equals(before.metadata.drop_columns(["split"]))
    written = files_of(out)
    assert sorted(written) == sorted(files_of(demo))  # no staging left in the output
    for name, data in files_of(demo).items():  # shards, sidecars, index, metadata.parquet
        if name != "config.yaml":
            assert written[name] == data, name
    assert [p.name for p in tmp_path.iterdir()] == ["again"]  # nothing written beside it


class _Rows(Source):
    kind: ClassVar[str] = "rows"

    def __init__(self, table: pa.Table) -> None:
        self.table, self.uri = table, "rows"

    def scan(self) -> ScanResult:
        return ScanResult(self.table, LABELS)


def _direct_source(n: int) -> tuple[_Rows, pa.Table]:
    """The same samples as a scan table (what shardex.export reads) and as Ray rows."""
    exts = ["jpg", "png", "webp"]
    images = [image_bytes(i, exts[i % 3]) for i in range(n)]
    keys = [f"s/{i:04d}" for i in range(n)]
    paths = [f"in/{i}.{exts[i % 3]}" for i in range(n)]
    splits = ["val" if i % 5 == 0 else "train" for i in range(n)]
    labels = [i % 3 for i in range(n)]
    score = pa.array(np.linspace(0, 1, n, dtype=np.float32))
    emb = np.arange(n * 8, dtype=np.float32).reshape(n, 8)
    tags = [f"tag {i}" for i in range(n)]
    members = [
        [{"ext": exts[i % 3], "path": None, "offset": -1, "size": len(b), "data": b}]
        for i, b in enumerate(images)
    ]
    metadata = pa.table(
        {
            "score": score,
            "tag": tags,
            "embedding": pa.FixedSizeListArray.from_arrays(pa.array(emb.ravel()), 8),
        }
    )
    table = build_table(keys, paths, members, splits=splits, labels=labels, metadata=metadata)
    rows = pa.table(
        {
            "key": keys,
            "original_path": paths,
            "image": pa.array(images, pa.binary()),
            "image_ext": [exts[i % 3] for i in range(n)],
            "split": splits,
            "label": labels,
            "score": score,
            "tag": tags,
        }
    )
    return _Rows(table), rows


@pytest.mark.usefixtures("ray_cluster")
def test_write_is_byte_identical_to_a_direct_export(tmp_path: Path) -> None:
    source, rows = _direct_source(45)
    options = {"samples_per_shard": 7}
    shardex.export(source, tmp_path / "direct", **options)
    blocks = [rows.slice(0, 10), rows.slice(10, 20), rows.slice(30, 15)]

    def _add_embedding(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Embeddings as numpy (a Ray tensor column); local, so Ray pickles it by value."""
        index = np.array([int(k.split("/")[1]) for k in batch["key"]])
        batch["embedding"] = (index[:, None] * 8 + np.arange(8)).astype(np.float32)
        return batch

    dataset = ray.data.from_arrow(blocks).map_batches(_add_embedding, batch_format="numpy")
    config = ray_data.write_shardex(dataset, tmp_path / "ray", label_names=LABELS, **options)
    assert config.source_datasets[-1].kind == "ray"
    assert {s: i.num_samples for s, i in config.splits.items()} == {"train": 36, "val": 9}
    assert_same_but_the_source(files_of(tmp_path / "direct"), files_of(tmp_path / "ray"))
    meta = shardex.open_dataset(tmp_path / "ray", split="val").metadata
    assert meta.schema.field("embedding").type == pa.list_(pa.float32(), 8)


@pytest.mark.usefixtures("ray_cluster")
def test_an_array_backend_is_written_by_ray_tasks_as_a_direct_export_writes_it(
    tmp_path: Path,
) -> None:
    rows = local_rows(20)
    options = {"samples_per_shard": 8, "backend": "numpy_mmap"}
    shardex.export(RowsSource(rows), tmp_path / "direct", **options)
    dataset = ray.data.from_arrow([rows.slice(0, 9), rows.slice(9)])
    ray_data.write_shardex(dataset, tmp_path / "ray", label_names=LABELS, **options)
    assert_same_but_the_source(files_of(tmp_path / "direct"), files_of(tmp_path / "ray"))


@pytest.mark.usefixtures("ray_cluster")
def test_rows_without_a_key_fail_clearly_and_commit_nothing(tmp_path: Path) -> None:
    _, rows = _direct_source(6)
    out = tmp_path / "out"
    no_key = ray.data.from_arrow(rows.drop_columns(["key"]))
    with pytest.raises(SourceError, match="'key' or '__key__'"):
        ray_data.write_shardex(no_key, out)
    keys = rows.column("key").to_pylist()
    keys[3] = None
    null_key = ray.data.from_arrow(rows.set_column(0, "key", pa.array(keys, pa.string())))
    with pytest.raises(SourceError, match="row 3 of a block has no sample key"):
        ray_data.write_shardex(null_key, out)
    assert not (out / "config.yaml").exists()
    assert not out.exists() or files_of(out) == {}  # no staging, nothing half-visible
    assert [p.name for p in tmp_path.iterdir() if p.name != "out"] == []


@pytest.mark.usefixtures("ray_cluster")
def test_a_bad_image_fails_the_shard_tasks_and_leaves_the_output_as_it_was(
    tmp_path: Path,
) -> None:
    _, rows = _direct_source(12)
    images = rows.column("image").to_pylist()
    images[7] = b"\xff\xd8\xff not a whole jpeg"
    bad = ray.data.from_arrow(rows.set_column(2, "image", pa.array(images, pa.binary())))
    out = tmp_path / "out"
    with pytest.raises(BadSampleError, match=r"'in/7.png'"):
        ray_data.write_shardex(bad, out, label_names=LABELS, samples_per_shard=4)
    assert not out.exists() or files_of(out) == {}  # no shard, no staging, no config.yaml
    config = ray_data.write_shardex(  # skipped and recorded instead, then committed
        bad, out, label_names=LABELS, samples_per_shard=4, on_error="skip"
    )
    assert config.num_samples == 11
    assert config.num_skipped == 1
    assert not (out / ".shardex-staging").exists()


@pytest.mark.usefixtures("ray_cluster")
def test_an_output_taken_or_refused_fails_before_any_task_stages(tmp_path: Path) -> None:
    _, rows = _direct_source(6)
    dataset = ray.data.from_arrow(rows)
    out = tmp_path / "out"
    shardex.export(_direct_source(6)[0], out, samples_per_shard=4)
    before = files_of(out)
    with pytest.raises(OutputExistsError, match="holds an export"):
        ray_data.write_shardex(dataset, out, label_names=LABELS)
    assert files_of(out) == before  # nothing staged, nothing replaced
    with LocalStorage(out).lock("another export"), pytest.raises(OutputLockedError):
        ray_data.write_shardex(dataset, out, label_names=LABELS, overwrite=True)
    assert files_of(out) == before
    with pytest.raises(ConfigError, match="temp_dir= is gone"):
        ray_data.ShardexDatasink(out, temp_dir=tmp_path)


@pytest.mark.usefixtures("ray_cluster")
def test_a_map_step_may_add_the_key(tmp_path: Path) -> None:
    _, rows = _direct_source(6)

    def _add_key(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        batch["key"] = np.array([p.replace(".", "_") for p in batch["original_path"]])
        return batch

    dataset = ray.data.from_arrow(rows.drop_columns(["key"])).map_batches(_add_key)
    config = ray_data.write_shardex(dataset, tmp_path / "out", label_names=LABELS)
    assert config.num_samples == 6


@pytest.mark.usefixtures("ray_cluster")
def test_object_storage_read_and_write(demo: Path, s3: Any) -> None:
    """Tasks read ranges and sidecars from S3; write tasks stage locally (one node)."""
    url = s3.child("demo")
    shardex.export("demo:30", url, samples_per_shard=8, storage_options=s3.direct)
    ds = shardex.open_dataset(url, split="train", storage_options=s3.direct)
    rows = _rows(ray_data.read_shardex(url, storage_options=s3.direct, parallelism=2))
    assert [r["__key__"] for r in rows] == [s["__key__"] for s in ds]
    assert [r["jpg"] for r in rows] == [s.get("jpg") for s in ds]
    again = s3.child("again")
    ray_data.write_shardex(
        ray_data.read_shardex(url, storage_options=s3.direct),
        again,
        samples_per_shard=8,
        label_names=ds.config.label_names,
        storage_options=s3.direct,
    )
    assert list(shardex.open_dataset(again, split="train", storage_options=s3.direct)) == list(ds)


@pytest.mark.usefixtures("ray_cluster")
def test_docs_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "pipeline.md").read_text()
    section = text.split("\n## Ray Data\n", 1)[1].split("\n## ", 1)[0]
    (code,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    monkeypatch.chdir(tmp_path)
    # a module name Ray cannot import, so it pickles the example's functions by value
    scope: dict[str, Any] = {"__name__": "shardex_docs_example"}
    exec(compile(code.replace('"demo:300"', '"demo:60"'), "docs/pipeline.md", "exec"), scope)
    written = shardex.open_dataset(tmp_path / "bright-export")
    assert 0 < len(written) == scope["config"].num_samples < 60
    assert written.metadata.schema.field("mean_byte").type == pa.float64()
    assert all(s > 5 for s in written.metadata.column("aesthetic_score").to_pylist())


def test_import_shardex_does_not_import_ray() -> None:
    code = "import sys, shardex; assert 'ray' not in sys.modules, 'ray imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_users_own_staging_named_folder_is_refused_not_deleted(tmp_path: Path) -> None:
    from shardex.ray.write import ShardexDatasink

    out = tmp_path / "out"
    killed = out / ".shardex-staging" / "0123456789ab"  # what a killed run staged
    killed.mkdir(parents=True)
    (killed / "task-000000-deadbeef.bin").write_bytes(b"bytes")
    (killed / ".task-000001-cafef00d.parquet.tmp-01234567").write_bytes(b"half")
    ShardexDatasink(out).close()  # a sink that never started: nothing removed
    sink = ShardexDatasink(out)
    sink.on_write_start()
    sink.close()
    assert not [p for p in out.rglob("*") if p.is_file() and p.name != ".shardex-lock"]
    mine = out / ".shardex-staging" / "notes.txt"
    mine.parent.mkdir()
    mine.write_text("my notes\n")
    sink = ShardexDatasink(out, mode="overwrite")
    with pytest.raises(OutputExistsError, match=r"notes\.txt"):
        sink.on_write_start()
    sink.close()
    assert mine.read_text() == "my notes\n"


@pytest.mark.usefixtures("ray_cluster")
def test_a_second_writer_is_refused_until_the_first_has_committed(tmp_path: Path) -> None:
    """A second ``write_shardex`` that starts at any moment of the first (its driver
    hook, run in a tight loop) is refused while the first holds the output, also between
    the staging and the export of the staged rows; the first then commits."""

    from shardex.ray.write import ShardexDatasink

    _, rows = _direct_source(24)
    out = tmp_path / "out"
    done = threading.Event()
    taken: list[str] = []
    refused = [0]

    def _second_writer(target: Path) -> None:
        while not (target / ".shardex-staging").exists():  # the first holds the output
            if done.wait(0.001):
                return
        while not done.is_set():
            sink = ShardexDatasink(target, label_names=LABELS)
            try:
                sink.on_write_start()  # what write_shardex runs first on its driver
            except OutputLockedError:
                refused[0] += 1
                continue
            except OutputExistsError:  # the first has committed: nothing left to race
                return
            taken.append("took the output while the first was writing it")
            time.sleep(0.2)  # as long as its tasks would stage
            sink.close()

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # threads take turns often: the race shows if it is there
    try:
        for attempt in range(4):
            target = out / f"run{attempt}"
            racer = threading.Thread(target=_second_writer, args=(target,))
            racer.start()
            try:
                config = ray_data.write_shardex(
                    ray.data.from_arrow([rows.slice(i, 4) for i in range(0, 24, 4)]),
                    target,
                    label_names=LABELS,
                    samples_per_shard=4,
                )
            finally:
                done.set()
                racer.join()
                done.clear()
            assert taken == []
            assert config.num_samples == 24
            assert not (target / ".shardex-staging").exists()
    finally:
        sys.setswitchinterval(interval)
    assert refused[0] > 0  # the second writer did run while the first held the output
