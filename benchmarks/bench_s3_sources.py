"""Export from a source on S3 (a real SeaweedFS on 127.0.0.1) against the same export from
local disk (issue 14: SeaweedFS -> SeaweedFS >= 0.8x local disk -> local disk).

Takes the cached image folder of ``bench_format.py`` (N JPEGs of about ``--size-kb`` KB in
class folders), uploads it to a prefix of a fresh SeaweedFS, and times, interleaved, the
median of ``--repeats`` runs of each:

* local folder -> local folder (the baseline);
* the S3 prefix -> local folder (the source's listing and one GET per image);
* the S3 prefix -> S3 (source and output on the server; the issue's target);
* local folder -> S3 (the output's cost alone, for reference);
* raw GETs of every source image (32 concurrent, from this process), the ceiling of what
  the server serves: an export from S3 cannot fetch its images faster.

With ``--tars``, the images are first packed into WebDataset tars (``--per-tar`` samples
each, an image and a ``.cls``), and the source is the tars (local, or uploaded).

The outputs are checked equal (the S3-source exports hold the same shards as the local
one). The machine is shared and noisy: compare the ratios, measured in one run.

``--scan-costs`` measures instead what a tar source on S3 fetches, through a counting
proxy, for tiny samples (16x16 JPEG + ``.cls``), ~25 KB and ~100 KB images, and tars that
mix them (one ~100 KB image in four): the ranged scan (GETs that hop from header to
header, reading small members through) with and without local copies of what it read
(:data:`shardex.sources.objecttars.KEEP_COPIES`), with members of 16 KiB and more hopped
over, with every member of 64 KiB and more hopped over even when a grown window fetched
its start (``READ_ON`` 0, the scan before session 11): requests and bytes per sample of
the scan alone and of the whole export, the scan's and the export's times. (One streamed
GET per tar, measured against these until session 21, is gone: RESULTS.md keeps its rows.)

``--ray-scan-costs`` measures what the same tiny and ~25 KB tars fetch when exported with
``executor="ray"`` on a 2-node local cluster (one CPU and 512 MiB of object store each),
40,000 tiny or 4,000 ~25 KB samples (~100 MB of tars each): the scan tasks keeping what
they read in Ray's object store (:mod:`shardex.sources.held`), against no part kept
(``HOLD_SHARE`` 0: the path before), and the local executor (``--workers``) in the same
run; bytes fetched over the tars' bytes, export times (medians of ``--repeats``), and the
shards and Parquet files of all three checked equal. ``--ray-reexport-costs``: the same
for a re-export of a ``webdataset`` export on S3 (2,000 ~25 KB JPEGs, 200 a shard), read
and checked by the driver (before: ``stored.held_tars`` None) or by Ray's tasks (after
one untimed Ray export: the workers' start-up).

Usage::

    .venv/bin/python benchmarks/bench_s3_sources.py [--images 5000] [--size-kb 16]
        [--repeats 3] [--workers 2] [--tars] [--per-tar 1000] [--workdir DIR] [--json PATH]
    .venv/bin/python benchmarks/bench_s3_sources.py --scan-costs
    PYTHONPATH=src:. .venv/bin/python benchmarks/bench_s3_sources.py --ray-scan-costs
    .venv/bin/python benchmarks/bench_s3_sources.py --listing 20000 [--classes 50]

``--listing N`` measures the listing of an image-folder prefix of N keys (see
:func:`listing_costs`): before (one process, page after page), folders listed at once by
threads, and by a runner's tasks.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
import time
import unittest.mock
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import shardex
from _report import Row, median_times, render, write_json
from bench_format import DEFAULT_WORKDIR, build_folder

TARGET = 0.8  # S3 -> S3 / local -> local (issue 14)


def upload(folder: Path, url: str, options: dict[str, str]) -> int:
    """Every file of ``folder`` put below ``url``; returns the number of files."""
    from shardex.storage import ObjectStorage

    storage = ObjectStorage(url, options)
    files = [p for p in sorted(folder.rglob("*")) if p.is_file()]
    with ThreadPoolExecutor(32) as pool:
        list(
            pool.map(lambda p: storage.put(p.relative_to(folder).as_posix(), p.read_bytes()), files)
        )
    return len(files)


def shards_of(out: Path | str, options: dict[str, str] | None) -> dict[str, int]:
    """The shard files of an export (name -> size): what must be equal."""
    from shardex.storage import open_storage

    storage = open_storage(out, options)
    return {p: storage.size(p) for p in storage.list() if p.endswith((".tar", ".parquet"))}


def pack_tars(folder: Path, out: Path, per_tar: int) -> Path:
    """The images of ``folder`` as WebDataset tars under ``out`` (key: class and name,
    members ``.jpg`` and ``.cls``), ``per_tar`` samples each."""
    import io
    import tarfile

    files = [p for p in sorted(folder.rglob("*")) if p.is_file()]
    classes = sorted({p.parent.name for p in files})
    out.mkdir(parents=True)
    for t in range(0, len(files), per_tar):
        with tarfile.open(out / f"part-{t // per_tar:05d}.tar", "w") as tf:
            for p in files[t : t + per_tar]:
                key = f"{p.parent.name}_{p.stem}"
                label = str(classes.index(p.parent.name)).encode()
                for ext, data in (("jpg", p.read_bytes()), ("cls", label)):
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
    return out


def _digests(out: Path) -> dict[str, str]:
    """The shard and Parquet files of a local export (name -> blake2b of the bytes)."""
    import hashlib

    return {
        p.relative_to(out).as_posix(): hashlib.blake2b(p.read_bytes()).hexdigest()
        for p in sorted(out.rglob("*"))
        if p.suffix in (".tar", ".parquet")
    }


def _jpeg(seed: int, side: int, noise: bool) -> bytes:
    import io

    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    if noise:  # noise does not compress: 280x280 is about 100 KB
        pixels = rng.integers(0, 256, (side, side, 3), dtype=np.uint8)
    else:
        pixels = np.full((side, side, 3), rng.integers(0, 256, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=95)
    return out.getvalue()


def scan_costs(workers: int, repeats: int = 1) -> list[Row]:
    """Requests and bytes per sample of tar sources on S3 (see the module docstring);
    times are the medians of ``repeats`` runs, the ways interleaved."""
    import io
    import tarfile

    from shardex.sources import TarSource, objecttars
    from shardex.storage import ObjectStorage
    from tests.support.proxy import CountingProxy
    from tests.support.seaweedfs import SeaweedFS

    cases = {  # samples, image side, noise (incompressible), one ~100 KB image in four,
        # a .json member too
        "tiny (16x16 JPEG + .cls)": (4000, 16, False, False, False),
        "~25 KB JPEG + .cls": (1000, 140, True, False, False),
        "~100 KB JPEG + .cls": (400, 280, True, False, False),
        "mixed (1 in 4 ~100 KB, else tiny) + .cls": (1600, 16, False, True, False),
        "mixed + .cls + .json": (1600, 16, False, True, True),
    }
    ways = [  # scan, members read through below, copies kept, READ_ON
        ("ranged", 64 << 10, False, objecttars.READ_ON),
        ("ranged", 64 << 10, True, objecttars.READ_ON),
        ("ranged", 64 << 10, True, 0),
        ("ranged", 16 << 10, True, objecttars.READ_ON),
    ]
    default, keep, read_on = objecttars.READ_THROUGH, objecttars.KEEP_COPIES, objecttars.READ_ON
    rows: list[Row] = []
    scratch = Path(tempfile.mkdtemp(prefix="bench-tar-scan-"))
    try:
        with SeaweedFS(bucket="shardex-bench") as server, CountingProxy(server.endpoint) as proxy:
            base = {
                "region": server.region,
                "access_key_id": server.access_key,
                "secret_access_key": server.secret_key,
            }
            direct = {**base, "endpoint_url": server.endpoint}
            counted = {**base, "endpoint_url": proxy.endpoint}
            for case, (count, side, noise, mixed, meta) in cases.items():
                images = [
                    _jpeg(i, 280, True) if mixed and i % 4 == 0 else _jpeg(i, side, noise)
                    for i in range(min(count, 64))
                ]
                tars = {}
                for t in range(4):
                    buf = io.BytesIO()
                    with tarfile.open(fileobj=buf, mode="w") as tf:
                        for i in range(t * count // 4, (t + 1) * count // 4):
                            members = [("jpg", images[i % 64]), ("cls", str(i % 7).encode())]
                            if meta:
                                members.append(("json", b'{"score": %d}' % i))
                            for ext, data in members:
                                info = tarfile.TarInfo(f"s{i:06d}.{ext}")
                                info.size = len(data)
                                tf.addfile(info, io.BytesIO(data))
                    tars[f"part-{t}.tar"] = buf.getvalue()
                prefix = server.url(f"scan-{side}-{mixed:d}{meta:d}")
                store = ObjectStorage(prefix, direct)
                for name, data in tars.items():
                    store.put(name, data)
                total = sum(len(d) for d in tars.values())
                mean = sum(len(i) for i in images) / len(images)
                times: dict[int, tuple[list[float], list[float]]] = {
                    w: ([], []) for w in range(len(ways))
                }
                got_scan: dict[int, list[Any]] = {}
                got_export: dict[int, list[Any]] = {}
                shards: dict[int, dict[str, int]] = {}
                for repeat in range(repeats):
                    for w, (_, through, copies, on) in enumerate(ways):
                        objecttars.READ_THROUGH = through  # type: ignore[misc]
                        objecttars.KEEP_COPIES = copies
                        objecttars.READ_ON = on  # type: ignore[misc]
                        proxy.reset()
                        t0 = time.perf_counter()
                        list(TarSource(prefix + "/", counted).stream().batches)
                        times[w][0].append(time.perf_counter() - t0)
                        got_scan[w] = proxy.gets()
                        proxy.reset()
                        out = scratch / f"{side}-{w}-{repeat}"
                        t0 = time.perf_counter()
                        shardex.export(
                            prefix + "/", out, workers=workers, source_storage_options=counted
                        )
                        times[w][1].append(time.perf_counter() - t0)
                        got_export[w] = proxy.gets()
                        shards[w] = _digests(out)
                        shutil.rmtree(out)
                assert all(s == shards[0] for s in shards.values()), "the exports differ"
                for w, (way, through, copies, on) in enumerate(ways):
                    name = f"{way} scan" + (f", hop >= {through >> 10} KiB" if through else "")
                    name += ", copies kept" if copies else ""
                    name += ", no reading on (before)" if way == "ranged" and not on else ""
                    scan_s, export_s = (sorted(t)[len(t) // 2] for t in times[w])
                    for what, got in (("scan", got_scan[w]), ("export", got_export[w])):
                        fetched = sum(r.body_bytes for r in got)
                        took = scan_s if what == "scan" else export_s
                        rows.append(
                            Row(
                                f"{case} (mean {mean / 1024:.1f} KiB), {name}: {what}",
                                "requests/sample",
                                len(got) / count,
                                note=f"{fetched / count:,.0f} B/sample fetched, "
                                f"{fetched / total:.2f}x the tars' bytes; {what} {took:.2f} s",
                            )
                        )
            objecttars.READ_THROUGH = default  # type: ignore[misc]
            objecttars.KEEP_COPIES = keep
            objecttars.READ_ON = read_on  # type: ignore[misc]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return rows


def listing_costs(objects: int, classes: int, repeats: int, workers: int) -> list[Row]:
    """Listing an image-folder prefix of ``objects`` keys (``{train,val}/cNNN/``): the
    whole prefix listed by this process as before (the layout by jumps, then page after
    page), the folders listed at once by threads, and by the tasks of a runner (worker
    processes: what reaches this process is the folders' LISTs and the key tables the
    tasks hand back). Wall time (median of ``repeats``, interleaved), LIST requests and
    bytes per sample, and the bytes that reach this process per sample."""
    import pickle

    from shardex.parallel import Runner
    from shardex.sources import FolderSource, folderlist
    from shardex.storage import ObjectStorage
    from tests.support.proxy import CountingProxy
    from tests.support.seaweedfs import SeaweedFS

    per_class = objects // (2 * classes)
    names = [
        f"{split}/c{c:03d}/img{i:06d}.jpg"
        for split in ("train", "val")
        for c in range(classes)
        for i in range(per_class)
    ]
    handed = [0]

    class Counted(Runner):
        def imap(self, fn: Any, items: Any) -> Any:
            for result in super().imap(fn, items):
                handed[0] += len(pickle.dumps(result))
                yield result

    with SeaweedFS(bucket="shardex-bench") as server, CountingProxy(server.endpoint) as proxy:
        base = {
            "region": server.region,
            "access_key_id": server.access_key,
            "secret_access_key": server.secret_key,
        }
        prefix = server.url("listing")
        store = ObjectStorage(prefix, {**base, "endpoint_url": server.endpoint})
        t0 = time.perf_counter()
        with ThreadPoolExecutor(32) as pool:
            list(pool.map(lambda n: store.put(n, b"x"), names))
        print(f"put {len(names)} objects in {time.perf_counter() - t0:.0f} s", flush=True)
        counted = {**base, "endpoint_url": proxy.endpoint}

        def before() -> Any:  # the layout by jumps, then the prefix listed page by page
            with unittest.mock.patch.object(folderlist, "_plan", return_value=None):
                return FolderSource(prefix, counted).stream()

        runner = Counted(workers)
        runner.__enter__()
        ways: dict[str, Any] = {
            "one process (before)": before,
            "threads": lambda: FolderSource(prefix, counted).stream(),
            f"runner tasks ({workers} processes)": lambda: FolderSource(prefix, counted).stream_on(
                runner
            ),
        }
        seen: dict[str, list[str]] = {}

        def read(way: str) -> None:
            seen[way] = [k for b in ways[way]().batches for k in b.table.column("key").to_pylist()]

        times = median_times([lambda w=w: read(w) for w in ways], repeats)  # type: ignore[misc]
        rows: list[Row] = []
        base_time = times[0]
        for (way, _), took in zip(ways.items(), times, strict=True):
            assert seen[way] == seen["one process (before)"], way  # the same keys, in order
            proxy.reset()
            handed[0] = 0
            read(way)
            lists = proxy.lists()
            xml = sum(r.body_bytes for r in lists)
            tasks = "runner" in way
            mine = sum(r.body_bytes for r in lists if r.params.get("delimiter")) if tasks else xml
            rows.append(
                Row(
                    f"list {len(names):,} keys, {way}",
                    "s",
                    took,
                    baseline=base_time,
                    higher=False,
                    note=f"{len(lists)} LISTs, {xml / len(names):.0f} B/key of XML; "
                    f"reaching this process {(mine + handed[0]) / len(names):.1f} B/key"
                    + (f" (LISTs {mine:,} B, key tables {handed[0]:,} B)" if tasks else ""),
                )
            )
        runner.__exit__(None, None, None)
    return rows


def _small_tars(count: int, side: int, noise: bool) -> dict[str, bytes]:
    """Four tars of ``count`` samples in all: a JPEG (``side`` pixels square) and a ``.cls``."""
    import io
    import tarfile

    images = [_jpeg(i, side, noise) for i in range(64)]
    tars = {}
    for t in range(4):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tf:
            for i in range(t * count // 4, (t + 1) * count // 4):
                for ext, data in (("jpg", images[i % 64]), ("cls", str(i % 7).encode())):
                    info = tarfile.TarInfo(f"s{i:06d}.{ext}")
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
        tars[f"part-{t}.tar"] = buf.getvalue()
    return tars


@contextlib.contextmanager
def _on_ray_and_s3(name: str) -> Iterator[tuple[Any, dict[str, str], dict[str, str], Path]]:
    """A SeaweedFS behind the counting proxy and a 2-node Ray cluster (one CPU and 512 MiB
    of object store a node); yields the proxy, the storage options to the server and
    through the proxy, and a scratch folder (removed after)."""
    from tests.support.proxy import CountingProxy
    from tests.support.raycluster import ray_nodes
    from tests.support.seaweedfs import SeaweedFS

    scratch = Path(tempfile.mkdtemp(prefix=f"bench-{name}-"))
    try:
        with (
            SeaweedFS(bucket="shardex-bench") as server,
            CountingProxy(server.endpoint) as proxy,
            ray_nodes(nodes=2, cpus_per_node=1, object_store_memory=512 << 20),
        ):
            base = {
                "region": server.region,
                "access_key_id": server.access_key,
                "secret_access_key": server.secret_key,
            }
            direct = {**base, "endpoint_url": server.endpoint}
            yield proxy, direct, {**base, "endpoint_url": proxy.endpoint}, scratch
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _rows_of_ways(
    what: str,
    unit: str,
    ways: tuple[str, ...],
    times: dict[str, list[float]],
    fetched: dict[str, int],
    total: int,
) -> list[Row]:
    """A row per way: the bytes it fetched over ``total``, its median time against the
    second way's (Ray before), and every run's time."""

    def median(runs: list[float]) -> float:
        return sorted(runs)[len(runs) // 2]

    before = median(times[ways[1]])
    return [
        Row(
            f"{what}, {way}",
            unit,
            fetched[way] / total,
            note=f"{fetched[way]:,} B fetched of {total:,}; export {median(times[way]):.2f} s "
            f"({median(times[way]) / before:.2f}x Ray before; runs "
            f"{', '.join(f'{t:.2f}' for t in times[way])})",
        )
        for way in ways
    ]


def ray_scan_costs(workers: int, repeats: int = 1) -> list[Row]:
    """Bytes fetched and export times of tiny and ~25 KB tars on S3 exported on Ray, the
    parts kept or not, and by the local executor (see the module docstring)."""
    import warnings

    from shardex.sources import tars as tars_module
    from shardex.storage import ObjectStorage

    cases = {
        "tiny (16x16 JPEG + .cls)": (40_000, 16, False),
        "~25 KB JPEG + .cls": (4_000, 140, True),
    }
    ways = ("ray, parts kept", "ray, none kept (before)", f"local executor, workers={workers}")
    share = tars_module.HOLD_SHARE
    rows: list[Row] = []
    try:
        with _on_ray_and_s3("ray-tar-scan") as (proxy, direct, counted, scratch):
            for case, (count, side, noise) in cases.items():
                tars = _small_tars(count, side, noise)
                prefix = f"s3://shardex-bench/ray-scan-{side}"
                store = ObjectStorage(prefix, direct)
                for name, data in tars.items():
                    store.put(name, data)
                total = sum(len(d) for d in tars.values())
                times: dict[str, list[float]] = {way: [] for way in ways}
                fetched: dict[str, int] = {}
                shards: dict[str, dict[str, str]] = {}
                for repeat in range(repeats):
                    for way in ways:
                        tars_module.HOLD_SHARE = 0.0 if "before" in way else share  # type: ignore[misc]
                        options: dict[str, Any] = (
                            {"executor": "ray"} if way.startswith("ray") else {"workers": workers}
                        )
                        out = scratch / f"{side}-{len(times[way])}-{repeat}"
                        proxy.reset()
                        t0 = time.perf_counter()
                        with warnings.catch_warnings():
                            warnings.simplefilter("ignore")  # "before": fetched again, said once
                            shardex.export(
                                prefix + "/", out, source_storage_options=counted, **options
                            )
                        times[way].append(time.perf_counter() - t0)
                        fetched[way] = sum(r.body_bytes for r in proxy.gets())
                        shards[way] = _digests(out)
                        shutil.rmtree(out)
                tars_module.HOLD_SHARE = share  # type: ignore[misc]
                assert all(s == shards[ways[0]] for s in shards.values()), "the exports differ"
                what = f"{case}, {count} samples, 4 tars"
                rows += _rows_of_ways(what, "x tars' bytes", ways, times, fetched, total)
    finally:
        tars_module.HOLD_SHARE = share  # type: ignore[misc]
    return rows


def ray_reexport_costs(workers: int, repeats: int = 1) -> list[Row]:
    """Bytes fetched and times of a re-export of a webdataset export on S3, on Ray with
    the samples read by tasks or by the driver, and by the local executor."""
    from shardex.backends.webdataset import stored
    from shardex.storage import ObjectStorage

    ways = ("ray, read by tasks", "ray, read by the driver (before)", f"local, workers={workers}")
    rows: list[Row] = []
    real = stored.held_tars  # the driver's, put back after
    try:
        with _on_ray_and_s3("ray-reexport") as (proxy, direct, counted, scratch):
            folder = scratch / "src"
            for i in range(2000):
                path = folder / f"train/c{i % 10}/img{i:05d}.jpg"
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(_jpeg(i, 140, True))
            url = "s3://shardex-bench/wds"
            shardex.export(str(folder), url, samples_per_shard=200, storage_options=direct)
            config = shardex.read_config(ObjectStorage(url, direct))
            total = sum(s.num_bytes for s in config.splits["train"].shards)
            times: dict[str, list[float]] = {way: [] for way in ways}
            fetched: dict[str, int] = {}
            shards: dict[str, dict[str, str]] = {}
            # untimed: the cluster's workers start and import shardex
            shardex.export(url, scratch / "warm", source_storage_options=direct, executor="ray")
            for repeat in range(repeats):
                for way in ways:
                    stored.held_tars = (lambda: None) if "before" in way else real  # type: ignore[assignment]
                    options: dict[str, Any] = (
                        {"executor": "ray"} if way.startswith("ray") else {"workers": workers}
                    )
                    out = scratch / f"out-{len(times[way])}-{repeat}"
                    proxy.reset()
                    t0 = time.perf_counter()
                    shardex.export(url, out, source_storage_options=counted, **options)
                    times[way].append(time.perf_counter() - t0)
                    fetched[way] = sum(r.body_bytes for r in proxy.gets() if r.key.endswith(".tar"))
                    shards[way] = _digests(out)
                    shutil.rmtree(out)
            assert all(s == shards[ways[0]] for s in shards.values()), "the exports differ"
            what = "re-export of 2,000 ~25 KB samples (10 shards)"
            rows += _rows_of_ways(what, "x shards' bytes", ways, times, fetched, total)
    finally:
        stored.held_tars = real  # type: ignore[assignment]
    return rows


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--images", type=int, default=5000)
    parser.add_argument("--size-kb", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--tars", action="store_true", help="the images packed in tars")
    parser.add_argument("--per-tar", type=int, default=1000)
    parser.add_argument("--scan-costs", action="store_true")
    parser.add_argument("--ray-scan-costs", action="store_true")
    parser.add_argument("--ray-reexport-costs", action="store_true")
    parser.add_argument("--listing", type=int, default=0, metavar="N", help="list N keys")
    parser.add_argument("--classes", type=int, default=50, help="per split, with --listing")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from tests.support.seaweedfs import SeaweedFS, loopback_only_environment

    args = parse_args(argv)
    loopback_only_environment()
    if args.listing:
        rows = listing_costs(args.listing, args.classes, args.repeats, args.workers)
        print(render(rows))
        print(f"load average: {os.getloadavg()}")
        if args.json:
            write_json(args.json, rows)
        return 0
    if args.scan_costs or args.ray_scan_costs or args.ray_reexport_costs:
        run = ray_scan_costs if args.ray_scan_costs else scan_costs
        run = ray_reexport_costs if args.ray_reexport_costs else run
        costs = run(args.workers, args.repeats)
        print(render(costs))
        print(f"load average: {os.getloadavg()}")
        if args.json:
            write_json(args.json, costs)
        return 0
    folder = build_folder(args.workdir, args.images, args.size_kb)
    scratch = Path(tempfile.mkdtemp(prefix="bench-s3-sources-"))
    if args.tars:
        folder = pack_tars(folder, scratch / "tars", args.per_tar)
    try:
        with SeaweedFS(bucket="shardex-bench") as server:
            options = {
                "endpoint_url": server.endpoint,
                "region": server.region,
                "access_key_id": server.access_key,
                "secret_access_key": server.secret_key,
            }
            source = server.url("source")
            t0 = time.perf_counter()
            count = upload(folder, source, options)
            print(f"uploaded {count} files in {time.perf_counter() - t0:.1f} s")
            if args.tars:
                source += "/"  # a prefix of tars
                count = args.images
            runs = [0]
            outs: dict[str, Path | str] = {}

            def run(kind: str, src: str, out_s3: bool) -> None:
                runs[0] += 1
                out: Path | str = (
                    server.url(f"out-{kind}-{runs[0]}") if out_s3 else scratch / f"{kind}-{runs[0]}"
                )
                shardex.export(
                    src,
                    out,
                    workers=args.workers,
                    storage_options=options if out_s3 else None,
                    source_storage_options=options,
                )
                outs[kind] = out

            kinds = {
                "local -> local": (str(folder), False),
                "S3 -> local": (source, False),
                "S3 -> S3": (source, True),
                "local -> S3": (str(folder), True),
            }
            fns = [lambda k=k, v=v: run(k, *v) for k, v in kinds.items()]  # type: ignore[misc]
            from shardex.storage import ObjectStorage

            images = ObjectStorage(source, options)
            ranges = [
                (p.relative_to(folder).as_posix(), 0, p.stat().st_size)
                for p in sorted(folder.rglob("*"))
                if p.is_file()
            ]
            fns.append(lambda: images.get_range_batch(ranges))
            times = median_times(fns, args.repeats)
            took = dict(zip([*kinds, "raw"], times, strict=True))
            expected = shards_of(outs["local -> local"], None)
            for kind, out in outs.items():
                got = shards_of(out, options if kinds[kind][1] else None)
                assert got == expected, f"{kind}: different shards"
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    base = count / took["local -> local"]
    rows = [Row("export local -> local", "images/s", base, note=f"workers={args.workers}")]
    rows += [
        Row(
            f"export {kind}",
            "images/s",
            count / took[kind],
            baseline=base,
            target=TARGET if kind == "S3 -> S3" else None,
            note="baseline: local -> local, same run, interleaved",
        )
        for kind in ("S3 -> local", "S3 -> S3", "local -> S3")
    ]
    rows.append(
        Row(
            "raw GETs of the source images",
            "images/s",
            count / took["raw"],
            baseline=base,
            note="32 concurrent GETs from one process: the server's ceiling"
            + (" (whole tars)" if args.tars else ""),
        )
    )
    print(render(rows))
    if args.json:
        write_json(args.json, rows, images=count, size_kb=args.size_kb, repeats=args.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
