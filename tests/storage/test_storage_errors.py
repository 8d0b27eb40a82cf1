"""A storage that cannot be used fails in one line naming the URL and the cause, within
the configured retry budget, from the API and from the CLI.

Real clients throughout: obstore against SeaweedFS (refused credentials), a closed port
(server down), a name under ``.invalid`` (DNS), a plain web server (an endpoint that is
not S3), no credentials at all (the metadata service, pointed at a closed port by
conftest), and a small HTTP server answering as AWS does for a missing bucket.
"""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import shardex
from helpers import closed_port, serving
from shardex.errors import BucketNotFoundError, StorageError
from tests.support.s3data import S3Location

BUDGET = 1.0  # seconds: storage option retry_timeout in every case


class _Answer(http.server.BaseHTTPRequestHandler):
    status = 404
    body = b"<!DOCTYPE html><html><body>Not here</body></html>"
    content_type = "text/html"

    def _answer(self) -> None:
        self.send_response(self.status)
        self.send_header("Content-Type", self.content_type)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(self.body)

    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _answer

    def log_message(self, *args: Any) -> None:
        pass


class _NoSuchBucket(_Answer):
    """What AWS S3 answers for any object of a bucket that does not exist."""

    body = (
        b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>NoSuchBucket</Code>'
        b"<Message>The specified bucket does not exist</Message>"
        b"<BucketName>no-such-bucket</BucketName></Error>"
    )
    content_type = "application/xml"


def _serve(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[str]:
    yield from serving(http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler))


@pytest.fixture
def web_server() -> Iterator[str]:
    yield from _serve(_Answer)


@pytest.fixture
def missing_bucket_server() -> Iterator[str]:
    yield from _serve(_NoSuchBucket)


def _case(name: str, s3: S3Location, web: str, missing: str) -> tuple[str, dict[str, Any], str]:
    """(url, storage options, what the message must say) of one failure."""
    keys = {k: s3.direct[k] for k in ("access_key_id", "secret_access_key", "region")}
    down = f"http://127.0.0.1:{closed_port()}"
    return {
        "server down": (
            s3.url,
            {**keys, "endpoint_url": down},
            f"cannot reach {down}: connection refused",
        ),
        "wrong host": (
            s3.url,
            {**keys, "endpoint_url": "http://no-such-host.invalid:8333"},
            "cannot reach http://no-such-host.invalid:8333: its host name does not resolve",
        ),
        "not S3": (
            s3.url,
            {**keys, "endpoint_url": web},
            f"{web} answered HTTP 404 with a web page",
        ),
        "bad key": (
            s3.url,
            {**s3.direct, "access_key_id": "nobody"},
            f"was denied by {s3.server.endpoint} (InvalidAccessKeyId)",
        ),
        "bad secret": (
            s3.url,
            {**s3.direct, "secret_access_key": "wrong"},
            f"was denied by {s3.server.endpoint} (SignatureDoesNotMatch)",
        ),
        "no credentials": (
            s3.url,
            {"endpoint_url": s3.server.endpoint, "region": s3.server.region},
            "no credentials: none were given",
        ),
        "missing bucket": (
            "s3://no-such-bucket/x",
            {**keys, "endpoint_url": missing},
            f"the bucket 'no-such-bucket' does not exist at {missing}",
        ),
    }[name]


def _attempt(attempt: str, url: str, options: dict[str, Any]) -> None:
    if attempt == "open":
        shardex.open_dataset(url, storage_options=options)
    else:
        shardex.export("demo:4", url + "/new", storage_options=options, workers=1)


CASES = [
    "server down",
    "wrong host",
    "not S3",
    "bad key",
    "bad secret",
    "no credentials",
    "missing bucket",
]


@pytest.mark.parametrize("name", CASES)
def test_open_and_export_fail_in_one_line(
    name: str, s3: S3Location, web_server: str, missing_bucket_server: str, tmp_path: Path
) -> None:
    url, options, says = _case(name, s3, web_server, missing_bucket_server)
    options = {**options, "retry_timeout": f"{BUDGET}s", "connect_timeout": "1s"}
    for attempt in ("open", "export"):
        started = time.monotonic()
        with pytest.raises(StorageError) as failed:
            _attempt(attempt, url, options)
        message = str(failed.value)
        assert says in message, message
        assert message.startswith(("s3://", "access to s3://")), message
        assert "\n" not in message
        assert "169.254.169.254" not in message
        assert "secret" not in message.lower() or "secret_access_key" in message
        assert time.monotonic() - started < BUDGET + 10  # the budget, plus slack for load
    if name == "missing bucket":
        assert isinstance(failed.value, BucketNotFoundError)


# Failures that are not retried (a server down,
# no metadata service or a 5xx answer are retried for 2 minutes by default).
@pytest.mark.parametrize(
    ("name", "command"),
    [
        ("bad secret", "inspect"),
        ("bad secret", "export-dataset"),
        ("bad key", "export-dataset"),
        ("not S3", "inspect"),
    ],
)
def test_cli_says_the_same_in_one_line(
    name: str, command: str, s3: S3Location, web_server: str, missing_bucket_server: str
) -> None:
    url, options, says = _case(name, s3, web_server, missing_bucket_server)
    flags = ["--s3-endpoint-url", options["endpoint_url"], "--s3-region", s3.server.region]
    arguments = [url] if command == "inspect" else ["demo:4", "-o", url + "/new", "-q"]
    environment = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": options["access_key_id"],
        "AWS_SECRET_ACCESS_KEY": options["secret_access_key"],
    }
    done = subprocess.run(
        [sys.executable, "-m", "shardex.cli", command, *arguments, *flags],
        capture_output=True,
        text=True,
        timeout=120,
        env=environment,
    )
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("error: "), lines[0]
    assert says in lines[0]
