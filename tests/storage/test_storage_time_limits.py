"""The object-storage time limits from the CLI (--s3-retry-timeout, --s3-timeout,
--s3-connect-timeout) and the API (storage options of the same names): a server that is
down or never answers fails within the limits given, in one line; a working server works
with them. Real clients: the shardex CLI in a subprocess, obstore, SeaweedFS, a closed
port, and a TCP server that accepts connections and never answers."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

import shardex
from helpers import closed_port
from shardex.errors import StorageError
from tests.support.s3data import S3Location


@pytest.fixture
def silent_server() -> Iterator[str]:
    """An endpoint whose connections are accepted (by the kernel's backlog) and never
    answered: only a request time limit ends a request to it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(64)
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


def _cli(
    args: list[str], s3: S3Location, timeout: float = 120
) -> tuple[subprocess.CompletedProcess[str], float]:
    environment = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": s3.direct["access_key_id"],
        "AWS_SECRET_ACCESS_KEY": s3.direct["secret_access_key"],
    }
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "shardex.cli", *args, "--s3-region", s3.server.region],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=environment,
    )
    return done, time.monotonic() - started


def _one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("error: "), lines[0]
    return lines[0]


def test_cli_server_down_fails_within_the_retry_timeout_given(s3: S3Location) -> None:
    down = f"http://127.0.0.1:{closed_port()}"
    done, took = _cli(
        ["inspect", s3.url, "--s3-endpoint-url", down, "--s3-retry-timeout", "1s"], s3
    )
    line = _one_error_line(done)
    assert f"cannot reach {down}: connection refused" in line
    assert "storage option retry_timeout" in line
    assert took < 20  # the default budget is 2 minutes


def test_cli_a_server_that_never_answers_fails_within_the_request_timeout(
    s3: S3Location, silent_server: str
) -> None:
    args = ["--s3-endpoint-url", silent_server, "--s3-timeout", "500ms", "--s3-retry-timeout", "2"]
    done, took = _cli(["export-dataset", "demo:4", "-o", s3.url + "/new", "-q", *args], s3)
    line = _one_error_line(done)
    assert silent_server in line, line
    assert took < 30  # the default request limit alone is 60 s


def test_api_takes_the_time_limits_as_seconds_too(s3: S3Location, silent_server: str) -> None:
    options: dict[str, Any] = {
        **s3.direct,
        "endpoint_url": silent_server,
        "timeout": 0.5,  # a bare number of seconds, as retry_timeout takes it
        "connect_timeout": 1,
        "retry_timeout": 1,
    }
    started = time.monotonic()
    with pytest.raises(StorageError) as caught:
        shardex.open_dataset(s3.url, storage_options=options)
    assert time.monotonic() - started < 30
    assert silent_server in str(caught.value)
    assert "\n" not in str(caught.value)


def test_cli_with_time_limits_works_against_a_real_server(s3: S3Location) -> None:
    limits = ["--s3-timeout", "30s", "--s3-connect-timeout", "5", "--s3-retry-timeout", "1m"]
    flags = ["--s3-endpoint-url", s3.server.endpoint, *limits]
    done, _ = _cli(["export-dataset", "demo:6", "-o", s3.url, "-q", *flags], s3)
    assert done.returncode == 0, done.stderr
    done, _ = _cli(["inspect", s3.url, *flags], s3)
    assert done.returncode == 0, done.stderr
    assert "6" in done.stdout


def test_cli_refuses_a_time_limit_that_is_not_a_duration(s3: S3Location) -> None:
    done, _ = _cli(["inspect", s3.url, "--s3-timeout", "soon"], s3)
    assert done.returncode == 2
    assert "--s3-timeout" in done.stderr
    assert "'soon'" in done.stderr
