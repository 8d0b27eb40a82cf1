"""Random reads at an object store's latency, where no server is the bottleneck.

An export held in memory is read through :class:`shardex.storage.latency.LatencyStorage`:
every ranged read answers after ``delay`` (10 and 40 ms), and with a tail, 2% of them
300 ms later still. For each setting, in one run:

* a PyTorch DataLoader over ``MapDataset`` (2 workers, batches of 64 in a uniformly random
  order, raw bytes), made by ``MapDataset.dataloader()`` and as a plain ``DataLoader``:
  samples/s against the ideal of the same setting, every request of a batch in flight at
  once and no tail (workers x 64 / delay);
* batches of 64 read in this process with ``get_many``, hedging on and off: p50 and p99
  batch time, the extra requests hedging sent, GETs and bytes per sample;
* ``ds[i]`` one at a time (``batch_size=None``): GETs per sample;
* opening the export with an empty index cache and reading one sample: GETs and bytes;
* with ``--seaweedfs``, on a SeaweedFS server on loopback: reads through this process's
  obstore against the same reads through a helper process (the hop of a DataLoader worker
  forked after its parent's first request), and random reads in a DataLoader against
  MosaicML Streaming and LitData with caches smaller than the dataset (``_s3_peers.py``).

Usage::

    .venv/bin/python benchmarks/bench_s3_latency.py [--samples 10000] [--size-kb 16]
        [--batches 200] [--json PATH] [--seaweedfs [--peer-seconds 60]]
        [--cold-open-samples 2000000]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from typing import Any

import shardex
from shardex.storage.batch import BatchPolicy, read_stats
from shardex.storage.latency import LatencyStorage
from shardex.storage.memory import MemoryStorage

BATCH = 64
WORKERS = 2
TAIL, TAIL_DELAY = 0.02, 0.300


def _export(samples: int, size_kb: int) -> MemoryStorage:
    rng = random.Random(0)
    data = {
        "key": [f"s{i:07d}" for i in range(samples)],
        "bin": [rng.randbytes(size_kb * 1000) for _ in range(samples)],
    }
    shardex.export(data, "memory://bench/export", workers=1)
    return MemoryStorage("memory://bench/export")


def _loader_rate(slow: LatencyStorage, batches: int, lookahead: bool) -> float:
    """Samples/s of a DataLoader over ``MapDataset`` (after one warm-up batch a worker):
    ``MapDataset.dataloader()`` (each worker's next batch requested while one is made), or
    a plain ``DataLoader`` (each batch requested when it is asked)."""
    from torch.utils.data import DataLoader, RandomSampler

    from shardex.torch import MapDataset

    ds = MapDataset(slow, decode=False)
    n = len(ds)
    sampler = RandomSampler(range(n), num_samples=BATCH * (batches + 2 * WORKERS))
    settings: dict[str, Any] = {"sampler": sampler, "num_workers": WORKERS}
    if lookahead:
        loader = ds.dataloader(BATCH, collate_fn=_as_is, **settings)
    else:
        loader = DataLoader(ds, batch_size=BATCH, collate_fn=_as_is, **settings)
    it = iter(loader)
    for _ in range(2 * WORKERS):  # workers started, their index pages fetched
        next(it)
    start = time.perf_counter()
    got = sum(len(batch) for batch in it)
    return got / (time.perf_counter() - start)


def _as_is(batch: list[Any]) -> list[Any]:
    return batch


def _batches(slow: LatencyStorage, batches: int, hedge: bool) -> dict[str, float]:
    """Batches of 64 read here: batch times, extra requests, GETs and bytes per sample."""
    slow.policy = BatchPolicy(hedge=hedge)
    ds = shardex.open_dataset(slow)
    _ = ds.records  # the whole index local: what follows counts sample reads only
    rng = random.Random(1)
    for _ in range(3):  # latencies seen, so that hedging has a threshold
        ds.get_many(rng.sample(range(len(ds)), BATCH))
    read_stats.reset()
    gets, read = slow.gets, slow.bytes_read
    payload, times = 0, []
    for _ in range(batches):
        picks = rng.sample(range(len(ds)), BATCH)
        start = time.perf_counter()
        out = ds.get_many(picks)
        times.append(time.perf_counter() - start)
        payload += sum(len(s["bin"]) for s in out)
    times.sort()
    samples = batches * BATCH
    return {
        "p50_ms": 1000 * times[len(times) // 2],
        "p99_ms": 1000 * times[min(len(times) - 1, int(len(times) * 0.99))],
        "extra_requests": read_stats.hedged / max(1, read_stats.requests - read_stats.hedged),
        "gets_per_sample": (slow.gets - gets) / samples,
        "bytes_per_payload": (slow.bytes_read - read) / payload,
    }


def _one_at_a_time(slow: LatencyStorage, reads: int) -> float:
    ds = shardex.open_dataset(slow)
    _ = ds.records
    rng = random.Random(2)
    gets = slow.gets
    for i in rng.sample(range(len(ds)), reads):
        ds[i]
    return (slow.gets - gets) / reads


def _cold_open_at(samples: int) -> dict[str, int]:
    """:func:`_cold_open` of an export of ``samples`` tiny samples (the index's size)."""
    url = f"memory://bench-cold-{samples}/export"
    data = {"key": [f"k{i:09d}" for i in range(samples)], "bin": [b"x"] * samples}
    shardex.export(data, url, workers=1, samples_per_shard=100_000)
    mem = MemoryStorage(url)
    index = sum(mem.size(p) for p in mem.list() if "/index-" in f"/{p}")
    return {"samples": samples, "index_bytes": index, **_cold_open(mem)}


def _cold_open(mem: MemoryStorage) -> dict[str, int]:
    with tempfile.TemporaryDirectory() as cache:
        os.environ["SHARDEX_CACHE_DIR"] = cache
        slow = LatencyStorage(mem)
        ds = shardex.open_dataset(slow)
        ds[len(ds) // 2]
        return {"gets": slow.gets, "bytes": slow.bytes_read}


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _helper_hop(samples: int, size_kb: int, batches: int, repeats: int = 3) -> dict[str, Any]:
    """On SeaweedFS: reads through this process's obstore against the same reads through a
    helper process (what a DataLoader worker forked after its parent's first request
    uses), batches of 64 and ``ds[i]`` one at a time: samples/s and CPU per sample (this
    process plus the helper), medians of ``repeats`` alternated runs."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from shardex.storage import ObjectStorage
    from shardex.storage.helper import HelperObjectStorage, _helper
    from tests.support.seaweedfs import SeaweedFS, loopback_only_environment

    loopback_only_environment()
    rng = random.Random(0)
    data = {
        "key": [f"s{i:07d}" for i in range(samples)],
        "bin": [rng.randbytes(size_kb * 1000) for _ in range(samples)],
    }
    picks = [rng.sample(range(samples), BATCH) for _ in range(batches)]
    out: dict[str, Any] = {}
    with SeaweedFS(bucket="hop") as server:
        options = {
            "endpoint_url": server.endpoint,
            "region": server.region,
            "access_key_id": server.access_key,
            "secret_access_key": server.secret_key,
        }
        url = server.url("hop/export")
        shardex.export(data, url, workers=1, storage_options=options)
        for mode in ("batch", "one at a time"):
            runs: dict[str, list[tuple[float, float]]] = {"direct": [], "helper": []}
            for _ in range(repeats):
                for kind, rows in runs.items():
                    storage = ObjectStorage(url, options)
                    if kind == "helper":
                        storage._impl = HelperObjectStorage(storage.uri, storage._options)
                        storage._impl_pid = os.getpid()
                    ds = shardex.open_dataset(storage)
                    _ = ds.records
                    ds.get_many(picks[0])
                    helper = _helper()._proc.pid if kind == "helper" else None  # type: ignore[union-attr]
                    aside = _cpu_seconds(helper) if helper else 0.0
                    wall, cpu = time.perf_counter(), time.process_time()
                    for batch in picks:
                        if mode == "batch":
                            ds.get_many(batch)
                        else:
                            for i in batch[:16]:
                                ds[i]
                    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                    rows.append((wall, cpu + (_cpu_seconds(helper) - aside if helper else 0.0)))
            count = len(picks) * (BATCH if mode == "batch" else 16)
            for kind, rows in runs.items():
                walls, cpus = sorted(r[0] for r in rows), sorted(r[1] for r in rows)
                out[f"{mode}, {kind}"] = {
                    "samples_per_s": count / walls[len(walls) // 2],
                    "cpu_us_per_sample": 1e6 * cpus[len(cpus) // 2] / count,
                }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=10_000)
    parser.add_argument("--size-kb", type=int, default=16)
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--json", default=None)
    parser.add_argument(
        "--seaweedfs",
        action="store_true",
        help="also on a SeaweedFS server on loopback: the helper process's hop, and random "
        "reads against MosaicML Streaming and LitData (benchmarks/_s3_peers.py)",
    )
    parser.add_argument("--peer-seconds", type=float, default=60.0)
    parser.add_argument(
        "--cold-open-samples",
        type=int,
        default=0,
        help="also open an export of this many tiny samples cold and read one (~30 s a 2M)",
    )
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs", flush=True)
    mem = _export(args.samples, args.size_kb)
    results: dict[str, Any] = {"cold_open": _cold_open(mem)}
    print(f"cold open + one sample: {results['cold_open']}", flush=True)
    if args.cold_open_samples:
        results["cold_open_large"] = _cold_open_at(args.cold_open_samples)
        print(f"cold open + one sample: {results['cold_open_large']}", flush=True)
    with tempfile.TemporaryDirectory() as cache:
        os.environ["SHARDEX_CACHE_DIR"] = cache
        for delay in (0.010, 0.040):
            for tail in (0.0, TAIL):
                name = f"{delay * 1000:.0f} ms" + (
                    f", {TAIL:.0%} +{TAIL_DELAY * 1000:.0f} ms" if tail else ""
                )
                slow = LatencyStorage(mem, delay, tail=tail, tail_delay=TAIL_DELAY)
                ideal = WORKERS * BATCH / delay
                plain = _loader_rate(slow, args.batches, lookahead=False)
                rate = _loader_rate(slow, args.batches, lookahead=True)
                row: dict[str, Any] = {"loader_samples_per_s": rate, "ideal": ideal}
                row["vs_ideal"], row["plain_vs_ideal"] = rate / ideal, plain / ideal
                for hedge in (False, True):
                    row[f"hedge_{hedge}"] = _batches(slow, args.batches, hedge)
                row["one_at_a_time_gets_per_sample"] = _one_at_a_time(slow, 200)
                results[name] = row
                off, on = row["hedge_False"], row["hedge_True"]
                print(
                    f"{name:>20}: dataloader() {rate:7.0f} samples/s = {rate / ideal:.2f} of "
                    f"ideal {ideal:.0f} (plain DataLoader {plain / ideal:.2f}); batch p50/p99 {off['p50_ms']:.0f}/{off['p99_ms']:.0f} ms "
                    f"unhedged, {on['p50_ms']:.0f}/{on['p99_ms']:.0f} ms hedged "
                    f"(p99 x{off['p99_ms'] / on['p99_ms']:.2f}, +{on['extra_requests']:.1%} "
                    f"requests); {on['gets_per_sample']:.3f} GETs and "
                    f"{on['bytes_per_payload']:.3f}x bytes a sample; one at a time "
                    f"{row['one_at_a_time_gets_per_sample']:.2f} GETs a sample",
                    flush=True,
                )
    if args.seaweedfs:
        results["helper_hop"] = _helper_hop(min(args.samples, 3000), args.size_kb, 20)
        for name, row in results["helper_hop"].items():
            print(
                f"SeaweedFS, {name:>20}: {row['samples_per_s']:6.0f} samples/s, "
                f"{row['cpu_us_per_sample']:4.0f} us of CPU a sample",
                flush=True,
            )
        from _s3_peers import run_peers

        results["peers"] = run_peers(20_000, [0, 40], args.peer_seconds)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    print(f"load average {os.getloadavg()[0]:.2f}", file=sys.stderr)


if __name__ == "__main__":
    main()
