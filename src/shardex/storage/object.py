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
import difflib
import os
import re
import threading
from collections.abc import Coroutine, Iterator, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Final, TypeVar

from shardex.errors import ConfigError, MissingDependencyError, ObjectNotFoundError, StorageError
from shardex.storage.base import ObjectWriter, Storage, checked_path

if TYPE_CHECKING:
    from obstore.store import ObjectStore

T = TypeVar("T")

SCHEMES: Final = ("s3://", "s3a://", "gs://", "az://", "abfs://", "abfss://", "http://", "https://")
#: Bytes per multipart part; with MAX_PARTS_IN_FLIGHT, a writer holds at most ~32 MiB.
PART_SIZE: Final = 8 * 1024 * 1024
MAX_PARTS_IN_FLIGHT: Final = 4
#: Concurrent requests of one batch of ranged reads.
MAX_CONCURRENT_READS: Final = 32
#: How long a request is retried (connection refused or dropped, timeouts, 5xx, throttling)
#: before it fails; storage option ``retry_timeout``. 403 and 404 are never retried.
DEFAULT_RETRY_TIMEOUT: Final = timedelta(minutes=2)
#: Retries back off from 100 ms, doubling up to 4 s (with jitter): a server back after a
#: restart is seen within about 4 s.
_BACKOFF: Final = {
    "init_backoff": timedelta(milliseconds=100),
    "max_backoff": timedelta(seconds=4),
    "base": 2.0,
}


def retry_config(budget: timedelta) -> dict[str, Any]:
    """obstore's retry settings for a time budget: every request made through the store
    (multipart parts included) is retried until ``budget`` has passed since its first try;
    the count is only a backstop, set so that the budget is what ends the retries (the
    backoff is jittered down to ~0 and a refused connection fails at once, so a count of
    one per 10 ms of budget is never reached first)."""
    return {
        "max_retries": max(10, int(budget.total_seconds() * 100)),
        "retry_timeout": budget,
        "backoff": _BACKOFF,
    }


#: Options users may pass (CLI flags --s3-endpoint-url, --s3-region, --s3-profile).
_OPTION_NAMES: Final = {"endpoint_url": "endpoint", "region": "region"}
#: shardex's own options; ``retry_timeout`` is the retry budget of every request.
_SHARDEX_OPTIONS: Final = frozenset({"endpoint_url", "region", "profile", "retry_timeout"})
#: Options of the HTTP client rather than the store (obstore 0.12's ClientConfig):
#: durations such as "500ms", "60s", flags as bools.
_CLIENT_OPTIONS: Final = frozenset(
    {
        "allow_http", "allow_invalid_certificates", "connect_timeout", "default_content_type",
        "http1_only", "http2_keep_alive_interval", "http2_keep_alive_timeout",
        "http2_keep_alive_while_idle", "http2_only", "pool_idle_timeout",
        "pool_max_idle_per_host", "proxy_url", "proxy_ca_certificate", "proxy_excludes",
        "randomize_addresses", "read_timeout", "timeout", "user_agent",
    }
)  # fmt: skip
#: Store options by scheme (obstore 0.12's S3Config, GCSConfig, AzureConfig), and the
#: prefix obstore also accepts on them (``aws_region``, ``AWS_REGION``).
_STORE_OPTIONS: Final = {
    "s3": ("aws_", frozenset({
        "access_key_id", "bucket", "checksum_algorithm", "conditional_put",
        "container_credentials_relative_uri", "container_credentials_full_uri",
        "container_authorization_token_file", "copy_if_not_exists", "default_region",
        "disable_tagging", "disable_bulk_delete", "endpoint", "metadata_endpoint", "region",
        "request_payer", "role_arn", "role_session_name", "secret_access_key",
        "server_side_encryption", "session_token", "skip_signature", "sse_bucket_key_enabled",
        "sse_kms_key_id", "sts_endpoint", "unsigned_payload", "virtual_hosted_style_request",
        "web_identity_token_file",
    })),
    "gs": ("google_", frozenset({
        "service_account", "service_account_key", "base_url", "bucket",
        "application_credentials", "skip_signature",
    })),
    "az": ("azure_", frozenset({
        "account_name", "account_key", "client_id", "client_secret", "tenant_id",
        "authority_host", "sas_key", "token", "use_emulator", "use_fabric_endpoint",
        "endpoint", "msi_endpoint", "object_id", "msi_resource_id", "federated_token_file",
        "use_azure_cli", "skip_signature", "container_name", "disable_tagging",
        "fabric_token_service_url", "fabric_workload_host", "fabric_session_token",
        "fabric_cluster_identifier",
    })),
    "http": ("", frozenset()),
}  # fmt: skip
_SCHEME_KIND: Final = {
    "s3": "s3", "s3a": "s3", "gs": "gs", "az": "az", "abfs": "az", "abfss": "az",
    "http": "http", "https": "http",
}  # fmt: skip
_DURATION: Final = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*(ms|s|m|min|h)?\s*$")


def _duration(value: Any, name: str) -> timedelta:
    """A duration option: seconds as a number, or "500ms", "30s", "2m", "1h"."""
    if isinstance(value, timedelta):
        return value
    match = None if isinstance(value, bool) else _DURATION.match(str(value))
    if match is None:
        raise ConfigError(
            f"storage option {name!r} must be a duration such as 30 (seconds), '500ms', "
            f"'30s' or '2m', not {value!r}"
        )
    scale = {"ms": 0.001, None: 1, "s": 1, "m": 60, "min": 60, "h": 3600}[match.group(2)]
    return timedelta(seconds=float(match.group(1)) * scale)


def _setting(uri: str, name: str) -> str:
    """The setting an option name stands for: ``AWS_REGION``, ``aws_region`` and
    ``region`` are one; ``endpoint_url`` is ``endpoint``."""
    prefix = _STORE_OPTIONS[_SCHEME_KIND[uri.split("://", 1)[0].lower()]][0]
    bare = name.lower()
    bare = bare[len(prefix) :] if prefix and bare.startswith(prefix) else bare
    return _OPTION_NAMES.get(bare, bare)


def merge_options(uri: str, given: dict[str, Any], environment: dict[str, str]) -> dict[str, Any]:
    """The options of a store: the given ones, checked, over those of the environment
    (an environment variable gives way to the same setting given under any name)."""
    check_options(uri, given)
    taken = {_setting(uri, name) for name, value in given.items() if value is not None}
    kept = {k: v for k, v in environment.items() if _setting(uri, k) not in taken}
    return {**kept, **given}


def check_options(uri: str, options: dict[str, Any]) -> None:
    """Refuse option names obstore does not know (it panics on some), values that are
    not text, numbers or flags, and one setting given twice; name the nearest option."""
    store = _STORE_OPTIONS[_SCHEME_KIND[uri.split("://", 1)[0].lower()]][1]
    known = _SHARDEX_OPTIONS | _CLIENT_OPTIONS | store | set(_OPTION_NAMES.values())
    seen: dict[str, str] = {}
    for name, value in options.items():
        if not isinstance(name, str):
            raise ConfigError(f"storage option names must be text, not {name!r}")
        bare = _setting(uri, name)
        if bare not in known:
            near = difflib.get_close_matches(bare, sorted(known), n=1)
            hint = f"did you mean {near[0]!r}? " if near else ""
            raise ConfigError(
                f"unknown storage option {name!r} for {uri}; {hint}known options: "
                f"{', '.join(sorted(known))}"
            )
        if bare in seen and value is not None:
            raise ConfigError(
                f"storage options {seen[bare]!r} and {name!r} name the same setting; "
                "give one of them"
            )
        if value is not None:
            seen[bare] = name
        allowed = (
            (str, bool, int, float, timedelta)
            if bare == "retry_timeout"
            else (str, bool, int, float)
        )
        if value is not None and not isinstance(value, allowed):
            raise ConfigError(
                f"storage option {name!r} must be text, a number or a bool, not "
                f"{type(value).__name__}"
            )
    if options.get("retry_timeout") is not None:
        _duration(options["retry_timeout"], "retry_timeout")


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
            ``"60s"`` and ``"5s"``; a timed-out request is retried), ``retry_timeout``
            (how long a failing request is retried, default ``"2m"``), and any obstore
            store or client option (``access_key_id``, ``secret_access_key``,
            ``session_token``, ``virtual_hosted_style_request``, ``allow_http``, ...);
            an unknown name is a :class:`ConfigError`. Unset options come from the
            standard ``AWS_*`` environment variables.
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
        self._options = merge_options(self.uri, storage_options or {}, _from_environment())
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

    @property
    def retry_timeout(self) -> timedelta:
        """How long a failing request is retried (storage option ``retry_timeout``)."""
        value = self._options.get("retry_timeout")
        return DEFAULT_RETRY_TIMEOUT if value is None else _duration(value, "retry_timeout")

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
            if name.lower() in _CLIENT_OPTIONS:
                client[name.lower()] = value if isinstance(value, bool) else str(value)
            elif name not in ("profile", "retry_timeout"):
                config[_setting(self.uri, name)] = value if isinstance(value, bool) else str(value)
        endpoint = str(config.get("endpoint", ""))
        if endpoint.startswith("http://") or self.uri.startswith("http://"):
            client.setdefault("allow_http", True)
        kwargs: dict[str, Any] = {
            "client_options": client,
            "retry_config": retry_config(self.retry_timeout),
        }
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
        checked_path(path, self.uri)
        done, value = self._remote("get", path)
        if done:
            return value  # type: ignore[no-any-return]
        result = self._call(self.join(path), _obstore().get, path)
        return bytes(result.bytes())

    def get_range(self, path: str, start: int, length: int) -> bytes:
        checked_path(path, self.uri)
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
        for path in {r[0] for r in requests}:
            checked_path(path, self.uri)
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
        checked_path(path, self.uri)
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
            # obstore itself resumes a body broken mid-way (a ranged GET of the rest),
            # under the same retry settings as every request
            result = _obstore().get(self._client(), path)
            for chunk in result.stream(min_chunk_size=chunk_size):
                yield bytes(chunk)
        except StorageError:
            raise
        except Exception as exc:
            raise _map_error(exc, self.join(path)) from exc

    def size(self, path: str) -> int:
        checked_path(path, self.uri)
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
        checked_path(path, self.uri)
        if self._remote("delete", path)[0]:
            return
        self._call(self.join(path), _obstore().delete, path)

    def rename(self, source: str, target: str) -> None:
        checked_path(source, self.uri)
        checked_path(target, self.uri)
        if self._remote("rename", source, target)[0]:
            return
        self._call(self.join(source), _obstore().rename, source, target)

    def put(self, path: str, data: bytes | bytearray | memoryview) -> None:
        checked_path(path, self.uri)
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
        checked_path(path, self.uri)
        done, value = self._remote("presign", path, expires_in)
        if done:
            return str(value)
        return str(self._call(self.join(path), _obstore().sign, "GET", path, expires_in))

    def open_writer(self, path: str) -> ObjectWriter:
        checked_path(path, self.uri)
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
