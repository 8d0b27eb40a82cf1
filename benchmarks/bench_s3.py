"""shardex on S3 (a real SeaweedFS on 127.0.0.1) against raw obstore doing the same requests.

Starts its own SeaweedFS, takes the cached image folder of ``bench_format.py`` (N JPEGs of
about ``--size-kb`` KB, generated once by its generator) and measures, in one run:

* export throughput to S3 against export to local disk (``workers=2``, interleaved);
* random ``ds[i]`` (raw bytes, ``decode=False``) from N threads in the main process (the
  default storage: obstore in this process), against N threads doing obstore ``get_range``
  of exactly the same byte ranges on an equally configured store; and from 4 spawned
  processes, each with a pickled dataset, against 4 processes doing raw ``get_range``;
* ``get_many(64)`` against 64 ``obstore.get_range_async`` gathered with asyncio;
* iteration (one streamed GET per shard) against ``obstore.get`` of each whole shard;
* the requests that ``ds[i]``, ``get_many`` and iteration make, counted by a proxy.

The machine is shared and noisy: every rate is the median of a few repeats, each measure
runs interleaved with its baseline (``ds[i]`` on 1 thread and ``get_many`` block by block:
25 samples or one batch, then the baseline's same requests, the order alternating), and
the ratio (value / baseline) is what to compare. Main-process rows also give the CPU time
per sample of this process against the baseline's: where the load makes wall time noise,
what shardex adds to the same requests. The load average is printed at start and end.
Every request goes to 127.0.0.1; explicit credentials are passed to every client, and the
cloud metadata endpoint is pointed at a closed loopback port.

Usage::

    .venv/bin/python benchmarks/bench_s3.py [--images 5000] [--size-kb 16] [--reads 800]
        [--repeats 5] [--export-repeats 3] [--iter-repeats 15] [--workdir DIR] [--json PATH]
        [--profile]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import multiprocessing
import os
import pstats
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

import shardex
from _report import Row, median_times, render, write_json
from bench_format import DEFAULT_WORKDIR, build_folder

SEED = 4321
BATCH = 64
SPLIT = "train"
PROCESSES = 4
THREADS = (1, 4, 16)
BLOCK = 25  # samples of a block of the 1-thread ds[i] row, read by both back to back
THREAD_BLOCK = 200  # samples of a block of the n-thread rows, shared by the n threads
TARGET = 0.9  # main-process reads / raw obstore doing the same requests (issue 19)

Range = tuple[str, int, int]  # (path under the export's prefix, start, length)


def loopback_only() -> None:
    """No client may look for cloud credentials: the metadata endpoint is a closed port.

    Set before any client is made; spawned children inherit it.
    """
    from tests.support.seaweedfs import loopback_only_environment

    loopback_only_environment()


# ---------------------------------------------------------------- stores and datasets


def raw_store(url: str, options: dict[str, str]) -> Any:
    """An obstore store configured as ObjectStorage configures its own (same URL, options,
    client timeouts and retry policy), for the baselines."""
    from obstore.store import from_url

    from shardex.storage.options import DEFAULT_RETRY_TIMEOUT, retry_config

    config = {
        "endpoint": options["endpoint_url"],
        "region": options["region"],
        "access_key_id": options["access_key_id"],
        "secret_access_key": options["secret_access_key"],
    }
    client = {"connect_timeout": "5s", "timeout": "60s", "allow_http": True}
    return from_url(
        url, config=config, client_options=client, retry_config=retry_config(DEFAULT_RETRY_TIMEOUT)
    )  # type: ignore[arg-type]


def open_s3(url: str, options: dict[str, str]) -> Any:
    """The split on S3, opened as a user would (the main process requests directly)."""
    return shardex.open_dataset(url, split=SPLIT, decode=False, storage_options=options)


def sample_ranges(ds: Any, indices: Sequence[int]) -> list[Range]:
    """The byte range of each sample, from the index: what ``ds[i]`` fetches."""
    paths = [s.path for s in ds.config.splits[SPLIT].shards]
    out = []
    for i in indices:
        offset, _checksum, shard, length = ds.index.record(i)
        out.append((paths[shard], int(offset), int(length)))
    return out


# ---------------------------------------------------------------- readers


def read_items(ds: Any, indices: Sequence[int]) -> None:
    for i in indices:
        ds[i]


def read_raw(store: Any, ranges: Sequence[Range]) -> None:
    import obstore

    get_range = obstore.get_range
    for path, start, length in ranges:
        get_range(store, path, start=start, length=length)


def in_threads(fn: Callable[[Any], object], parts: Sequence[Any]) -> None:
    """``fn(part)`` for each part, each on its own thread; re-raises the first error."""
    errors: list[BaseException] = []

    def run(part: Any) -> None:
        try:
            fn(part)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(p,)) for p in parts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def split_parts(items: Sequence[Any], n: int) -> list[list[Any]]:
    return [list(items[k::n]) for k in range(n)]


class AsyncBaseline:
    """Batches of ranged reads as ``asyncio.gather`` of ``obstore.get_range_async``."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.loop = asyncio.new_event_loop()

    async def _gather(self, ranges: Sequence[Range]) -> list[Any]:
        import obstore

        return await asyncio.gather(
            *(obstore.get_range_async(self.store, p, start=s, length=n) for p, s, n in ranges)
        )

    def batches(self, batches: Sequence[Sequence[Range]]) -> None:
        for ranges in batches:
            self.loop.run_until_complete(self._gather(ranges))

    def close(self) -> None:
        self.loop.close()


def iterate(ds: Any) -> int:
    n = 0
    for _ in ds:
        n += 1
    return n


def get_shards(store: Any, paths: Sequence[str]) -> int:
    import obstore

    return sum(len(obstore.get(store, p).bytes()) for p in paths)


# ---------------------------------------------------------------- reader processes

_proc: dict[str, Any] = {}


def _proc_init(ds: Any, url: str, options: dict[str, str], barrier: Any) -> None:
    """A spawned reader: the unpickled dataset (requests directly) and a raw store."""
    _proc.update(ds=ds, store=raw_store(url, options), barrier=barrier)


def _proc_read(job: tuple[str, list[Any]]) -> int:
    mode, part = job
    _proc["barrier"].wait(timeout=60)  # one job per process, all starting together
    if mode == "ds":
        read_items(_proc["ds"], part)
    else:
        read_raw(_proc["store"], part)
    return os.getpid()


class ReaderProcesses:
    """``PROCESSES`` spawned processes, each reading its share of the samples."""

    def __init__(self, ds: Any, url: str, options: dict[str, str]) -> None:
        ctx = multiprocessing.get_context("spawn")
        barrier = ctx.Barrier(PROCESSES)
        self.pool = ctx.Pool(PROCESSES, _proc_init, (ds, url, options, barrier))

    def run(self, mode: str, parts: Sequence[list[Any]]) -> None:
        pids = self.pool.map(_proc_read, [(mode, p) for p in parts], chunksize=1)
        if len(set(pids)) != PROCESSES:
            raise RuntimeError(f"reader jobs ran in {len(set(pids))} processes, not {PROCESSES}")

    def close(self) -> None:
        self.pool.close()
        self.pool.join()


# ---------------------------------------------------------------- the benchmark


Blocks = Sequence[Callable[[], object]]


def paired_times(fn: Blocks, base: Blocks, repeats: int) -> tuple[float, float, float, float]:
    """Medians over ``repeats`` runs of the wall and CPU seconds of all of ``fn``'s blocks
    and of all of ``base``'s: block k of each runs back to back, the order alternating
    from block to block and from run to run, so that the load of each moment hits both
    alike (on a loaded machine, whole runs one after the other swing by ±20 %). CPU is
    this process's (obstore's threads included): what a reader costs beside the same
    requests."""
    runs: list[tuple[float, float, float, float]] = []
    for rep in range(repeats):
        gc.collect()
        wall, cpu = [0.0, 0.0], [0.0, 0.0]
        for k, pair in enumerate(zip(fn, base, strict=True)):
            for side in (0, 1) if (k + rep) % 2 == 0 else (1, 0):
                w, c = time.perf_counter(), time.process_time()
                pair[side]()
                wall[side] += time.perf_counter() - w
                cpu[side] += time.process_time() - c
        runs.append((wall[0], wall[1], cpu[0], cpu[1]))
    return tuple(statistics.median(r[k] for r in runs) for k in range(4))  # type: ignore[return-value]


def rate_row(
    name: str,
    count: int,
    fn: Callable[[], object] | Blocks,
    base: Callable[[], object] | Blocks,
    repeats: int,
    note: str,
    target: float | None = None,
    unit: str = "samples/s",
    cpu: bool = True,
) -> Row:
    """``count`` items per run of ``fn`` and of ``base`` (each a callable, or a list of
    blocks run pairwise, see :func:`paired_times`): one warm-up each, then medians; with
    ``cpu``, the CPU time per item of both (this process's) goes in the note."""
    fns = [fn] if callable(fn) else list(fn)
    bases = [base] if callable(base) else list(base)
    for f in (*fns, *bases):
        f()
    took, base_took, used, base_used = paired_times(fns, bases, repeats)
    print(f"  {name}: {count / took:,.0f} vs {count / base_took:,.0f} {unit}", flush=True)
    extra = 1e6 * (took - base_took) / count
    note = f"{note}; {extra:+.0f} µs/sample of wall time"
    if cpu:
        note += (
            f"; CPU {1e6 * used / count:.0f} vs {1e6 * base_used / count:.0f} µs/sample "
            f"(×{used / base_used:.2f})"
        )
    return Row(name, unit, count / took, count / base_took, target, note=note)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (``/proc/PID/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def busy_seconds() -> float:
    """CPU seconds all cores of the machine spent busy so far (``/proc/stat``)."""
    ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def bench_export(
    folder: Path,
    count: int,
    server: Any,
    url: str,
    options: dict[str, str],
    local_root: Path,
    repeats: int,
) -> tuple[list[Row], str, Path]:
    """Export to fresh S3 prefixes and a fresh local folder, interleaved, ``workers=2``;
    also the server's CPU and the machine's busy CPU per run."""
    runs = 0
    cpu: dict[str, list[tuple[float, float]]] = {"s3": [], "local": []}

    def measured(kind: str, fn: Callable[[], object]) -> Callable[[], None]:
        def run() -> None:
            nonlocal runs
            runs += 1
            server_before, busy_before = cpu_seconds(server.pid), busy_seconds()
            fn()
            server_cpu = cpu_seconds(server.pid) - server_before
            cpu[kind].append((server_cpu, busy_seconds() - busy_before))

        return run

    s3_urls: list[str] = []
    local_dirs: list[Path] = []

    def to_s3() -> None:
        s3_urls.append(f"{url}/export-{runs}")
        shardex.export(folder, s3_urls[-1], storage_options=options, workers=2)

    def to_local() -> None:
        local_dirs.append(local_root / f"export-{runs}")
        shardex.export(folder, local_dirs[-1], workers=2)

    fns = [measured("s3", to_s3), measured("local", to_local)]
    took_s3, took_local = median_times(fns, repeats)

    def usage(kind: str) -> str:
        server_cpu = statistics.median(c[0] for c in cpu[kind])
        busy = statistics.median(c[1] for c in cpu[kind])
        return f"server CPU {server_cpu:.2f} s, machine busy {busy:.2f} CPU-s a run"

    rows = [
        Row(
            "export → S3, workers=2",
            "images/s",
            count / took_s3,
            count / took_local,
            note=f"baseline: the same export to local disk; {usage('s3')}",
        ),
        Row(
            "export → local, workers=2",
            "images/s",
            count / took_local,
            note=f"the baseline of the row above; {usage('local')}",
        ),
    ]
    for row in rows:
        print(f"  {row.name}: {row.value:,.0f} images/s", flush=True)
    return rows, s3_urls[-1], local_dirs[-1]


def check_same(ds_s3: Any, local: Path, order: Sequence[int]) -> None:
    """The S3 export is byte for byte the local one (else the comparison means nothing)."""
    ds_local = shardex.open_dataset(local, split=SPLIT)
    for i in order[:50]:
        if ds_s3[i] != ds_local[i]:
            raise SystemExit(f"sample {i} differs between the S3 and the local export")


def bench_threads(
    ds: Any, store: Any, order: list[int], repeats: int, mode: str, threads: Sequence[int]
) -> list[Row]:
    rows = []
    ranges = sample_ranges(ds, order)
    for n in threads:
        # Blocks of samples, each read by both back to back (n threads sharing a block):
        # whole runs one after the other swung the 16-thread ratio from 0.68 to 1.22
        # between two runs of the same code; paired blocks read 1.09 at load 32.
        if n == 1:  # one thread: this one
            fn: Blocks = [lambda b=b: read_items(ds, b) for b in chunked(order, BLOCK)]
            base: Blocks = [lambda b=b: read_raw(store, b) for b in chunked(ranges, BLOCK)]
        else:
            items = [split_parts(b, n) for b in chunked(order, THREAD_BLOCK)]
            raws = [split_parts(b, n) for b in chunked(ranges, THREAD_BLOCK)]
            fn = [lambda ps=ps: in_threads(lambda p: read_items(ds, p), ps) for ps in items]
            base = [lambda ps=ps: in_threads(lambda p: read_raw(store, p), ps) for ps in raws]
        rows.append(
            rate_row(
                f"ds[i] random, {mode}, {n} thread{'s' if n > 1 else ''}",
                len(order),
                fn,
                base,
                repeats,
                f"baseline: {n} thread(s) of obstore get_range, same ranges",
                TARGET,
            )
        )
    return rows


def chunked(items: Sequence[Any], n: int) -> list[Sequence[Any]]:
    return [items[k : k + n] for k in range(0, len(items), n)]


def bench_processes(
    ds: Any, url: str, options: dict[str, str], order: list[int], repeats: int
) -> Row:
    ranges = sample_ranges(ds, order)
    t0 = time.perf_counter()
    procs = ReaderProcesses(ds, url, options)
    try:
        ids, rngs = split_parts(order, PROCESSES), split_parts(ranges, PROCESSES)
        procs.run("ds", ids)  # imports, index mapping and connections before timing
        print(f"  ({PROCESSES} spawned readers ready in {time.perf_counter() - t0:.1f} s)")
        return rate_row(
            f"ds[i] random, {PROCESSES} processes (spawn, pickled ds)",
            len(order),
            lambda: procs.run("ds", ids),
            lambda: procs.run("raw", rngs),
            repeats,
            f"baseline: {PROCESSES} processes of obstore get_range, same ranges",
            TARGET,
            cpu=False,  # the reading is done in the children
        )
    finally:
        procs.close()


def bench_get_many(
    datasets: dict[str, Any], store: Any, order: list[int], repeats: int
) -> list[Row]:
    batches = [order[k : k + BATCH] for k in range(0, len(order) - BATCH + 1, BATCH)]
    any_ds = next(iter(datasets.values()))
    range_batches = [sample_ranges(any_ds, b) for b in batches]
    count = len(batches) * BATCH
    base = AsyncBaseline(store)
    rows = []
    try:
        for mode, ds in datasets.items():
            rows.append(
                rate_row(
                    f"get_many({BATCH}) random, {mode}",
                    count,
                    [lambda ds=ds, b=b: ds.get_many(b) for b in batches],
                    [lambda r=r: base.batches([r]) for r in range_batches],
                    repeats,
                    f"baseline: asyncio.gather of {BATCH} get_range_async, same ranges",
                    TARGET,
                )
            )
    finally:
        base.close()
    return rows


def stream_chunks(storage: Any, paths: Sequence[str]) -> int:
    return sum(len(chunk) for p in paths for chunk in storage.iter_chunks(p))


def stream_views(storage: Any, paths: Sequence[str]) -> int:
    return sum(len(view) for p in paths for view in storage.iter_views(p))


def bench_iterate(datasets: dict[str, Any], store: Any, repeats: int) -> list[Row]:
    """Each pass is short (~0.1 s): ``repeats`` should be larger than the other rows'."""
    any_ds = next(iter(datasets.values()))
    paths = [s.path for s in any_ds.config.splits[SPLIT].shards]
    count = len(any_ds)
    # The storage layer alone (the stream of each shard, no parsing): what is left of the
    # iteration row's gap is the reader's per-sample work (tar parsing, checksums).
    chunks_row = rate_row(
        "stream each shard (storage.iter_chunks), main process",
        count,
        lambda: stream_chunks(any_ds.storage, paths),
        lambda: get_shards(store, paths),
        repeats,
        f"baseline: obstore get of each whole shard ({len(paths)} shards)",
        TARGET,
    )
    views_row = rate_row(
        "stream each shard (storage.iter_views, what iteration reads), main process",
        count,
        lambda: stream_views(any_ds.storage, paths),
        lambda: get_shards(store, paths),
        repeats,
        f"baseline: obstore get of each whole shard ({len(paths)} shards)",
        TARGET,
    )
    return [chunks_row, views_row] + [
        rate_row(
            f"iterate (for s in ds), {mode}",
            count,
            lambda ds=ds: iterate(ds),
            lambda: get_shards(store, paths),
            repeats,
            f"baseline: obstore get of each whole shard ({len(paths)} shards)",
            TARGET,
        )
        for mode, ds in datasets.items()
    ]


def count_requests(server: Any, url: str, options: dict[str, str], count: int) -> list[Row]:
    """GETs made by ds[i], get_many and one iteration pass, seen by a counting proxy."""
    from tests.support.proxy import CountingProxy

    rng = np.random.default_rng(SEED + 1)
    with CountingProxy(server.endpoint) as proxy:
        ds = open_s3(url, {**options, "endpoint_url": proxy.endpoint})
        picks = rng.choice(count, 20, replace=False).tolist()
        ranges = sample_ranges(ds, picks)
        ds[0]  # the first read fetches index-members.npy (once per process, then cached)
        proxy.reset()
        per_item = []
        for i, (_path, start, length) in zip(picks, ranges, strict=True):
            before = len(proxy.requests)
            ds[i]
            new = proxy.requests[before:]
            per_item.append(len(new))
            want = f"bytes={start}-{start + length - 1}"
            if len(new) != 1 or new[0].range != want or new[0].body_bytes != length:
                raise SystemExit(f"ds[{i}] made {[(r.method, r.range) for r in new]}, not {want}")
        print(f"  ds[i]: {per_item.count(1)} of {len(picks)} reads made exactly 1 ranged GET")
        proxy.reset()
        batch = rng.choice(count, BATCH, replace=False).tolist()
        ds.get_many(batch)
        many = proxy.gets()
        many_bytes = sum(r.body_bytes for r in many)
        need = sum(n for _p, _s, n in sample_ranges(ds, batch))
        proxy.reset()
        ds.get_many(batch, coalesce_gap=0)
        exact = proxy.gets()
        proxy.reset()
        iterate(ds)
        shards = len(ds.config.splits[SPLIT].shards)
        it = proxy.gets()
    print(f"  get_many({BATCH}): {len(many)} GETs, {many_bytes / need:.2f}× the sample bytes")
    print(f"  iteration: {len(it)} GETs for {shards} shards")
    return [
        Row(
            "requests per ds[i]",
            "GETs",
            max(per_item),
            target=1,
            target_on="value",
            higher=False,
            note=f"max over {len(picks)} random i; each exactly 1 ranged GET of the sample",
        ),
        Row(
            f"requests per get_many({BATCH})",
            "GETs",
            len(many),
            note=f"ranges 64 KiB apart merge (default); {many_bytes / need:.2f}× the sample bytes",
        ),
        Row(
            f"requests per get_many({BATCH}), coalesce_gap=0",
            "GETs",
            len(exact),
            note=f"{sum(r.body_bytes for r in exact) / need:.2f}× the sample bytes",
        ),
        Row(
            "requests per iteration pass",
            "GETs",
            len(it),
            target=shards,
            target_on="value",
            higher=False,
            note=f"{shards} shards: one streamed GET each",
        ),
    ]


def profile(ds: Any, store: Any, order: list[int], limit: int = 15) -> None:
    """cProfile of ds[i] (main process, 1 thread) and of the raw get_range of the same ranges."""
    ranges = sample_ranges(ds, order)
    for title, fn in (
        ("ds[i] random, main process, 1 thread", lambda: read_items(ds, order)),
        ("obstore get_range, same ranges", lambda: read_raw(store, ranges)),
    ):
        prof = cProfile.Profile()
        prof.runcall(fn)
        print(f"\n--- cProfile: {title} (top {limit} by tottime) ---")
        pstats.Stats(prof).sort_stats("tottime").print_stats(limit)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--images", type=int, default=5000, help="number of images")
    p.add_argument("--size-kb", type=int, default=16, help="mean JPEG size in KB")
    p.add_argument("--reads", type=int, default=800, help="random samples per read run")
    p.add_argument("--repeats", type=int, default=5, help="repeats per read measure")
    p.add_argument("--export-repeats", type=int, default=3, help="repeats per export measure")
    p.add_argument(
        "--iter-repeats", type=int, default=15, help="repeats per iteration measure (short)"
    )
    p.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR, help="image folder cache")
    p.add_argument("--json", type=Path, help="also write the results as JSON here")
    p.add_argument("--profile", action="store_true", help="print cProfile of ds[i] and raw")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    loopback_only()
    args = parse_args(argv)
    started = time.perf_counter()
    load_start = " ".join(f"{x:.2f}" for x in os.getloadavg())
    from tests.support.seaweedfs import SeaweedFS

    count = args.images
    folder = build_folder(args.workdir, count, args.size_kb)
    scratch = Path(tempfile.mkdtemp(prefix="bench-s3-"))
    os.environ["SHARDEX_CACHE_DIR"] = str(scratch / "cache")  # remote index copies
    rows: list[Row] = []
    try:
        t0 = time.perf_counter()
        with SeaweedFS(bucket="shardex-bench") as server:
            print(f"SeaweedFS at {server.endpoint}, ready in {time.perf_counter() - t0:.1f} s")
            options = {
                "endpoint_url": server.endpoint,
                "region": server.region,
                "access_key_id": server.access_key,
                "secret_access_key": server.secret_key,
            }
            base_url = server.url("bench")
            print(f"export ({count} images, workers=2, S3 vs local):")
            export_rows, url, local = bench_export(
                folder, count, server, base_url, options, scratch, args.export_repeats
            )
            rows += export_rows

            order = np.random.default_rng(SEED).permutation(count)[: args.reads].tolist()
            store = raw_store(url, options)
            main_ds = open_s3(url, options)
            check_same(main_ds, local, order)
            print(f"random ds[i], {len(order)} samples a run:")
            rows += bench_threads(main_ds, store, order, args.repeats, "main process", THREADS)
            rows.append(bench_processes(main_ds, url, options, order, args.repeats))
            both = {"main process": main_ds}
            exact = {"main process, coalesce_gap=0": open_s3(url, {**options, "coalesce_gap": "0"})}
            print(f"get_many({BATCH}):")
            rows += bench_get_many({**both, **exact}, store, order, args.repeats)
            print("iteration:")
            rows += bench_iterate(both, store, args.iter_repeats)
            print("requests (counting proxy):")
            rows += count_requests(server, url, options, count)
            if args.profile:
                profile(main_ds, store, order)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print()
    print(render(rows))
    took = time.perf_counter() - started
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"\nload average at start: {load_start}; at end: {load}")
    print(
        f"\n{count} images; medians of {args.export_repeats} (export) and {args.repeats} "
        f"(read) runs; {args.reads} random samples a read run"
    )
    print(f"total {took:.0f} s")
    if args.json:
        write_json(
            args.json,
            rows,
            versions={"shardex": shardex.__version__},
            images=count,
            size_kb=args.size_kb,
            reads=args.reads,
            seconds=took,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
