"""A storage that injects faults into chosen calls of another, and records every call.

In the spirit of httpx's ``MockTransport``: the test says what goes wrong, on which call,
and the code under test meets it through the ordinary :class:`Storage` interface::

    store = FaultyStorage(MemoryStorage("memory://t"))
    store.fail("get_range", nth=3, path="*.tar")  # the 3rd ranged read of a tar raises
    store.delay("list_pages", 1.0, times=None)    # every listing waits a second
    store.truncate("get", keep=10)                # the next whole read is cut short
    store.drop("put", path="*.json")              # the next put of a .json is lost
    ...
    assert [c.path for c in store.calls_to("get_range")] == [...]

A rule counts the calls that match it (its method, and its path glob if given) and acts
on calls ``nth`` to ``nth + times - 1`` (:class:`When`; ``times=None``: every call from
``nth`` on). A writer's ``write`` and ``commit`` are calls too (a dropped commit leaves
nothing). Faults and records are this process's: pickled (to an export's workers), the
storage is its inner storage, so that an export injects faults only where it runs inline
(``workers=1``).
"""

from __future__ import annotations

import builtins
import fnmatch
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal, TypedDict, Unpack

from shardex.errors import StorageError
from shardex.storage.base import ObjectWriter, Storage

Action = Literal["fail", "delay", "truncate", "drop"]


@dataclass(frozen=True)
class Call:
    """One call that reached the storage (or was meant to), and the fault it met."""

    method: str
    path: str  # its first argument when that is a path, else ""
    args: tuple[Any, ...]
    fault: Action | None = None


class When(TypedDict, total=False):
    """Which calls a rule acts on (keywords of every rule)."""

    nth: int  # the first, counting the calls that match (default 1: the next one)
    times: int | None  # how many from ``nth`` on (default 1; None: every one)
    path: str | None  # a glob the call's path must match (default None: any path)


@dataclass
class _Rule:
    method: str
    action: Action
    nth: int = 1
    times: int | None = 1
    path: str | None = None
    error: BaseException | None = None
    seconds: float = 0.0
    keep: int = 0
    seen: int = 0

    def due(self, method: str, path: str) -> bool:
        """Whether this call (counted when it matches) is one the rule acts on."""
        if method != self.method:
            return False
        if self.path is not None and not fnmatch.fnmatchcase(path, self.path):
            return False
        self.seen += 1
        return self.nth <= self.seen and (self.times is None or self.seen < self.nth + self.times)


def _forward(name: str) -> Any:
    def method(self: FaultyStorage, *args: Any, **kwargs: Any) -> Any:
        return self._call(name, args, lambda: getattr(self.inner, name)(*args, **kwargs))

    method.__name__ = name
    return method


class FaultyStorage(Storage):
    """``inner``, with the faults its rules inject; every call recorded in :attr:`calls`."""

    def __init__(self, inner: Storage) -> None:
        self.inner = inner
        self.uri = inner.uri
        self.coalesce_gap = inner.coalesce_gap
        self.calls: builtins.list[Call] = []
        self._rules: builtins.list[_Rule] = []
        self._lock = threading.Lock()

    def __reduce__(self) -> tuple[Any, ...]:
        return (_itself, (self.inner,))

    def __repr__(self) -> str:
        return f"FaultyStorage({self.inner!r})"

    # --------------------------------------------------------------- rules

    def fail(self, method: str, error: BaseException | None = None, **when: Unpack[When]) -> None:
        """Raise ``error`` (a StorageError naming the call by default) in place of the call."""
        self._rules.append(_Rule(method, "fail", error=error, **when))

    def delay(self, method: str, seconds: float, **when: Unpack[When]) -> None:
        """Make the call ``seconds`` late (a slow server)."""
        self._rules.append(_Rule(method, "delay", seconds=seconds, **when))

    def truncate(self, method: str, keep: int, **when: Unpack[When]) -> None:
        """Cut what a read returns to its first ``keep`` bytes (each range of a batch, a
        stream of chunks as a whole): a response that ended early."""
        self._rules.append(_Rule(method, "truncate", keep=keep, **when))

    def drop(self, method: str, **when: Unpack[When]) -> None:
        """Return None without making the call (a write lost on its way; a writer's
        dropped commit aborts it)."""
        self._rules.append(_Rule(method, "drop", **when))

    def clear_faults(self) -> None:
        self._rules.clear()

    def calls_to(self, method: str) -> builtins.list[Call]:
        return [call for call in self.calls if call.method == method]

    # --------------------------------------------------------------- calls

    def _call(
        self,
        method: str,
        args: tuple[Any, ...],
        run: Callable[[], Any],
        dropped: Callable[[], object] | None = None,
    ) -> Any:
        """``run()``, the call ``method(*args)``, as the first rule due for it says."""
        path = args[0] if args and isinstance(args[0], str) else ""
        with self._lock:
            rule = next((r for r in self._rules if r.due(method, path)), None)
            self.calls.append(Call(method, path, args, rule.action if rule else None))
        if rule is None:
            return run()
        if rule.action == "fail":
            raise rule.error or StorageError(f"injected failure of {method}({path!r})")
        if rule.action == "drop":
            return dropped() if dropped is not None else None
        if rule.action == "delay":
            time.sleep(rule.seconds)
            return run()
        return _cut(run(), rule.keep)

    get = _forward("get")
    get_range = _forward("get_range")
    get_ranges = _forward("get_ranges")
    get_range_batch = _forward("get_range_batch")
    iter_chunks = _forward("iter_chunks")
    iter_objects = _forward("iter_objects")
    iter_views = _forward("iter_views")
    size = _forward("size")
    exists = _forward("exists")
    list = _forward("list")
    list_pages = _forward("list_pages")
    list_folder = _forward("list_folder")
    delete = _forward("delete")
    rename = _forward("rename")
    put = _forward("put")
    get_tagged = _forward("get_tagged")
    put_if = _forward("put_if")
    leftovers = _forward("leftovers")
    sync = _forward("sync")
    # no local_path: every read goes through the calls, none maps a file past them

    def open_writer(self, path: str) -> ObjectWriter:
        opened = self._call("open_writer", (path,), lambda: self.inner.open_writer(path))
        return _Writer(self, path, opened)


class _Writer(ObjectWriter):
    """A writer whose ``write`` and ``commit`` are calls of its storage."""

    def __init__(self, storage: FaultyStorage, path: str, inner: ObjectWriter) -> None:
        self._storage, self._path, self._inner = storage, path, inner

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self._storage._call("write", (self._path, data), lambda: self._inner.write(data))

    def commit(self) -> None:
        self._storage._call("commit", (self._path,), self._inner.commit, self._inner.abort)

    def abort(self) -> None:
        self._inner.abort()

    @property
    def tell(self) -> int:
        return self._inner.tell


def _itself(storage: Storage) -> Storage:
    return storage


def _cut(result: Any, keep: int) -> Any:
    """``result`` (bytes, a list of them, or a stream of chunks) cut after ``keep`` bytes."""
    if isinstance(result, bytes | bytearray | memoryview):
        return result[:keep]
    if isinstance(result, list):
        return [_cut(part, keep) for part in result]
    return _cut_stream(result, keep)


def _cut_stream(chunks: Iterator[Any], keep: int) -> Iterator[Any]:
    for chunk in chunks:
        if keep <= 0:
            break
        yield chunk[:keep]
        keep -= len(chunk)
