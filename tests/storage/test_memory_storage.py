"""The in-memory storage (``memory://``) and the fault-injecting wrapper of the tests."""

from __future__ import annotations

import pickle
import subprocess
import sys
import time
from pathlib import Path

import pytest

import shardex
from helpers import image_bytes
from shardex.errors import ConfigError, ObjectNotFoundError, StorageError
from shardex.storage import open_storage
from shardex.storage.memory import MemoryStorage
from shardex.testing import StorageTests
from tests.support.faults import FaultyStorage


class TestMemoryStorage(StorageTests):
    @pytest.fixture
    def storage(self, memory_storage: MemoryStorage) -> MemoryStorage:
        return memory_storage


class TestFaultyStorage(StorageTests):
    """With no rule, the wrapper is the storage it wraps."""

    @pytest.fixture
    def storage(self, memory_storage: MemoryStorage) -> FaultyStorage:
        return FaultyStorage(memory_storage)


def test_urls_of_one_name_share_its_objects(memory_storage: MemoryStorage) -> None:
    assert open_storage(memory_storage.uri) is not memory_storage
    open_storage(f"{memory_storage.uri}/sub/").put("a.bin", b"a")
    assert list(memory_storage.list()) == ["sub/a.bin"]
    assert open_storage(memory_storage.uri).get("sub/a.bin") == b"a"
    assert memory_storage.join("x") == f"{memory_storage.uri}/x"
    with pytest.raises(ObjectNotFoundError, match=f"{memory_storage.uri}/sub/b.bin does not"):
        open_storage(f"{memory_storage.uri}/sub").get("b.bin")


@pytest.mark.parametrize("url", ["memory://", "memory:///x", "s3://b/x"])
def test_urls_without_a_name_are_refused(url: str) -> None:
    with pytest.raises(ConfigError, match="is not a memory://NAME"):
        MemoryStorage(url)


def test_storage_options_are_taken_and_ignored(
    memory_storage: MemoryStorage, tmp_path: Path
) -> None:
    """An export hands its output's storage options to a source that has none of its own
    (here a local output's, which ignores them too)."""
    memory_storage.put("c0/a.jpg", image_bytes(0))
    memory_storage.put("c1/b.jpg", image_bytes(1))
    assert open_storage(memory_storage.uri, {"region": "x"}).get("c0/a.jpg") == image_bytes(0)
    out = tmp_path / "out"
    config = shardex.export(memory_storage.uri, out, workers=1, storage_options={"region": "x"})
    assert config.label_names == ("c0", "c1")


def test_listing_pages_hold_page_size_entries(memory_storage: MemoryStorage) -> None:
    memory_storage.page_size = 3
    for i in range(7):
        memory_storage.put(f"f/{i}", bytes(i))
    pages = list(memory_storage.list_pages("f"))
    assert [len(page) for page in pages] == [3, 3, 1]
    assert [entry for page in pages for entry in page] == [(f"f/{i}", i) for i in range(7)]
    assert [len(page) for page in memory_storage.list_pages("f", after="f/3")] == [3]


_CHILD = """
import pickle, sys
storage = pickle.loads(sys.stdin.buffer.read())
print(storage.get("a.bin").decode())
try:
    storage.put("b.bin", b"lost")
except Exception as exc:
    print(type(exc).__name__, exc)
"""


def test_another_process_reads_a_copy_and_writes_nothing(memory_storage: MemoryStorage) -> None:
    memory_storage.put("a.bin", b"here")
    child = subprocess.run(
        [sys.executable, "-c", _CHILD],
        input=pickle.dumps(memory_storage),
        capture_output=True,
        check=True,
        timeout=60,
    )
    read, refused = child.stdout.decode().splitlines()
    assert read == "here"
    assert refused.startswith(f"StorageError cannot write {memory_storage.uri}/b.bin: ")
    assert "export with workers=1" in refused
    here = pickle.loads(pickle.dumps(memory_storage))
    assert here._bucket is memory_storage._bucket  # in this process: the same objects


def test_an_export_round_trips_and_its_workers_cannot_write(
    memory_storage: MemoryStorage,
) -> None:
    config = shardex.export("demo:12", memory_storage.uri, samples_per_shard=5, workers=1)
    ds = shardex.open_dataset(memory_storage.uri)
    assert len(ds) == config.num_samples == 12
    assert ds.storage.local_path("config.yaml") is None
    assert shardex.verify(memory_storage.uri).ok
    with pytest.raises(StorageError, match="written only by the process that made them"):
        shardex.export("demo:12", f"{memory_storage.uri}/two", samples_per_shard=5, workers=2)


# ---------------------------------------------------------------- faults


def test_a_rule_acts_on_its_nth_matching_calls_only(memory_storage: MemoryStorage) -> None:
    for name in ("a.tar", "b.tar", "c.json"):
        memory_storage.put(name, name.encode())
    store = FaultyStorage(memory_storage)
    store.fail("get", nth=2, times=2, path="*.tar", error=StorageError("access denied"))
    assert store.get("a.tar") == b"a.tar"
    assert store.get("c.json") == b"c.json"  # not a .tar: not counted
    for name in ("b.tar", "a.tar"):
        with pytest.raises(StorageError, match="access denied"):
            store.get(name)
    assert store.get("b.tar") == b"b.tar"
    assert [(c.path, c.fault) for c in store.calls_to("get")] == [
        ("a.tar", None),
        ("c.json", None),
        ("b.tar", "fail"),
        ("a.tar", "fail"),
        ("b.tar", None),
    ]
    store.fail("size", times=None)
    for _ in range(3):
        with pytest.raises(StorageError, match=r"injected failure of size\('a.tar'\)"):
            store.size("a.tar")


def test_truncated_reads_end_early(memory_storage: MemoryStorage) -> None:
    data = bytes(range(200))
    memory_storage.put("d.bin", data)
    store = FaultyStorage(memory_storage)
    store.truncate("get_range", keep=5)
    store.truncate("get_ranges", keep=3)
    store.truncate("iter_chunks", keep=25)
    assert store.get_range("d.bin", 10, 50) == data[10:15]
    assert store.get_range("d.bin", 10, 50) == data[10:60]  # the next call is whole
    assert store.get_ranges("d.bin", [0, 100], [10, 10]) == [data[0:3], data[100:103]]
    assert b"".join(store.iter_chunks("d.bin", chunk_size=10)) == data[:25]


def test_delays_and_dropped_writes(memory_storage: MemoryStorage) -> None:
    store = FaultyStorage(memory_storage)
    store.delay("exists", 0.3)
    started = time.monotonic()
    assert not store.exists("x")
    assert time.monotonic() - started >= 0.3
    store.drop("put", path="*.json")
    store.put("lost.json", b"{}")
    store.put("kept.bin", b"1")
    store.drop("commit")
    with store.open_writer("never.bin") as writer:
        writer.write(b"abc")
    assert writer.tell == 3
    assert list(memory_storage.list()) == ["kept.bin"]
    methods = [c.method for c in store.calls]
    assert methods == ["exists", "put", "put", "open_writer", "write", "commit"]


def test_pickled_it_is_the_storage_it_wraps(memory_storage: MemoryStorage) -> None:
    store = FaultyStorage(memory_storage)
    store.fail("get", times=None)
    memory_storage.put("p.bin", b"p")
    clone = pickle.loads(pickle.dumps(store))
    assert type(clone) is MemoryStorage
    assert clone.get("p.bin") == b"p"
