"""The read path against a bare ``os.pread`` (issue 15): format 3 (index-members.npy) and
format 2 (tar headers parsed per sample) on the same shards, in one run.

Uses the image folder and baseline file of ``bench_format.py`` (built once, cached in
``--workdir``) and an export of it under a name that carries the format version
(``export-f3``: rebuilt when missing or written by another format), plus a copy of it
without ``index-members.npy`` as format 2 wrote it (``export-f2``, hard links).

Every row is paired with its baseline measured interleaved in the same run: random reads
with ``os.pread`` of the same image bytes in the same order from ONE concatenated file,
iteration with ``os.pread`` of every image in file order. The machine is shared and noisy,
so each row is given twice: wall clock (median of ``--repeats``) and CPU time of this
process (best of ``--repeats``), which other processes' load barely moves.

Usage::

    .venv/bin/python benchmarks/bench_read.py [--images 20000] [--size-kb 16]
        [--workdir DIR] [--repeats 9] [--json PATH]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import yaml

import shardex
from _report import Row, render, write_json
from bench_format import (
    BATCH,
    DEFAULT_WORKDIR,
    SEED,
    Concat,
    build_concat,
    build_folder,
    check_same_bytes,
    pread_in_order,
    read_all,
    read_batches,
    read_random,
    tar_urls,
    warm,
    webdataset_count,
)
from shardex.contract import FORMAT_VERSION

#: LitData's iterator in the issue's run (same 20,000 JPEGs): litdata is not installed
#: here, as installing it would replace the environment's torch.
LITDATA_ISSUE_RATE = 164_758


def fresh_export(folder: Path, out_root: Path) -> Path:
    """The export of the current format, rebuilt when missing or of another format."""
    out = out_root / f"export-f{FORMAT_VERSION}"
    config = out / "config.yaml"
    if config.exists() and yaml.safe_load(config.read_text())["format_version"] == FORMAT_VERSION:
        return out
    shutil.rmtree(out, ignore_errors=True)
    shardex.export(folder, out, workers=2)
    return out


def as_format_2(export: Path, out_root: Path) -> Path:
    """The same shards as format 2 wrote them: no index-members.npy (hard links)."""
    out = out_root / "export-f3-as-f2"
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(export, out, copy_function=os.link)
    raw = yaml.safe_load((out / "config.yaml").read_text())
    raw["format_version"] = 2
    for info in raw["splits"].values():
        (out / info["index"].pop("members")).unlink()
    (out / "config.yaml").unlink()
    (out / "config.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    return out


def keep_batches(ds: object, batches: Sequence[Sequence[int]]) -> None:
    """Each batch read with ``ds[i]`` into a list, as ``get_many`` returns it."""
    for batch in batches:
        [ds[i] for i in batch]  # type: ignore[index]


def runs(
    fns: Sequence[Callable[[], object]], repeats: int
) -> tuple[list[list[float]], list[list[float]]]:
    """Wall and CPU seconds of each function's runs, run interleaved."""
    walls: list[list[float]] = [[] for _ in fns]
    cpus: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for k, fn in enumerate(fns):
            w, c = time.perf_counter(), time.process_time()
            fn()
            cpus[k].append(time.process_time() - c)
            walls[k].append(time.perf_counter() - w)
    return walls, cpus


def timings(fns: Sequence[Callable[[], object]], repeats: int) -> list[tuple[float, float]]:
    """(median wall seconds, best CPU seconds) of each function, run interleaved."""
    walls, cpus = runs(fns, repeats)
    return [(statistics.median(w), min(c)) for w, c in zip(walls, cpus, strict=True)]


class Reads:
    """The read rows of one export, each with its pread baseline of the same run."""

    def __init__(self, out: Path, concat: Concat, count: int, repeats: int, label: str) -> None:
        self.concat, self.count, self.repeats, self.label = concat, count, repeats, label
        self.order = np.random.default_rng(SEED).permutation(count).tolist()
        self.ds = shardex.open_dataset(out, split="train")
        self.fast = shardex.open_dataset(out, split="train", verify=False)
        check_same_bytes(self.ds, concat, [0, count // 2, count - 1, *self.order[:20]])
        warm(iter([concat.path, *map(Path, tar_urls(out))]))
        for ds in (self.ds, self.fast):
            read_random(ds, self.order)  # faults in the index pages, opens every shard
        self.urls = tar_urls(out)
        from shardex.torch import MapDataset

        self.items = MapDataset(out, "train", decode=False)
        read_random(self.items, self.order[:100])

    def _pair(
        self, name: str, fn: Callable[[], object], sequential: bool, target: float | None
    ) -> list[Row]:
        order = list(range(self.count)) if sequential else self.order
        walls, cpus = runs([fn, lambda: pread_in_order(self.concat, order)], self.repeats)
        (wall, cpu), (base_wall, base_cpu) = (
            (statistics.median(w), min(c)) for w, c in zip(walls, cpus, strict=True)
        )
        # Each run beside the baseline run next to it, under the same load: on a shared
        # machine the best CPU times of the two can come from different moments.
        paired = statistics.median(b / c for c, b in zip(*cpus, strict=True))
        kind = "in file order" if sequential else "same random order"
        note = f"baseline: pread of the image bytes, {kind}, one file"
        n = self.count
        return [
            Row(f"{name}, {self.label}, wall", "samples/s", n / wall, n / base_wall, target,
                note=f"{note}; median of {self.repeats}"),
            Row(f"{name}, {self.label}, CPU", "samples/s", n / cpu, n / base_cpu, target,
                note=f"{note}; best CPU time of {self.repeats}"),
            Row(f"{name}, {self.label}, CPU paired", "x", paired, target=target,
                target_on="value", note=f"median of {self.repeats} CPU-time ratios, each "
                "run to the baseline run beside it"),
        ]  # fmt: skip

    def rows(self) -> list[Row]:
        ds, fast, order = self.ds, self.fast, self.order
        batches = [order[k : k + BATCH] for k in range(0, self.count, BATCH)]
        rows = [
            *self._pair("ds[i] random, verify=True", lambda: read_random(ds, order), False, 0.8),
            *self._pair("ds[i] random, verify=False", lambda: read_random(fast, order), False, 0.85),
            *self._pair(f"get_many({BATCH}), verify=True", lambda: read_batches(ds, batches), False, None),
            *self._pair(f"get_many({BATCH}), verify=False", lambda: read_batches(fast, batches), False, None),
            *self._pair("iterate (for s in ds), verify=True", lambda: read_all(ds), True, 0.8),
            *self._pair("iterate (for s in ds), verify=False", lambda: read_all(fast), True, None),
        ]  # fmt: skip
        (one, _), (many, _) = timings(
            [lambda: read_random(ds, order), lambda: read_batches(ds, batches)], self.repeats
        )
        rows.append(
            Row(f"get_many({BATCH}) / ds[i] per sample, {self.label}", "x", one / many,
                target=1.0, target_on="value", note="wall medians, verify=True")
        )  # fmt: skip
        # The same batches built with ds[i] (the samples of a batch alive together, as
        # get_many returns them): ds[i] above drops each sample before the next read and
        # so reuses one buffer hot in the CPU cache, which a batch cannot.
        (kept, kept_cpu), (many, many_cpu) = timings(
            [lambda: keep_batches(ds, batches), lambda: read_batches(ds, batches)], self.repeats
        )
        rows.append(
            Row(f"get_many({BATCH}) / [ds[i] for i in batch], {self.label}", "x",
                kept_cpu / many_cpu, target=1.0, target_on="value",
                note=f"best CPU of {self.repeats}, verify=True; wall {kept / many:.3f}")
        )  # fmt: skip
        (item, _), (raw, _) = timings(
            [lambda: read_random(self.items, order), lambda: read_random(ds, order)], self.repeats
        )
        rows.append(
            Row(f"MapDataset(decode=False)[i] / ds[i], {self.label}", "x", raw / item,
                target=0.9, target_on="value", note="num_workers=0, wall medians")
        )  # fmt: skip
        return rows

    def peer_rows(self, wall_rate: float, cpu_rate: float) -> list[Row]:
        (peer, _), (base, _) = timings(
            [
                lambda: webdataset_count(self.urls),
                lambda: pread_in_order(self.concat, range(self.count)),
            ],
            self.repeats,
        )
        n = self.count
        note = (
            f"LitData is not installed here (it would replace torch): its {LITDATA_ISSUE_RATE:,}"
            "/s is the issue's run, not this one"
        )
        return [
            Row("iterate webdataset.WebDataset (peer)", "samples/s", n / peer, n / base, None,
                note="baseline: pread in file order; median wall"),
            Row("iterate shardex (wall) / LitData (issue's figure)", "x",
                wall_rate / LITDATA_ISSUE_RATE, target=1.0, target_on="value", note=note),
            Row("iterate shardex (CPU) / LitData (issue's figure)", "x",
                cpu_rate / LITDATA_ISSUE_RATE, target=1.0, target_on="value", note=note),
        ]  # fmt: skip


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--images", type=int, default=20_000, help="number of images")
    p.add_argument("--size-kb", type=int, default=16, help="mean JPEG size in KB")
    p.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR, help="cache folder")
    p.add_argument("--repeats", type=int, default=9, help="repeats per measure")
    p.add_argument("--json", type=Path, help="also write the results as JSON here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    count = args.images
    folder = build_folder(args.workdir, count, args.size_kb)
    out_root = args.workdir / f"exports-n{count}-kb{args.size_kb}"
    out_root.mkdir(parents=True, exist_ok=True)
    concat = build_concat(folder, count, out_root / "concat.bin")
    export = fresh_export(folder, out_root)
    old = as_format_2(export, out_root)
    print(f"load average before: {os.getloadavg()}")
    new_reads = Reads(export, concat, count, args.repeats, f"format {FORMAT_VERSION}")
    rows = new_reads.rows()
    wall, cpu = (
        r.value
        for r in rows
        if r.name.startswith("iterate (for s in ds), verify=True") and r.unit == "samples/s"
    )
    rows += Reads(old, concat, count, args.repeats, "format 2").rows()
    rows += new_reads.peer_rows(wall, cpu)
    print(f"load average after: {os.getloadavg()}")
    print()
    print(render(rows))
    took = time.perf_counter() - started
    print(f"\n{count} images; {args.repeats} repeats; total {took:.0f} s")
    if args.json:
        write_json(args.json, rows, versions={"shardex": shardex.__version__}, images=count,
                   size_kb=args.size_kb, seconds=took)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
