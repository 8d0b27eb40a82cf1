"""Every kind of source round-trips through export + open_dataset with its bytes, labels,
splits and metadata intact. Tests taking the ``storage`` fixture put their source on a
local folder, memory:// and the S3 server in turn (what only the server shows, request
counts and the like, is in test_s3_sources.py)."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest

import shardex
from helpers import files_of, image_bytes, image_field, make_tree, write_image
from shardex.backends.registry import get_backend
from shardex.errors import NotAnExportError, SourceError
from shardex.sources import TarSource
from shardex.sources.demo import CLASSES, EMBEDDING_DIM
from shardex.storage import Storage
from tests.support.places import Place
from tests.support.s3data import cli_export, huge_size, labelled_tars, same_export, tar_of


def _samples(out: Path, split: str | None = None) -> dict[str, dict[str, object]]:
    """Every sample of a split, by key."""
    ds = shardex.open_dataset(out, split=split)
    samples = {s["__key__"]: s for s in ds}
    assert len(samples) == len(ds), "keys of a split must be unique"
    return samples


def _meta_rows(out: Path, split: str | None = None) -> dict[str, dict[str, object]]:
    """The metadata rows of a split, by key."""
    return {r["key"]: r for r in shardex.open_dataset(out, split=split).metadata.to_pylist()}


# ---------------------------------------------------------------- image folders


def test_class_folders_give_sorted_label_names_and_labels(tmp_path: Path) -> None:
    src = tmp_path / "src"
    # created out of alphabetical order: label numbers must follow the sorted names
    rels = [f"{cls}/img{i}.jpg" for cls in ("dog", "bird", "cat") for i in range(3)]
    written = make_tree(src, rels)

    config = shardex.export(src, tmp_path / "out", samples_per_shard=4, workers=1)

    assert config.label_names == ("bird", "cat", "dog")
    assert config.num_classes == 3
    assert list(config.splits) == ["train"]
    assert config.num_samples == 9
    assert len(config.splits["train"].shards) == 3  # 4 + 4 + 1, never padded
    samples = _samples(tmp_path / "out")
    meta = _meta_rows(tmp_path / "out")
    assert sorted(samples) == sorted(r.rsplit(".", 1)[0] for r in rels)
    for rel, data in written.items():
        key = rel.rsplit(".", 1)[0]
        label = config.label_names.index(rel.split("/")[0])
        assert samples[key]["jpg"] == data
        assert samples[key]["cls"] == str(label).encode()
        assert meta[key]["label"] == label
        assert meta[key]["original_path"] == rel
    decoded = shardex.open_dataset(tmp_path / "out", decode=True).get("cat/img0")
    assert decoded["cls"] == 1
    assert decoded["jpg"].shape == (10, 12, 3)


def test_split_folders_keep_splits_and_share_label_names(storage: Place, tmp_path: Path) -> None:
    """An image folder on each storage: its splits and labels, and the export of the
    same folder on local disk byte for byte (an array backend too, whose workers read
    the members with the source's options)."""
    src = tmp_path / "src"
    rels = [
        *(f"train/{c}/t{i}.jpg" for c in ("cat", "dog") for i in range(4)),
        *(f"val/dog/v{i}.png" for i in range(2)),  # val has only one of the classes
        *(f"test/cat/s{i}.jpg" for i in range(3)),
    ]
    written = make_tree(src, rels)
    url = storage.put(written, "images")
    for backend in ("numpy", "webdataset"):
        local = tmp_path / f"{backend}-local"
        shardex.export(src, local, backend=backend, samples_per_shard=5, workers=1)
        out = tmp_path / ("out" if backend == "webdataset" else backend)
        read: dict[str, Any] = {"source_storage_options": storage.options, "workers": 2}
        config = shardex.export(url, out, backend=backend, samples_per_shard=5, **read)
        same_export(local, out, url)

    assert list(config.splits) == ["train", "val", "test"]
    assert config.split_method == "source"
    assert {n: s.num_samples for n, s in config.splits.items()} == {
        "train": 8,
        "val": 2,
        "test": 3,
    }
    assert config.label_names == ("cat", "dog")
    for split in config.splits:
        samples = _samples(tmp_path / "out", split)
        meta = _meta_rows(tmp_path / "out", split)
        expected = {rel: data for rel, data in written.items() if rel.startswith(f"{split}/")}
        assert sorted(r["original_path"] for r in meta.values()) == sorted(expected)
        for key, row in meta.items():
            assert row["split"] == split
            assert image_field(samples[key]) == expected[row["original_path"]]
            class_name = row["original_path"].split("/")[1]
            assert row["label"] == config.label_names.index(class_name)
            assert samples[key]["cls"] == str(row["label"]).encode()
    # the val split (only dogs) still numbers dog as 1 out of the shared names
    assert {r["label"] for r in _meta_rows(tmp_path / "out", "val").values()} == {1}


@pytest.mark.parametrize(
    "rels",
    [
        ["train/cat/a.jpg", "val/cat/b.jpg", "extra/cat/c.jpg"],
        ["train/cat/a.jpg", "loose.jpg"],
    ],
    ids=["other-folder", "top-level-file"],
)
def test_split_folders_mixed_with_other_entries_are_refused(
    tmp_path: Path, rels: list[str]
) -> None:
    make_tree(tmp_path / "src", rels)
    with pytest.raises(SourceError, match="mixes split folders") as info:
        shardex.export(tmp_path / "src", tmp_path / "out", workers=1)
    message = str(info.value)
    assert "train" in message
    assert ("extra" if "extra/cat/c.jpg" in rels else "top level") in message
    with pytest.raises(NotAnExportError):
        shardex.open_dataset(tmp_path / "out")


def test_dots_in_file_names_become_underscores_in_keys(tmp_path: Path) -> None:
    src = tmp_path / "src"
    written = make_tree(src, ["img.v2.jpg", "a.b.c.png", "plain.jpg"])

    config = shardex.export(src, tmp_path / "out", workers=1)

    assert config.label_names is None  # no class folders: no labels
    ds = shardex.open_dataset(tmp_path / "out")
    meta = _meta_rows(tmp_path / "out")
    assert sorted(meta) == ["a_b_c", "img_v2", "plain"]
    assert meta["img_v2"]["original_path"] == "img.v2.jpg"
    assert meta["a_b_c"]["original_path"] == "a.b.c.png"
    sample = ds.get("img_v2")
    assert sample["jpg"] == written["img.v2.jpg"]
    assert "cls" not in sample
    assert ds.get("a_b_c")["png"] == written["a.b.c.png"]


def test_unicode_and_spaces_in_file_names(tmp_path: Path) -> None:
    src = tmp_path / "src"
    rels = ["café au lait.jpg", "日本 語/写真 1.png", "日本 語/ünïcödé.jpg", "spaces dir/a b.jpg"]
    written = make_tree(src, rels)

    config = shardex.export(src, tmp_path / "out", workers=1)

    assert config.label_names == ("spaces dir", "日本 語")
    ds = shardex.open_dataset(tmp_path / "out")
    meta = _meta_rows(tmp_path / "out")
    assert sorted(meta) == sorted(r.rsplit(".", 1)[0] for r in rels)
    for rel, data in written.items():
        key = rel.rsplit(".", 1)[0]
        assert meta[key]["original_path"] == rel
        assert image_field(ds.get(key)) == data
    assert {s["__key__"] for s in ds} == set(meta)


# ---------------------------------------------------------------- tables


def _typed_metadata(n: int) -> dict[str, pa.Array]:
    rng = np.random.default_rng(7)
    return {
        "width": pa.array([100 + i for i in range(n)], pa.int64()),
        "score": pa.array([0.5 + i / 4 for i in range(n)], pa.float64()),
        "caption": pa.array([f"caption {i} ü" for i in range(n)], pa.string()),
        # a plain (variable-size) list column whose rows all have 8 values
        "embedding": pa.array(
            [rng.random(8, dtype=np.float32).tolist() for _ in range(n)], pa.list_(pa.float32())
        ),
    }


def test_parquet_table_with_paths_and_typed_metadata(tmp_path: Path) -> None:
    n = 7
    rels = [f"imgs/im{i:02d}.jpg" for i in range(n)]
    written = make_tree(tmp_path, rels)
    meta_cols = _typed_metadata(n)
    names = ["zebra", "ant", "moose"]
    table = pa.table(
        {
            "image_path": pa.array(rels),
            "label": pa.array([names[i % 3] for i in range(n)]),
            **meta_cols,
        }
    )
    pq.write_table(table, tmp_path / "table.parquet")

    config = shardex.export(
        tmp_path / "table.parquet", tmp_path / "out", samples_per_shard=3, workers=1
    )

    assert config.label_names == ("ant", "moose", "zebra")
    assert config.num_classes == 3
    emb_spec = config.key_spec("embedding")
    assert emb_spec is not None
    assert (emb_spec.dtype, emb_spec.shape) == ("float32", (8,))
    fixed = pa.list_(pa.float32(), 8)
    expected_types = {
        "width": pa.int64(),
        "score": pa.float64(),
        "caption": pa.string(),
        "embedding": fixed,
    }
    out = tmp_path / "out"
    sidecars = [pq.read_table(out / s.metadata) for s in config.splits["train"].shards]
    for where in [pq.read_table(out / "metadata.parquet"), *sidecars]:
        for name, typ in expected_types.items():
            assert where.schema.field(name).type == typ, f"{name}: {where.schema.field(name).type}"
    ds = shardex.open_dataset(out)
    assert ds.metadata.schema.field("embedding").type == fixed
    samples = _samples(out)
    rows = _meta_rows(out)
    for i, rel in enumerate(rels):
        key = rel.rsplit(".", 1)[0]
        row = rows[key]
        assert row["original_path"] == rel
        assert samples[key]["jpg"] == written[rel]
        assert config.label_names[row["label"]] == names[i % 3]
        assert samples[key]["cls"] == str(row["label"]).encode()
        for name in ("width", "score", "caption", "embedding"):
            assert row[name] == meta_cols[name][i].as_py(), name
        # scalars travel in the .json member too; the embedding stays typed in Parquet only
        assert json.loads(samples[key]["json"]) == {
            "width": row["width"],
            "score": row["score"],
            "caption": row["caption"],
        }


def test_csv_table_with_splits_and_int_labels(tmp_path: Path) -> None:
    rels = [f"pics/p{i}.png" for i in range(6)]
    written = make_tree(tmp_path, rels)
    splits = ["train", "train", "val", "train", "test", "val"]
    table = pa.table(
        {
            "file_name": rels,
            "label": pa.array([i % 2 for i in range(6)], pa.int64()),
            "split": splits,
            "photographer": [f"person {i}" for i in range(6)],
        }
    )
    pcsv.write_csv(table, tmp_path / "list.csv")

    config = shardex.export(tmp_path / "list.csv", tmp_path / "out", workers=1)

    assert list(config.splits) == ["train", "val", "test"]
    assert config.split_method == "source"
    assert config.num_classes == 2
    for split in config.splits:
        samples = _samples(tmp_path / "out", split)
        rows = _meta_rows(tmp_path / "out", split)
        expected = [i for i, s in enumerate(splits) if s == split]
        assert sorted(r["original_path"] for r in rows.values()) == [rels[i] for i in expected]
        for i in expected:
            key = rels[i].rsplit(".", 1)[0]
            assert samples[key]["png"] == written[rels[i]]
            assert rows[key]["label"] == i % 2
            assert rows[key]["photographer"] == f"person {i}"
            assert json.loads(samples[key]["json"]) == {"photographer": f"person {i}"}


def test_table_with_image_bytes_column(tmp_path: Path) -> None:
    blobs = [image_bytes(i, "png" if i % 3 == 0 else "jpg") for i in range(5)]
    table = pa.table(
        {
            "key": [f"row-{i}" for i in range(5)],
            "image_bytes": pa.array(blobs, pa.binary()),
            "label": pa.array([i % 2 for i in range(5)], pa.int64()),
            "note": [f"n{i}" for i in range(5)],
        }
    )
    pq.write_table(table, tmp_path / "blobs.parquet")

    shardex.export(tmp_path / "blobs.parquet", tmp_path / "out", workers=1)

    samples = _samples(tmp_path / "out")
    rows = _meta_rows(tmp_path / "out")
    assert sorted(samples) == [f"row-{i}" for i in range(5)]
    for i, blob in enumerate(blobs):
        sample = samples[f"row-{i}"]
        ext = "png" if i % 3 == 0 else "jpg"  # extension from the bytes, not a name
        assert sample[ext] == blob
        assert sample["cls"] == str(i % 2).encode()
        assert rows[f"row-{i}"]["note"] == f"n{i}"


# ---------------------------------------------------------------- WebDataset tars


def _add(tf: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tf.addfile(info, io.BytesIO(data))


def _write_wds_tars(folder: Path) -> dict[str, dict[str, object]]:
    """Two WebDataset tars with jpg/png + cls + json members; returns what each key holds."""
    folder.mkdir(parents=True)
    expected: dict[str, dict[str, object]] = {}
    for shard in range(2):
        with tarfile.open(
            folder / f"shard-{shard:04d}.tar", "w", format=tarfile.USTAR_FORMAT
        ) as tf:
            for j in range(4):
                n = shard * 4 + j
                key = f"s{n:03d}"
                ext = "png" if n == 5 else "jpg"
                data = image_bytes(n, ext)
                meta = {"caption": f"sample {n}", "score": n / 2, "votes": n * 10}
                _add(tf, f"{key}.{ext}", data)
                _add(tf, f"{key}.cls", str(n % 3).encode())
                _add(tf, f"{key}.json", json.dumps(meta).encode())
                expected[key] = {"ext": ext, "data": data, "label": n % 3, "meta": meta}
    return expected


def test_webdataset_tars_folder(tmp_path: Path) -> None:
    expected = _write_wds_tars(tmp_path / "tars")

    config = shardex.export(tmp_path / "tars", tmp_path / "out", workers=1)

    assert config.source_datasets[0].kind == "webdataset-tars"
    assert config.num_samples == 8
    assert config.num_classes == 3
    samples = _samples(tmp_path / "out")
    rows = _meta_rows(tmp_path / "out")
    assert sorted(samples) == sorted(expected)
    for key, want in expected.items():
        sample, row = samples[key], rows[key]
        assert sample[want["ext"]] == want["data"]
        assert sample["cls"] == str(want["label"]).encode()
        assert row["label"] == want["label"]
        for name, value in want["meta"].items():
            assert row[name] == value, name
        assert json.loads(sample["json"]) == want["meta"]
    assert rows["s005"]["original_path"] == "shard-0001.tar:s005"


def test_single_tar_and_glob(tmp_path: Path) -> None:
    expected = _write_wds_tars(tmp_path / "tars")
    one = shardex.export(tmp_path / "tars" / "shard-0001.tar", tmp_path / "one", workers=1)
    assert one.num_samples == 4
    assert sorted(_samples(tmp_path / "one")) == [k for k in sorted(expected) if k >= "s004"]
    both = shardex.export(str(tmp_path / "tars" / "shard-*.tar"), tmp_path / "both", workers=1)
    assert both.num_samples == 8


def test_tar_batches_are_the_same_whatever_the_runner(storage: Place) -> None:
    """Tars scanned by a runner's worker processes give the batches a scan in this
    process gives (batches spanning tars, in the same order, metadata typed alike)."""
    from shardex.parallel import Runner

    source = TarSource(storage.put(labelled_tars(5, 7), "r"), storage.options, batch_size=4)

    def batches(runner: Runner | None) -> list[pa.Table]:
        return [batch.table for batch in source.stream_on(runner).batches]

    alone = batches(None)
    assert sum(t.num_rows for t in alone) == 35
    assert [t.num_rows for t in alone] == [4] * 8 + [3]
    for workers in (1, 2):
        with Runner(workers) as runner:
            on_runner = batches(runner)
        assert len(on_runner) == len(alone)
        assert all(a.equals(b) for a, b in zip(alone, on_runner, strict=True))


@pytest.mark.parametrize(
    "damage", ["cut inside a member", "data after the end", "k2.jpg", "k2.json"]
)
def test_a_damaged_tar_is_refused_or_skipped_as_on_local_disk(
    storage: Place, tmp_path: Path, damage: str
) -> None:
    """A tar cut short, with data after its end, or whose member's header claims 8 GiB
    (``k2.*``: it would run past the end of the tar), on each storage: its sample is
    skipped as from the same tar on local disk, or the export refused in one line."""
    good = tar_of([(f"k{i}", image_bytes(i), i % 2) for i in range(6)])
    data = {"cut inside a member": good[: len(good) // 2 + 100], "data after the end": good + good}
    bad = data.get(damage) or huge_size(good, damage)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "part.tar").write_bytes(bad)
    url = storage.put({"part.tar": bad}, "bad")
    opts: dict[str, Any] = {"samples_per_shard": 5, "workers": 1, "on_error": "skip"}
    shardex.export(tmp_path / "src", tmp_path / "local", **opts)
    opts["source_storage_options"] = storage.options
    remote = shardex.export(url, tmp_path / "remote", **opts)
    assert remote.num_skipped == 1
    same_export(tmp_path / "local", tmp_path / "remote", url)
    code, output = cli_export(storage.s3, url, "-o", str(tmp_path / "refused"), "--workers", "1")
    assert code == 1
    assert len(output.strip().splitlines()) == 1
    assert "part.tar" in output
    assert ("runs past the end of the tar" if damage.startswith("k2") else "damaged") in output


# ---------------------------------------------------------------- re-export


def test_reexport_of_an_export_preserves_everything(storage: Place, tmp_path: Path) -> None:
    """An export (on each storage) re-exported, and converted to another backend: what
    the same export on local disk gives, byte for byte."""
    n = 12
    rels = [f"imgs/{'cat' if i % 2 else 'dog'}-{i}.jpg" for i in range(n)]
    make_tree(tmp_path, rels)
    table = pa.table(
        {
            "image_path": rels,
            "label": ["cat" if i % 2 else "dog" for i in range(n)],
            **_typed_metadata(n),
        }
    )
    pq.write_table(table, tmp_path / "t.parquet")
    opts: dict[str, Any] = {"split_fractions": {"train": 0.6, "val": 0.4}, "seed": 3}
    opts |= {"samples_per_shard": 5, "workers": 1}
    write = {"storage_options": storage.options, **opts}
    first = shardex.export(tmp_path / "t.parquet", storage.url, **write)
    assert set(first.splits) == {"train", "val"}
    assert all(s.num_samples > 0 for s in first.splits.values())

    read = {"source_storage_options": storage.options}
    second = shardex.export(storage.url, tmp_path / "second", samples_per_shard=2, **read)

    assert second.source_datasets[0].kind == "shardex-export"
    assert second.label_names == first.label_names == ("cat", "dog")
    assert list(second.splits) == list(first.splits)
    compared = ["key", "original_path", "label", "width", "score", "caption", "embedding"]
    for split in first.splits:
        a = shardex.open_dataset(storage.url, split=split, storage_options=storage.options)
        b = shardex.open_dataset(tmp_path / "second", split=split)
        assert len(a) == len(b) == first.splits[split].num_samples
        assert [dict(s) for s in a] == [dict(s) for s in b]  # keys and every member's bytes
        assert a.metadata.select(compared).equals(b.metadata.select(compared))
        assert b.metadata.schema.field("embedding").type == pa.list_(pa.float32(), 8)
    shardex.export(tmp_path / "t.parquet", tmp_path / "twin", **opts)  # on local disk
    shardex.export(tmp_path / "twin", tmp_path / "second-twin", samples_per_shard=2, workers=1)
    same_export(tmp_path / "second-twin", tmp_path / "second", storage.url)
    shardex.export(tmp_path / "twin", tmp_path / "np-twin", backend="numpy", workers=1)
    shardex.export(storage.url, tmp_path / "np", backend="numpy", **read)
    same_export(tmp_path / "np-twin", tmp_path / "np", storage.url)


def _flip(store: Storage, name: str, at: int) -> None:
    data = bytearray(store.get(name))
    data[at] ^= 0xFF
    store.put(name, bytes(data))


def _damage(store: Storage, backend: str) -> tuple[str, set[str]]:
    """Flip one byte of the export in ``store``: (the damaged file, the keys it holds)."""
    meta = pq.read_table(io.BytesIO(store.get("metadata.parquet"))).to_pylist()
    if backend == "webdataset":
        row = meta[len(meta) // 2]
        _flip(store, row["tar_file"], row["sample_offset"] + row["sample_length"] // 2)
        return row["tar_file"], {row["key"]}
    config = shardex.read_config(store)
    shard = config.splits["train"].shards[1]
    files = list(store.list(f"{shard.path}/")) or [shard.path]
    target = max(files, key=store.size)
    _flip(store, target, store.size(target) // 2)
    first = config.splits["train"].shards[0].num_samples
    keys = {r["key"] for r in meta if first <= r["sample_index"] < first + shard.num_samples}
    return shard.path, keys


def _same_samples_except(
    a: shardex.Dataset, copy: Path, lost: set[str], split: str = "train"
) -> None:
    """The copy holds every sample of ``a`` but ``lost``, field for field."""
    got = {s["__key__"]: dict(s) for s in shardex.open_dataset(copy, split=split)}
    assert set(got) == set(a.metadata.column("key").to_pylist()) - lost
    assert all(dict(a.get(key)) == sample for key, sample in got.items())


@pytest.mark.parametrize(
    ("source_backend", "target_backend"),
    [
        ("webdataset", "webdataset"),
        ("webdataset", "zarr"),  # a conversion
        ("torch", "webdataset"),  # one-file runs: checked as they are read
        ("numpy", "numpy"),  # per-sample files: the run checksum is checked first
    ],
)
def test_reexport_does_not_copy_damaged_samples(
    storage: Place, tmp_path: Path, source_backend: str, target_backend: str
) -> None:
    source, options = storage.url, storage.options
    shardex.export(
        "demo:24",
        source,
        backend=source_backend,
        samples_per_shard=8,
        workers=1,
        split_fractions={"train": 1.0},
        storage_options=options,
    )
    damaged, lost = _damage(storage.store, source_backend)
    ds = shardex.open_dataset(source, split="train", on_error="skip", storage_options=options)
    checked = get_backend(source_backend).capabilities.checked_reads  # numpy reads unchecked
    assert len(list(ds)) == 24 - len(lost) or not checked
    assert shardex.verify(source, storage_options=options).ok is False

    copy: dict[str, Any] = {"backend": target_backend, "workers": 1}
    copy["source_storage_options"] = options
    with pytest.raises(SourceError) as refused:
        shardex.export(source, tmp_path / "copy", **copy)
    message = str(refused.value)
    assert "\n" not in message
    assert damaged in message
    assert "damaged" in message
    assert "checksum" in message
    assert "--on-error skip" in message
    assert not (tmp_path / "copy" / "config.yaml").exists()

    config = shardex.export(source, tmp_path / "copy", on_error="skip", mode="overwrite", **copy)
    assert config.num_skipped == len(lost)
    errors = pq.read_table(tmp_path / "copy" / "errors.parquet").to_pylist()
    assert {e["key"] for e in errors} == lost
    assert all(damaged in e["reason"] for e in errors)
    assert shardex.verify(tmp_path / "copy").ok
    ds = shardex.open_dataset(source, split="train", storage_options=options)
    _same_samples_except(ds, tmp_path / "copy", lost)


@pytest.mark.parametrize("damage", ["truncated", "deleted"])
def test_reexport_of_a_truncated_or_missing_shard_names_it_or_skips_what_is_lost(
    tmp_path: Path, damage: str
) -> None:
    source = tmp_path / "source"
    shardex.export("demo:24", source, samples_per_shard=8, workers=1, split_fractions={"t": 1.0})
    config = shardex.read_config(source)
    shard = config.splits["t"].shards[1]
    meta = pq.read_table(source / "metadata.parquet").to_pylist()
    rows = [r for r in meta if r["tar_file"] == shard.path]
    if damage == "truncated":
        cut = rows[3]["sample_offset"] + 700  # inside the 4th sample of the shard
        with open(source / shard.path, "r+b") as f:
            f.truncate(cut)
        lost = {r["key"] for r in rows[3:]}
    else:
        (source / shard.path).unlink()
        lost = {r["key"] for r in rows}

    with pytest.raises(SourceError) as refused:
        shardex.export(source, tmp_path / "copy", workers=1)
    assert shard.path in str(refused.value)
    assert ("truncated" if damage == "truncated" else "No such file") in str(refused.value)
    assert "\n" not in str(refused.value)

    done = shardex.export(source, tmp_path / "copy", workers=1, on_error="skip")
    assert done.num_skipped == len(lost) == (5 if damage == "truncated" else 8)
    assert shardex.verify(tmp_path / "copy").ok
    _same_samples_except(shardex.open_dataset(source, split="t"), tmp_path / "copy", lost, "t")


@pytest.mark.parametrize("where", ["footer", "middle"])
def test_reexport_of_a_damaged_metadata_file_is_one_line_error(tmp_path: Path, where: str) -> None:
    from click.testing import CliRunner

    from shardex.cli import main

    source = tmp_path / "source"
    shardex.export("demo:12", source, workers=1)
    meta = source / "metadata.parquet"
    size = meta.stat().st_size
    if where == "footer":
        data = bytearray(meta.read_bytes())
        data[size - 60 : size - 8] = b"\xff" * 52  # the thrift footer, magic kept
        meta.write_bytes(bytes(data))
    else:
        with open(meta, "r+b") as f:
            f.truncate(size // 2)
    with pytest.raises(SourceError, match=r"metadata\.parquet"):
        shardex.export(source, tmp_path / "copy", workers=1)
    result = CliRunner().invoke(main, ["export-dataset", str(source), "-o", str(tmp_path / "c2")])
    assert result.exit_code == 1
    last = result.output.splitlines()[-1]
    assert last.startswith("error: ")
    assert "metadata.parquet" in last
    assert last.isprintable()
    assert "Traceback" not in result.output


# ---------------------------------------------------------------- reserved names


@pytest.mark.parametrize("column", ["sample_offset", "tar_file", "metadata"])
def test_reserved_metadata_column_in_a_table_is_refused(tmp_path: Path, column: str) -> None:
    write_image(tmp_path / "a.jpg", 0)
    pq.write_table(pa.table({"image_path": ["a.jpg"], column: [1]}), tmp_path / "t.parquet")
    with pytest.raises(SourceError, match="reserved") as info:
        shardex.export(tmp_path / "t.parquet", tmp_path / "out", workers=1)
    assert column in str(info.value)
    assert not (tmp_path / "out" / "config.yaml").exists()


def test_tar_json_fields_named_like_shardex_columns_are_kept_renamed(tmp_path: Path) -> None:
    # img2dataset writes "key" into every .json member: refusing it would refuse its tars
    (tmp_path / "tars").mkdir()
    fields = {"key": "../../x", "label": 7, "sample_checksum": 5, "ok": 1}
    with tarfile.open(tmp_path / "tars" / "a.tar", "w") as tf:
        _add(tf, "x.jpg", image_bytes(0))
        _add(tf, "x.json", json.dumps(fields).encode())
    shardex.export(tmp_path / "tars", tmp_path / "out", workers=1)
    (row,) = _meta_rows(tmp_path / "out").values()
    assert row["key"] == "x"
    assert "label" not in row  # labels come from .cls members only
    assert {k: row[k] for k in ("json_key", "json_label", "json_sample_checksum", "ok")} == {
        "json_key": "../../x",
        "json_label": 7,
        "json_sample_checksum": 5,
        "ok": 1,
    }
    assert json.loads(_samples(tmp_path / "out")["x"]["json"])["json_key"] == "../../x"
    assert not (tmp_path / "x").exists()
    assert not (tmp_path.parent / "x").exists()


def test_tar_json_field_colliding_with_its_renamed_field_is_refused(tmp_path: Path) -> None:
    (tmp_path / "tars").mkdir()
    with tarfile.open(tmp_path / "tars" / "a.tar", "w") as tf:
        _add(tf, "x.jpg", image_bytes(0))
        _add(tf, "x.json", json.dumps({"key": "a", "json_key": "b"}).encode())
    with pytest.raises(SourceError, match=r"'key' is reserved.*'json_key'") as info:
        shardex.export(tmp_path / "tars", tmp_path / "out", workers=1)
    assert str(info.value).startswith("'a.tar:x': member 'x.json': field 'key' is reserved")
    assert "\n" not in str(info.value)
    assert not (tmp_path / "out" / "config.yaml").exists()


# ---------------------------------------------------------------- demo


def test_demo_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("SHARDEX_CACHE_DIR", str(cache))

    config = shardex.export(
        "demo:50",
        tmp_path / "out",
        split_fractions={"train": 0.8, "val": 0.2},
        samples_per_shard=16,
        workers=2,
    )

    assert any(cache.rglob("metadata.parquet")), "demo images are generated into the cache"
    assert config.source_datasets[0].kind == "demo"
    assert config.num_samples == 50
    assert sum(s.num_samples for s in config.splits.values()) == 50
    assert config.label_names == CLASSES
    train = shardex.open_dataset(tmp_path / "out", split="train", decode=True)
    meta = train.metadata
    assert meta.schema.field("embedding").type == pa.list_(pa.float32(), EMBEDDING_DIM)
    exts = set()
    for i in range(len(train)):
        sample = train[i]
        row = meta.slice(i, 1).to_pylist()[0]
        assert sample["__key__"] == row["key"]
        (ext,) = (e for e in sample if e in ("jpg", "png", "webp"))
        exts.add(ext)
        assert sample[ext].shape == (row["height"], row["width"], 3)
        assert sample["cls"] == row["label"]
        assert row["caption"].split()[2] == CLASSES[row["label"]]
    assert exts == {"jpg", "png", "webp"}
    # a second export reuses the cached images: same keys, same bytes
    cached = files_of(cache)
    again = shardex.export("demo:50", tmp_path / "again", samples_per_shard=100, workers=1)
    assert again.num_samples == 50
    assert files_of(cache) == cached
    everything = {**_samples(tmp_path / "out", "train"), **_samples(tmp_path / "out", "val")}
    assert _samples(tmp_path / "again") == everything
