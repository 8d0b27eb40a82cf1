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
proxy, for tiny samples (16x16 JPEG + ``.cls``) and ~100 KB images, for both ways of
scanning headers (:data:`shardex.sources.objecttars.SCAN`: ranged GETs that hop from
header to header, or one streamed GET per tar): requests and bytes per sample of the scan
alone and of the whole export.

Usage::

    .venv/bin/python benchmarks/bench_s3_sources.py [--images 5000] [--size-kb 16]
        [--repeats 3] [--workers 2] [--tars] [--per-tar 1000] [--workdir DIR] [--json PATH]
    .venv/bin/python benchmarks/bench_s3_sources.py --scan-costs
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

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


def scan_costs(workers: int) -> list[Row]:
    """Requests and bytes per sample of tar sources on S3, both ways of scanning."""
    import io
    import tarfile

    from shardex.sources import TarSource, objecttars
    from shardex.storage import ObjectStorage
    from tests.support.proxy import CountingProxy
    from tests.support.seaweedfs import SeaweedFS

    cases = {"tiny (16x16 JPEG + .cls)": (4000, 16, False), "~100 KB JPEG + .cls": (400, 280, True)}
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
            for case, (count, side, noise) in cases.items():
                images = [_jpeg(i, side, noise) for i in range(min(count, 64))]
                tars = {}
                for t in range(4):
                    buf = io.BytesIO()
                    with tarfile.open(fileobj=buf, mode="w") as tf:
                        for i in range(t * count // 4, (t + 1) * count // 4):
                            for ext, data in (
                                ("jpg", images[i % 64]),
                                ("cls", str(i % 7).encode()),
                            ):
                                info = tarfile.TarInfo(f"s{i:06d}.{ext}")
                                info.size = len(data)
                                tf.addfile(info, io.BytesIO(data))
                    tars[f"part-{t}.tar"] = buf.getvalue()
                prefix = server.url(f"scan-{side}")
                store = ObjectStorage(prefix, direct)
                for name, data in tars.items():
                    store.put(name, data)
                total = sum(len(d) for d in tars.values())
                for way in ("ranged", "stream"):
                    objecttars.SCAN = way  # type: ignore[assignment]
                    proxy.reset()
                    list(TarSource(prefix + "/", counted).stream().batches)
                    scan = proxy.gets()
                    proxy.reset()
                    out = scratch / f"{side}-{way}"
                    shardex.export(
                        prefix + "/", out, workers=workers, source_storage_options=counted
                    )
                    every = proxy.gets()
                    for what, got in (("scan", scan), ("export", every)):
                        fetched = sum(r.body_bytes for r in got)
                        rows.append(
                            Row(
                                f"{case}, {way} scan: {what}",
                                "requests/sample",
                                len(got) / count,
                                note=f"{fetched / count:,.0f} B/sample fetched, "
                                f"{fetched / total:.2f}x the tars' bytes",
                            )
                        )
            objecttars.SCAN = "ranged"
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
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
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from tests.support.seaweedfs import SeaweedFS, loopback_only_environment

    args = parse_args(argv)
    loopback_only_environment()
    if args.scan_costs:
        costs = scan_costs(args.workers)
        print(render(costs))
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
