"""obstore's errors as one line a user can act on, mapped once at the storage boundary.

obstore's messages run to dozens of lines of Rust debug output, or name the wrong thing
(missing credentials show as an error about ``169.254.169.254``).
"""

from __future__ import annotations

import os
import re
from typing import Any, Final

from shardex.errors import BucketNotFoundError, ObjectNotFoundError, StorageError
from shardex.quoting import quoted

_REQUEST: Final = re.compile(
    r"Error performing (?:\w+ )?(?:request: Error performing \w+ )?(\w+://[^/\s?]+)"
)
_ELAPSED: Final = re.compile(r"in ([\d.]+)(µs|ms|s)(?:, after (\d+) retries)?")
_S3_CODE: Final = re.compile(r"<Code>([A-Za-z]+)</Code>")
_OS_MESSAGE: Final = re.compile(r'message: "([^"]+)"')
#: One key obstore cannot parse as a path fails the whole listing.
_BAD_KEY: Final = re.compile(r'invalid path: Error parsing Path "(.*?)": (.*?) whilst', re.S)
_DNS: Final = re.compile(r'"dns error",\s*Custom \{[^}]*error: "([^"]+)"', re.S)
_METADATA: Final = ("169.254.169.254", "169.254.170.2", "/latest/api/token")


def storage_error(exc: BaseException, what: str, options: dict[str, Any]) -> StorageError:
    """One shardex error for an obstore error about ``what`` (a URL)."""
    text = str(exc)
    server = _server(text, options)
    if _asked_metadata(text, options):
        return StorageError(
            f"{what}: no credentials: none were given (storage options access_key_id and "
            "secret_access_key, the AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY variables, "
            "or a profile) and this machine's cloud metadata service gave none"
            f"{_reason(text)}; give credentials, or skip_signature=True for a public bucket"
        )
    code = _S3_CODE.search(text)
    if code is not None and code.group(1) == "NoSuchBucket":
        bucket = what.split("://", 1)[-1].split("/", 1)[0]
        return BucketNotFoundError(f"{what}: the bucket {bucket!r} does not exist at {server}")
    if isinstance(exc, FileNotFoundError):
        if _not_s3(text):
            return _not_s3_error(what, server, 404)
        return ObjectNotFoundError(f"{what} does not exist")
    if _is_denied(exc):
        cause = code.group(1) if code is not None else type(exc).__name__
        return StorageError(
            f"access to {what} was denied by {server} ({cause}); check the credentials "
            "and their permissions"
        )
    if "ConnectError" in text or "kind: Connect" in text or "kind: Timeout" in text:
        return StorageError(f"{what}: cannot reach {server}: {_connect_reason(text)}{_tried(text)}")
    status = re.search(r"status code: (\d{3})", text)
    if status is not None and _not_s3(text):
        return _not_s3_error(what, server, int(status.group(1)))
    bad_key = _BAD_KEY.search(text)
    if bad_key is not None:
        return StorageError(
            f"{what}: the store holds an object whose name cannot be read as a path, "
            f"{quoted(bad_key.group(1))} ({quoted(bad_key.group(2).lower())}), so it cannot "
            "be listed; rename or delete that object, or use a prefix without it"
        )
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return StorageError(f"{what}: {first}")


def _server(text: str, options: dict[str, Any]) -> str:
    found = _REQUEST.search(text)
    if found is not None:
        return found.group(1)
    return str(options.get("endpoint_url") or options.get("endpoint") or "the server")


def _asked_metadata(text: str, options: dict[str, Any]) -> bool:
    endpoint = (
        options.get("metadata_endpoint")
        or options.get("aws_metadata_endpoint")
        or os.environ.get("AWS_METADATA_ENDPOINT")
    )
    marks = (*_METADATA, str(endpoint).rstrip("/")) if endpoint else _METADATA
    head = text.split("Debug source", 1)[0]
    return any(mark in head for mark in marks)


def _is_denied(exc: BaseException) -> bool:
    import obstore

    denied = (obstore.exceptions.PermissionDeniedError, obstore.exceptions.UnauthenticatedError)
    return isinstance(exc, denied)


def _not_s3(text: str) -> bool:
    head = text.split("Debug source", 1)[0].lower()
    return "<html" in head or "<!doctype" in head


def _not_s3_error(what: str, server: str, status: int) -> StorageError:
    return StorageError(
        f"{what}: {server} answered HTTP {status} with a web page, not an S3 response; "
        "check the endpoint (storage option endpoint_url, --s3-endpoint-url)"
    )


def _connect_reason(text: str) -> str:
    dns = _DNS.search(text)
    if dns is not None:
        return f"its host name does not resolve ({dns.group(1)})"
    if "kind: Timeout" in text or "timed out" in text.lower():
        return "no answer within the connect timeout (storage option connect_timeout)"
    message = _OS_MESSAGE.findall(text)
    return message[-1].lower() if message else "the connection failed"


def _reason(text: str) -> str:
    status = re.search(r"status code: (\d{3}[^:\n]*)", text)
    if status is not None:
        return f" (it answered {status.group(1).strip()})"
    if "ConnectError" in text or "kind: Connect" in text:
        return f" (it cannot be reached: {_connect_reason(text)})"
    return ""


def _tried(text: str) -> str:
    found = _ELAPSED.search(text)
    if found is None or not found.group(3):
        return ""
    scale = {"µs": 1e-6, "ms": 1e-3, "s": 1.0}[found.group(2)]
    seconds = float(found.group(1)) * scale
    return (
        f" (tried {int(found.group(3)) + 1} times in {seconds:.1f} s; storage option retry_timeout)"
    )


def link_refused(where: object) -> StorageError:
    """The one-line refusal of a symbolic link found where shardex writes in an output."""
    return StorageError(
        f"{quoted(str(where))} is a symbolic link inside the output; shardex never writes, "
        "replaces or deletes through a link there: remove it, or choose another output"
    )
