"""Object-store storage (S3 and S3-compatible, GCS, Azure, HTTP): the public class.

:class:`ObjectStorage` checks its options once, then hands each operation to the right
implementation for the calling process:

* :class:`~shardex.storage.direct.DirectObjectStorage`, obstore in this process: the main
  process, spawned and forkserver-started workers, children forked before any request;
* :class:`~shardex.storage.helper.HelperObjectStorage`, a helper process: a child forked
  from a process that had already made requests, where obstore would hang (its runtime
  does not survive ``fork()``); this is what a forked DataLoader worker uses.

Fork-safety is this one wrapper, chosen per process; neither implementation knows of it.
"""

from __future__ import annotations

import copy
import os
from datetime import timedelta
from typing import Any

from shardex.errors import ConfigError
from shardex.storage.base import Forwarded, Storage
from shardex.storage.direct import DirectObjectStorage, forked_after_io, runtime_started
from shardex.storage.helper import HelperObjectStorage
from shardex.storage.options import (
    DEFAULT_COALESCE_GAP,
    DEFAULT_RETRY_TIMEOUT,
    SCHEMES,
    byte_size,
    duration,
    from_environment,
    merge_options,
)
from shardex.storage.profiles import profile_options

__all__ = ["SCHEMES", "ObjectStorage"]


class ObjectStorage(Storage):
    """Objects under ``s3://bucket/prefix`` (or ``gs://``, ``az://``, ``http(s)://``).

    Args:
        url: the root URL.
        storage_options: ``endpoint_url``, ``region``, ``profile`` (a named AWS profile,
            read from the AWS shared files; boto3 only for a role, SSO or a
            ``credential_process``), ``timeout`` and ``connect_timeout`` per request (defaults
            ``"60s"`` and ``"5s"``; a timed-out request is retried), ``retry_timeout``
            (how long a failing request is retried, default ``"2m"``), ``coalesce_gap``
            (batched reads, ``get_many``, fetch two ranges of a shard in one request
            when at most this many bytes lie between them: ``0`` fetches only the bytes
            asked for, a larger gap makes fewer requests; bytes or ``"64KiB"``, default
            0), ``read_concurrency`` (ranged GETs of a batch in flight, default 64) and
            ``hedge`` (a second GET for a slow request, default true; see
            docs/storage.md), and any obstore
            store or client option (``access_key_id``, ``secret_access_key``,
            ``session_token``, ``virtual_hosted_style_request``, ``allow_http``, ...);
            an unknown name is a :class:`ConfigError`. Unset options come from the
            standard ``AWS_*`` environment variables (keys win over ``AWS_PROFILE``).
            Credentials stay in memory: they are never written to config.yaml, logs or
            error messages.
    """

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None) -> None:
        if not url.startswith(SCHEMES):
            raise ConfigError(f"{url!r} is not an object-store URL ({', '.join(SCHEMES)})")
        self.uri = url.rstrip("/")
        # Credentials and endpoint are read from the environment here, once, so that they
        # travel with the storage to worker processes (whose environment may be older).
        self._options = merge_options(self.uri, storage_options or {}, from_environment())
        if self._options.get("profile"):  # its files too are read here, once
            profile = str(self._options.pop("profile"))
            self._options = profile_options(profile, self._options, now=True)
        self._impl: DirectObjectStorage | HelperObjectStorage | None = None
        self._impl_pid = -1

    def __getstate__(self) -> dict[str, Any]:
        return {"uri": self.uri, "options": self._options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.uri, self._options = state["uri"], state["options"]
        self._impl, self._impl_pid = None, -1

    def __repr__(self) -> str:  # no options: they may hold credentials
        return f"ObjectStorage({self.uri!r})"

    @property
    def coalesce_gap(self) -> int:  # type: ignore[override]  # always set here
        """The gap batched reads merge ranges across (storage option ``coalesce_gap``)."""
        value = self._options.get("coalesce_gap")
        return DEFAULT_COALESCE_GAP if value is None else byte_size(value, "coalesce_gap")

    @property
    def retry_timeout(self) -> timedelta:
        """How long a failing request is retried (storage option ``retry_timeout``)."""
        value = self._options.get("retry_timeout")
        return DEFAULT_RETRY_TIMEOUT if value is None else duration(value, "retry_timeout")

    @property
    def _io(self) -> DirectObjectStorage | HelperObjectStorage:
        """The implementation for this process (made again after a fork)."""
        pid = os.getpid()
        if self._impl is None or self._impl_pid != pid:
            kind = HelperObjectStorage if forked_after_io() else DirectObjectStorage
            self._impl, self._impl_pid = kind(self.uri, self._options), pid
        return self._impl

    def get_range(self, path: str, start: int, length: int) -> bytes:
        impl = self._impl  # ds[i]'s path: the property only when a fork may have happened
        if impl is None or self._impl_pid != os.getpid():
            impl = self._io
        return impl.get_range(path, start, length)

    def before_fork(self) -> ObjectStorage:
        """This storage, for a process about to fork workers that read it (a DataLoader's).

        Until this process has requested through obstore itself, the copy's requests go to
        a helper process, so the workers it forks later request directly instead of each
        through a helper of its own (a local socket's round trip and ~0.3 ms of CPU a
        request); afterwards it is this storage.
        """
        if runtime_started():
            return self
        twin = copy.copy(self)
        twin._impl, twin._impl_pid = HelperObjectStorage(self.uri, self._options), os.getpid()
        return twin

    # the rest as the implementation for this process does them
    get = Forwarded("_io")
    get_head = Forwarded("_io")
    get_ranges = Forwarded("_io")
    get_range_batch = Forwarded("_io")
    submit_range_batch = Forwarded("_io")
    iter_chunks = Forwarded("_io")
    iter_objects = Forwarded("_io")
    iter_views = Forwarded("_io")
    size = Forwarded("_io")
    exists = Forwarded("_io")
    list = Forwarded("_io")
    list_pages = Forwarded("_io")
    list_folder = Forwarded("_io")
    delete = Forwarded("_io")
    rename = Forwarded("_io")
    put = Forwarded("_io")
    get_tagged = Forwarded("_io")
    put_if = Forwarded("_io")
    open_writer = Forwarded("_io")

    def presign(self, path: str, expires_in: timedelta = timedelta(hours=1)) -> str:
        """A presigned HTTPS/HTTP GET URL of an object, for tools that read plain URLs
        (``webdataset.WebDataset("pipe:curl -s URL")``, DALI, browsers)."""
        return self._io.presign(path, expires_in)
