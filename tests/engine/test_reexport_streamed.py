"""A re-export (an export as the source of another) streams: memory does not grow with the
source's samples, whatever its backend and wherever it is (local or on object storage),
its samples come by reference where they are byte ranges of tars, and the output is the
same bytes wherever the source export lies."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import shardex
from shardex.sources import open_source
from shardex.storage import ObjectStorage
from shardex.testing.data import make_image
from tests.conftest import S3Location
from tests.helpers import Inlined, peak_rss_kb

pytestmark = pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc VmHWM")

#: One noisy JPEG of about 62 KB: holding a split's samples would show in megabytes.
_IMAGE = make_image(7, size=(370, 270))
_SIZES = (500, 2000)


def _source(n: int) -> dict[str, object]:
    return {
        "key": [f"s{i:05d}" for i in range(n)],
        "jpg": [_IMAGE] * n,
        "label": [i % 3 for i in range(n)],
    }


def _reexport_peak_kb(source: str, out: Path, options: dict[str, object] | None) -> int:
    """Peak resident memory (VmHWM) of a fresh process that re-exports ``source`` in
    batches of 50 samples (3 MB: the allocators settle after a few)."""
    code = (
        "import json, sys, shardex\n"
        "from shardex.sources import ExportSource\n"
        "source = ExportSource(sys.argv[1], json.loads(sys.argv[3]) or None, batch_size=50)\n"
        "shardex.export(source, sys.argv[2], workers=1, samples_per_shard=50)"
    )
    return peak_rss_kb(code, [source, str(out), json.dumps(options)])


def _same_files(a: Path, b: Path) -> None:
    """The same files, byte for byte (config.yaml: but the source's address)."""
    names = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    assert names == sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    for name in names:
        if str(name) != "config.yaml":
            assert (a / name).read_bytes() == (b / name).read_bytes(), name
    ca, cb = shardex.read_config(a), shardex.read_config(b)
    assert ca.splits == cb.splits


@pytest.mark.parametrize("backend", ["torch", "webdataset"])
def test_reexport_memory_does_not_grow_with_the_source(tmp_path: Path, backend: str) -> None:
    """A local export of 500 and of 2,000 62 KB images (31 and 124 MB) re-exported: the
    peak RSS of the second is within 20 MB of the first's (a split held in memory grows
    by the 93 MB of bytes the second adds: the torch backend's samples are made from its
    arrays, batch by batch, and spilled to scratch)."""
    peaks = {}
    for n in _SIZES:
        src = tmp_path / f"src{n}"
        shardex.export(_source(n), src, backend=backend, samples_per_shard=64, workers=1)
        peaks[n] = _reexport_peak_kb(str(src), tmp_path / f"out{n}", None)
        assert shardex.verify(tmp_path / f"out{n}").ok
        a = shardex.open_dataset(src, split="train")
        b = shardex.open_dataset(tmp_path / f"out{n}", split="train")
        assert len(b) == n
        assert dict(b[n - 1]) == dict(a[n - 1])
    assert peaks[_SIZES[1]] - peaks[_SIZES[0]] < 20_000, peaks


def test_reexport_from_s3_streams_fetches_each_byte_once_and_matches_local(
    s3: S3Location, tmp_path: Path
) -> None:
    """A webdataset export on SeaweedFS re-exported to local disk: peak RSS within 20 MB
    from 500 to 2,000 62 KB samples; the shards' bytes are fetched once (the check and
    the write share them); the output is byte for byte the re-export of the same export
    from local disk."""
    peaks = {}
    for n in _SIZES:
        url = s3.child(f"src{n}")
        shardex.export(_source(n), url, samples_per_shard=64, workers=1, storage_options=s3.direct)
        s3.proxy.reset()
        peaks[n] = _reexport_peak_kb(url, tmp_path / f"out{n}", s3.counted)
        config = shardex.read_config(ObjectStorage(url, s3.direct))
        shard_bytes = sum(s.num_bytes for s in config.splits["train"].shards)
        fetched = sum(r.body_bytes for r in s3.proxy.gets() if r.key.endswith(".tar"))
        assert shard_bytes <= fetched < 1.05 * shard_bytes, (fetched, shard_bytes)
    assert peaks[_SIZES[1]] - peaks[_SIZES[0]] < 20_000, peaks

    local = tmp_path / "local-src"
    shardex.export(_source(_SIZES[1]), local, samples_per_shard=64, workers=1)
    shardex.export(local, tmp_path / "from-local", workers=1, samples_per_shard=50)
    _same_files(tmp_path / f"out{_SIZES[1]}", tmp_path / "from-local")


def test_reexport_from_s3_without_scratch_copies_names_the_objects(
    s3: S3Location, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without copies of what the check read (a Ray export: shards written elsewhere),
    the members name the source shards by URL and the writers fetch them: same output."""
    import shardex.storage.fetch.tars as objecttars

    url = s3.child("src")
    shardex.export(_source(40), url, samples_per_shard=16, workers=1, storage_options=s3.direct)
    shardex.export(url, tmp_path / "copied", workers=2, source_storage_options=s3.direct)
    monkeypatch.setattr(objecttars, "KEEP_COPIES", False)
    s3.proxy.reset()
    counted = dict(s3.counted)
    shardex.export(url, tmp_path / "fetched", workers=2, source_storage_options=counted)
    _same_files(tmp_path / "copied", tmp_path / "fetched")
    # checked by this process, then fetched by the shard writers: each byte twice
    config = shardex.read_config(ObjectStorage(url, s3.direct))
    shard_bytes = sum(s.num_bytes for s in config.splits["train"].shards)
    fetched = sum(r.body_bytes for r in s3.proxy.gets() if r.key.endswith(".tar"))
    assert fetched >= 1.5 * shard_bytes


# ------------------------------------------- options and appends on the streamed path


def _table_source(root: Path, n: int, first: int = 0, labels: str = "ab") -> Path:
    """A Parquet table of ``n`` images (JPEG, PNG, WebP in turn) with metadata columns of
    numbers, text and fixed-size lists, and ``.npy`` float64 members beside them."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    (root / "imgs").mkdir(parents=True, exist_ok=True)
    rels, labs = [], []
    for i in range(first, first + n):
        fmt, ext = [("JPEG", "jpg"), ("PNG", "png"), ("WEBP", "webp")][i % 3]
        (root / "imgs" / f"i{i:03d}.{ext}").write_bytes(make_image(i, fmt=fmt))
        rels.append(f"imgs/i{i:03d}.{ext}")
        labs.append(labels[i % len(labels)])
    table = pa.table(
        {
            "image_path": rels,
            "label": labs,
            "score": [None if i == 3 else i * 0.5 for i in range(first, first + n)],
            "caption": [None if i == 4 else f"caption {i}" for i in range(first, first + n)],
            "emb": pa.array(
                [np.linspace(0, i, 3).tolist() for i in range(first, first + n)],
                pa.list_(pa.float64(), 3),
            ),
        }
    )
    path = root / f"t{first}.parquet"
    pq.write_table(table, path)
    return path


_OPTIONS = {
    "x-keys-of-columns": {"x_keys": ("image", "score", "emb"), "y_keys": ("label", "caption")},
    "dtype": {"x_keys": ("image", "emb"), "dtype": "float16", "workers": 2},
    "image-member": {"image_member": "jpg", "split_fractions": {"tr": 0.6, "va": 0.4}},
}


def _export_twice(source: Path, out: Path, more: Path | None, **opts: object) -> tuple[Path, Path]:
    """``source`` exported (then ``more`` appended) as it is, and with its bytes read into
    memory first (pinned members)."""
    files, inline = out / "files", out / "inline"
    for target, wrap in ((files, open_source), (inline, lambda s: Inlined(open_source(s)))):
        shardex.export(wrap(source), target, samples_per_shard=4, **opts)  # type: ignore[arg-type]
        if more is not None:
            shardex.export(wrap(more), target, mode="append", samples_per_shard=4)
    return files, inline


@pytest.mark.parametrize("case", list(_OPTIONS))
@pytest.mark.parametrize("append", [False, True], ids=["export", "append"])
def test_options_and_appends_write_the_same_from_files_or_bytes_in_memory(
    tmp_path: Path, case: str, append: bool
) -> None:
    """x/y keys naming metadata columns, ``dtype``, ``image_member``, and appends to such
    exports (the appended samples' labels are a subset: their numbers follow the
    export's names) give the same files, byte for byte, whether the source's members
    name files or hold their bytes in memory."""
    source = _table_source(tmp_path / "src", 14)
    more = _table_source(tmp_path / "src", 5, first=40, labels="b") if append else None
    streamed, inline = _export_twice(source, tmp_path, more, **_OPTIONS[case])
    _same_files(streamed, inline)
    assert shardex.verify(streamed).ok
    config = shardex.read_config(streamed)
    assert config.num_samples == 14 + (5 if append else 0)
    if append:  # the new samples' only label, "b", is number 1 of the export's names
        import pyarrow.parquet as pq

        meta = config.metadata_file or "metadata.parquet"
        rows = pq.read_table(streamed / meta).to_pylist()
        added = [r["label"] for r in rows if r["key"] >= "imgs/i040"]
        assert added == [1] * 5
        assert config.label_names == ("a", "b")


def test_an_append_refuses_keys_already_in_the_export_streamed(tmp_path: Path) -> None:
    """The export's keys, held as hashes, still refuse a sample whose key is in the export
    (and only those), naming it; with --on-error skip the others are appended."""
    import pyarrow.parquet as pq

    from shardex.errors import DuplicateKeyError

    source = _table_source(tmp_path / "src", 10)
    shardex.export(source, tmp_path / "out", samples_per_shard=4, workers=1)
    again = _table_source(tmp_path / "src", 6, first=7)  # i007..i009 are in the export
    with pytest.raises(DuplicateKeyError, match=r"already in the export \(and 2 more\)"):
        shardex.export(again, tmp_path / "out", mode="append", workers=1)
    config = shardex.export(again, tmp_path / "out", mode="append", workers=1, on_error="skip")
    assert config.num_samples == 13
    errors = pq.read_table(tmp_path / "out" / "errors.parquet").column("key").to_pylist()
    assert sorted(errors) == ["imgs/i007", "imgs/i008", "imgs/i009"]
