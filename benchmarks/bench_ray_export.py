"""An image-folder prefix on S3 exported to S3 by a 2-node Ray cluster on this machine,
against the local executor in the same run (issue 14, points 2 and 3).

A real SeaweedFS on 127.0.0.1 holds ``--samples`` small JPEGs under ``src/`` laid out
``split/class/name.jpg``. Each export runs in a fresh driver process (so that its peak
RSS and its I/O counters are its own): the local executor (``--workers`` processes) and
``--executor ray``'s path (``run_export`` on a :class:`RayRunner`, a cluster of
``--nodes`` raylets of one CPU each started by ``ray.cluster_utils.Cluster``).

What the driver reads and writes is counted three ways, as no single Linux counter sees
all of it:

* files and pipes: ``rchar`` + ``wchar`` of ``/proc/self/io``, the export's delta. These
  count every ``read``/``write`` (page-cache hits included), which is what the driver
  moves; ``read_bytes``/``write_bytes`` count only block-device traffic, and miss
  whatever the page cache absorbs (all of it, here), so they are shown beside only.
  Neither counts socket ``recv``/``send`` (obstore's HTTP, Ray's gRPC) nor Ray's
  shared-memory object store;
* S3: every connection to the server goes through a TCP relay in the benchmark's own
  process, which attributes each connection to the process that holds its socket (found
  by its port in ``/proc/net/tcp`` and the driver's ``/proc/PID/fd``) and counts its bytes
  both ways, as they move (a connection kept alive across a ``reset`` is charged only what
  it moves after it);
* Ray: the pickled size of every job the driver sends to a task and of every result it
  gets back (the offsets and checksums returned), and the bytes of every object it puts
  in the object store (the reference rows that shard tasks fetch themselves).

The dataset's bytes are the source objects' sizes. The outputs are compared file by file
(SHA-256 of every object, config.yaml included).

Usage::

    .venv/bin/python benchmarks/bench_ray_export.py [--samples 100000] [--size-kb 8]
        [--nodes 2] [--workers 2] [--json PATH] [--before BASE/src]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import os
import resource
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from _report import Row, render, write_json

TARGET_DRIVER_BYTES = 0.01  # of the dataset's bytes (issue 14)
TARGET_RSS_MB = 400.0
TARGET_SPEED = 0.8  # Ray / local executor
SPLITS = (("train", 9), ("val", 1))  # 90% / 10%
CLASSES = 10


# --- the images -------------------------------------------------------------------------


def jpegs(count: int, size_kb: int) -> list[bytes]:
    """``count`` distinct noise JPEGs of about ``size_kb`` KB each."""
    import numpy as np
    from PIL import Image

    side = max(8, int((size_kb * 1024 / 1.1) ** 0.5))  # noise JPEG q=90: ~1.1 B/pixel
    rng = np.random.default_rng(0)
    out = []
    for _ in range(count):
        pixels = rng.integers(0, 256, size=(side, side, 3), dtype=np.uint8)
        buf = io.BytesIO()
        Image.fromarray(pixels).save(buf, format="JPEG", quality=90)
        out.append(buf.getvalue())
    return out


def upload(url: str, options: dict[str, str], samples: int, size_kb: int) -> int:
    """The image folder under ``url``; returns its bytes. 997 distinct images, cycled (the
    export checks and hashes each sample; it does not care that some are alike)."""
    from shardex.storage import ObjectStorage

    storage = ObjectStorage(url, options)
    images = jpegs(997, size_kb)
    parts = sum(w for _, w in SPLITS)
    names = []
    for i in range(samples):
        split = SPLITS[0][0] if i % parts < SPLITS[0][1] else SPLITS[1][0]
        names.append((f"{split}/class{i % CLASSES}/img{i:07d}.jpg", images[i % len(images)]))
    with ThreadPoolExecutor(32) as pool:
        list(pool.map(lambda kv: storage.put(*kv), names))
    return sum(len(data) for _, data in names)


# --- the relay that attributes S3 bytes to the driver -------------------------------------


def _socket_inode(client_port: int, server_port: int) -> str | None:
    """The inode of the client-side socket of a loopback connection, from /proc/net/tcp."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, remote = fields[1], fields[2]
            if (
                int(local.rsplit(":", 1)[1], 16) == client_port
                and int(remote.rsplit(":", 1)[1], 16) == server_port
            ):
                return fields[9]
    return None


def _held_by(pid: int, inode: str) -> bool:
    want = f"socket:[{inode}]"
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for name in names:
        try:
            if os.readlink(f"/proc/{pid}/fd/{name}") == want:
                return True
        except OSError:
            continue
    return False


class Relay:
    """A TCP relay in front of the S3 server: bytes both ways, per connection, counted for
    the driver (the process ``driver_pid``) and for everyone."""

    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        self._upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        self.driver_pid = 0
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self.reset()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def reset(self) -> None:
        with self._lock:
            self.driver = {"up": 0, "down": 0, "connections": 0}
            self.everyone = {"up": 0, "down": 0, "connections": 0}

    def close(self) -> None:
        """Stop accepting connections (those open go on until they close)."""
        self._server.close()

    def _accept(self) -> None:
        while True:
            try:
                client, (_, port) = self._server.accept()
            except OSError:  # closed
                return
            inode = _socket_inode(port, self.port)
            mine = inode is not None and _held_by(self.driver_pid, inode)
            upstream = socket.create_connection(self._upstream)
            with self._lock:
                for counts in (self.everyone, *([self.driver] if mine else [])):
                    counts["connections"] += 1
            for a, b, way in ((client, upstream, "up"), (upstream, client, "down")):
                t = threading.Thread(target=self._pipe, args=(a, b, way, mine), daemon=True)
                t.start()
                self._threads.append(t)

    def _pipe(self, a: socket.socket, b: socket.socket, way: str, mine: bool) -> None:
        # Each piece is counted as it moves, into the counters of that moment: counted at
        # the connection's close instead, a keep-alive connection of the upload (the
        # benchmark's own obstore pool, closed seconds later) charged the whole dataset's
        # upload to the first export after ``reset``. Counted before it is passed on, so
        # that a piece the other end has seen is counted.
        try:
            while data := a.recv(1 << 16):
                with self._lock:
                    self.everyone[way] += len(data)
                    if mine:
                        self.driver[way] += len(data)
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
            a.close()  # the other direction's pipe closes ``b``

    def settle(self, timeout: float = 30.0) -> None:
        """Wait for the connections of the finished driver to be counted."""
        end = time.monotonic() + timeout
        for t in list(self._threads):
            t.join(max(0.0, end - time.monotonic()))
        self._threads = [t for t in self._threads if t.is_alive()]


# --- one export in a fresh driver process -----------------------------------------------


def _io() -> dict[str, int]:
    out = {}
    for line in Path("/proc/self/io").read_text().splitlines():
        name, _, value = line.partition(":")
        out[name] = int(value)
    return out


def _peak_rss_mb() -> float:
    """This process's peak resident memory: ``VmHWM``, the high-water mark of its own
    address space. Not ``ru_maxrss``: Linux carries the forking parent's peak across
    ``execve`` into it (the benchmark's process, which held the images it uploaded)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(mode: str, source: str, output: str, options: dict[str, str], args: Any) -> None:
    """Run one export as the driver; print what it measured as one JSON line."""
    from shardex.engine.run import run_export
    from shardex.options import ExportOptions

    opts = ExportOptions(workers=args.workers)
    sent = {"jobs": 0, "job_bytes": 0, "results": 0, "result_bytes": 0, "puts": 0, "put_bytes": 0}
    started = time.perf_counter()
    if mode == "local":
        before, t0 = _io(), time.perf_counter()
        run_export(source, output, opts, storage_options=options)
        took, after, startup = time.perf_counter() - t0, _io(), 0.0
    else:
        import pickle

        from shardex.pipeline import RayExecutor
        from shardex.pipeline.ray_executor import RayRunner
        from tests.support.raycluster import ray_nodes

        imap = RayRunner.imap

        def counted(self: RayRunner, fn: Any, items: Any) -> Any:
            def each() -> Any:
                for item in items:
                    sent["jobs"] += 1
                    sent["job_bytes"] += len(pickle.dumps(item))
                    yield item

            for result in imap(self, fn, each()):
                sent["results"] += 1
                sent["result_bytes"] += len(pickle.dumps(result))
                yield result

        put = getattr(RayRunner, "put", None)  # not in the code before it (--before)

        def counted_put(self: RayRunner, data: bytes) -> Any:
            assert put is not None
            sent["puts"] += 1
            sent["put_bytes"] += len(data)
            return put(self, data)

        RayRunner.imap = counted  # type: ignore[method-assign]
        if put is not None:
            RayRunner.put = counted_put  # type: ignore[method-assign]
        with ray_nodes(nodes=args.nodes, cpus_per_node=args.workers // args.nodes or 1):
            startup = time.perf_counter() - started
            before, t0 = _io(), time.perf_counter()
            run_export(source, output, opts, storage_options=options, runner=RayExecutor().runner())
            took, after = time.perf_counter() - t0, _io()
    rss = _peak_rss_mb()
    delta = {k: after[k] - before[k] for k in ("rchar", "wchar", "read_bytes", "write_bytes")}
    print(json.dumps({"seconds": took, "startup": startup, "rss_mb": rss, **delta, **sent}))


def run_driver(
    mode: str, source: str, output: str, options: dict[str, str], relay: Relay, args: Any
) -> dict[str, Any]:
    relay.reset()
    env = dict(os.environ)
    if mode == "ray-before":  # the same export with the code of --before (its src folder)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(args.before), *filter(None, [env.get("PYTHONPATH")])]
        )
    command = [
        sys.executable,
        __file__,
        "--child",
        mode.removesuffix("-before"),
        "--source",
        source,
        "--output",
        output,
        "--options",
        json.dumps(options),
        "--nodes",
        str(args.nodes),
        "--workers",
        str(args.workers),
    ]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
    relay.driver_pid = proc.pid
    out, _ = proc.communicate()
    if proc.returncode:
        raise RuntimeError(f"the {mode} export failed (exit {proc.returncode})")
    relay.settle()
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    result["s3_driver"] = dict(relay.driver)
    result["s3_everyone"] = dict(relay.everyone)
    return result


def checksums(url: str, options: dict[str, str]) -> dict[str, str]:
    """SHA-256 of every file of an export on S3."""
    from shardex.storage import ObjectStorage

    storage = ObjectStorage(url, options)
    names = sorted(storage.list())
    with ThreadPoolExecutor(16) as pool:
        digests = pool.map(lambda n: hashlib.sha256(storage.get(n)).hexdigest(), names)
        return dict(zip(names, digests, strict=True))


# --- the report -------------------------------------------------------------------------


def driver_bytes(r: dict[str, Any]) -> int:
    """Files and pipes, S3 both ways, and the Ray jobs and results (0 for local)."""
    s3 = r["s3_driver"]["up"] + r["s3_driver"]["down"]
    ray = r["job_bytes"] + r["result_bytes"] + r.get("put_bytes", 0)
    return int(r["rchar"] + r["wchar"] + s3 + ray)


def rows_of(results: dict[str, dict[str, Any]], samples: int, data: int, same: bool) -> list[Row]:
    local, ray = results["local"], results["ray"]
    base = samples / local["seconds"]
    out = [
        Row("export S3 -> S3, local executor", "samples/s", base, note="workers=2, same run"),
        Row(
            "export S3 -> S3, Ray (2 nodes)",
            "samples/s",
            samples / ray["seconds"],
            baseline=base,
            target=TARGET_SPEED,
            note=f"cluster start-up ({ray['startup']:.0f} s) not counted",
        ),
    ]
    for name, r in results.items():
        total = driver_bytes(r)
        s3 = r["s3_driver"]
        out.append(
            Row(
                f"driver bytes / dataset bytes, {name}",
                "%",
                100 * total / data,
                target=100 * TARGET_DRIVER_BYTES if name.startswith("ray") else None,
                target_on="value",
                higher=False,
                note=(
                    f"{total / samples:.0f} B/sample: files {r['rchar'] + r['wchar']:,} "
                    f"(read_bytes+write_bytes {r['read_bytes'] + r['write_bytes']:,}), "
                    f"S3 down {s3['down']:,} up {s3['up']:,} ({s3['connections']} conns), "
                    f"Ray jobs {r['job_bytes']:,} results {r['result_bytes']:,} "
                    f"puts {r.get('put_bytes', 0):,}"
                ),
            )
        )
        everyone = r["s3_everyone"]
        out.append(
            Row(
                f"S3 up, all processes / dataset bytes, {name}",
                "%",
                100 * everyone["up"] / data,
                note=(
                    f"{everyone['up']:,} B up, {everyone['down']:,} B down "
                    f"({everyone['connections']} conns): the output (tar headers and "
                    "index files on top of the images) and every request's head"
                ),
            )
        )
        out.append(
            Row(
                f"driver peak RSS, {name}",
                "MB",
                r["rss_mb"],
                target=TARGET_RSS_MB if name.startswith("ray") else None,
                target_on="value",
                higher=False,
                note="VmHWM of the driver process (Ray's start-up included)",
            )
        )
    out.append(
        Row(
            "output identical (SHA-256 of every file)",
            "bool",
            float(same),
            target=1.0,
            target_on="value",
            note="every Ray export against the local executor's, config.yaml included",
        )
    )
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--samples", type=int, default=100_000)
    parser.add_argument("--size-kb", type=int, default=8)
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2, help="local processes / Ray CPUs")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--before",
        type=Path,
        default=None,
        help="a src folder of other code (e.g. `git archive BASE src`): its Ray export runs "
        "too, in the same session, for a before/after",
    )
    parser.add_argument("--child", choices=["local", "ray"], help=argparse.SUPPRESS)
    parser.add_argument("--source", help=argparse.SUPPRESS)
    parser.add_argument("--output", help=argparse.SUPPRESS)
    parser.add_argument("--options", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from tests.support.seaweedfs import SeaweedFS, loopback_only_environment

    args = parse_args(argv)
    loopback_only_environment()
    if args.child:
        child(args.child, args.source, args.output, json.loads(args.options), args)
        return 0
    with SeaweedFS(bucket="shardex-bench") as server:
        relay = Relay(server.endpoint)
        options = {
            "endpoint_url": relay.endpoint,
            "region": server.region,
            "access_key_id": server.access_key,
            "secret_access_key": server.secret_key,
        }
        t0 = time.perf_counter()
        data = upload(server.url("src"), options, args.samples, args.size_kb)
        print(
            f"uploaded {args.samples} images, {data:,} bytes, in {time.perf_counter() - t0:.0f} s"
        )
        results = {}
        for mode in ("local", "ray", *(["ray-before"] if args.before else [])):
            load = os.getloadavg()[0]
            results[mode] = run_driver(
                mode, server.url("src") + "/", server.url(f"out-{mode}"), options, relay, args
            )
            results[mode]["load"] = load
            print(mode, json.dumps(results[mode]), flush=True)
        local = checksums(server.url("out-local"), options)
        same = all(local == checksums(server.url(f"out-{m}"), options) for m in results)
        relay.close()
    rows = rows_of(results, args.samples, data, same)
    print(render(rows))
    loads = ", ".join(f"{m} {r['load']:.1f}" for m, r in results.items())
    print(f"load average at the starts: {loads}")
    if args.json:
        write_json(args.json, rows, samples=args.samples, size_kb=args.size_kb, results=results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
