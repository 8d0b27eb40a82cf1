"""Object-store storage (S3 and S3-compatible, GCS, Azure, HTTP) through obstore.

One ranged GET per ``get_range``; writes stream as multipart uploads with a few parts in
memory and become visible only when completed, so an aborted write leaves nothing.

The obstore client is made lazily in each process. obstore's I/O runtime does not survive
``os.fork()``: a child forked from a process that already did obstore I/O hangs on its
first request. So the process that creates an ObjectStorage hands its requests to a helper
process (see :mod:`shardex.storage.delegate`) and never starts that runtime itself; every
other process (forked or spawned DataLoader workers, export workers) requests directly.
``SHARDEX_OBJECT_IO=direct`` (or ``delegate=False``) makes the creating process request
directly too: faster, but then it must not fork; a forked child that would hang gets a
:class:`StorageError` naming the cause and the fix instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Coroutine, Iterator, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Final, TypeVar

from shardex.errors import ConfigError, MissingDependencyError, ObjectNotFoundError, StorageError
from shardex.storage.base import ObjectWriter, Storage

if TYPE_CHECKING:
    from obstore.store import ObjectStore

T = TypeVar("T")

SCHEMES: Final = ("s3://", "s3a://", "gs://", "az://", "abfs://", "abfss://", "http://", "https://")
#: Bytes per multipart part; with MAX_PARTS_IN_FLIGHT, a writer holds at most ~32 MiB.
PART_SIZE: Final = 8 * 1024 * 1024
MAX_PARTS_IN_FLIGHT: Final = 4
#: Concurrent requests of one batch of ranged reads.
MAX_CONCURRENT_READS: Final = 32
RETRY: Final = {
    "max_retries": 8,
    "retry_timeout": timedelta(seconds=120),
    "backoff": {
        "init_backoff": timedelta(milliseconds=100),
        "max_backoff": timedelta(seconds=10),
        "base": 2.0,
    },
}
#: Options users may pass (CLI flags --s3-endpoint-url, --s3-region, --s3-profile).
_OPTION_NAMES: Final = {"endpoint_url": "endpoint", "region": "region"}
#: Options of the HTTP client rather than the store: durations such as "500ms", "60s".
_CLIENT_OPTIONS: Final = frozenset({"timeout", "connect_timeout"})

# The pid of the process whose obstore runtime has done I/O (None before any).
_runtime_pid: int | None = None


def _check_fork() -> None:
    global _runtime_pid
    pid = os.getpid()
    if _runtime_pid is not None and _runtime_pid != pid:
        raise StorageError(
            "this process was forked from one that had already read or written object "
            "storage, and obstore cannot work after such a fork; start workers with "
            "'spawn' or 'forkserver' (DataLoader(multiprocessing_context='forkserver'), "
            "multiprocessing.set_start_method('forkserver'))"
        )
    _runtime_pid = pid


def _obstore() -> Any:
    try:
        import obstore
    except ImportError as exc:
        raise MissingDependencyError(
            "object storage needs obstore: pip install 'shardex[s3]'"
        ) from exc
    return obstore


def _map_error(exc: BaseException, what: str) -> StorageError:
    """One shardex error for an obstore error; messages name the object, never secrets."""
    obstore = _obstore()
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if isinstance(exc, FileNotFoundError):
        return ObjectNotFoundError(f"{what} does not exist")
    if isinstance(
        exc, (obstore.exceptions.PermissionDeniedError, obstore.exceptions.UnauthenticatedError)
    ):
        return StorageError(
            f"access to {what} was denied ({type(exc).__name__}); check the "
            "credentials and their permissions"
        )
    return StorageError(f"{what}: {first}")


class _Loop:
    """One event loop per process on a daemon thread, for batches of concurrent reads."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        threading.Thread(
            target=self.loop.run_forever, daemon=True, name="shardex-object-io"
        ).start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()


_loop: _Loop | None = None


def _run(coro: Coroutine[Any, Any, T]) -> T:
    global _loop
    if _loop is None or _loop.pid != os.getpid():
        _loop = _Loop()
    return _loop.run(coro)


class ObjectStorage(Storage):
    """Objects under ``s3://bucket/prefix`` (or ``gs://``, ``az://``, ``http(s)://``).

    Args:
        url: the root URL.
        storage_options: ``endpoint_url``, ``region``, ``profile`` (a named AWS profile;
            needs boto3), ``timeout`` and ``connect_timeout`` per request (defaults
            ``"60s"`` and ``"5s"``; a timed-out request is retried), and any obstore store
            option (``access_key_id``,
            ``secret_access_key``, ``session_token``, ``virtual_hosted_style_request``,
            ...). Unset options come from the standard ``AWS_*`` environment variables.
            Credentials stay in memory: they are never written to config.yaml, logs or
            error messages.
    """

    def __init__(
        self,
        url: str,
        storage_options: dict[str, Any] | None = None,
        *,
        delegate: bool | None = None,
    ) -> None:
        if not url.startswith(SCHEMES):
            raise ConfigError(f"{url!r} is not an object-store URL ({', '.join(SCHEMES)})")
        self.uri = url.rstrip("/")
        # Credentials and endpoint are read from the environment here, once, so that they
        # travel with the storage to worker processes (whose environment may be older).
        self._options = {**_from_environment(), **(storage_options or {})}
        self._store: Any = None
        self._pid = -1
        if delegate is None:
            delegate = os.environ.get("SHARDEX_OBJECT_IO", "helper") != "direct"
        # Requests are delegated only in the creating process; its children request directly.
        self._delegate_in = os.getpid() if delegate else -1

    def __getstate__(self) -> dict[str, Any]:
        return {"uri": self.uri, "options": self._options, "delegate_in": self._delegate_in}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["uri"], state["options"], delegate=False)  # type: ignore[misc]
        self._delegate_in = state["delegate_in"]

    def _remote(self, op: str, *args: Any) -> tuple[bool, Any]:
        """(True, result) when this process delegates its requests; else (False, None)."""
        if self._delegate_in != os.getpid():
            return False, None
        from shardex.storage import delegate

        return True, delegate.call(self.uri, self._options, op, *args)

    def __repr__(self) -> str:  # no options: they may hold credentials
        return f"ObjectStorage({self.uri!r})"

    def _client(self) -> ObjectStore:
        if self._store is None or self._pid != os.getpid():
            _check_fork()
            self._store = self._make_store()
            self._pid = os.getpid()
        return self._store  # type: ignore[no-any-return]

    def _make_store(self) -> Any:
        from obstore.store import from_url

        options = {k: v for k, v in self._options.items() if v is not None}
        config: dict[str, Any] = {}
        client: dict[str, Any] = {"connect_timeout": "5s", "timeout": "60s"}
        for name, value in options.items():
            if name in _CLIENT_OPTIONS:
                client[name] = str(value)
            elif name != "profile":
                config[_OPTION_NAMES.get(name, name)] = (
                    value if isinstance(value, bool) else str(value)
                )
        endpoint = str(config.get("endpoint", ""))
        if endpoint.startswith("http://") or self.uri.startswith("http://"):
            client["allow_http"] = True
        kwargs: dict[str, Any] = {"client_options": client, "retry_config": RETRY}
        if options.get("profile"):
            kwargs["credential_provider"] = _profile_credentials(str(options["profile"]))
        try:
            return from_url(self.uri, config=config or None, **kwargs)  # type: ignore[arg-type]
        except Exception as exc:  # obstore rejects bad options with several types
            raise ConfigError(f"cannot use {self.uri}: {str(exc).splitlines()[0]}") from exc

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(self._client(), *args, **kwargs)
        except StorageError:
            raise
        except Exception as exc:
            raise _map_error(exc, what) from exc

    def get(self, path: str) -> bytes:
        done, value = self._remote("get", path)
        if done:
            return value  # type: ignore[no-any-return]
        result = self._call(self.join(path), _obstore().get, path)
        return bytes(result.bytes())

    def get_range(self, path: str, start: int, length: int) -> bytes:
        if length == 0:
            return b""
        done, value = self._remote("get_range", path, start, length)
        if done:
            return value  # type: ignore[no-any-return]
        data = self._call(self.join(path), _obstore().get_range, path, start=start, length=length)
        return bytes(data)

    def get_ranges(self, path: str, starts: Sequence[int], lengths: Sequence[int]) -> list[bytes]:
        return self.get_range_batch([(path, s, n) for s, n in zip(starts, lengths, strict=True)])

    def get_range_batch(self, requests: Sequence[tuple[str, int, int]]) -> list[bytes]:
        """Ranged GETs of several objects, at most MAX_CONCURRENT_READS at a time.

        Each range is its own request: obstore's ``get_ranges`` would merge ranges up to
        1 MiB apart into one GET, fetching far more than asked.
        """
        if len(requests) <= 1:
            return [self.get_range(*r) for r in requests]
        done, value = self._remote("get_range_batch", requests)
        if done:
            return value  # type: ignore[no-any-return]
        obstore, store = _obstore(), self._client()

        async def gather() -> list[bytes]:
            limit = asyncio.Semaphore(MAX_CONCURRENT_READS)

            async def one(path: str, start: int, length: int) -> bytes:
                async with limit:
                    data = await obstore.get_range_async(store, path, start=start, length=length)
                return bytes(data)

            return list(await asyncio.gather(*(one(*r) for r in requests)))

        try:
            return _run(gather())
        except Exception as exc:
            raise _map_error(exc, f"{self.uri} (one of {len(requests)} ranged reads)") from exc

    def iter_chunks(self, path: str, chunk_size: int = 4 << 20) -> Iterator[bytes]:
        """The object as a stream: one GET, read as chunks arrive (bounded memory)."""
        done, stream_id = self._remote("open_stream", path, chunk_size)
        if done:
            finished = False
            try:
                while (chunk := self._remote("next_chunk", stream_id)[1]) is not None:
                    yield chunk
                finished = True
            finally:
                if not finished:  # stopped early: let the helper drop the response
                    self._remote("close_stream", stream_id)
            return
        try:
            result = _obstore().get(self._client(), path)
            for chunk in result.stream(min_chunk_size=chunk_size):
                yield bytes(chunk)
        except StorageError:
            raise
        except Exception as exc:
            raise _map_error(exc, self.join(path)) from exc

    def size(self, path: str) -> int:
        done, value = self._remote("size", path)
        if done:
            return int(value)
        return int(self._call(self.join(path), _obstore().head, path)["size"])

    def exists(self, path: str) -> bool:
        try:
            self.size(path)
        except ObjectNotFoundError:
            return False
        return True

    def list(self, prefix: str = "") -> Iterator[str]:
        done, value = self._remote("list", prefix)
        if done:
            return iter(value)

        def walk() -> list[str]:
            names: list[str] = []
            for batch in _obstore().list(self._client(), prefix=prefix or None):
                names.extend(str(meta["path"]) for meta in batch)
            return names

        try:
            return iter(sorted(walk()))
        except Exception as exc:
            raise _map_error(exc, f"{self.uri}/{prefix}") from exc

    def delete(self, path: str) -> None:
        if self._remote("delete", path)[0]:
            return
        self._call(self.join(path), _obstore().delete, path)

    def rename(self, source: str, target: str) -> None:
        if self._remote("rename", source, target)[0]:
            return
        self._call(self.join(source), _obstore().rename, source, target)

    def put(self, path: str, data: bytes | bytearray | memoryview) -> None:
        if self._remote("put", path, bytes(data))[0]:
            return
        self._call(
            self.join(path),
            _obstore().put,
            path,
            bytes(data),
            chunk_size=PART_SIZE,
            max_concurrency=MAX_PARTS_IN_FLIGHT,
        )

    def get_tagged(self, path: str) -> tuple[bytes, str] | None:
        done, value = self._remote("get_tagged", path)
        if done:
            return value  # type: ignore[no-any-return]
        try:
            result = self._call(self.join(path), _obstore().get, path)
        except ObjectNotFoundError:
            return None
        return bytes(result.bytes()), str(result.meta["e_tag"])

    def put_if(self, path: str, data: bytes, tag: str | None) -> str | None:
        """A conditional put: ``If-None-Match: *`` (tag None) or ``If-Match: tag``."""
        done, value = self._remote("put_if", path, bytes(data), tag)
        if done:
            return value  # type: ignore[no-any-return]
        obstore = _obstore()
        mode: Any = "create" if tag is None else {"e_tag": tag}
        try:
            result = obstore.put(self._client(), path, bytes(data), mode=mode, use_multipart=False)
        except (obstore.exceptions.AlreadyExistsError, obstore.exceptions.PreconditionError):
            return None
        except FileNotFoundError:  # If-Match on an object that is gone
            return None
        except Exception as exc:
            raise _map_error(exc, self.join(path)) from exc
        return str(result["e_tag"])

    def presign(self, path: str, expires_in: timedelta = timedelta(hours=1)) -> str:
        """A presigned HTTPS/HTTP GET URL of an object, for tools that read plain URLs
        (``webdataset.WebDataset("pipe:curl -s URL")``, DALI, browsers)."""
        done, value = self._remote("presign", path, expires_in)
        if done:
            return str(value)
        return str(self._call(self.join(path), _obstore().sign, "GET", path, expires_in))

    def open_writer(self, path: str) -> ObjectWriter:
        done, value = self._remote("open_writer", path)
        if done:
            return _DelegatedWriter(self, int(value))
        try:
            writer = _obstore().open_writer(
                self._client(), path, buffer_size=PART_SIZE, max_concurrency=MAX_PARTS_IN_FLIGHT
            )
        except StorageError:
            raise
        except Exception as exc:
            raise _map_error(exc, self.join(path)) from exc
        return _MultipartWriter(writer, self.join(path))


class _MultipartWriter(ObjectWriter):
    """obstore's writer: parts upload as they fill; completing makes the object appear."""

    def __init__(self, writer: Any, where: str) -> None:
        self._w = writer
        self._where = where
        self._pos = 0
        self._done = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        try:
            self._w.write(data)
        except Exception as exc:
            self.abort()
            raise _map_error(exc, self._where) from exc
        self._pos += len(data)

    @property
    def tell(self) -> int:
        return self._pos

    def commit(self) -> None:
        if self._done:
            return
        self._done = True
        try:
            self._w.close()
        except Exception as exc:
            raise _map_error(exc, self._where) from exc

    def abort(self) -> None:
        if self._done:
            return
        self._done = True
        # Leaving obstore's writer through an exception aborts the multipart upload.
        error = RuntimeError("aborted")
        with contextlib.suppress(Exception):  # already gone: nothing is visible either way
            self._w.__exit__(type(error), error, None)


_ENVIRONMENT: Final = {
    "AWS_ACCESS_KEY_ID": "access_key_id",
    "AWS_SECRET_ACCESS_KEY": "secret_access_key",
    "AWS_SESSION_TOKEN": "session_token",
    "AWS_REGION": "region",
    "AWS_DEFAULT_REGION": "region",
    "AWS_ENDPOINT_URL": "endpoint_url",
    "AWS_PROFILE": "profile",
}


def _from_environment() -> dict[str, str]:
    found: dict[str, str] = {}
    for variable, option in _ENVIRONMENT.items():
        value = os.environ.get(variable)
        if value and option not in found:
            found[option] = value
    return found


class _DelegatedWriter(ObjectWriter):
    """A multipart write made by the helper process on behalf of this one."""

    def __init__(self, storage: ObjectStorage, writer_id: int) -> None:
        self._storage, self._id, self._pos, self._done = storage, writer_id, 0, False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self._storage._remote("write", self._id, bytes(data))
        self._pos += len(data)

    @property
    def tell(self) -> int:
        return self._pos

    def commit(self) -> None:
        if not self._done:
            self._done = True
            self._storage._remote("commit", self._id)

    def abort(self) -> None:
        if not self._done:
            self._done = True
            self._storage._remote("abort", self._id)


def _profile_credentials(profile: str) -> Any:
    try:
        import boto3
        from obstore.auth.boto3 import Boto3CredentialProvider
    except ImportError as exc:
        raise MissingDependencyError(
            f"the AWS profile {profile!r} needs boto3: pip install boto3"
        ) from exc
    return Boto3CredentialProvider(boto3.Session(profile_name=profile))
