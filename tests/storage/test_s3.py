"""Object storage against a real S3-compatible server on loopback (no mocks of the client).

Requests are counted by a transparent proxy between obstore and the server.
"""

from __future__ import annotations

import os
import pickle
import random
import signal
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import pytest

import shardex
from shardex.errors import ConfigError, NotAnExportError, StorageError
from shardex.sources import DemoSource
from shardex.storage import ObjectStorage
from shardex.storage.direct import STREAM_PIECE
from shardex.storage.paged import PAGE
from shardex.testing import StorageTests
from tests.support.interop import read_with_webdataset
from tests.support.proxy import RequestHead, RequestRecord
from tests.support.s3data import S3Location

FRACTIONS = {"train": 0.8, "val": 0.2}


class TestObjectStorage(StorageTests):
    @pytest.fixture
    def storage(self, s3: S3Location) -> ObjectStorage:
        return ObjectStorage(s3.url, s3.direct)


def _objects(storage: ObjectStorage) -> dict[str, bytes]:
    return {name: storage.get(name) for name in storage.list()}


def _local_files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def _export_s3(s3: S3Location, source: str = "demo:120", **kwargs: object) -> None:
    opts = {"split_fractions": FRACTIONS, "samples_per_shard": 25, "workers": 1, **kwargs}
    shardex.export(source, s3.url, storage_options=s3.direct, **opts)  # type: ignore[arg-type]


def test_export_to_s3_is_byte_identical_to_local(s3: S3Location, tmp_path: Path) -> None:
    opts = {"split_fractions": FRACTIONS, "samples_per_shard": 25, "workers": 2}
    shardex.export("demo:120", tmp_path / "local", **opts)  # type: ignore[arg-type]
    _export_s3(s3, workers=2)
    assert _objects(ObjectStorage(s3.url, s3.direct)) == _local_files(tmp_path / "local")
    for split in FRACTIONS:
        remote = shardex.open_dataset(s3.url, split=split, storage_options=s3.direct)
        local = shardex.open_dataset(tmp_path / "local", split=split)
        assert list(remote) == list(local)
        picks = random.Random(1).sample(range(len(local)), k=10)
        assert remote.get_many(picks) == local.get_many(picks)
        assert remote.metadata.equals(local.metadata)


def test_reads_cost_one_ranged_get_per_sample_and_no_list(s3: S3Location) -> None:
    _export_s3(s3)
    proxy = s3.proxy
    proxy.reset()
    prefix = s3.url.rpartition("/")[2] + "/"

    def mine() -> list[RequestRecord]:
        # this export's requests, whatever an earlier test's client still sends
        return [r for r in proxy.requests if r.key.startswith(prefix)]

    def seen() -> list[tuple[object, ...]]:
        return [(r.method, r.key, r.range, r.status, r.fault) for r in proxy.requests]

    ds = shardex.open_dataset(s3.url, split="train", storage_options=s3.counted)
    proxy.wait_idle()
    opened = [r.key.removeprefix(prefix) for r in mine()]
    assert opened == ["config.yaml", "train/index-samples.npy"], seen()
    assert proxy.lists() == []
    assert mine()[1].range is not None  # the index's first page, not all of it
    proxy.reset()
    ds[0]  # the first read also fetches the first page of index-members.npy, once
    proxy.wait_idle()
    assert mine()[0].key.endswith("/index-members.npy"), seen()
    assert [r.range is None for r in mine()] == [False, False], seen()
    for i in random.Random(0).sample(range(len(ds)), k=15):
        proxy.reset()
        sample = ds[i]
        proxy.wait_idle()
        (request,) = mine()
        offset, _checksum, _shard, length = ds.index.record(i)  # type: ignore[attr-defined]
        assert request.method == "GET"
        assert request.range == f"bytes={offset}-{offset + length - 1}"
        assert request.body_bytes <= length + 1024
        assert len([k for k in sample if k != "__key__"]) == 3  # image, cls, json
    key = ds[3]["__key__"]
    ds.get(key)  # the first lookup fetches the key table once
    proxy.reset()
    assert ds.get(ds[7]["__key__"])["__key__"] != key
    proxy.wait_idle()
    assert [r.method for r in mine()] == ["GET", "GET"], seen()  # ds[7], get: ranged GETs
    assert proxy.lists() == []
    proxy.reset()
    shardex.open_dataset(s3.url, split="train", storage_options=s3.counted)
    proxy.wait_idle()
    assert [r.key for r in mine()] == [prefix + "config.yaml"], seen()  # the index is cached


def test_a_cold_open_and_one_read_fetch_pages_of_the_index_not_all_of_it(
    s3: S3Location, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """20,000 samples (1.3 MB of index): opening with an empty cache and reading one
    sample fetches at most 256 KiB, every index request a page; the node's next process
    reads what the first one fetched; reads stay exact."""
    monkeypatch.setenv("SHARDEX_CACHE_DIR", str(tmp_path / "cache"))
    n = 20_000
    data = {"key": [f"s{i:05d}" for i in range(n)], "txt": [b"%d" % i for i in range(n)]}
    shardex.export(data, s3.url, storage_options=s3.direct, samples_per_shard=5000)
    proxy = s3.proxy
    proxy.reset()
    ds = shardex.open_dataset(s3.url, storage_options=s3.counted)
    assert ds[12_345]["txt"] == b"12345"
    proxy.wait_idle()
    index = [r for r in proxy.requests if "/index-" in r.key]
    assert sum(r.body_bytes for r in proxy.requests) <= 256 << 10, proxy.requests
    assert index
    assert all(r.range is not None and r.body_bytes <= PAGE for r in index)
    picks = random.Random(3).sample(range(n), k=200)
    assert [s["txt"] for s in ds.get_many(picks)] == [b"%d" % i for i in picks]
    assert ds.get("s00042")["txt"] == b"42"
    proxy.reset()
    script = (
        "import sys, json, shardex; ds = shardex.open_dataset(sys.argv[1], "
        "storage_options=json.loads(sys.argv[2])); print(ds[12345]['txt'].decode())"
    )
    import json

    out = subprocess.run(
        [sys.executable, "-c", script, s3.url, json.dumps(s3.counted)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ},
    )
    assert out.stdout.strip() == "12345"
    proxy.wait_idle()
    fetched = [r.key.rpartition("/")[2] for r in proxy.requests]
    assert not [k for k in fetched if k.startswith("index-")], fetched  # the node's pages


def test_iteration_streams_each_shard_with_one_get(s3: S3Location, tmp_path: Path) -> None:
    _export_s3(s3)
    ds = shardex.open_dataset(s3.url, split="train", storage_options=s3.counted)
    ds.stream_chunk_size = 1000  # type: ignore[attr-defined]  # many chunks per shard
    ds[0]  # the first read fetches index-members.npy (once per process)
    s3.proxy.reset()
    samples = list(ds)
    s3.proxy.wait_idle()
    shards = shardex.read_config(ObjectStorage(s3.url, s3.direct)).splits["train"].shards
    assert [r.method for r in s3.proxy.requests] == ["GET"] * len(shards)
    assert all(r.range is None for r in s3.proxy.requests)
    assert samples == [ds[i] for i in range(len(ds))]


def test_iteration_asks_for_the_next_shard_while_one_is_read(s3: S3Location) -> None:
    """The GET of shard k+1 is sent when shard k is handed over, so the server's time to
    first byte passes while the caller works on shard k; a pass still makes one GET a
    shard, and an iteration stopped early sends nothing more."""
    _export_s3(s3, samples_per_shard=10)  # train: 96 samples, 10 shards
    ds = shardex.open_dataset(s3.url, split="train", storage_options=s3.counted)
    ds[0]  # the first read fetches index-members.npy (once per process)
    shards = shardex.read_config(ObjectStorage(s3.url, s3.direct)).splits["train"].shards
    names = [s.path.rpartition("/")[2] for s in shards]
    first = ds[0]
    s3.proxy.reset()
    samples = iter(ds)
    assert next(samples) == first
    deadline = time.monotonic() + 10  # shard 1's GET is sent by a thread: under load, later
    while len(s3.proxy.gets()) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    s3.proxy.wait_idle()
    # shard 0 read, and shard 1's request already sent
    assert sorted(r.key.rpartition("/")[2] for r in s3.proxy.gets()) == sorted(names[:2])
    samples.close()
    time.sleep(0.2)
    s3.proxy.wait_idle()
    assert len(s3.proxy.gets()) == 2
    s3.proxy.reset()
    assert list(ds) == [ds[i] for i in range(len(ds))]
    s3.proxy.wait_idle()
    gets = [r for r in s3.proxy.gets() if r.range is None]  # (ds[i] makes ranged GETs)
    assert sorted(r.key.rpartition("/")[2] for r in gets) == sorted(names)  # one GET a shard


def test_a_stream_of_views_is_the_object_in_one_get(s3: S3Location) -> None:
    data = os.urandom(300_000)
    ObjectStorage(s3.url, s3.direct).put("blob", data)
    storage = ObjectStorage(s3.url, s3.counted)
    s3.proxy.reset()
    views = list(storage.iter_views("blob", 64 << 10))
    assert all(isinstance(v, memoryview) and v.readonly for v in views)
    assert b"".join(views) == data == b"".join(storage.iter_chunks("blob", 64 << 10))
    s3.proxy.wait_idle()
    assert [(r.method, r.range) for r in s3.proxy.requests] == [("GET", None)] * 2


def test_a_stream_holds_small_chunks_in_one_get(s3: S3Location) -> None:
    """Streams (iteration, verify, tar sources) hold chunks of about STREAM_PIECE, not
    the 4 MiB asked for: what a reader holds at once, and cheaper to copy."""
    data = os.urandom(3 << 20)
    ObjectStorage(s3.url, s3.direct).put("blob", data)
    storage = ObjectStorage(s3.url, s3.counted)
    s3.proxy.reset()
    chunks = list(storage.iter_chunks("blob"))  # asks for 4 MiB chunks
    views = list(storage.iter_views("blob"))
    assert b"".join(chunks) == b"".join(views) == data
    sizes = [len(c) for c in chunks[:-1]] + [len(v) for v in views[:-1]]
    assert len(sizes) >= 2
    assert all(STREAM_PIECE <= n < 2 << 20 for n in sizes)
    s3.proxy.wait_idle()
    assert [(r.method, r.range) for r in s3.proxy.requests] == [("GET", None)] * 2


def test_a_stalled_request_of_a_batch_is_hedged_on_the_server(s3: S3Location) -> None:
    """The proxy holds one sample's GET for 8 s: the batch answers long before, with the
    same samples, through a second GET of the same range; hedges are counted."""
    from shardex.storage.batch import read_stats

    _export_s3(s3)
    hedged_options = {**s3.counted, "hedge": True}
    ds = shardex.open_dataset(s3.url, split="train", storage_options=hedged_options)
    want = shardex.open_dataset(s3.url, split="train", storage_options=s3.direct)
    rng = random.Random(4)
    read_stats.reset(latencies=True)
    while len(read_stats.latencies) < 128:  # latencies seen: a threshold to hedge at
        ds.get_many(rng.sample(range(len(ds)), 20))
    picks = rng.sample(range(len(ds)), 20)
    offset, _, shard, _ = ds.index.record(picks[7])  # type: ignore[attr-defined]
    path = shardex.read_config(ObjectStorage(s3.url, s3.direct)).splits["train"].shards[shard].path

    def stalled(head: RequestHead | RequestRecord) -> bool:  # the GET holding that sample
        if head.range is None or not head.path.endswith(path):
            return False
        first, last = (int(x) for x in head.range.removeprefix("bytes=").split("-"))
        return first <= offset <= last

    s3.proxy.reset()
    s3.proxy.delay_next(1, 8, when=stalled)
    hedged, won = read_stats.hedged, read_stats.hedges_won  # (the warm-up's count too:
    began = time.monotonic()  # the budget is 5% of every request sent)
    try:
        assert ds.get_many(picks) == want.get_many(picks)
        assert time.monotonic() - began < 6
    finally:
        s3.proxy.clear_faults()
    assert read_stats.hedged > hedged
    assert read_stats.hedges_won > won
    assert s3.proxy.wait_idle(30)  # the held GET answered too: nothing left for later tests
    read_stats.reset(latencies=True)  # nor a threshold this warm-up set
    assert len([r for r in s3.proxy.requests if stalled(r)]) == 2


def test_get_many_runs_bounded_ranged_gets(s3: S3Location) -> None:
    _export_s3(s3)
    # requests counted exactly: no hedge (test_batch.py and the test above cover those)
    options = {**s3.counted, "hedge": False}
    ds = shardex.open_dataset(s3.url, split="train", storage_options=options)
    picks = random.Random(5).sample(range(len(ds)), k=20)
    ds[0]  # the first read fetches index-members.npy (once per process)
    s3.proxy.reset()
    batch = ds.get_many(picks, coalesce_gap=0)
    s3.proxy.wait_idle()
    gets = s3.proxy.requests
    assert [s["__key__"] for s in batch] == [ds[i]["__key__"] for i in picks]
    assert {r.method for r in gets} == {"GET"}
    wanted = sum(ds.index.record(i)[3] for i in picks)  # type: ignore[attr-defined]
    assert 1 <= len(gets) <= len(picks)
    assert sum(r.body_bytes for r in gets) == wanted  # gap 0 merges only touching samples


def test_stock_webdataset_streams_s3_shards(s3: S3Location) -> None:
    _export_s3(s3)
    storage = ObjectStorage(s3.url, s3.direct)
    config = shardex.read_config(storage)
    fetch = "import sys, urllib.request; sys.stdout.buffer.write(urllib.request.urlopen(sys.argv[1]).read())"
    urls = [
        f"pipe:{sys.executable} -c '{fetch}' '{storage.presign(s.path)}'"
        for s in config.splits["train"].shards
    ]
    ours = list(shardex.open_dataset(storage, split="train"))
    assert read_with_webdataset(urls) == ours


def test_interrupted_export_resumes_to_identical_bytes(s3: S3Location) -> None:
    DemoSource(300).scan()  # draw the demo images before timing anything
    script = (
        "import shardex, sys, json; shardex.export('demo:300', sys.argv[1], "
        "storage_options=json.loads(sys.argv[2]), samples_per_shard=10, workers=1, "
        "split_fractions={'train': 0.8, 'val': 0.2}, mode=sys.argv[3])"
    )
    import json

    s3.proxy.delay_next(10_000, 0.05, when=lambda head: head.method == "PUT")
    env = {**os.environ, "SHARDEX_LOCK_LEASE": "2"}  # the killed writer's lease: 2 s
    child = subprocess.Popen(
        [sys.executable, "-c", script, s3.url, json.dumps(s3.counted), "error"], env=env
    )
    storage = ObjectStorage(s3.url, s3.direct)
    deadline = time.monotonic() + 60
    while sum(n.endswith(".tar") for n in storage.list()) < 6:
        assert child.poll() is None, "the export finished before it could be interrupted"
        assert time.monotonic() < deadline
        time.sleep(0.05)
    child.send_signal(signal.SIGKILL)
    child.wait()
    s3.proxy.clear_faults()
    left = list(storage.list())
    assert "config.yaml" not in left
    with pytest.raises(NotAnExportError):
        shardex.open_dataset(storage, split="train")
    kept = {n for n in left if n.endswith(".tar")}
    time.sleep(2.5)  # until the killed writer's lease expires
    s3.proxy.reset()
    subprocess.run(
        [sys.executable, "-c", script, s3.url, json.dumps(s3.counted), "resume"],
        check=True,
        env=env,
    )
    s3.proxy.wait_idle()
    uploaded = {
        r.key.split("/", 1)[1]
        for r in s3.proxy.requests
        if r.method == "PUT" and r.key.endswith(".tar")
    }
    assert uploaded.isdisjoint(kept - {max(kept)})  # complete shards were not sent again
    clean = f"{s3.url}-clean"
    shardex.export(
        "demo:300",
        clean,
        storage_options=s3.direct,
        samples_per_shard=10,
        workers=1,
        split_fractions={"train": 0.8, "val": 0.2},
    )
    assert _objects(storage) == _objects(ObjectStorage(clean, s3.direct))


def test_errors_name_the_object_and_hide_secrets(s3: S3Location) -> None:
    with pytest.raises(NotAnExportError, match=r"config\.yaml"):
        shardex.open_dataset(s3.child("nothing"), storage_options=s3.direct)
    _export_s3(s3)
    wrong = {**s3.direct, "secret_access_key": "not-the-secret-123"}
    with pytest.raises(StorageError) as info:
        shardex.open_dataset(s3.url, split="train", storage_options=wrong)
    assert "config.yaml" in str(info.value)
    assert "not-the-secret-123" not in str(info.value)
    assert "not-the-secret-123" not in repr(ObjectStorage(s3.url, wrong))


def test_server_errors_are_retried(s3: S3Location) -> None:
    _export_s3(s3)
    ds = shardex.open_dataset(s3.url, split="val", storage_options=s3.counted)
    expected = ds[0]
    s3.proxy.reset()
    s3.proxy.fail_next(2, status=503)
    assert ds[0] == expected
    s3.proxy.wait_idle()
    assert [r.status for r in s3.proxy.requests] == [503, 503, 206]


def test_a_multipart_upload_whose_completion_fails_is_aborted(s3: S3Location) -> None:
    """A writer whose last request (completing the upload) is refused raises, and the
    upload's parts are aborted (by obstore's writer as its close fails): nothing is
    visible and no part is left billed."""
    storage = ObjectStorage(s3.url, s3.counted)
    writer = storage.open_writer("big.bin")
    writer.write(b"x" * (9 << 20))  # past one part: a multipart upload
    # the completion (the upload's creation is a POST too, without an uploadId)
    s3.proxy.fail_next(
        1, status=400, when=lambda head: head.method == "POST" and "uploadId" in head.query
    )
    with pytest.raises(StorageError, match=r"big\.bin"):
        writer.commit()
    s3.proxy.wait_idle()
    aborts = [r for r in s3.proxy.requests if r.method == "DELETE" and "uploadId" in r.query]
    assert aborts, [(r.method, r.path, r.query, r.status) for r in s3.proxy.requests]
    assert not storage.exists("big.bin")


def _read_in_child(ds: shardex.Dataset) -> str:
    try:
        return str(ds[0]["__key__"])
    except StorageError as exc:
        return f"error: {exc}"


def _in_forked_child(ds: shardex.Dataset) -> str:
    """What ds[0] gives in a child forked now (an alarm turns a hang into an answer)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGALRM, signal.SIG_DFL)  # not the test runner's handler
        signal.alarm(20)
        os.write(write, _read_in_child(ds).encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    answer = os.read(read, 4096).decode()
    os.close(read)
    return answer or "hang"


def test_dataloader_style_workers_fork_or_spawn(s3: S3Location) -> None:
    import multiprocessing

    _export_s3(s3)
    ds = shardex.open_dataset(s3.url, split="val", storage_options=s3.direct)
    key = ds[0]["__key__"]  # the parent has read: its children cannot use obstore
    assert _in_forked_child(ds) == key
    assert ds[1]["__key__"] != key  # and the parent still reads after the fork
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        assert pool.map(_read_in_child, [pickle.loads(pickle.dumps(ds))] * 2) == [key, key]


def _forked_child_work(ds: shardex.Dataset, storage: ObjectStorage) -> str:
    """In a forked child: threads of ds[i], stopped and whole iterations, a write."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as pool:  # each thread has its own connection to the helper
        by_threads = list(pool.map(ds.__getitem__, range(len(ds))))
    for _ in range(3):  # iterations stopped early must not wedge the helper
        it = iter(ds)
        next(it)
        it.close()  # type: ignore[attr-defined]
    with storage.open_writer("from-child") as writer:
        writer.write(b"written by a forked child")
    assert by_threads == list(ds)
    return f"{type(storage._io).__name__} {len(by_threads)}"


def test_forked_child_of_a_reading_process_uses_a_helper(s3: S3Location) -> None:
    _export_s3(s3)
    ds = shardex.open_dataset(s3.url, split="train", storage_options=s3.direct)
    storage = ObjectStorage(s3.url, s3.direct)
    assert ds[0]
    assert storage.exists("config.yaml")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGALRM, signal.SIG_DFL)  # not the test runner's handler
        signal.alarm(60)  # a hang becomes an answer
        try:
            answer = _forked_child_work(ds, storage)
        except BaseException as exc:
            answer = f"error: {type(exc).__name__}: {exc}"
        os.write(write, answer.encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    answer = os.read(read, 4096).decode()
    os.close(read)
    assert answer == f"HelperObjectStorage {len(ds)}"
    assert storage.get("from-child") == b"written by a forked child"
    assert type(storage._io).__name__ == "DirectObjectStorage"  # this process: direct


def test_cli_reads_and_writes_s3(s3: S3Location, monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from shardex.cli import main

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3.server.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3.server.secret_key)
    flags = ["--s3-endpoint-url", s3.server.endpoint, "--s3-region", s3.server.region]
    runner = CliRunner()
    result = runner.invoke(main, ["export-dataset", "demo:40", "-o", s3.url, "-q", *flags])
    assert result.exit_code == 0, result.output
    result = runner.invoke(main, ["inspect", s3.url, *flags])
    assert result.exit_code == 0, result.output
    assert "40 samples" in result.output
    result = runner.invoke(main, ["get", s3.url, "circle/000000", *flags])
    assert result.exit_code == 0, result.output
    assert "cls: 1 bytes 0" in result.output
    assert s3.server.secret_key not in result.output


def test_storage_docs_example_runs(s3: S3Location) -> None:
    import re

    text = (Path(__file__).parents[2] / "docs" / "storage.md").read_text()
    (code,) = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    code = code.replace("http://127.0.0.1:8333", s3.server.endpoint).replace(
        "s3://my-bucket/exports/demo", s3.url
    )
    scope: dict[str, object] = {}
    exec(compile(code, "docs/storage.md", "exec"), scope)
    assert len(scope["batch"]) == 22  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "backend", ["numpy", "numpy_mmap", "torch", "tensor_shards", "tensordict_memmap", "zarr"]
)
def test_array_backends_write_and_read_object_storage(
    backend: str, s3: S3Location, tmp_path: Path
) -> None:
    if backend == "torch":
        pytest.importorskip("torch")
    if backend == "tensordict_memmap":
        pytest.importorskip("tensordict")
    shardex.export("demo:30", tmp_path / "local", backend=backend, samples_per_shard=8, workers=1)
    url = s3.child(backend)
    shardex.export(
        "demo:30", url, backend=backend, samples_per_shard=8, workers=1, storage_options=s3.direct
    )
    remote = shardex.open_dataset(url, storage_options=s3.direct)
    local = shardex.open_dataset(tmp_path / "local")
    assert list(remote) == list(local)
    assert remote.get(local[5]["__key__"]) == local[5]
    assert shardex.verify(url, storage_options=s3.direct).ok


@pytest.mark.parametrize(
    "backend", ["numpy", "numpy_mmap", "tensordict_memmap", "torch", "tensor_shards"]
)
def test_inspect_prints_no_local_only_call_for_object_storage(
    backend: str, s3: S3Location, monkeypatch: pytest.MonkeyPatch
) -> None:
    """numpy, torch and tensordict read local files: a printed ``load_memmap('s3://...')``
    would fail as written, so ``shardex inspect`` prints none for an export on object
    storage."""
    pytest.importorskip("tensordict")
    from click.testing import CliRunner

    from shardex.cli import main

    url = s3.child(backend)
    shardex.export("demo:6", url, backend=backend, workers=1, storage_options=s3.direct)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3.server.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3.server.secret_key)
    flags = ["--s3-endpoint-url", s3.server.endpoint, "--s3-region", s3.server.region]
    result = CliRunner().invoke(main, ["inspect", url, *flags])
    assert result.exit_code == 0, result.output
    assert f"backend {backend}" in result.output
    assert "s3://" not in result.output.partition("without shardex:")[2]


def test_tensordict_on_object_storage_is_downloaded_once_and_checked(
    s3: S3Location, tmp_path: Path, cache_dir: Path
) -> None:
    """Written staged and uploaded; read from one checked download in the cache, shared
    by later opens; a damaged object is refused, never mapped."""
    tensordict = pytest.importorskip("tensordict")
    from shardex.errors import ChecksumError

    url = s3.child("td")
    config = shardex.export(
        "demo:12", url, backend="tensordict_memmap", workers=1, storage_options=s3.counted
    )
    (shard,) = config.split("train").shards
    storage = ObjectStorage(url, s3.direct)
    uploaded = sorted(storage.list(f"{shard.path}/"))
    assert f"{shard.path}/meta.json" in uploaded
    assert not list(
        Path(tempfile.gettempdir()).glob("shardex-export-*-tensordict-*")
    )  # staging gone
    copies = cache_dir / "tensordict"
    before = set(copies.iterdir()) if copies.is_dir() else set()
    first = list(shardex.open_dataset(url, storage_options=s3.counted))
    s3.proxy.reset()
    again = list(shardex.open_dataset(url, storage_options=s3.counted))
    assert again == first
    # only config.yaml, the key table and metadata are read again: no array file
    assert not [r.key for r in s3.proxy.gets() if f"/{shard.path}/" in r.key]
    (copy,) = set(copies.iterdir()) - before
    assert tensordict.TensorDict.load_memmap(copy)["label__label"].tolist() == [
        int(s["cls"]) for s in first
    ]
    # the same bytes under another name: a new export at another URL is a new download
    victim = f"{shard.path}/label__label.memmap"
    data = bytearray(storage.get(victim))
    data[0] ^= 1
    other = s3.child("td2")
    shardex.export(
        "demo:12", other, backend="tensordict_memmap", workers=1, storage_options=s3.direct
    )
    damaged = ObjectStorage(other, s3.direct)
    damaged.put(victim, bytes(data))
    with pytest.raises(ChecksumError, match="differs"):
        shardex.open_dataset(other, storage_options=s3.direct)[0]


def test_a_forked_childs_helper_exits_when_the_child_is_killed(s3: S3Location) -> None:
    import json

    storage = ObjectStorage(s3.url, s3.direct)
    storage.put("blob", b"x")
    # A program whose forked child starts a helper, reports both pids, then waits.
    code = (
        "import json, os, sys, time\n"
        "from shardex.storage import ObjectStorage\n"
        "from shardex.storage import helper\n"
        "storage = ObjectStorage(sys.argv[1], json.loads(sys.argv[2]))\n"
        "storage.get('blob')\n"
        "if os.fork() == 0:\n"
        "    storage.get('blob')\n"
        "    print(os.getpid(), helper._helper()._proc.pid, flush=True)\n"
        "    time.sleep(60)\n"
        "    os._exit(0)\n"
        "time.sleep(60)\n"
    )
    with subprocess.Popen(
        [sys.executable, "-c", code, s3.url, json.dumps(s3.direct)],
        stdout=subprocess.PIPE,
        text=True,
    ) as program:
        try:
            assert program.stdout is not None
            child, helper_pid = map(int, program.stdout.readline().split())
            assert _alive(helper_pid)
            os.kill(child, signal.SIGKILL)
            deadline = time.monotonic() + 15
            while _alive(helper_pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert not _alive(helper_pid)
        finally:
            program.kill()


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not count: it has exited)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_exported_dataset_takes_the_cli_s3_keywords(s3: S3Location) -> None:
    shardex.export("demo:6", s3.url, storage_options=s3.direct, workers=1)
    keys = {k: v for k, v in s3.direct.items() if k not in ("endpoint_url", "region")}
    ds = shardex.ExportedDataset(
        s3.url,
        label_keys=("label",),
        storage_options=keys,
        s3_endpoint_url=s3.direct["endpoint_url"],
        s3_region=s3.direct["region"],
    )
    assert len(ds) == 6
    assert ds[0]["key"] == shardex.open_dataset(s3.url, storage_options=s3.direct)[0]["__key__"]
    assert "secret" not in repr(ds)


def _without_aws_env() -> dict[str, str]:
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("AWS_") or k == "AWS_METADATA_ENDPOINT"
    }


# boto3 made unimportable, as after `pip install 'shardex[s3]'`, which does not install it
_NO_BOTO3 = "import sys; sys.modules['boto3'] = None; from shardex.cli import main; main()"


def test_s3_profile_reads_the_aws_files_without_boto3(s3: S3Location, tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".aws").mkdir(parents=True)
    (home / ".aws" / "credentials").write_text(
        f"[other]\naws_access_key_id = wrong\naws_secret_access_key = wrong\n\n"
        f"[curator]\naws_access_key_id = {s3.server.access_key}\n"
        f"aws_secret_access_key = {s3.server.secret_key}\n"
    )
    (home / ".aws" / "config").write_text(
        f"[profile curator]\nregion = {s3.server.region}\nendpoint_url = {s3.server.endpoint}\n"
        f"[profile other]\nregion = {s3.server.region}\nendpoint_url = {s3.server.endpoint}\n"
    )
    env = {**_without_aws_env(), "HOME": str(home)}

    def cli(*args: str, extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", _NO_BOTO3, *args],
            env={**env, **(extra or {})},
            capture_output=True,
            text=True,
            timeout=120,
        )

    done = cli("export-dataset", "demo:6", "-o", s3.url, "-q", "--s3-profile", "curator")
    assert done.returncode == 0, done.stderr
    assert len(shardex.open_dataset(s3.url, storage_options=s3.direct)) == 6
    # AWS_SHARED_CREDENTIALS_FILE and AWS_CONFIG_FILE are honoured in place of ~/.aws
    moved = tmp_path / "moved"
    (home / ".aws").rename(moved)
    files = {
        "AWS_SHARED_CREDENTIALS_FILE": str(moved / "credentials"),
        "AWS_CONFIG_FILE": str(moved / "config"),
    }
    done = cli("inspect", s3.url, "--s3-profile", "curator", extra=files)
    assert done.returncode == 0, done.stderr
    assert "6 samples" in done.stdout
    done = cli("inspect", s3.url, "--s3-profile", "other", extra=files)
    assert done.returncode == 1
    assert s3.server.secret_key not in done.stderr
    done = cli("inspect", s3.url, "--s3-profile", "nobody", extra=files)
    assert done.returncode == 1
    assert done.stderr.startswith("error: ")
    assert "no AWS profile 'nobody' in " in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_aws_profile_in_the_environment_does_not_replace_keys_given(
    s3: S3Location, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # as for the AWS CLI, keys beat AWS_PROFILE: a shell with AWS_PROFILE set must not
    # swap the credentials a user passed (here for the wrong ones) behind their back
    credentials = tmp_path / "credentials"
    credentials.write_text("[other]\naws_access_key_id = wrong\naws_secret_access_key = wrong\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_PROFILE", "other")
    shardex.export(DemoSource(4), s3.url, storage_options=s3.direct, workers=1)
    assert len(shardex.open_dataset(s3.url, storage_options=s3.direct)) == 4
    # keys from the variables win over AWS_PROFILE too
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3.server.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3.server.secret_key)
    env_only = {k: v for k, v in s3.direct.items() if "key" not in k}
    assert len(shardex.open_dataset(s3.url, storage_options=env_only)) == 4


def test_s3_profile_files_set_after_workers_started_reach_the_workers(
    s3: S3Location, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a notebook: one export starts the worker processes, then AWS_* file variables are
    # set; the workers (whose environment is older) must write with that profile too
    from helpers import make_tree

    make_tree(tmp_path / "src", [f"c{i % 2}/{i:03d}.jpg" for i in range(24)])
    shardex.export(tmp_path / "src", tmp_path / "local", workers=2, samples_per_shard=4)
    files = tmp_path / "aws"
    files.mkdir()
    (files / "credentials").write_text(
        f"[curator]\naws_access_key_id = {s3.server.access_key}\n"
        f"aws_secret_access_key = {s3.server.secret_key}\n"
    )
    (files / "config").write_text(
        f"[profile curator]\nregion = {s3.server.region}\nendpoint_url = {s3.server.endpoint}\n"
    )
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(files / "credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(files / "config"))
    done = shardex.export(
        tmp_path / "src",
        s3.url,
        workers=2,
        samples_per_shard=4,
        storage_options={"profile": "curator"},
    )
    assert done.num_samples == 24
    assert len(shardex.open_dataset(s3.url, storage_options=s3.direct)) == 24


def test_coalesce_gap_chooses_bytes_or_requests(s3: S3Location) -> None:
    _export_s3(s3)
    every_other = list(range(0, 24, 2))  # one shard of 25, a sample's gap between each
    seen = {}
    for gap in (0, "1MiB"):
        options = {**s3.counted, "coalesce_gap": gap, "hedge": False}  # counted exactly
        ds = shardex.open_dataset(s3.url, split="train", storage_options=options)
        ds[1]  # index files fetched
        s3.proxy.reset()
        batch = ds.get_many(every_other)
        s3.proxy.wait_idle()
        seen[gap] = (len(s3.proxy.gets()), sum(r.body_bytes for r in s3.proxy.gets()))
        assert [s["__key__"] for s in batch] == [ds[i]["__key__"] for i in every_other]
        from shardex.torch import MapDataset

        items = MapDataset(s3.url, "train", decode=False, storage_options=options)
        items[1]
        s3.proxy.reset()
        assert [s["__key__"] for s in items.__getitems__(every_other)] == [
            s["__key__"] for s in batch
        ]
        s3.proxy.wait_idle()
        assert len(s3.proxy.gets()) == seen[gap][0]
    wanted = sum(ds.index.record(i)[3] for i in every_other)  # type: ignore[attr-defined]
    assert seen[0] == (len(every_other), wanted)  # only the samples' bytes
    assert seen["1MiB"][0] == 1  # one request, the gaps fetched too
    assert seen["1MiB"][1] > wanted
    with pytest.raises(ConfigError, match="'coalesce_gap' must be a size in bytes"):
        shardex.open_dataset(s3.url, storage_options={**s3.direct, "coalesce_gap": "lots"})


@pytest.mark.parametrize("name", ["COALESCE_GAP", "aws_coalesce_gap"])
def test_shardex_options_take_every_spelling_of_their_name(s3: S3Location, name: str) -> None:
    # AWS_REGION, aws_region and region are one setting: so are shardex's own options
    _export_s3(s3)
    every_other = list(range(0, 24, 2))
    options = {**s3.counted, name: 0, "hedge": False}  # requests counted exactly
    ds = shardex.open_dataset(s3.url, split="train", storage_options=options)
    assert ds.storage.coalesce_gap == 0
    ds[1]  # index files fetched
    s3.proxy.reset()
    assert [s["__key__"] for s in ds.get_many(every_other)] == [
        ds[i]["__key__"] for i in every_other
    ]
    s3.proxy.wait_idle()
    assert len(s3.proxy.gets()) == 2 * len(every_other)  # get_many's, then ds[i]'s
    storage = ObjectStorage(s3.url, {**s3.direct, "AWS_RETRY_TIMEOUT": "3s"})
    assert storage.retry_timeout == timedelta(seconds=3)


def test_proxy_latency_holds_every_request(s3: S3Location) -> None:
    storage = ObjectStorage(s3.url, s3.counted)
    storage.put("a.bin", b"x" * 10)
    s3.proxy.reset()
    s3.proxy.latency = 0.2
    try:
        start = time.perf_counter()
        for _ in range(3):
            assert storage.get("a.bin") == b"x" * 10
        took = time.perf_counter() - start
    finally:
        s3.proxy.latency = 0.0
    assert len(s3.proxy.gets()) == 3
    assert took >= 3 * 0.2
