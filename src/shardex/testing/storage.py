"""The storage conformance suite: subclass and provide a ``storage`` fixture."""

from __future__ import annotations

import pickle
from collections.abc import Callable

import pytest

from shardex.errors import ObjectNotFoundError, OutputLockedError, StorageError
from shardex.storage.base import Storage

#: Paths that would reach outside a storage's root (or name no object in it).
OUTSIDE_PATHS = (
    "../x",
    "a/../../x",
    "/abs",
    "",
    "a//b",
    "./a",
    "a/.",
    "a\\..\\b",
    "a\x00b",
    "a\nb",
)


class StorageTests:
    """Every Storage must pass these. Provide ``storage``: an empty storage root."""

    @pytest.fixture
    def storage(self) -> Storage:
        raise NotImplementedError("subclasses provide a `storage` fixture")

    def test_put_get_round_trip(self, storage: Storage) -> None:
        storage.put("a/b.bin", b"hello world")
        assert storage.get("a/b.bin") == b"hello world"
        assert storage.size("a/b.bin") == 11
        assert storage.exists("a/b.bin")

    def test_ranges(self, storage: Storage) -> None:
        data = bytes(range(256)) * 40
        storage.put("r.bin", data)
        assert storage.get_range("r.bin", 100, 50) == data[100:150]
        assert storage.get_range("r.bin", len(data) - 10, 100) == data[-10:]
        starts, lengths = [5000, 0, 777], [10, 3, 1000]
        got = storage.get_ranges("r.bin", starts, lengths)
        assert got == [data[s : s + n] for s, n in zip(starts, lengths, strict=True)]

    def test_missing_object(self, storage: Storage) -> None:
        with pytest.raises(ObjectNotFoundError):
            storage.get("nope.bin")
        with pytest.raises(FileNotFoundError):
            storage.size("nope.bin")
        with pytest.raises(ObjectNotFoundError):
            storage.get_range("nope.bin", 0, 1)
        assert not storage.exists("nope.bin")

    def test_list_sorted_with_prefix(self, storage: Storage) -> None:
        for name in ("b/2", "a/1", "b/1", "c"):
            storage.put(name, b"x")
        assert list(storage.list()) == ["a/1", "b/1", "b/2", "c"]
        assert list(storage.list("b/")) == ["b/1", "b/2"]

    def test_list_pages(self, storage: Storage) -> None:
        for name, data in (("b/x/2", b"22"), ("a/1", b"1"), ("b/1", b"333"), ("c", b"")):
            storage.put(name, data)
        listed = [entry for page in storage.list_pages() for entry in page]
        assert listed == [("a/1", 1), ("b/1", 3), ("b/x/2", 2), ("c", 0)]
        assert [e for page in storage.list_pages("b") for e in page] == [("b/1", 3), ("b/x/2", 2)]
        # (not after "b/": SeaweedFS 4.48 then skips the whole folder b/, as S3 does not)
        after = [e for page in storage.list_pages("", after="a0") for e in page]
        assert after == [("b/1", 3), ("b/x/2", 2), ("c", 0)]
        assert [e for page in storage.list_pages("nothing") for e in page] == []

    def test_list_folder(self, storage: Storage) -> None:
        for name, data in (("b/x/2", b"22"), ("a b", b"1"), ("b/1", b"333"), ("b/y/z/3", b"")):
            storage.put(name, data)
        assert storage.list_folder() == (["b"], [("a b", 1)])
        assert storage.list_folder("b") == (["b/x", "b/y"], [("b/1", 3)])
        assert storage.list_folder("b/y") == (["b/y/z"], [])
        assert storage.list_folder("nothing") == ([], [])

    def test_delete_is_idempotent(self, storage: Storage) -> None:
        storage.put("d.bin", b"x")
        storage.delete("d.bin")
        storage.delete("d.bin")
        assert not storage.exists("d.bin")

    def test_writer_invisible_until_commit(self, storage: Storage) -> None:
        writer = storage.open_writer("w.bin")
        writer.write(b"part1")
        writer.write(b"part2")
        assert writer.tell == 10
        assert not storage.exists("w.bin")
        assert list(storage.list()) == []
        writer.commit()
        assert storage.get("w.bin") == b"part1part2"

    def test_writer_abort_leaves_nothing(self, storage: Storage) -> None:
        storage.put("keep.bin", b"old")

        def broken_write() -> None:
            with storage.open_writer("keep.bin") as writer:
                writer.write(b"new but broken")
                raise RuntimeError("boom")

        with pytest.raises(RuntimeError):
            broken_write()
        assert storage.get("keep.bin") == b"old"
        assert list(storage.list()) == ["keep.bin"]

    def test_overwrite_replaces_whole_object(self, storage: Storage) -> None:
        storage.put("o.bin", b"a long old value")
        storage.put("o.bin", b"new")
        assert storage.get("o.bin") == b"new"

    def test_conditional_put(self, storage: Storage) -> None:
        first = storage.put_if("lock", b"one", None)  # create: only if missing
        assert first is not None
        assert storage.put_if("lock", b"two", None) is None
        found = storage.get_tagged("lock")
        assert found is not None
        assert found[0] == b"one"
        second = storage.put_if("lock", b"three", found[1])  # update: only if unchanged
        assert second is not None
        assert storage.put_if("lock", b"four", found[1]) is None  # a stale tag
        assert storage.get("lock") == b"three"
        assert storage.get_tagged("gone") is None

    def test_lock_is_exclusive(self, storage: Storage) -> None:
        with (
            storage.lock("the first holder"),
            pytest.raises(OutputLockedError, match="the first holder"),
        ):
            storage.lock("the second holder")
        storage.lock("the second holder").release()  # free again

    def test_pickle_round_trip(self, storage: Storage) -> None:
        storage.put("p.bin", b"pickled")
        storage.get_range("p.bin", 0, 1)  # opens a cached handle
        clone = pickle.loads(pickle.dumps(storage))
        assert clone.get_range("p.bin", 1, 3) == b"ick"
        assert clone.uri == storage.uri

    @pytest.mark.parametrize(
        "operation",
        ["put", "open_writer", "get", "get_range", "get_ranges", "size", "delete", "rename"],
    )
    @pytest.mark.parametrize("path", OUTSIDE_PATHS)
    def test_paths_outside_the_root_are_refused(
        self, storage: Storage, path: str, operation: str
    ) -> None:
        storage.put("inside.bin", b"x")
        calls: dict[str, Callable[[], object]] = {
            "put": lambda: storage.put(path, b"evil"),
            "open_writer": lambda: storage.open_writer(path),
            "get": lambda: storage.get(path),
            "get_range": lambda: storage.get_range(path, 0, 1),
            "get_ranges": lambda: storage.get_ranges(path, [0, 0], [1, 1]),
            "size": lambda: storage.size(path),
            "delete": lambda: storage.delete(path),
            "rename": lambda: storage.rename("inside.bin", path),
        }
        with pytest.raises(StorageError, match="refused path"):
            calls[operation]()
        assert list(storage.list()) == ["inside.bin"]
        assert storage.get("inside.bin") == b"x"
