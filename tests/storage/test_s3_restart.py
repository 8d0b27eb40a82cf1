"""Object storage rides out a restart of the S3 server: requests are retried for a time
budget (storage option ``retry_timeout``, default 2 minutes), not a count.

Each test runs its own SeaweedFS (the session's is shared by other tests), kills it with
SIGKILL or stops it gracefully in the middle of an export or a read, and starts it again
on the same ports and data.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import shardex
from shardex.errors import ConfigError, ObjectNotFoundError, StorageError
from shardex.storage import ObjectStorage
from tests.support.s3data import S3Location
from tests.support.seaweedfs import SeaweedFS


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedFS]:
    with SeaweedFS(bucket="restart-test", workdir=tmp_path_factory.mktemp("weed")) as weed:
        yield weed


def _options(server: SeaweedFS, **more: Any) -> dict[str, Any]:
    return {
        "endpoint_url": server.endpoint,
        "access_key_id": server.access_key,
        "secret_access_key": server.secret_key,
        "region": server.region,
        **more,
    }


def _restart_in_background(server: SeaweedFS, downtime: float, kill: bool) -> threading.Thread:
    thread = threading.Thread(target=server.restart, args=(downtime,), kwargs={"kill": kill})
    thread.start()
    return thread


def _wait_until_down(server: SeaweedFS) -> None:
    """Return once the S3 port refuses connections."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", server.port)) != 0:
                return
        time.sleep(0.02)
    raise AssertionError("the server did not go down")


@pytest.mark.parametrize(("downtime", "kill"), [(5.0, True), (15.0, False)])
def test_export_survives_a_server_restart(
    server: SeaweedFS, tmp_path: Path, downtime: float, kill: bool
) -> None:
    url = server.url(f"export-{downtime:g}")
    env = {**os.environ, **server.environ()}
    env.pop("AWS_ALLOW_HTTP", None)
    args = ["export-dataset", "demo:200", "-o", url, "--s3-endpoint-url", server.endpoint]
    args += ["--samples-per-shard", "10", "--workers", "1"]
    cli = [sys.executable, "-c", "from shardex.cli import main; main()", *args]
    export = subprocess.Popen(cli, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    watcher = ObjectStorage(url, _options(server, retry_timeout="2s"))
    deadline = time.monotonic() + 60
    while not any(name.endswith(".tar") for name in watcher.list()):  # a shard is written
        assert export.poll() is None, export.communicate()[0].decode()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    restart = _restart_in_background(server, downtime, kill)
    _wait_until_down(server)
    assert export.poll() is None, "the export ended before the server went down"
    output, _ = export.communicate(timeout=120)
    restart.join()
    assert export.returncode == 0, output.decode()
    options = _options(server)
    assert shardex.verify(url, storage_options=options).ok
    shardex.export("demo:200", tmp_path / "local", samples_per_shard=10, workers=1)
    remote = shardex.open_dataset(url, storage_options=options)
    assert list(remote) == list(shardex.open_dataset(tmp_path / "local"))


def test_reads_survive_a_server_crash(server: SeaweedFS) -> None:
    url = server.url("read")
    options = _options(server)
    storage = ObjectStorage(server.url("blobs"), options)
    big = os.urandom(8 << 20)
    storage.put("big.bin", big)
    shardex.export("demo:60", url, storage_options=options, samples_per_shard=10, workers=1)
    ds = shardex.open_dataset(url, storage_options=options)
    want = [ds[i] for i in range(len(ds))]

    chunks = storage.iter_chunks("big.bin", 1 << 20)
    got = [next(chunks)]
    rest: list[bytes] = []
    reader = threading.Thread(target=lambda: rest.extend(chunks))
    restart = _restart_in_background(server, 5.0, kill=True)
    _wait_until_down(server)
    reader.start()  # the rest of the stream, read across the restart
    assert [ds[i] for i in range(len(ds))] == want  # ranged GETs across the restart
    reader.join()
    restart.join()
    assert b"".join(got + rest) == big
    assert ds.get_many(list(range(len(ds)))) == want


def test_a_stream_cut_mid_body_resumes_where_it_broke(s3: S3Location) -> None:
    data = os.urandom(3 << 20)
    ObjectStorage(s3.url, s3.direct).put("blob", data)
    storage = ObjectStorage(s3.url, s3.counted)
    s3.proxy.reset()
    s3.proxy.cut_next(2, after=1 << 20, when=lambda head: head.method == "GET")
    assert b"".join(storage.iter_chunks("blob", 64 << 10)) == data
    s3.proxy.wait_idle()
    gets = s3.proxy.gets()
    assert [g.fault for g in gets] == ["cut", "cut", None]
    assert gets[0].range is None
    starts = [int(g.range.removeprefix("bytes=").split("-")[0]) for g in gets[1:] if g.range]
    assert len(starts) == 2
    assert 0 < starts[0] <= 1 << 20 < starts[1] <= 2 << 20  # each picks up where it broke


def test_a_dead_server_fails_within_the_budget_with_one_line(server: SeaweedFS) -> None:
    url = server.url("dead")
    storage = ObjectStorage(url, _options(server, retry_timeout="3s"))
    storage.put("x", b"x")
    server.stop()
    started = time.monotonic()
    try:
        with pytest.raises(StorageError) as failed:
            storage.get("x")
        spent = time.monotonic() - started
    finally:
        server.start()
    assert 2.5 < spent < 15
    message = str(failed.value)
    assert "\n" not in message
    assert f"{url}/x" in message


def test_missing_objects_and_refused_credentials_fail_at_once(server: SeaweedFS) -> None:
    url = server.url("fast")
    storage = ObjectStorage(url, _options(server))  # the default budget: 2 minutes
    started = time.monotonic()
    with pytest.raises(ObjectNotFoundError, match="missing"):
        storage.get("missing")
    denied = ObjectStorage(url, _options(server, secret_access_key="wrong"))
    with pytest.raises(StorageError, match=r"denied|Forbidden|403|signature"):
        denied.put("x", b"x")
    assert time.monotonic() - started < 5


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"regoin": "us-east-1"}, "did you mean 'region'"),
        ({"endpoint": "http://x", "retry_timeot": "1s"}, "did you mean 'retry_timeout'"),
        ({"region": {"name": "us-east-1"}}, "must be text, a number or a bool"),
        ({"retry_timeout": "soon"}, "must be a duration"),
        ({"region": "a", "AWS_REGION": "b"}, "name the same setting"),
        ({"client_options": {"allow_http": True}}, "unknown storage option 'client_options'"),
    ],
)
def test_bad_storage_options_are_one_line_config_errors(
    options: dict[str, Any], expected: str, capfd: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ConfigError, match=expected) as refused:
        ObjectStorage("s3://bucket/prefix", options)
    assert "\n" not in str(refused.value)
    assert "panicked" not in capfd.readouterr().err


def test_client_options_given_at_the_top_level_reach_the_client(server: SeaweedFS) -> None:
    # allow_http as a top-level key made obstore panic (a 36-frame Rust backtrace)
    options = _options(server, allow_http=True, AWS_DEFAULT_REGION=server.region)
    storage = ObjectStorage(server.url("flat"), options)
    storage.put("x", b"hello")
    assert storage.get("x") == b"hello"


def test_the_environment_gives_way_to_a_setting_given_under_another_name(
    server: SeaweedFS, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("AWS_REGION", "eu-west-3")
    options = _options(server)
    options["AWS_ENDPOINT"] = options.pop("endpoint_url")
    options["aws_region"] = options.pop("region")
    storage = ObjectStorage(server.url("env"), {**options, "retry_timeout": "1s"})
    storage.put("x", b"from the given endpoint")
    assert storage.get("x") == b"from the given endpoint"
