"""Joining a Ray cluster for an export: an address where no cluster answers is refused in
one line within a bounded time (CLI and API), and a Ray the export started is shut down
when it ends, while a Ray the caller had initialised stays."""

from __future__ import annotations

import http.server
import os
import socket
import socketserver
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import shardex
from helpers import closed_port, make_tree, serving
from shardex.errors import ClusterUnreachableError, ConfigError
from shardex.pipeline.ray_connect import check_reachable

pytest.importorskip("ray")

_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ray-connect")
    make_tree(root, [f"c{i % 2}/img{i:03d}.jpg" for i in range(12)])
    return root


def _run_child(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a child Python that imports this checkout's tests (an installed
    shardex runs with no PYTHONPATH set: CI); it must succeed."""
    path = [str(_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    command = [sys.executable, "-c", textwrap.dedent(code), *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env, cwd=_ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A loopback port that never answers: a listener whose accept queue is full, so the
    kernel drops new connection requests (as a firewall that drops packets does)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = int(listener.getsockname()[1])
    queued = []
    for _ in range(4):  # fill the queue; later attempts time out
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        queued.append(s)
    time.sleep(0.2)
    try:
        yield port
    finally:
        for s in queued:
            s.close()
        listener.close()


def test_an_unreachable_address_is_refused_in_one_line_from_python(
    images: Path, tmp_path: Path
) -> None:
    address = f"127.0.0.1:{closed_port()}"
    start = time.monotonic()
    with pytest.raises(ClusterUnreachableError) as refused:
        shardex.export(images, tmp_path / "out", executor="ray", ray_address=address)
    assert time.monotonic() - start < 10
    message = str(refused.value)
    assert "\n" not in message
    assert repr(address) in message, message
    assert "refused" in message, message
    assert "SHARDEX_RAY_CONNECT_TIMEOUT" in message
    assert isinstance(refused.value, ConnectionError)
    assert not (tmp_path / "out").exists()  # nothing written, no lock left
    import ray

    assert not ray.is_initialized()


def test_an_address_that_never_answers_is_refused_within_the_timeout(
    images: Path, tmp_path: Path, silent_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHARDEX_RAY_CONNECT_TIMEOUT", "1.5")
    address = f"ray://127.0.0.1:{silent_port}"
    start = time.monotonic()
    with pytest.raises(ClusterUnreachableError, match=r"no answer within 1\.5 s"):
        shardex.export(images, tmp_path / "out", executor="ray", ray_address=address)
    assert 1.4 < time.monotonic() - start < 8


def test_an_unreachable_address_is_one_error_line_from_the_command(
    images: Path, tmp_path: Path
) -> None:
    address = f"127.0.0.1:{closed_port()}"
    command = [
        *(sys.executable, "-m", "shardex.cli"),
        *("export-dataset", str(images), "-o", str(tmp_path / "out")),
        *("--executor", "ray", "--ray-address", address, "--quiet"),
    ]
    start = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert time.monotonic() - start < 60  # Ray's own retries took minutes
    assert done.returncode == 1, done.stderr
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("error: cannot reach the Ray cluster at"), lines[0]
    assert repr(address) in lines[0]


@pytest.mark.parametrize("address", ["host:port", "ray://", "http://host:6379/x"])
def test_an_address_that_is_not_one_is_refused(images: Path, tmp_path: Path, address: str) -> None:
    with pytest.raises(ConfigError, match="is not host:port"):
        shardex.export(images, tmp_path / "out", executor="ray", ray_address=address)


_RUN = """
import sys
import ray
import shardex
from shardex.errors import BadSampleError
from tests.support.raycluster import local_ray_cluster

images, out, mine = sys.argv[1], sys.argv[2], sys.argv[3] == "mine"
def export(name, **options):
    return shardex.export(images, f"{out}/{name}", executor="ray", ray_address="local",
                          samples_per_shard=4, **options)
if mine:
    with local_ray_cluster(num_cpus=2):
        address = ray.get_runtime_context().gcs_address
        export("a")
        assert ray.is_initialized(), "the caller's Ray was shut down"
        assert ray.get_runtime_context().gcs_address == address
        print("kept")
else:
    export("a")
    print("after success:", ray.is_initialized())
    open(f"{images}/c0/img000.jpg", "r+b").write(b"not a jpeg")  # one bad sample
    try:
        export("b")
    except BadSampleError:
        print("after failure:", ray.is_initialized())
"""


@pytest.mark.parametrize("whose", ["shardex", "mine"])
def test_ray_started_by_the_export_is_shut_down_and_a_callers_is_kept(
    images: Path, tmp_path: Path, whose: str
) -> None:
    source = tmp_path / "images"
    subprocess.run(["cp", "-r", str(images), str(source)], check=True)
    done = _run_child(_RUN, str(source), str(tmp_path), whose)
    if whose == "mine":
        assert "kept" in done.stdout
    else:
        assert "after success: False" in done.stdout, done.stdout
        assert "after failure: False" in done.stdout, done.stdout


_SPEC_RUN = """
import sys
import ray
from shardex.pipeline.ray_executor import RayExecutor
from shardex.pipeline.spec import run_spec

spec, out = sys.argv[1], sys.argv[2]
executor = RayExecutor("local", init_options={"num_cpus": 2})
executor.connect()  # the caller's executor starts Ray: it is the caller's to close
run_spec(spec, out, executor=executor)
print("after run_spec:", ray.is_initialized())
run_spec(spec, out + "2", executor=executor)
executor.close()
print("after close:", ray.is_initialized())
"""


def test_run_spec_leaves_a_callers_executor_and_its_ray_alone(images: Path, tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"source: {images}\nstages: []\noptions: {{samples_per_shard: 4}}\n")
    done = _run_child(_SPEC_RUN, str(spec), str(tmp_path / "out"))
    assert "after run_spec: True" in done.stdout, done.stdout  # was shut down under the caller
    assert "after close: False" in done.stdout, done.stdout


class _Closes(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        """Accept, then close at once (the server closes the connection)."""


class _Silent(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        """Accept, read, never answer (until the client gives up)."""
        while self.request.recv(1 << 16):
            pass


class _Http(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: the test's output is the client's."""


_NOT_RAY = {
    "closes": (_Closes, "closed this one without answering: not Ray"),
    "silent": (_Silent, "no answer within 2 s"),
    "http": (_Http, "not as Ray does"),
}


@pytest.fixture(params=sorted(_NOT_RAY))
def not_ray(request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    """The ``host:port`` of a loopback listener that is not Ray, and why it is refused."""
    handler, why = _NOT_RAY[request.param]
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    for url in serving(server):
        yield url.removeprefix("http://"), why


@pytest.mark.parametrize("scheme", ["", "ray://"])
def test_a_listener_that_is_not_ray_is_refused_in_one_line_within_the_timeout(
    images: Path, tmp_path: Path, not_ray: tuple[str, str], scheme: str
) -> None:
    """Something that accepts TCP at the address but is not Ray (a port that accepts and
    closes, one that never answers, a web server) is one error line within
    SHARDEX_RAY_CONNECT_TIMEOUT, not Ray's own minutes of retries."""
    endpoint, why = not_ray
    address = f"{scheme}{endpoint}"
    command = [
        *(sys.executable, "-m", "shardex.cli"),
        *("export-dataset", str(images), "-o", str(tmp_path / "out")),
        *("--executor", "ray", "--ray-address", address, "--quiet"),
    ]
    env = {**os.environ, "SHARDEX_RAY_CONNECT_TIMEOUT": "2"}
    start = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert time.monotonic() - start < 60  # Ray's own retries take minutes
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"error: cannot reach the Ray cluster at {address!r}"), lines[0]
    assert why in lines[0], lines[0]
    assert not (tmp_path / "out").exists()


def test_a_ray_cluster_passes_the_check() -> None:
    """The check refuses what is not Ray, and lets a real Ray GCS through."""
    from tests.support.raycluster import ray_nodes

    with ray_nodes(nodes=1, cpus_per_node=1) as cluster:
        check_reachable(cluster.address)
