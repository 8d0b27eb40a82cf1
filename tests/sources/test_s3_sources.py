"""Sources on object storage, against a real S3-compatible server (SeaweedFS on loopback).

Each kind of source is put on the server and exported; the export must equal the export
of the same files from local disk (shards byte for byte; config.yaml differs only in the
source's URI). Requests are counted by the transparent proxy in front of the server.
What does not need the server runs on memory:// too (the ``storage`` fixture), and the
behaviour of a source wherever it lies is in test_sources.py, on each storage.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import re
import shlex
import socket
import tarfile
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

import shardex
from helpers import files_of, image_bytes, kill_once_shards_appear, make_tree, peak_rss_kb
from shardex.cli import main
from shardex.errors import BadSampleError, ConfigError, RefetchWarning, StorageError
from shardex.refs.scan import SampleStream, ScanBatch
from shardex.sources import FolderSource, TableSource, TarSource, open_source
from shardex.sources.tar_scan import TarRef, tar_samples
from shardex.storage import LocalStorage, ObjectStorage, open_storage
from shardex.storage.fetch import tars as objecttars
from shardex.storage.fetch.objects import MAX_IN_FLIGHT, ObjectReads
from shardex.storage.memory import MemoryStorage
from tests.support.faults import FaultyStorage
from tests.support.places import Place
from tests.support.proxy import RequestHead
from tests.support.s3data import (
    S3Location,
    cli_export,
    fetched_once_each,
    huge_size,
    labelled_tars,
    noise_jpeg,
    put_raw,
    ranges_asked,
    same_export,
    tar_of,
    tars_here_and_on_s3,
    upload,
)

RELS = [
    f"{split}/{cls}/img{i}.jpg"
    for split in ("train", "val")
    for cls in ("cat", "dog")
    for i in range(6)
]
OPTS = {"samples_per_shard": 5, "workers": 2}


def _object_gets(s3: S3Location, under: str) -> Counter[str]:
    return Counter(r.key for r in s3.proxy.gets() if r.status == 200 and under in r.key)


def test_an_image_folder_on_s3_is_fetched_once_and_never_written(
    s3: S3Location, tmp_path: Path
) -> None:
    """Every image fetched exactly once, with one GET, and nothing written to the source
    (what it exports: test_sources.py's split folders, on each storage)."""
    files = make_tree(tmp_path / "src", RELS)
    upload(ObjectStorage(s3.child("images"), s3.direct), files)
    s3.proxy.reset()
    shardex.export(
        s3.child("images") + "/",
        tmp_path / "remote",
        source_storage_options=s3.counted,
        **OPTS,  # type: ignore[arg-type]
    )
    gets = _object_gets(s3, "/images/")
    assert sorted(gets) == sorted(f"{s3.url.split('/', 3)[3]}/images/{rel}" for rel in RELS)
    assert set(gets.values()) == {1}
    assert s3.proxy.count("PUT") == s3.proxy.count("DELETE") == 0


def test_listing_is_paginated_and_streamed(s3: S3Location) -> None:
    """More objects than one LIST page: every page is asked for once, the samples come
    in key order, and the layout costs one LIST with a delimiter and a probe of each
    folder's first page, not a listing of every object."""
    count = 1100  # S3 lists at most 1,000 keys per page
    data = image_bytes(0)
    names = [f"{cls}/n{i:05d}.jpg" for i in range(count) for cls in ["a" if i < 1050 else "b"]]
    started = time.monotonic()
    upload(ObjectStorage(s3.child("many"), s3.direct), dict.fromkeys(names, data))
    source = FolderSource(s3.child("many"), s3.counted, batch_size=300)
    s3.proxy.reset()
    stream = source.stream()
    assert stream.label_names == ("a", "b")
    # the layout: the prefix's first page, its folders (one LIST with a delimiter), and
    # each folder's first page
    layout = s3.proxy.lists()
    below = [r.params.get("prefix", [""])[0].rpartition("many")[2] for r in layout]
    assert below[:2] == ["/", "/"]
    assert sorted(below[2:]) == ["/a/", "/b/"]  # the probes are made at once
    assert [bool(r.params.get("delimiter")) for r in layout] == [False, True, False, False]
    keys: list[str] = []
    labels: list[int] = []
    for batch in stream.batches:
        assert batch.table.num_rows <= 300
        keys += batch.table.column("key").to_pylist()
        labels += batch.table.column("label").to_pylist()
    assert keys == [name[:-4] for name in names]
    assert labels == [0] * 1050 + [1] * 50
    # b's probe saw all of b (50 keys): only a is listed again, in two pages
    pages = s3.proxy.lists()[len(layout) :]
    assert [r.params["prefix"][0].rpartition("many")[2] for r in pages] == ["/a/"] * 2
    assert pages[1].params.get("continuation-token") is not None
    assert time.monotonic() - started < 20  # it is a few seconds on a laptop


#: An image folder with what a listing cut at its folders must keep in order: a class
#: of more than one LIST page, keys beside folders (a README, images directly in a split,
#: a format left out), folders holding no image, names that sort around a folder's "/"
#: (" ", "-", "." sort before it) and names with characters URLs escape.
HOSTILE = [
    *(f"train/cat/{i:04d}.jpg" for i in range(1010)),
    "train/cat/sub/deep.jpg",
    "train/dog/a b.jpg",
    "train/dog/a-b.jpg",
    "train/dog/a.jpg",
    "train/dog.jpg",
    "train/dog/ü%2F+#&?=.jpg",
    "train/do g/x.jpg",
    "train/zz top.jpg",
    "val/bird/b.jpg",
    "val/cat/v.jpg",
]
OTHER_FILES = {
    "README.txt": b"hello",
    "train/notes/readme.txt": b"no image here",
    "train/dog/raw.heic": b"not exported",
    "val-extra/x.heic": b"left out",
    "val/y.heic": b"left out",
}


def _hostile_tree(root: Path) -> dict[str, bytes]:
    files = make_tree(root, HOSTILE)
    for rel, data in OTHER_FILES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return {**files, **OTHER_FILES}


def test_a_listing_cut_at_folders_exports_as_the_local_folder(
    s3: S3Location, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Folders listed at once (threads; a runner's worker processes) give the export of
    the local folder, byte for byte, and with a runner this process makes no LIST of
    objects (only LISTs of folders) and gets back a few bytes a key, not the XML."""
    from shardex.parallel import Runner
    from shardex.storage.object import ObjectStorage as Store

    files = _hostile_tree(tmp_path / "src")
    upload(ObjectStorage(s3.child("h"), s3.direct), files)
    opts: dict[str, Any] = {"samples_per_shard": 100, "workers": 2, "on_error": "skip"}
    shardex.export(str(tmp_path / "src"), tmp_path / "local", **opts)
    s3.proxy.reset()
    config = shardex.export(
        s3.child("h"), tmp_path / "remote", source_storage_options=s3.counted, **opts
    )
    assert config.label_names == ("bird", "cat", "do g", "dog")
    same_export(tmp_path / "local", tmp_path / "remote", s3.child("h"))
    assert len(pq.read_table(tmp_path / "remote" / "errors.parquet")) == 3
    lists = s3.proxy.lists()
    xml = sum(r.body_bytes for r in lists if not r.params.get("delimiter"))
    keys = len(files)

    source = FolderSource(s3.child("h"), s3.direct, batch_size=128)
    alone = [b.table for b in source.stream().batches]
    object_lists: list[int] = []
    plain = Store.list_pages

    def counted(self: Store, *args: Any) -> Any:
        object_lists.append(os.getpid())  # only in this process: workers have their own list
        return plain(self, *args)

    monkeypatch.setattr(Store, "list_pages", counted)
    handed: list[int] = []
    with Runner(2) as runner:
        imap = runner.imap

        def sized_imap(fn: Any, items: Any) -> Iterator[Any]:
            for result in imap(fn, items):
                handed.append(len(pickle.dumps(result)))
                yield result

        monkeypatch.setattr(runner, "imap", sized_imap)
        on_runner = [b.table for b in source.stream_on(runner).batches]
    assert sum(t.num_rows for t in alone) == len(HOSTILE)
    assert len(on_runner) == len(alone) == -(-len(HOSTILE) // 128)
    assert all(a.equals(b) for a, b in zip(alone, on_runner, strict=True))
    assert object_lists == []  # every LIST of objects was made by a worker
    assert sum(handed) < keys * 20 < xml / 5  # the XML is ~200 B a key here


def test_folders_are_probed_and_listed_at_once(
    memory_storage: MemoryStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each LIST of objects answered after 1 s: eight class folders are probed, and
    listed, in about the time of one (one after the other they take 8 s and more; the
    bounds leave room for a loaded machine)."""
    from shardex.sources import folder
    from shardex.sources.listing import Part, listed

    names = [f"c{c}/{i}.jpg" for c in range(8) for i in range(3)]
    for name in names:
        memory_storage.put(name, image_bytes(0))
    storage = FaultyStorage(memory_storage)
    storage.delay("list_pages", 1.0, times=None)  # not list_folder: a LIST with a delimiter
    monkeypatch.setattr(folder, "open_storage", lambda url, options: storage)
    source = FolderSource(storage.uri)
    started = time.monotonic()
    keys = [k for batch in source.stream().batches for k in batch.table.column("key").to_pylist()]
    probed = time.monotonic() - started
    assert keys == [name[:-4] for name in names]
    # the prefix's first page, then the eight probes at once (each saw all its folder)
    assert [c.path for c in storage.calls_to("list_pages")][:1] == [""]
    probes = sorted(c.path for c in storage.calls_to("list_pages")[1:])
    assert probes == [f"c{c}" for c in range(8)]
    assert probed < 5.0, probed
    started = time.monotonic()
    entries = list(listed(storage, [Part(f"c{c}") for c in range(8)], None))
    took = time.monotonic() - started
    assert [rel for rel, _ in entries] == names
    assert took < 4.0, took


@pytest.mark.parametrize("storage", ["memory", "s3"], indirect=True)
def test_a_flat_prefix_and_a_flat_split_export_as_the_local_folder(
    storage: Place, tmp_path: Path
) -> None:
    """Images directly in the prefix beside class folders, or directly in a split beside
    its class folders: listed as one part, the same export as the local folder's."""
    for name, rels in {
        "flat": ["a.jpg", "b/x.jpg", "c.jpg", "d/y.jpg", "d/z.jpg"],
        "split": ["train/a.jpg", "train/b/x.jpg", "train/c.jpg", "val/d/y.jpg", "val/e.jpg"],
    }.items():
        url = storage.put(make_tree(tmp_path / name, rels), name)
        shardex.export(tmp_path / name, tmp_path / f"{name}-local", samples_per_shard=5, workers=1)
        shardex.export(
            url, tmp_path / f"{name}-remote", source_storage_options=storage.options, **OPTS
        )  # type: ignore[arg-type]
        same_export(tmp_path / f"{name}-local", tmp_path / f"{name}-remote", url)


def test_webdataset_tars_export_as_their_local_twins(s3: S3Location, tmp_path: Path) -> None:
    tars = {
        f"shards/part-{t}.tar": tar_of(
            [(f"s{t}_{i}", image_bytes(10 * t + i), i % 3) for i in range(8)]
        )
        for t in range(3)
    }
    tars["shards/part-x.txt"] = b"not a tar"  # not matched by the glob
    for name, data in tars.items():
        (tmp_path / "src" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "src" / name).write_bytes(data)
    upload(ObjectStorage(s3.child("wds"), s3.direct), tars)
    local = tmp_path / "src" / "shards" / "part-*.tar"
    shardex.export(str(local), tmp_path / "local", **OPTS)  # type: ignore[arg-type]
    for source in (s3.child("wds/shards/part-*.tar"), s3.child("wds/shards/")):
        if source.endswith("/"):  # a prefix holding only tars is a tar source
            ObjectStorage(s3.child("wds"), s3.direct).delete("shards/part-x.txt")
        s3.proxy.reset()
        out = tmp_path / ("prefix" if source.endswith("/") else "glob")
        assert isinstance(open_source(source, s3.counted), TarSource)
        shardex.export(source, out, source_storage_options=s3.counted, **OPTS)  # type: ignore[arg-type]
        same_export(tmp_path / "local", out, source)
        read = {r.key for r in s3.proxy.gets() if r.status in (200, 206)}
        assert read == {f"{s3.url.split('/', 3)[3]}/wds/{n}" for n in tars if n.endswith(".tar")}
        got = sum(r.body_bytes for r in s3.proxy.gets())
        # tiny members: the scan reads each tar through (the windows grow), the shards
        # fetch the images again, by ranges; never more than twice the tars' bytes
        assert got <= 2 * sum(len(d) for n, d in tars.items() if n.endswith(".tar"))
        assert s3.proxy.count("PUT") == 0


def test_tar_members_on_s3_are_fetched_once_by_coalesced_ranged_gets(
    s3: S3Location, tmp_path: Path
) -> None:
    """Tars of ~100 KB images: the scan hops from header to header (one small GET a
    sample, the images' bytes skipped); each shard fetches its images from each tar with
    one ranged GET; no image byte is fetched twice but a few KB after each header."""
    per_tar, sps = 12, 5
    tars = {
        f"part-{t}.tar": tar_of(
            [(f"s{t}_{i:02d}", noise_jpeg(t * 100 + i), i % 2) for i in range(per_tar)]
        )
        for t in range(2)
    }
    total = sum(len(d) for d in tars.values())
    assert total > 2 * per_tar * 80_000
    (tmp_path / "src").mkdir()
    for name, data in tars.items():
        (tmp_path / "src" / name).write_bytes(data)
    upload(ObjectStorage(s3.child("big"), s3.direct), tars)
    opts = {"samples_per_shard": sps, "workers": 2}
    shardex.export(str(tmp_path / "src"), tmp_path / "local", **opts)  # type: ignore[arg-type]
    # the scan alone: about one GET of a few KB per sample
    s3.proxy.reset()
    source = TarSource(s3.child("big/"), s3.counted)
    scanned = sum(batch.table.num_rows for batch in source.stream().batches)
    assert scanned == 2 * per_tar
    scan = s3.proxy.gets()
    assert len(scan) <= scanned + 2 * len(tars)
    assert sum(r.body_bytes for r in scan) < 0.1 * total
    # the export: the scan, then the shards' ranged GETs
    s3.proxy.reset()
    shardex.export(s3.child("big/"), tmp_path / "remote", source_storage_options=s3.counted, **opts)  # type: ignore[arg-type]
    same_export(tmp_path / "local", tmp_path / "remote", s3.child("big/"))
    gets = s3.proxy.gets()
    assert all(r.status == 206 for r in gets)  # no tar is read whole
    assert sum(r.body_bytes for r in gets) < 1.15 * total
    # one GET per (shard, tar) run of samples: shard k holds samples [k*sps, (k+1)*sps)
    runs = {(n // sps, n // per_tar) for n in range(2 * per_tar)}
    writes = [r for r in gets if r.body_bytes > 64 << 10]
    assert len(writes) == len(runs)
    # every image's bytes lie inside exactly one of the shards' GETs
    spans = ranges_asked(writes)
    for name, data in tars.items():
        with tarfile.open(fileobj=io.BytesIO(data)) as tf:
            for info in tf.getmembers():
                if info.name.endswith(".jpg"):
                    inside = [
                        (a, b)
                        for (a, b), r in zip(spans, writes, strict=True)
                        if r.key.endswith(name)
                        and a <= info.offset_data
                        and info.offset_data + info.size <= b
                    ]
                    assert len(inside) == 1, (name, info.name)


def test_tables_on_s3_and_tables_of_s3_urls(s3: S3Location, tmp_path: Path) -> None:
    rels = [f"imgs/{i:02d}.jpg" for i in range(10)]
    files = make_tree(tmp_path / "src", rels)
    labels = ["cat" if i % 2 else "dog" for i in range(10)]
    table = pa.table({"image_path": rels, "label": labels, "score": [i / 4 for i in range(10)]})
    pq.write_table(table, tmp_path / "src" / "table.parquet")
    (tmp_path / "src" / "table.csv").write_text(table.to_pandas().to_csv(index=False))
    uploaded = {**files, "table.parquet": (tmp_path / "src" / "table.parquet").read_bytes()}
    uploaded["table.csv"] = (tmp_path / "src" / "table.csv").read_bytes()
    upload(ObjectStorage(s3.child("data"), s3.direct), uploaded)
    shardex.export(str(tmp_path / "src" / "table.parquet"), tmp_path / "local", **OPTS)  # type: ignore[arg-type]
    for name in ("table.parquet", "table.csv"):
        s3.proxy.reset()
        url = s3.child(f"data/{name}")
        assert isinstance(open_source(url, s3.counted), TableSource)
        shardex.export(url, tmp_path / name, source_storage_options=s3.counted, **OPTS)  # type: ignore[arg-type]
        if name.endswith(".parquet"):
            same_export(tmp_path / "local", tmp_path / name, url)
        gets = _object_gets(s3, "/data/imgs/")
        assert len(gets) == 10
        assert set(gets.values()) == {1}
        assert s3.proxy.count("HEAD") == 10  # each row's size: one HEAD
    # a local table whose paths are s3:// URLs: the same samples as its local twin
    urls = [f"{s3.child('data')}/{rel}" for rel in rels] + [s3.child("data/imgs/missing.jpg")]
    local_paths = [str(tmp_path / "src" / rel) for rel in rels] + [
        str(tmp_path / "src" / "imgs" / "missing.jpg")
    ]
    for name, paths in (("urls.parquet", urls), ("paths.parquet", local_paths)):
        pq.write_table(pa.table({"image_path": paths, "label": [*labels, "cat"]}), tmp_path / name)
    s3.proxy.reset()
    a = shardex.export(str(tmp_path / "paths.parquet"), tmp_path / "a", on_error="skip", **OPTS)  # type: ignore[arg-type]
    b = shardex.export(
        str(tmp_path / "urls.parquet"),
        tmp_path / "b",
        on_error="skip",
        source_storage_options=s3.counted,
        **OPTS,  # type: ignore[arg-type]
    )
    assert a.num_skipped == b.num_skipped == 1
    for split in a.splits:
        ours = shardex.open_dataset(tmp_path / "b", split=split)
        assert list(ours) == list(shardex.open_dataset(tmp_path / "a", split=split))
        assert ours.metadata.column("original_path").to_pylist()[0].startswith("s3://")
    assert set(_object_gets(s3, "/data/imgs/").values()) == {1}


def test_transient_server_errors_are_retried(s3: S3Location, tmp_path: Path) -> None:
    files = make_tree(tmp_path / "src", RELS[:8])
    upload(ObjectStorage(s3.child("flaky"), s3.direct), files)
    shardex.export(str(tmp_path / "src"), tmp_path / "local", **OPTS)  # type: ignore[arg-type]
    s3.proxy.reset()
    # two image GETs and one LIST answered 503 (as a throttling or restarting server)
    s3.proxy.fail_next(2, 503, when=lambda h: h.method == "GET" and h.path.endswith(".jpg"))
    s3.proxy.fail_next(1, 503, when=lambda h: "list-type" in h.query)
    shardex.export(
        s3.child("flaky"), tmp_path / "remote", source_storage_options=s3.counted, **OPTS
    )  # type: ignore[arg-type]
    same_export(tmp_path / "local", tmp_path / "remote", s3.child("flaky"))
    failed = [r for r in s3.proxy.requests if r.fault == "fail"]
    assert len(failed) == 3
    gets = _object_gets(s3, "/flaky/")
    assert sum(gets.values()) == 8  # each image read whole once, after the retries


def test_cli_source_flags(s3: S3Location, tmp_path: Path) -> None:
    files = make_tree(tmp_path / "src", RELS[:6])
    upload(ObjectStorage(s3.child("cli"), s3.direct), files)
    code, output = cli_export(s3, s3.child("cli/"), "-o", str(tmp_path / "out"))
    assert code == 0, output
    assert "exported 6 samples" in output
    assert s3.server.secret_key not in output
    assert (
        "--source-s3-endpoint-url" in CliRunner().invoke(main, ["export-dataset", "--help"]).output
    )
    # the example of docs/storage.md, its source and output on the server
    text = (Path(__file__).parents[2] / "docs" / "storage.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    (block,) = [b for b in blocks if "s3://my-bucket/images/" in b]
    command = shlex.split(
        block.replace("\\\n", " ")
        .replace("s3://my-bucket/images/", s3.child("cli/"))
        .replace("s3://my-bucket/exports/images", s3.child("cli-out"))
        .replace("http://127.0.0.1:8333", s3.server.endpoint)
    )
    assert command[:2] == ["shardex", "export-dataset"]
    env = {"AWS_ACCESS_KEY_ID": s3.server.access_key, "AWS_SECRET_ACCESS_KEY": s3.server.secret_key}
    result = CliRunner().invoke(main, command[1:], env=env)
    assert result.exit_code == 0, result.output
    assert shardex.read_config(s3.child("cli-out"), s3.direct).num_samples == 6
    # the source's own flags are refused where they would not be used (a spec file
    # names its source; --executor ray uses them: tests/test_ray_export.py)
    code, output = cli_export(s3, str(tmp_path / "spec.yaml"), "-o", str(tmp_path / "spec"))
    assert code == 2
    assert "--source-s3-*" in output


@pytest.mark.parametrize(
    "flags",
    [
        # the source takes the --s3-* flags, time limits among them
        ["--s3-endpoint-url", "{endpoint}", "--s3-region", "{region}", "--s3-timeout", "30s"],
        # each --source-s3-* flag not given is its --s3-* one (here the endpoint)
        ["--s3-endpoint-url", "{endpoint}", "--source-s3-region", "{region}"],
    ],
    ids=["s3 flags and a time limit", "one source flag"],
)
def test_a_source_on_s3_takes_each_s3_flag_it_is_not_given_a_source_flag_for(
    s3: S3Location, tmp_path: Path, flags: list[str]
) -> None:
    files = make_tree(tmp_path / "src", RELS[:4])
    upload(ObjectStorage(s3.child("fallback"), s3.direct), files)
    given = [f.format(endpoint=s3.server.endpoint, region=s3.server.region) for f in flags]
    env = {
        "AWS_ACCESS_KEY_ID": s3.server.access_key,
        "AWS_SECRET_ACCESS_KEY": s3.server.secret_key,
        # a flag the source lost would send it here: a closed port on loopback
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
    }
    out = tmp_path / "out"
    args = ["export-dataset", s3.child("fallback/"), "-o", str(out), "-q", "--s3-retry-timeout"]
    result = CliRunner().invoke(main, [*args, "2s", *given], env=env)
    assert result.exit_code == 0, result.output
    assert shardex.read_config(out).num_samples == 4


@pytest.mark.parametrize("case", ["missing bucket", "empty prefix", "bad credentials"])
def test_source_errors_are_one_line_naming_the_url(
    s3: S3Location, tmp_path: Path, case: str
) -> None:
    url, env = s3.child("nothing-here/"), None
    if case == "missing bucket":
        url = "s3://no-such-bucket-h7/images/"
    elif case == "bad credentials":
        env = {"AWS_SECRET_ACCESS_KEY": "wrong-secret"}
    code, output = cli_export(s3, url, "-o", str(tmp_path / "out"), env=env)
    assert code == 1
    lines = output.strip().splitlines()
    assert len(lines) == 1, output
    assert lines[0].startswith("error: ")
    assert url.split("://", 1)[1].split("/", 1)[0] in lines[0]  # names the bucket, at least
    expected = {
        "missing bucket": "does not exist",
        "empty prefix": "holds no image files",
        "bad credentials": "denied",
    }[case]
    assert expected in lines[0]
    assert "wrong-secret" not in output
    assert s3.server.secret_key not in output
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_an_unreachable_source_endpoint_is_one_line(s3: S3Location, tmp_path: Path) -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    options = {**s3.direct, "endpoint_url": f"http://127.0.0.1:{port}", "retry_timeout": "1s"}
    with pytest.raises(StorageError) as caught:
        shardex.export(s3.child("images/"), tmp_path / "out", source_storage_options=options)
    message = str(caught.value)
    assert "\n" not in message
    assert s3.child("images") in message
    assert "cannot reach" in message
    assert s3.server.secret_key not in message


def test_a_bad_image_on_s3_is_skipped_as_on_disk(s3: S3Location, tmp_path: Path) -> None:
    files = make_tree(tmp_path / "src", RELS)
    bad = RELS[7]  # cut short: its header check fails when its shard is written
    (tmp_path / "src" / bad).write_bytes(files[bad][:40])
    upload(ObjectStorage(s3.child("bad-image"), s3.direct), files_of(tmp_path / "src"))
    local = shardex.export(str(tmp_path / "src"), tmp_path / "local", on_error="skip", **OPTS)  # type: ignore[arg-type]
    s3.proxy.reset()
    remote = shardex.export(
        s3.child("bad-image"),
        tmp_path / "remote",
        on_error="skip",
        source_storage_options=s3.counted,
        **OPTS,  # type: ignore[arg-type]
    )
    assert local.num_skipped == remote.num_skipped == 1
    same_export(tmp_path / "local", tmp_path / "remote", s3.child("bad-image"))
    # the shards after the bad one are planned again: their images may be read again
    assert set(_object_gets(s3, "/bad-image/")) == {
        f"{s3.url.split('/', 3)[3]}/bad-image/{rel}" for rel in RELS
    }


def test_a_later_source_in_the_same_bucket_is_read_with_its_own_options(
    s3: S3Location, tmp_path: Path
) -> None:
    """The stores of an earlier export's source (here through the counting proxy) never
    serve a later export's objects, even below the earlier one's longer prefix."""
    rels = [f"imgs/{i:02d}.jpg" for i in range(6)]
    files = make_tree(tmp_path / "src", rels)
    upload(ObjectStorage(s3.child("data"), s3.direct), files)
    shardex.export(
        s3.child("data/imgs"), tmp_path / "first", source_storage_options=s3.counted, workers=1
    )
    urls = [f"{s3.child('data')}/{rel}" for rel in rels]
    pq.write_table(pa.table({"image_path": urls}), tmp_path / "urls.parquet")
    s3.proxy.reset()
    shardex.export(
        str(tmp_path / "urls.parquet"),
        tmp_path / "second",
        source_storage_options=s3.direct,
        workers=1,
    )
    assert not _object_gets(s3, "/data/imgs/")  # read from its own endpoint, not the proxy
    assert len(shardex.open_dataset(tmp_path / "second", split="train")) == 6


def test_an_object_name_with_a_control_character_is_a_one_line_error(
    s3: S3Location, tmp_path: Path
) -> None:
    """A key holding a newline (written by another S3 client; here through the server's
    filer API), which obstore cannot list past: the error names that object in one line,
    and --on-error skip exports the rest."""
    ObjectStorage(s3.child("odd"), s3.direct).put("cat/ok.jpg", image_bytes(0))
    put_raw(s3, "odd/cat/a\nb.jpg", image_bytes(1))
    code, output = cli_export(s3, s3.child("odd"), "-o", str(tmp_path / "out"))
    assert code == 1
    error = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(error) == 1, output
    assert "cat/a\\nb.jpg" in error[0]
    assert "rename the object" in error[0]
    assert not (tmp_path / "out" / "config.yaml").exists()
    code, output = cli_export(s3, s3.child("odd"), "-o", str(tmp_path / "out"), "--on-error=skip")
    assert code == 0, output
    assert shardex.read_config(tmp_path / "out").num_skipped == 1


class _ChangedAfterListing(FolderSource):
    """An image folder on object storage whose objects change once the listing is read
    (between pass 1 and the writing of the shards): one grows, one goes."""

    def stream(self) -> SampleStream:
        listed = super().stream()
        store = open_storage(self.uri, self.storage_options)

        def batches() -> Iterator[ScanBatch]:
            yield from listed.batches
            store.put("cat/img1.jpg", image_bytes(1) + b"\0" * 100)
            store.delete("dog/img2.jpg")

        return SampleStream(batches(), listed.label_names)


@pytest.mark.parametrize("storage", ["memory", "s3"], indirect=True)
@pytest.mark.parametrize("workers", [1, 2])
def test_objects_changed_after_listing_are_bad_samples(
    storage: Place, tmp_path: Path, workers: int
) -> None:
    rels = [f"{cls}/img{i}.jpg" for cls in ("cat", "dog") for i in range(4)]
    files = make_tree(tmp_path / "src", rels)
    opts = {"samples_per_shard": 3, "workers": workers}
    for mode in ("skip", "error"):
        src = _ChangedAfterListing(storage.put(files, mode), storage.options)
        out = tmp_path / mode
        if mode == "error":
            with pytest.raises(BadSampleError, match=r"'cat/img1\.jpg': changed during export"):
                shardex.export(src, out, **opts)  # type: ignore[arg-type]
            assert not (out / "config.yaml").exists()
            continue
        config = shardex.export(src, out, on_error="skip", **opts)  # type: ignore[arg-type]
        errors = pq.read_table(out / "errors.parquet").to_pylist()
        assert {(e["key"], e["reason"].split(": ")[0]) for e in errors} == {
            ("cat/img1", "changed during export"),
            ("dog/img2", f"cannot read '{storage.child(mode)}/dog/img2.jpg'"),
        }
        assert config.splits["train"].num_samples == 6
        ds = shardex.open_dataset(out, split="train")
        assert sorted(s["__key__"] for s in ds) == sorted(
            r[: -len(".jpg")] for r in rels if r not in ("cat/img1.jpg", "dog/img2.jpg")
        )


@pytest.mark.parametrize("where", ["source", "output"])
def test_credentials_in_a_url_are_refused_and_never_shown(tmp_path: Path, where: str) -> None:
    (tmp_path / "src" / "cat").mkdir(parents=True)
    (tmp_path / "src" / "cat" / "a.jpg").write_bytes(image_bytes(0))
    url = "s3://AKIAEXAMPLE:hunter2secret@bucket/data/"
    source, output = (
        (url, str(tmp_path / "out"))
        if where == "source"
        else (
            str(tmp_path / "src"),
            url,
        )
    )
    result = CliRunner().invoke(main, ["export-dataset", source, "-o", output])
    assert result.exit_code == 1
    assert result.output.startswith("error: the URL s3://***@bucket/... holds credentials")
    assert "hunter2secret" not in result.output
    assert "AKIAEXAMPLE" not in result.output
    with pytest.raises(ConfigError, match="never in the URL") as info:
        shardex.export(source, output)
    assert "hunter2secret" not in str(info.value)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("member", ["k2.jpg", "k2.json"])
def test_a_member_declaring_a_huge_size_on_s3_is_never_fetched(
    s3: S3Location, tmp_path: Path, member: str
) -> None:
    """A header that claims 8 GiB: the scan neither fetches nor allocates it (what the
    export makes of it: test_a_damaged_tar_is_refused_or_skipped_as_on_local_disk)."""
    data = huge_size(tar_of([(f"k{i}", image_bytes(i), i % 2) for i in range(6)]), member)
    ObjectStorage(s3.child("huge"), s3.counted).put("part.tar", data)
    s3.proxy.reset()
    options = {"on_error": "skip", "workers": 1, "source_storage_options": s3.counted}
    remote = shardex.export(s3.child("huge/"), tmp_path / "remote", **options)  # type: ignore[arg-type]
    assert remote.num_skipped == 1
    assert sum(r.body_bytes for r in s3.proxy.gets()) <= 2 * len(data)


def _peak_rss_kb(source: str, options: dict[str, Any], out: Path) -> int:
    """Peak resident memory (VmHWM) of a fresh process exporting ``source``."""
    code = (
        "import json, sys, shardex\n"
        "shardex.export(sys.argv[1], sys.argv[2], workers=1, samples_per_shard=50,\n"
        "               source_storage_options=json.loads(sys.argv[3]))"
    )
    return peak_rss_kb(code, [source, str(out), json.dumps(options)])


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc VmHWM")
def test_exporting_tars_on_s3_holds_memory_flat_whatever_their_size(
    s3: S3Location, tmp_path: Path
) -> None:
    """Tars of ~100 KB images on S3, 62 MB then 194 MB: the export's peak RSS grows by
    far less than the tars (their bytes are fetched by ranges as shards are written, not
    held; before, it grew by about 3.2 bytes per tar byte). Measured: 176-178 MB, then
    188-190 MB."""
    images = [noise_jpeg(i) for i in range(16)]
    store = ObjectStorage(s3.child("rss"), s3.direct)
    sizes: dict[str, int] = {}
    for name, tars in (("small", 8), ("large", 25)):
        parts = {
            f"{name}/part-{t:02d}.tar": tar_of(
                [(f"s{t}_{i:02d}", images[(t + i) % 16], i % 2) for i in range(80)]
            )
            for t in range(tars)
        }
        upload(store, parts)
        sizes[name] = sum(len(d) for d in parts.values())
    assert sizes["large"] - sizes["small"] > 120 << 20
    peak = {
        name: _peak_rss_kb(s3.child(f"rss/{name}/"), s3.direct, tmp_path / name) << 10
        for name in sizes
    }
    assert len(shardex.open_dataset(tmp_path / "large")) == 25 * 80
    grew = peak["large"] - peak["small"]
    assert grew < 0.25 * (sizes["large"] - sizes["small"]), (peak, sizes)


def test_an_export_of_tars_on_s3_killed_while_writing_resumes_to_the_same_bytes(
    s3: S3Location, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGKILL once shards are being written (from the scan's copies of the tars), then
    ``mode="resume"``: the output equals an uninterrupted export's, file for file, and
    the killed run's copies are gone."""
    upload(ObjectStorage(s3.child("kill"), s3.direct), labelled_tars(4, 300))
    source = s3.child("kill/")
    clean, killed = tmp_path / "clean", tmp_path / "killed"
    opts: dict[str, Any] = {"samples_per_shard": 10, "workers": 2}
    shardex.export(source, clean, source_storage_options=s3.direct, **opts)
    code = (
        "import json, sys, shardex\n"
        "shardex.export(sys.argv[1], sys.argv[2], samples_per_shard=10, workers=2,\n"
        "               source_storage_options=json.loads(sys.argv[3]))"
    )
    # the export's scratch (with the copies of what its scan read) where it can be seen
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    kill_once_shards_appear(code, [source, str(killed), json.dumps(s3.direct)], killed)
    left = list(tmp.glob("shardex-export-*/tars/*.tar"))
    assert left, "the killed export kept no copy of its tars"
    shardex.export(source, killed, source_storage_options=s3.direct, mode="resume", **opts)
    # the killed run's scratch (copies and all) removed, the resume's too
    assert not list(tmp.glob("*shardex-export-*"))
    lock = ".shardex-lock"
    assert {n: d for n, d in files_of(killed).items() if n != lock} == {
        n: d for n, d in files_of(clean).items() if n != lock
    }


def _range_length(head: RequestHead) -> int:
    first, _, last = (head.range or "bytes=0-0")[len("bytes=") :].partition("-")
    return int(last) - int(first) + 1 if last else 0


def test_transient_errors_on_tar_range_gets_are_retried(s3: S3Location, tmp_path: Path) -> None:
    """503s on the scan's ranged GETs and on the shards' coalesced GETs: retried, the
    export as the local one."""
    data = tar_of([(f"k{i}", noise_jpeg(i), i % 2) for i in range(6)])
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "part.tar").write_bytes(data)
    ObjectStorage(s3.child("flaky"), s3.direct).put("part.tar", data)
    opts = {"samples_per_shard": 3, "workers": 2}
    shardex.export(str(tmp_path / "src"), tmp_path / "local", **opts)  # type: ignore[arg-type]
    s3.proxy.reset()
    tar_get = lambda h: h.method == "GET" and h.path.endswith(".tar")  # noqa: E731
    s3.proxy.fail_next(2, 503, when=lambda h: tar_get(h) and _range_length(h) <= 64 << 10)
    s3.proxy.fail_next(2, 503, when=lambda h: tar_get(h) and _range_length(h) > 64 << 10)
    shardex.export(
        s3.child("flaky/"), tmp_path / "remote", source_storage_options=s3.counted, **opts
    )  # type: ignore[arg-type]
    same_export(tmp_path / "local", tmp_path / "remote", s3.child("flaky/"))
    assert len([r for r in s3.proxy.requests if r.fault == "fail"]) == 4


def test_a_member_whose_fetch_has_not_started_is_waited_for(memory_storage: MemoryStorage) -> None:
    """Every fetching thread busy with GETs the reader dropped (samples found bad): a
    member whose GET is still queued is waited for, never cancelled under the reader."""
    names = [f"o{i:02d}" for i in range(40)]
    for i, name in enumerate(names):
        memory_storage.put(name, bytes([i]) * 100)
    store = FaultyStorage(memory_storage)
    for name in names[1 : MAX_IN_FLIGHT + 1]:  # a slow server
        store.delay("get_range", 0.5, path=name, times=None)
    reads = ObjectReads([(store.uri, store)])
    members = [(i, f"{store.uri}/{name}", 0, 100) for i, name in enumerate(names)]
    try:
        reads.expect(members)
        assert reads.read(*members[0]) == bytes([0]) * 100
        # 1..16 dropped while their threads sleep; 18 on is queued behind them
        for i in (MAX_IN_FLIGHT + 1, MAX_IN_FLIGHT + 2, MAX_IN_FLIGHT + 3):
            assert reads.read(*members[i]) == bytes([i]) * 100
    finally:
        reads.close()
    assert {c.path for c in store.calls_to("get_range") if c.fault} <= set(names[1:17])


@pytest.mark.parametrize("on_error", ["error", "skip"])
def test_a_storage_failure_mid_scan_fails_the_export_not_marks_the_tar_damaged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, memory_storage: MemoryStorage, on_error: str
) -> None:
    """A ranged GET of the scan that fails (after the storage layer's retries) is the
    storage's error: the export stops with it, and never records the tar's samples as
    damaged and skipped (under --on-error skip they would be silently left out)."""
    data = tar_of([(f"k{i}", noise_jpeg(i), i % 2) for i in range(6)])
    memory_storage.put("part.tar", data)

    def refusing() -> TarRef:
        """The tar, on a server that starts refusing mid-scan (access revoked)."""
        store = FaultyStorage(memory_storage)
        store.fail("get_range", nth=3, times=None, error=StorageError("access denied"))
        return TarRef("part.tar", "part.tar", len(data), store)

    with pytest.raises(StorageError, match="access denied"):
        list(tar_samples(refusing()))
    monkeypatch.setattr(TarSource, "_tars", lambda self, tar=refusing(): [tar])
    with pytest.raises(StorageError, match="access denied"):
        shardex.export(TarSource(str(tmp_path)), tmp_path / "out", on_error=on_error)
    assert not (tmp_path / "out" / "config.yaml").exists()


def _small_tars(kind: str) -> dict[str, bytes]:
    """Three tars of 40 samples: ``tiny`` (a JPEG of ~0.7 KB), ``25 KB`` JPEGs, or
    ``mixed`` (~100 KB JPEGs, hopped over by the scan, between tiny ones)."""

    def image(i: int) -> bytes:
        if kind == "tiny":
            return image_bytes(i)
        if kind == "25 KB":
            return noise_jpeg(i, side=140)
        return noise_jpeg(i) if i % 4 == 0 else image_bytes(i)

    return {
        f"part-{t}.tar": tar_of([(f"s{t}_{i:03d}", image(t * 40 + i), i % 3) for i in range(40)])
        for t in range(3)
    }


@pytest.mark.parametrize("kind", ["tiny", "25 KB", "mixed"])
def test_small_members_of_tars_on_s3_are_fetched_once(
    s3: S3Location, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """Tars of small samples, which the scan reads through: each byte of the tars is
    fetched once (the shards are written from the scan's copies on local scratch), the
    export equals the local tars' export and the export that fetched the members again
    (2x the bytes). Members the scan hops over (``mixed``) are fetched by the shards."""
    tars = _small_tars(kind)
    total = sum(len(d) for d in tars.values())
    source = tars_here_and_on_s3(tars, tmp_path / "src", s3, f"once-{kind.replace(' ', '')}")
    shardex.export(str(tmp_path / "src"), tmp_path / "local", **OPTS)  # type: ignore[arg-type]
    s3.proxy.reset()
    shardex.export(source, tmp_path / "once", source_storage_options=s3.counted, **OPTS)  # type: ignore[arg-type]
    same_export(tmp_path / "local", tmp_path / "once", source)
    gets = s3.proxy.gets()
    once = sum(r.body_bytes for r in gets)
    if kind == "mixed":  # a ~100 KB member whose start a grown window fetched is read on
        # through; one hopped over from a fresh 4 KiB window has those bytes fetched again
        # by its shard (1.15x before the scan read on)
        assert total < once <= 1.02 * total
    else:
        fetched_once_each(gets, tars)
    s3.proxy.reset()  # the scan alone: no fetch of it is larger than a window
    list(TarSource(source, s3.counted).stream().batches)
    assert max(end - start for start, end in ranges_asked(s3.proxy.gets())) <= objecttars.MAX_WINDOW
    monkeypatch.setattr(objecttars, "KEEP_COPIES", False)  # the path before: no copies
    s3.proxy.reset()
    shardex.export(source, tmp_path / "twice", source_storage_options=s3.counted, **OPTS)  # type: ignore[arg-type]
    assert files_of(tmp_path / "twice") == files_of(tmp_path / "once")
    again = sum(r.body_bytes for r in s3.proxy.gets())
    # the tiny samples (their images and the headers between them), fetched again: 8%
    assert again > (once + 0.05 * total if kind == "mixed" else 1.5 * total)


def test_tars_whose_copies_do_not_fit_are_fetched_again_after_one_warning(
    s3: S3Location, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scratch folder without room for the tars' copies: one warning line naming the
    tar and the folder, then the members are fetched again; the same export."""
    tars = _small_tars("tiny")
    upload(ObjectStorage(s3.child("nocopy"), s3.direct), tars)
    source = s3.child("nocopy/")
    shardex.export(source, tmp_path / "copied", source_storage_options=s3.direct, **OPTS)  # type: ignore[arg-type]
    monkeypatch.setattr(objecttars, "COPY_RESERVE", 1 << 62)  # more than any disk holds
    s3.proxy.reset()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        shardex.export(source, tmp_path / "fetched", source_storage_options=s3.counted, **OPTS)  # type: ignore[arg-type]
    said = [w for w in caught if issubclass(w.category, RefetchWarning)]
    assert len(said) == 1, [str(w.message) for w in caught]
    message = str(said[0].message)
    assert "\n" not in message
    assert "no room for a copy of tar 's3://" in message
    assert "set TMPDIR" in message
    assert files_of(tmp_path / "fetched") == files_of(tmp_path / "copied")
    total = sum(len(d) for d in tars.values())
    assert sum(r.body_bytes for r in s3.proxy.gets()) > 1.5 * total  # the images again


@settings(max_examples=60, deadline=2000)
@given(
    puts=st.lists(st.tuples(st.integers(0, 300), st.integers(1, 80)), max_size=12),
    asks=st.lists(st.tuples(st.integers(0, 400), st.integers(1, 60)), max_size=12),
    before=st.integers(0, 400),
)
def test_a_tar_copy_holds_exactly_the_bytes_put(
    puts: list[tuple[int, int]], asks: list[tuple[int, int]], before: int
) -> None:
    """A copy says it holds a range only when every byte of it was put, and then holds
    those bytes; ranges forgotten are only those that end before the point given."""
    with tempfile.TemporaryDirectory() as folder:
        copies = objecttars.TarCopies(Path(folder))
        copy = copies.start("s3://b/t.tar", 400)
        assert copy is not None
        tar = bytes(i % 251 for i in range(400))
        held: set[int] = set()
        for start, length in puts:
            copy.put(start, tar[start : start + length])
            held.update(range(start, min(start + length, 400)))
        copy.used = True
        copy.forget(before)
        for offset, size in asks:
            whole = all(b in held for b in range(offset, offset + size)) and offset + size <= 400
            if offset >= before:
                assert copy.holds(offset, size) == whole, (offset, size)
            elif copy.holds(offset, size):
                assert whole
        copy.close()
        with open(copy.path, "rb") as f:
            kept = f.read()
        assert all(kept[b] == tar[b] for b in held)


def test_tars_scanned_by_a_runners_tasks_keep_no_copies(s3: S3Location, tmp_path: Path) -> None:
    """Within an export's copies, a scan in this process names its copies for the
    members it read; a scan by a runner's tasks (Ray's, on any node) names the objects
    only: no task's local file is named where another machine would read it."""
    from shardex.parallel import Runner
    from shardex.refs.members import Members

    upload(ObjectStorage(s3.child("norunner"), s3.direct), labelled_tars(2, 6))
    source = TarSource(s3.child("norunner/"), s3.direct)

    def paths(runner: Runner | None) -> set[str]:
        with objecttars.copies_kept(tmp_path / f"copies-{runner is None}"):
            stream = source.stream_on(runner)
            tables = [batch.table for batch in stream.batches]
        members = Members.of(pa.concat_tables(tables).column("_members"))
        return {name.split("://")[0] for name in members.path_names}

    here = paths(None)
    assert all(p.startswith(str(tmp_path / "copies-True")) for p in here), here
    with Runner(2) as runner:
        assert paths(runner) == {"s3"}


def test_the_parts_a_ray_tasks_scan_keeps_hold_exactly_the_members_it_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scan that a Ray task runs (``shardex.storage.fetch.held``) keeps, in parts, the bytes
    of the members it read whole, each once, at their tar offsets; parts fill to
    ``PART_BYTES`` (a small last part joins the one before); a tar with less than
    ``MIN_PART`` read through is not held; the samples are the plain scan's."""
    from shardex.sources.tar_scan import tar_scan_held
    from shardex.storage.fetch import held

    monkeypatch.setattr(held, "PART_BYTES", 64 << 10)
    monkeypatch.setattr(held, "MIN_PART", 16 << 10)

    def image(i: int) -> bytes:  # every 10th a ~100 KB image, hopped over or read on
        return noise_jpeg(i) if i % 10 == 5 else image_bytes(i)

    data = tar_of([(f"k{i:03d}", image(i), i % 3) for i in range(300)])
    (tmp_path / "a.tar").write_bytes(data)
    store = LocalStorage(tmp_path)
    tar = TarRef("a.tar", "a.tar", len(data), store, hold=True)
    *parts, last = list(tar_scan_held(tar))
    assert isinstance(last, tuple)
    _, samples, spans = last
    assert [s.members for s in samples] == [s.members for s in tar_samples(tar)]
    sizes = [len(part[1]) for part in parts]
    assert len(parts) >= 3
    assert all(n >= held.PART_BYTES for n in sizes[:-1])
    assert sizes[-1] >= held.MIN_PART
    kept: list[tuple[int, int]] = []
    for (index, part), (start, end) in zip(parts, spans, strict=True):
        assert (start, end) == (index[0, 0], index[-1, 0] + index[-1, 1])
        for offset, size, at in index.tolist():
            assert part[at : at + size].tobytes() == data[offset : offset + size]
            kept.append((offset, size))
    assert len(kept) == len(set(kept))  # none twice
    small = {(o, n) for s in samples for _, o, n, _ in s.members if n < 4096}
    assert small <= set(kept)  # every tiny image the scan read through
    images = {(o, n) for s in samples for _, o, n, _ in s.members}
    assert set(kept) <= images  # images only: no header, label or metadata
    few = tar_of([(f"k{i}", image_bytes(i), 0) for i in range(5)])
    (tmp_path / "few.tar").write_bytes(few)
    *none, (_, _, no_spans) = tar_scan_held(
        TarRef("few.tar", "few.tar", len(few), store, hold=True)
    )
    assert none == []
    assert no_spans == []
