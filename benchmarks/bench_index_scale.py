"""The split index at scale: open time, memory and lookups for 10M samples, no image bytes.

Builds the two ``.npy`` files of a split index (``index-samples.npy``, ``index-keys.npy``)
for ``--entries`` synthetic samples with shardex's own builders: offsets/lengths laid out
as 1000-sample shards of ~16 KiB samples, random checksums, and the real key hashes of
keys ``k00000000, k00000001, ...`` (``--random-hashes`` skips hashing). The files are
fsynced and evicted from the page cache, then a FRESH subprocess (clean RSS) measures:

* ``SplitIndex(...)`` open time (cold page cache, then warm) and the RSS it adds;
* ``record(i)`` for random ``i``: first touch (page faults) and warm;
* ``list(idx.candidates(key))`` for random keys: the first lookup of the process
  (maps the key table), then other keys on cold pages, then the same keys warm.

Usage::

    .venv/bin/python benchmarks/bench_index_scale.py [--entries 10000000] [--workdir DIR]
        [--random-hashes] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from _report import Row, render, write_json
from shardex.format.index import (
    KEYS_FILE,
    SAMPLES_FILE,
    SplitIndex,
    build_keys_from_hashes,
    build_samples,
    key_hash,
    to_npy_bytes,
)

SEED = 7
SAMPLES_PER_SHARD = 1000
PROBES = 1000  # random records / keys per measure
WARM_ROUNDS = 20


def key_of(i: int) -> str:
    return f"k{i:08d}"


# ---------------------------------------------------------------- building (parent)


def synthetic_columns(n: int) -> tuple[npt.NDArray[Any], ...]:
    """(shard, offset, length, checksum) of ``n`` samples laid out like a real export."""
    rng = np.random.default_rng(SEED)
    shard = (np.arange(n, dtype=np.uint64) // SAMPLES_PER_SHARD).astype(np.uint32)
    length = (rng.integers(24, 40, size=n, dtype=np.uint32) * 512).astype(np.uint32)
    ends = np.cumsum(length, dtype=np.uint64)
    starts = ends - length
    first = starts[::SAMPLES_PER_SHARD]  # byte position of each shard's first sample
    offset = starts - np.repeat(first, SAMPLES_PER_SHARD)[:n]
    checksum = np.frombuffer(rng.bytes(8 * n), dtype=np.uint64)
    return shard, offset, length, checksum


def key_hashes(n: int, random_hashes: bool) -> tuple[npt.NDArray[np.uint64], float]:
    """Per-sample key hashes, and the seconds it took to make them."""
    t0 = time.perf_counter()
    if random_hashes:
        rng = np.random.default_rng(SEED + 1)
        hashes = np.frombuffer(rng.bytes(8 * n), dtype=np.uint64)
    else:
        hashes = np.fromiter((key_hash(key_of(i)) for i in range(n)), np.uint64, count=n)
    return hashes, time.perf_counter() - t0


def write_durably(path: Path, data: bytes) -> None:
    """Write and fsync, so that the pages are clean and can be evicted afterwards."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def build(folder: Path, n: int, random_hashes: bool) -> dict[str, float]:
    """Write both index files; returns the seconds each step took."""
    times: dict[str, float] = {}
    t0 = time.perf_counter()
    samples = build_samples(*synthetic_columns(n))
    times["columns + build_samples"] = time.perf_counter() - t0
    hashes, times["key hashes"] = key_hashes(n, random_hashes)
    t0 = time.perf_counter()
    keys = build_keys_from_hashes(hashes)
    times["build_keys_from_hashes (sort)"] = time.perf_counter() - t0
    del hashes
    t0 = time.perf_counter()
    write_durably(folder / SAMPLES_FILE, to_npy_bytes(samples))
    del samples
    write_durably(folder / KEYS_FILE, to_npy_bytes(keys))
    times["to_npy_bytes + write + fsync"] = time.perf_counter() - t0
    return times


# ---------------------------------------------------------------- measuring (child)


def rss_bytes() -> int:
    """This process's resident set (VmRSS of /proc/self/status)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def evict(*paths: Path) -> None:
    """Drop the files' (clean) pages from the page cache: the next reads go to disk."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def per_call_us(fn: Callable[[Any], object], args: list[Any], rounds: int = 1) -> float:
    """Mean microseconds of ``fn(a)`` over ``args`` (repeated ``rounds`` times)."""
    t0 = time.perf_counter()
    for _ in range(rounds):
        for a in args:
            fn(a)
    return (time.perf_counter() - t0) / (rounds * len(args)) * 1e6


def measure(folder: Path, n: int, check_keys: bool) -> dict[str, float]:
    """The child's measures (see the module docstring)."""
    samples_path, keys_path = folder / SAMPLES_FILE, folder / KEYS_FILE
    evict(samples_path, keys_path)
    rng = np.random.default_rng(SEED + 2)
    picks = rng.integers(0, n, size=PROBES).tolist()
    other = rng.integers(0, n, size=PROBES).tolist()
    keys = [key_of(i) for i in other]
    out: dict[str, float] = {}
    rss0 = rss_bytes()
    t0 = time.perf_counter()
    idx = SplitIndex(samples_path, keys_path, num_samples=n)
    out["open_cold_ms"] = (time.perf_counter() - t0) * 1e3
    out["rss_open_mb"] = (rss_bytes() - rss0) / 2**20
    t0 = time.perf_counter()
    SplitIndex(samples_path, keys_path, num_samples=n)
    out["open_warm_ms"] = (time.perf_counter() - t0) * 1e3

    out["record_cold_us"] = per_call_us(idx.record, picks)
    out["record_warm_us"] = per_call_us(idx.record, picks, WARM_ROUNDS)

    def lookup(key: str) -> list[int]:
        return list(idx.candidates(key))

    t0 = time.perf_counter()
    first = lookup(key_of(picks[0]))
    out["lookup_first_us"] = (time.perf_counter() - t0) * 1e6
    out["lookup_cold_us"] = per_call_us(lookup, keys)
    out["lookup_warm_us"] = per_call_us(lookup, keys, WARM_ROUNDS)
    again = SplitIndex(samples_path, keys_path, num_samples=n)  # new mappings, cached pages
    t0 = time.perf_counter()
    list(again.candidates(key_of(picks[1])))
    out["lookup_first_cached_us"] = (time.perf_counter() - t0) * 1e6
    out["rss_end_mb"] = (rss_bytes() - rss0) / 2**20
    if check_keys:
        found = [lookup(k) for k in keys[:100]]
        if first != [picks[0]] or any(f != [i] for f, i in zip(found, other, strict=False)):
            raise SystemExit("key lookup returned the wrong sample")
    return out


def run_child(folder: Path, n: int, check_keys: bool) -> dict[str, float]:
    cmd = [sys.executable, __file__, "--child", str(folder), "--entries", str(n)]
    if not check_keys:
        cmd.append("--random-hashes")
    done = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(done.stdout)  # type: ignore[no-any-return]


# ---------------------------------------------------------------- report


def rows_of(m: dict[str, float]) -> list[Row]:
    def at_most(name: str, unit: str, value: float, target: float, note: str = "") -> Row:
        return Row(name, unit, value, None, target, "value", higher=False, note=note)

    def info(name: str, unit: str, value: float, note: str) -> Row:
        return Row(name, unit, value, note=note)

    rounds = f"same {PROBES}, {WARM_ROUNDS} rounds"
    return [
        at_most("SplitIndex open, cold cache", "ms", m["open_cold_ms"], 50, "files evicted first"),
        at_most("SplitIndex open, warm", "ms", m["open_warm_ms"], 50, "second open"),
        at_most("RSS added by open", "MB", m["rss_open_mb"], 50, "VmRSS after - before"),
        info(
            "record(i), first touch",
            "µs/call",
            m["record_cold_us"],
            f"{PROBES} random i, cold cache: a disk read each",
        ),
        info("record(i), warm", "µs/call", m["record_warm_us"], rounds),
        info(
            "candidates(key), first of process",
            "µs",
            m["lookup_first_us"],
            "maps the key table; cold cache",
        ),
        info(
            "candidates(key), cold cache",
            "µs/call",
            m["lookup_cold_us"],
            f"{PROBES} other random keys",
        ),
        info("candidates(key), warm", "µs/call", m["lookup_warm_us"], rounds),
        info(
            "candidates(key), first of a new SplitIndex",
            "µs",
            m["lookup_first_cached_us"],
            "new mappings, pages in the page cache",
        ),
        info(
            "RSS after all probes",
            "MB",
            m["rss_end_mb"],
            "file-backed mmap pages touched (reclaimable)",
        ),
    ]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--entries", type=int, default=10_000_000, help="samples in the index")
    p.add_argument("--workdir", type=Path, help="where the temp dir goes (default: system)")
    p.add_argument("--random-hashes", action="store_true", help="random key hashes (faster)")
    p.add_argument("--json", type=Path, help="also write the results as JSON here")
    p.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    n = args.entries
    if args.child is not None:
        print(json.dumps(measure(args.child, n, not args.random_hashes)))
        return 0
    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="shardex-index-", dir=args.workdir) as tmp:
        folder = Path(tmp)
        t0 = time.perf_counter()
        times = build(folder, n, args.random_hashes)
        sizes = {p.name: p.stat().st_size for p in folder.iterdir()}
        print(f"built a {n:,}-entry index in {time.perf_counter() - t0:.1f} s:")
        for step, took in times.items():
            print(f"  {step:32s} {took:7.2f} s")
        if not args.random_hashes:
            rate = n / times["key hashes"]
            print(f"  (key_hash in a Python loop: {rate:,.0f} keys/s, {1e6 / rate:.2f} µs/key)")
        for name, size in sizes.items():
            print(f"  {name}: {size / 2**20:,.1f} MiB")
        measures = run_child(folder, n, not args.random_hashes)
    rows = rows_of(measures)
    print()
    print(render(rows))
    if args.json:
        write_json(
            args.json, rows, entries=n, build_seconds=times, file_bytes=sizes, measures=measures
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
