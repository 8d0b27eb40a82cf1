"""A transparent HTTP/1.1 proxy on loopback that counts requests and injects faults.

It sits between an S3 client and server, forwards every byte unchanged (SigV4 stays valid:
the client signs the ``Host`` it sends, which the proxy passes through) and records one
:class:`RequestRecord` per request; ``fail_next``, ``delay_next``, ``drop_next`` and
``cut_next`` inject errors, delays, dropped connections and responses cut mid-body.
"""

from __future__ import annotations

import contextlib
import io
import select
import socket
import socketserver
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Self
from urllib.parse import parse_qs, unquote, urlsplit
from xml.sax.saxutils import escape

from tests.support.service import Service

LOOPBACK = "127.0.0.1"


class _Target:
    """The path and the query of a request's ``target`` (path and query, as sent)."""

    target: str

    @property
    def path(self) -> str:
        return self.target.partition("?")[0]

    @property
    def query(self) -> str:
        return self.target.partition("?")[2]


@dataclass(frozen=True)
class RequestHead(_Target):
    """A request as the proxy sees it before answering; what fault predicates receive."""

    method: str
    target: str  # path and query, as sent
    headers: dict[str, str]  # lower-cased names

    @property
    def range(self) -> str | None:
        return self.headers.get("range")


@dataclass(frozen=True)
class RequestRecord(_Target):
    """One request that went through a :class:`CountingProxy`, and its answer."""

    method: str
    target: str  # path and query, as sent (path-style: /bucket/key?query)
    range: str | None  # the Range header, e.g. "bytes=0-1023"
    status: int  # 0 when the connection was dropped (drop_next) or broke
    body_bytes: int  # response payload bytes (chunk framing excluded)
    request_bytes: int  # request payload bytes
    duration: float  # seconds from the end of the request head to the end of the answer
    connection: int  # serial number of the client connection (keep-alive reuses one)
    fault: str | None = None  # "fail", "delay", "drop", or "upstream" (server unreachable or
    # broke off mid-response; unreachable is answered with a 502 S3 error)
    client_aborted: bool = False  # the response did not reach the client whole (best effort)
    headers: dict[str, str] = field(default_factory=dict, repr=False, compare=False)

    @property
    def params(self) -> dict[str, list[str]]:
        return parse_qs(self.query, keep_blank_values=True)

    @property
    def bucket(self) -> str:
        return unquote(self.path.lstrip("/").partition("/")[0])

    @property
    def key(self) -> str:
        """The object key (unquoted), empty for a bucket-level request."""
        return unquote(self.path.lstrip("/").partition("/")[2])

    @property
    def is_list(self) -> bool:
        """A ListObjectsV2: a GET on the bucket with ``list-type=2``."""
        return self.method == "GET" and self.params.get("list-type") == ["2"]


@dataclass
class _Fault:
    kind: str  # "fail" | "delay" | "drop" | "cut"
    remaining: int
    status: int = 503
    seconds: float = 0.0
    after: int = 0  # "cut": body bytes passed on before the connection is closed
    when: Callable[[RequestHead], bool] | None = None


_S3_ERROR_CODES = {
    400: "InvalidRequest",
    403: "AccessDenied",
    404: "NoSuchKey",
    408: "RequestTimeout",
    409: "OperationAborted",
    412: "PreconditionFailed",
    416: "InvalidRange",
    429: "SlowDown",
    500: "InternalError",
    502: "BadGateway",
    503: "ServiceUnavailable",
    504: "GatewayTimeout",
}


def _error_response(status: int, resource: str, request_id: str, message: str) -> bytes:
    """A complete HTTP/1.1 response with an S3 XML error body."""
    try:
        reason = HTTPStatus(status).phrase
    except ValueError:
        reason = "Error"
    code = _S3_ERROR_CODES.get(status, "InjectedError")
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>{escape(message)}</Message>"
        f"<Resource>{escape(resource)}</Resource><RequestId>{request_id}</RequestId></Error>"
    ).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\n"
        "Content-Type: application/xml\r\n"
        f"Content-Length: {len(body)}\r\n"
        f"x-amz-request-id: {request_id}\r\n"
        "Connection: keep-alive\r\n\r\n"
    ).encode()
    return head + body


class _ConnectionClosed(Exception):
    """The peer closed the connection between requests."""


def _read_head(rfile: io.BufferedReader) -> bytes:
    """Bytes of one message head, up to and including the blank line."""
    lines: list[bytes] = []
    size = 0
    while True:
        line = rfile.readline(65537)
        if not line:
            if lines:
                raise ConnectionError("connection closed inside a message head")
            raise _ConnectionClosed
        if not lines and line in (b"\r\n", b"\n"):
            continue  # tolerate stray blank lines between messages
        lines.append(line)
        size += len(line)
        if size > 256 * 1024:
            raise ConnectionError("message head too large")
        if line in (b"\r\n", b"\n"):
            return b"".join(lines)


def _parse_headers(head: bytes) -> tuple[str, dict[str, str]]:
    """The start line and the headers (lower-cased names, repeated ones joined by ',')."""
    lines = head.decode("latin-1").split("\n")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.rstrip("\r").partition(":")
        if sep:
            key = name.strip().lower()
            value = value.strip()
            headers[key] = f"{headers[key]},{value}" if key in headers else value
    return lines[0].rstrip("\r"), headers


def _is_chunked(headers: dict[str, str]) -> bool:
    return "chunked" in headers.get("transfer-encoding", "").lower()


def _pieces(rfile: io.BufferedReader, count: int, inside: str) -> Iterator[bytes]:
    """The next ``count`` bytes of ``rfile``, in pieces of 64 KiB at most; a connection
    closed before is a ConnectionError saying what it cut (``inside``)."""
    while count:
        piece = rfile.read(min(count, 1 << 16))
        if not piece:
            raise ConnectionError(f"connection closed inside {inside}")
        count -= len(piece)
        yield piece


def _iter_body(
    rfile: io.BufferedReader, headers: dict[str, str], *, until_close: bool
) -> Iterator[bytes]:
    """Raw body bytes as received (chunk framing included), in pieces.

    ``until_close``: with neither Content-Length nor chunking, the body runs to EOF
    (responses only; such a request has no body).
    """
    if _is_chunked(headers):
        while True:
            size_line = rfile.readline(4096)
            if not size_line:
                raise ConnectionError("connection closed inside a chunked body")
            yield size_line
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while True:  # trailers, then the blank line
                    line = rfile.readline(65537)
                    if not line:
                        raise ConnectionError("connection closed inside chunk trailers")
                    yield line
                    if line in (b"\r\n", b"\n"):
                        return
            yield from _pieces(rfile, size + 2, "a chunk")  # data and its CRLF
    elif "content-length" in headers:
        yield from _pieces(rfile, int(headers["content-length"]), "a message body")
    elif until_close:
        while piece := rfile.read(1 << 16):
            yield piece


def _dechunked_size(raw: bytes) -> int:
    """Payload bytes of a complete chunked body."""
    total, pos = 0, 0
    while True:
        end = raw.index(b"\n", pos)
        size = int(raw[pos:end].split(b";")[0].strip() or b"0", 16)
        if size == 0:
            return total
        total += size
        pos = end + 1 + size + 2


class _ChunkCounter:
    """Counts payload bytes of a chunked body from its raw pieces without keeping them."""

    def __init__(self) -> None:
        self.total = 0
        self._line = b""
        self._skip = 0  # bytes of chunk data (+ CRLF) still to pass over
        self._done = False

    def feed(self, piece: bytes) -> None:
        pos = 0
        while pos < len(piece) and not self._done:
            if self._skip:
                step = min(self._skip, len(piece) - pos)
                self._skip -= step
                pos += step
                continue
            end = piece.find(b"\n", pos)
            if end < 0:
                self._line += piece[pos:]
                return
            line, self._line = self._line + piece[pos:end], b""
            pos = end + 1
            size = int(line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                self._done = True
            else:
                self.total += size
                self._skip = size + 2


class _LaggedWriter:
    """Sends each piece only when the next arrives, so the last can wait for bookkeeping.

    If the client has gone (e.g. it timed out), later pieces are dropped and ``broken`` set,
    so the response can still be read to its end and recorded.
    """

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._pending = b""
        self.broken = False

    def _send(self, data: bytes) -> None:
        if data and not self.broken:
            try:
                self._sock.sendall(data)
            except OSError:
                self.broken = True

    def write(self, data: bytes) -> None:
        self._send(self._pending)
        self._pending = data

    def finish(self) -> None:
        self._send(self._pending)
        self._pending = b""


class _Upstream:
    """One keep-alive connection to the server, reopened when stale."""

    def __init__(
        self, host: str, port: int, timeout: float, track: Callable[[socket.socket, bool], None]
    ) -> None:
        self._addr = (host, port)
        self._timeout = timeout
        self._track = track
        self.sock: socket.socket | None = None
        self.rfile: io.BufferedReader | None = None

    def connect(self) -> None:
        self.close()
        sock = socket.create_connection(self._addr, timeout=self._timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._track(sock, True)
        self.sock = sock
        self.rfile = sock.makefile("rb")

    def stale(self) -> bool:
        """Whether the idle connection was closed (or sent something) by the server."""
        if self.sock is None:
            return True
        poller = select.poll()
        poller.register(self.sock, select.POLLIN | select.POLLERR | select.POLLHUP)
        try:
            return bool(poller.poll(0))
        except OSError:
            return True

    def close(self) -> None:
        if self.sock is not None:
            self._track(self.sock, False)
            with contextlib.suppress(OSError):
                self.sock.close()
        if self.rfile is not None:
            with contextlib.suppress(OSError):
                self.rfile.close()
        self.sock = None
        self.rfile = None


class _Server(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True
    block_on_close = False

    def __init__(self, proxy: CountingProxy, port: int) -> None:
        self.proxy = proxy
        super().__init__((LOOPBACK, port), _Handler)


class _Handler(socketserver.BaseRequestHandler):
    server: _Server

    def handle(self) -> None:
        self.server.proxy._serve_connection(self.request)


class CountingProxy(Service):
    """A transparent HTTP/1.1 proxy on 127.0.0.1 that records every request it forwards.

    Point a client's endpoint at :attr:`endpoint` instead of ``upstream``. Requests and
    responses pass byte for byte (keep-alive, chunked bodies, ``Expect: 100-continue``);
    each finished request appends a :class:`RequestRecord` to :attr:`requests` before the
    last byte of its response reaches the client, so a client call that returned is
    already counted. Faults (:meth:`fail_next`, :meth:`delay_next`, :meth:`drop_next`)
    apply, in the order they were queued, to the next requests they match. ``latency``
    holds every request that many seconds before forwarding it, as a distant server would.
    """

    def __init__(
        self, upstream: str, *, port: int = 0, timeout: float = 120.0, latency: float = 0.0
    ) -> None:
        parts = urlsplit(upstream)
        if parts.scheme != "http" or not parts.hostname or not parts.port:
            raise ValueError(f"upstream must look like http://127.0.0.1:PORT, not {upstream!r}")
        self.upstream = upstream.rstrip("/")
        self._up_host = parts.hostname
        self._up_port = parts.port
        self._port = port
        self._timeout = timeout
        #: seconds every request is held before it is forwarded (a network's round trip);
        #: may be changed while the proxy runs. Added to a ``delay_next`` fault's delay.
        self.latency = latency
        self._lock = threading.Lock()
        self._records: list[RequestRecord] = []
        self._faults: list[_Fault] = []
        self._sockets: set[socket.socket] = set()
        self._connections = 0
        self._served = 0
        self._in_flight = 0
        self._generation = 0  # bumped by reset(): requests begun before it are not recorded
        self._idle = threading.Condition(self._lock)
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        #: set by stop() and by reset(): a delayed request waiting on it is dropped
        self._forget = threading.Event()

    # -- lifecycle

    def start(self) -> Self:
        """Start listening (on a free port unless one was given)."""
        if self._server is not None:
            return self
        self._stopping.clear()
        self._forget = threading.Event()
        self._server = _Server(self, self._port)
        self._port = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.1},
            name=f"CountingProxy:{self._port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop listening and close every open connection."""
        server, self._server = self._server, None
        if server is None:
            return
        self._stopping.set()
        self._forget.set()
        server.shutdown()
        server.server_close()
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    @property
    def port(self) -> int:
        return self._port

    @property
    def endpoint(self) -> str:
        """``http://127.0.0.1:PORT`` of the proxy."""
        if self._server is None:
            raise RuntimeError("the proxy is not running")
        return f"http://{LOOPBACK}:{self._port}"

    # -- records

    @property
    def requests(self) -> list[RequestRecord]:
        """A snapshot of the recorded requests, oldest first."""
        with self._lock:
            return list(self._records)

    @property
    def connections(self) -> int:
        """Client connections accepted so far (fewer than requests means keep-alive works)."""
        with self._lock:
            return self._connections

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """Wait until no request is being handled (e.g. a delayed one whose client gave up).

        Returns ``False`` if requests were still in flight after ``timeout`` seconds.
        """
        with self._idle:
            return self._idle.wait_for(lambda: self._in_flight == 0, timeout)

    def reset(self) -> None:
        """Forget the recorded requests and any faults still queued.

        A request still in flight (e.g. one an earlier test delayed, whose client gave up)
        is not recorded when it ends: what is recorded after a reset began after it. One
        still held by a delay is dropped (its connection closed) at once.
        """
        with self._lock:
            self._records.clear()
            self._faults.clear()
            self._generation += 1
            self._forget.set()
            self._forget = threading.Event()

    def count(
        self,
        method: str | None = None,
        predicate: Callable[[RequestRecord], bool] | None = None,
    ) -> int:
        """Recorded requests with that method (any if ``None``) matching ``predicate``."""
        return len(self._select(method, predicate))

    def lists(self) -> list[RequestRecord]:
        """ListObjectsV2 requests (GETs with ``list-type=2``)."""
        return self._select("GET", lambda r: r.is_list)

    def gets(self) -> list[RequestRecord]:
        """GET requests that are not lists (whole or ranged object reads)."""
        return self._select("GET", lambda r: not r.is_list)

    def _select(
        self, method: str | None, predicate: Callable[[RequestRecord], bool] | None
    ) -> list[RequestRecord]:
        method = method.upper() if method else None
        return [
            r
            for r in self.requests
            if (method is None or r.method == method) and (predicate is None or predicate(r))
        ]

    # -- faults

    def fail_next(
        self, n: int = 1, status: int = 503, *, when: Callable[[RequestHead], bool] | None = None
    ) -> None:
        """Answer the next ``n`` matching requests with ``status`` and an S3 XML error body,
        without forwarding them."""
        self._add_fault(_Fault("fail", n, status=status, when=when))

    def delay_next(
        self, n: int, seconds: float, *, when: Callable[[RequestHead], bool] | None = None
    ) -> None:
        """Hold the next ``n`` matching requests for ``seconds`` before forwarding them.

        The request still reaches the server after the delay, even if the client gave up.
        """
        self._add_fault(_Fault("delay", n, seconds=seconds, when=when))

    def drop_next(self, n: int = 1, *, when: Callable[[RequestHead], bool] | None = None) -> None:
        """Close the client connection instead of answering the next ``n`` matching requests."""
        self._add_fault(_Fault("drop", n, when=when))

    def cut_next(
        self, n: int = 1, *, after: int, when: Callable[[RequestHead], bool] | None = None
    ) -> None:
        """Forward the next ``n`` matching requests but close the client connection after
        ``after`` bytes of the response body, as a server that dies mid-response."""
        self._add_fault(_Fault("cut", n, after=after, when=when))

    def clear_faults(self) -> None:
        """Drop every fault still queued."""
        with self._lock:
            self._faults.clear()

    def _add_fault(self, fault: _Fault) -> None:
        if fault.remaining < 1:
            raise ValueError("n must be at least 1")
        with self._lock:
            self._faults.append(fault)

    def _take_fault(self, head: RequestHead) -> _Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.when is None or fault.when(head):
                    fault.remaining -= 1
                    if fault.remaining <= 0:
                        self._faults.remove(fault)
                    return fault
        return None

    # -- serving

    def _track(self, sock: socket.socket, add: bool) -> None:
        with self._lock:
            if add:
                self._sockets.add(sock)
            else:
                self._sockets.discard(sock)

    def _record(self, record: RequestRecord, generation: int) -> None:
        with self._lock:
            if generation == self._generation:
                self._records.append(record)

    def _serve_connection(self, client: socket.socket) -> None:
        with self._lock:
            self._connections += 1
            conn_id = self._connections
        self._track(client, True)
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        rfile = client.makefile("rb")
        upstream = _Upstream(self._up_host, self._up_port, self._timeout, self._track)
        try:
            while not self._stopping.is_set():
                if not self._serve_one(client, rfile, upstream, conn_id):
                    break
        except (_ConnectionClosed, OSError, ValueError):
            pass
        finally:
            upstream.close()
            self._track(client, False)
            with contextlib.suppress(OSError):
                rfile.close()
            with contextlib.suppress(OSError):
                client.close()

    def _serve_one(
        self, client: socket.socket, rfile: io.BufferedReader, upstream: _Upstream, conn_id: int
    ) -> bool:
        """Relay one request and its response; ``False`` when the connection must close."""
        head = _read_head(rfile)
        with self._idle:
            self._in_flight += 1
        try:
            return self._relay(client, rfile, upstream, conn_id, head)
        finally:
            with self._idle:
                self._in_flight -= 1
                self._idle.notify_all()

    def _relay(
        self,
        client: socket.socket,
        rfile: io.BufferedReader,
        upstream: _Upstream,
        conn_id: int,
        head: bytes,
    ) -> bool:
        started = time.perf_counter()
        with self._lock:
            generation, forget = self._generation, self._forget
        start_line, headers = _parse_headers(head)
        method, _, rest = start_line.partition(" ")
        target = rest.rpartition(" ")[0] or rest
        version = rest.rpartition(" ")[2]
        method = method.upper()
        request_head = RequestHead(method, target, headers)

        own_continue = headers.get("expect", "").lower() == "100-continue"
        if own_continue:
            client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        body = b"".join(_iter_body(rfile, headers, until_close=False))
        request_bytes = _dechunked_size(body) if _is_chunked(headers) and body else len(body)
        client_close = headers.get("connection", "").lower() == "close" or version == "HTTP/1.0"

        def record(
            status: int, body_bytes: int, fault: str | None, client_aborted: bool = False
        ) -> None:
            self._record(
                RequestRecord(
                    method=method,
                    target=target,
                    range=headers.get("range"),
                    status=status,
                    body_bytes=body_bytes,
                    request_bytes=request_bytes,
                    duration=time.perf_counter() - started,
                    connection=conn_id,
                    fault=fault,
                    client_aborted=client_aborted,
                    headers=headers,
                ),
                generation,
            )

        fault = self._take_fault(request_head)
        fault_name = fault.kind if fault else None
        if fault is not None and fault.kind == "fail":
            with self._lock:
                self._served += 1
                request_id = f"SHARDEXPROXY{self._served:08d}"
            response = _error_response(
                fault.status, request_head.path, request_id, f"injected fault ({fault.status})"
            )
            if method == "HEAD":
                response = response.partition(b"\r\n\r\n")[0] + b"\r\n\r\n"
            record(
                fault.status,
                0 if method == "HEAD" else len(response.partition(b"\r\n\r\n")[2]),
                "fail",
            )
            client.sendall(response)
            return not client_close
        if fault is not None and fault.kind == "drop":
            record(0, 0, "drop")
            with contextlib.suppress(OSError):
                client.shutdown(socket.SHUT_RDWR)
            return False
        if fault is not None and fault.kind == "delay" and forget.wait(fault.seconds):
            return False  # the proxy stops, or was reset: the client's answer is not wanted
        if self.latency > 0 and forget.wait(self.latency):
            return False

        # Forward the request; retry once on a fresh connection if a reused one was stale.
        for attempt in range(2):
            reused = upstream.sock is not None
            try:
                if upstream.stale():
                    upstream.connect()
                    reused = False
                assert upstream.sock is not None
                assert upstream.rfile is not None
                upstream.sock.sendall(head + body)
                status_head = self._read_response_head(upstream.rfile, client, own_continue)
                break
            except (OSError, _ConnectionClosed) as exc:
                upstream.close()
                if reused and attempt == 0:
                    continue
                record(502, 0, "upstream")
                response = _error_response(
                    502, request_head.path, "SHARDEXPROXYUPSTREAM", f"upstream unreachable: {exc}"
                )
                client.sendall(response)
                return not client_close

        status_line, resp_headers = _parse_headers(status_head)
        parts = status_line.split(" ", 2)
        status = int(parts[1])
        no_body = method == "HEAD" or status in (204, 304)
        until_close = (
            not no_body and "content-length" not in resp_headers and not _is_chunked(resp_headers)
        )
        server_close = (
            until_close
            or resp_headers.get("connection", "").lower() == "close"
            or (
                parts[0] == "HTTP/1.0"
                and resp_headers.get("connection", "").lower() != "keep-alive"
            )
        )

        writer = _LaggedWriter(client)
        writer.write(status_head)
        body_bytes = 0
        if not no_body:
            assert upstream.rfile is not None
            counter = _ChunkCounter() if _is_chunked(resp_headers) else None
            try:
                for piece in _iter_body(upstream.rfile, resp_headers, until_close=until_close):
                    if counter is not None:
                        counter.feed(piece)
                    else:
                        body_bytes += len(piece)
                    if fault is not None and fault.kind == "cut" and body_bytes >= fault.after:
                        writer.write(piece[: len(piece) - (body_bytes - fault.after)])
                        writer.finish()
                        record(status, fault.after, "cut", True)
                        upstream.close()
                        with contextlib.suppress(OSError):
                            client.shutdown(socket.SHUT_RDWR)
                        return False
                    writer.write(piece)
            except OSError:  # the server broke off mid-body: pass the breakage on
                record(status, counter.total if counter else body_bytes, "upstream", True)
                upstream.close()
                return False
            if counter is not None:
                body_bytes = counter.total
        record(status, body_bytes, fault_name, writer.broken)
        writer.finish()
        if server_close:
            upstream.close()
        return not (client_close or server_close or writer.broken)

    @staticmethod
    def _read_response_head(
        rfile: io.BufferedReader, client: socket.socket, own_continue: bool
    ) -> bytes:
        """The final response head; interim 1xx heads go to the client unless already sent."""
        while True:
            head = _read_head(rfile)
            code = head[9:12]
            if code.startswith(b"1") and code != b"101":
                if not own_continue:
                    client.sendall(head)
                continue
            return head


# --------------------------------------------------------------------------- self-check
