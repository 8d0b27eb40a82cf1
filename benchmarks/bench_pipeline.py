"""Pipeline throughput: local processes and Ray against a plain single-process loop.

On the cached JPEG folder of ``bench_format.py`` (N images of about ``--size-kb`` KB), two
workloads, each written as a shardex export:

* **transform**: decode -> resize (shorter side 64, bicubic) -> re-encode (WebP q80);
* **passthrough**: read -> write (original bytes kept).

Each runs as a ``Pipeline`` on ``LocalExecutor(1)``, ``LocalExecutor(--workers)`` and
``RayExecutor`` (a local cluster with ``--workers`` CPUs), and as the baseline: a plain
loop in one process doing the same per-image work with Pillow, then ``shardex.export`` of
the result (the same writing the pipelines do). Reported: images/s and the ratio to the
baseline measured in the same run.

Usage::

    .venv/bin/python benchmarks/bench_pipeline.py [--images 2000] [--size-kb 16]
        [--workers 2] [--repeats 2] [--json PATH] [--no-ray]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

import shardex
from _report import Row, render, write_json
from bench_format import DEFAULT_WORKDIR, build_folder
from shardex.pipeline import ImageWriterStage, LocalExecutor, Pipeline, RayExecutor, ReaderStage
from shardex.pipeline.executors import Executor
from shardex.pipeline.stages import DecodeStage, EncodeStage, ResizeStage
from tests.support.raycluster import local_ray_cluster

SIZE = 64
QUALITY = 80


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--images", type=int, default=2000)
    p.add_argument("--size-kb", type=int, default=16)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR)
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--no-ray", action="store_true", help="skip the Ray executor")
    return p.parse_args(argv)


def baseline(folder: Path, out: Path, transform: bool) -> None:
    """The same work in a plain loop: Pillow per image, then one export."""
    from PIL import Image

    keys, images = [], []
    for path in sorted(folder.rglob("*.jpg")):
        data = path.read_bytes()
        if transform:
            with Image.open(io.BytesIO(data)) as im:
                im = im.convert("RGB")
                scale = SIZE / min(im.size)
                im = im.resize(
                    (round(im.width * scale), round(im.height * scale)), Image.Resampling.BICUBIC
                )
                buf = io.BytesIO()
                im.save(buf, format="WEBP", quality=QUALITY, method=4)
                data = buf.getvalue()
        keys.append(path.relative_to(folder).with_suffix("").as_posix())
        images.append(data)
    field = "webp" if transform else "jpg"
    shardex.export({"key": keys, field: images}, out, workers=1, validate="none")


def pipeline(folder: Path, out: Path, transform: bool, executor: Executor) -> None:
    stages = [DecodeStage(), ResizeStage(SIZE), EncodeStage("webp", quality=QUALITY)]
    Pipeline(
        "bench",
        [ReaderStage(folder, batch_size=64), *(stages if transform else []), ImageWriterStage(out)],
    ).run(executor)


def timed(fn: Callable[[], None], out: Path, repeats: int) -> float:
    best = []
    for _ in range(repeats):
        shutil.rmtree(out, ignore_errors=True)
        t0 = time.perf_counter()
        fn()
        best.append(time.perf_counter() - t0)
    return sorted(best)[len(best) // 2]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    folder = build_folder(args.workdir, args.images, args.size_kb)
    root = args.workdir / "pipeline-out"
    executors: list[tuple[str, Callable[[], Executor]]] = [
        ("local, 1 worker", lambda: LocalExecutor(1)),
        (f"local, {args.workers} workers", lambda: LocalExecutor(args.workers)),
    ]
    cluster = contextlib.ExitStack()
    if not args.no_ray:
        cluster.enter_context(local_ray_cluster(args.workers, object_store_memory=300 * 1024**2))
        executors.append((f"ray, {args.workers} CPUs", RayExecutor))
    rows: list[Row] = []
    n = args.images
    for transform in (True, False):
        work = "decode+resize+webp" if transform else "passthrough"
        base = timed(
            lambda t=transform: baseline(folder, root / "base", t), root / "base", args.repeats
        )
        rows.append(Row(f"{work}: plain loop", "images/s", n / base, n / base))
        for name, make in executors:
            took = timed(
                lambda t=transform, m=make: pipeline(folder, root / "p", t, m()),
                root / "p",
                args.repeats,
            )
            rows.append(Row(f"{work}: pipeline, {name}", "images/s", n / took, n / base))
    cluster.close()
    print()
    print(render(rows))
    took = time.perf_counter() - started
    print(f"\n{n} images of ~{args.size_kb} KB; medians of {args.repeats}; total {took:.0f} s")
    if args.json:
        write_json(
            args.json, rows, versions={"shardex": shardex.__version__}, images=n, seconds=took
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
