"""Every backend on the same data: export throughput, bytes on disk, random and sequential reads.

Exports the cached JPEG folder of ``bench_format.py`` (N images of about ``--size-kb`` KB in
10 class folders) with each installed backend, then measures, with a warm page cache:

* export throughput (images/s, ``--workers`` processes), as a ratio to the ``webdataset``
  backend's in the same run;
* bytes on disk (every file of the export) relative to the raw image bytes;
* random ``ds[i]`` (raw samples, a fixed random order over the train split), samples/s, as
  a ratio to ``webdataset``;
* sequential iteration (raw samples), samples/s, as a ratio to ``webdataset``.

Usage::

    .venv/bin/python benchmarks/bench_backends.py [--images 5000] [--size-kb 16]
        [--workers 2] [--reads 2000] [--repeats 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

import numpy as np

import shardex
from _report import Row, median_times, render, write_json
from bench_format import DEFAULT_WORKDIR, build_folder
from shardex.backends.registry import REGISTRY

BASE = "webdataset"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--images", type=int, default=5000)
    p.add_argument("--size-kb", type=int, default=16)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--reads", type=int, default=2000, help="random ds[i] per timed run")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR)
    p.add_argument("--json", type=Path, default=None)
    return p.parse_args(argv)


def _bytes_on_disk(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def export_all(
    folder: Path, root: Path, backends: list[str], workers: int, repeats: int
) -> dict[str, float]:
    """Seconds per export of each backend (median, the backends interleaved)."""
    times: dict[str, list[float]] = {b: [] for b in backends}
    for _ in range(repeats):
        for backend in backends:
            out = root / backend
            shutil.rmtree(out, ignore_errors=True)
            t0 = time.perf_counter()
            shardex.export(folder, out, backend=backend, workers=workers)
            times[backend].append(time.perf_counter() - t0)
    return {b: float(np.median(t)) for b, t in times.items()}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    folder = build_folder(args.workdir, args.images, args.size_kb)
    raw = sum(p.stat().st_size for p in folder.rglob("*.jpg"))
    root = args.workdir / f"backends-n{args.images}-kb{args.size_kb}"
    root.mkdir(parents=True, exist_ok=True)
    backends = [e.name for e in REGISTRY.entries() if e.available]
    backends.sort(key=lambda b: b != BASE)
    exports = export_all(folder, root, backends, args.workers, args.repeats)
    datasets = {b: shardex.open_dataset(root / b, split="train") for b in backends}
    order = np.random.default_rng(7).integers(0, args.images, args.reads).tolist()

    def random_reads(ds: shardex.Dataset) -> None:
        for i in order:
            ds[i]

    def iterate(ds: shardex.Dataset) -> None:
        for _ in ds:
            pass

    for ds in datasets.values():  # warm the page cache and each reader's open files
        iterate(ds)
    reads = median_times([lambda ds=ds: random_reads(ds) for ds in datasets.values()], args.repeats)
    scans = median_times([lambda ds=ds: iterate(ds) for ds in datasets.values()], args.repeats)
    n = args.images
    rows: list[Row] = []
    for k, backend in enumerate(backends):
        rows += [
            Row(f"{backend}: export", "images/s", n / exports[backend], n / exports[BASE]),
            Row(
                f"{backend}: bytes on disk / raw",
                "ratio",
                _bytes_on_disk(root / backend) / raw,
                higher=False,
            ),
            Row(
                f"{backend}: random ds[i]",
                "samples/s",
                args.reads / reads[k],
                args.reads / reads[0],
            ),
            Row(f"{backend}: iteration", "samples/s", n / scans[k], n / scans[0]),
        ]
    print()
    print(render(rows))
    took = time.perf_counter() - started
    print(f"\n{n} images of ~{args.size_kb} KB, {raw:,} raw bytes; baseline: the {BASE} backend")
    print(f"medians of {args.repeats} runs; total {took:.0f} s")
    if args.json:
        write_json(
            args.json,
            rows,
            versions={"shardex": shardex.__version__},
            images=n,
            size_kb=args.size_kb,
            seconds=took,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
