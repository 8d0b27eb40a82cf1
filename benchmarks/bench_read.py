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

LitData (a peer, ``pip install 'shardex[bench]'``) reads a copy of the same images made
once with ``litdata.optimize`` (``--workdir``/exports-.../litdata-VERSION): its iterator
and its random ``ds[i]`` (on the first ``--litdata-random`` samples of the random order:
a LitData random read costs ~1 ms) each beside a pread baseline of the same run.

Usage::

    .venv/bin/python benchmarks/bench_read.py [--images 20000] [--size-kb 16]
        [--workdir DIR] [--repeats 9] [--litdata-random 2000] [--json PATH]
"""

from __future__ import annotations

import argparse
import importlib.util
import math
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
    image_relpath,
    pread_in_order,
    read_all,
    read_batches,
    read_random,
    tar_urls,
    warm,
    webdataset_count,
)
from shardex.contract import FORMAT_VERSION

LITDATA_MISSING = "litdata not installed (pip install 'shardex[bench]')"


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


def litdata_item(job: tuple[str, int, int, int]) -> dict[str, object]:
    """One sample for ``litdata.optimize``: the image's bytes and its class."""
    path, offset, length, label = job
    with open(path, "rb") as f:
        f.seek(offset)
        return {"jpg": f.read(length), "cls": label}


def litdata_copy(concat: Concat, count: int, out_root: Path) -> Path | None:
    """The images of ``concat`` in sample order as LitData optimizes them (64 MB chunks,
    no compression), made once per LitData version; None without litdata."""
    if importlib.util.find_spec("litdata") is None:
        return None
    import litdata

    out = out_root / f"litdata-{litdata.__version__}"
    if (out / "index.json").exists():
        return out
    shutil.rmtree(out, ignore_errors=True)
    rels = sorted(image_relpath(i) for i in range(count))
    labels = [int(rel.split("/", 1)[0].removeprefix("class_")) for rel in rels]
    jobs = [
        (str(concat.path), off, n, label)
        for off, n, label in zip(concat.offsets, concat.lengths, labels, strict=True)
    ]
    litdata.optimize(
        fn=litdata_item, inputs=jobs, output_dir=str(out), chunk_bytes="64MB",
        num_workers=1, reorder_files=False, mode="overwrite", verbose=False,
    )  # fmt: skip
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
        (one, one_cpu), (many, many_cpu) = timings(
            [lambda: read_random(ds, order), lambda: read_batches(ds, batches)], self.repeats
        )
        rows += [
            Row(f"get_many({BATCH}) / ds[i] per sample, {self.label}", "x", one / many,
                target=1.0, target_on="value", note="wall medians, verify=True"),
            Row(f"get_many({BATCH}) / ds[i] per sample, {self.label}, CPU", "x",
                one_cpu / many_cpu, target=1.0, target_on="value",
                note=f"best CPU of {self.repeats}, verify=True"),
        ]  # fmt: skip
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
        (item, item_cpu), (raw, raw_cpu) = timings(
            [lambda: read_random(self.items, order), lambda: read_random(ds, order)], self.repeats
        )
        rows += [
            Row(f"MapDataset(decode=False)[i] / ds[i], {self.label}", "x", raw / item,
                target=0.9, target_on="value", note="num_workers=0, wall medians"),
            Row(f"MapDataset(decode=False)[i] / ds[i], {self.label}, CPU", "x",
                raw_cpu / item_cpu, target=0.9, target_on="value",
                note=f"num_workers=0, best CPU of {self.repeats}"),
        ]  # fmt: skip
        return rows

    def peer_rows(self, litdata_dir: Path | None, random_count: int) -> list[Row]:
        """The peers' rows: stock webdataset's iterator, and LitData's iterator and random
        ``ds[i]`` each with the pread baseline and shardex's own reads of the same run."""
        (peer, _), (base, _) = timings(
            [
                lambda: webdataset_count(self.urls),
                lambda: pread_in_order(self.concat, range(self.count)),
            ],
            self.repeats,
        )
        n = self.count
        rows = [
            Row("iterate webdataset.WebDataset (peer)", "samples/s", n / peer, n / base, None,
                note="baseline: pread in file order; median wall"),
        ]  # fmt: skip
        if litdata_dir is None:
            return [
                *rows,
                Row("iterate LitData StreamingDataset (peer)", "samples/s", math.nan,
                    note=LITDATA_MISSING),
                Row("iterate shardex / LitData, same run", "x", math.nan,
                    note=f"target x ≥ 1: {LITDATA_MISSING}"),
            ]  # fmt: skip
        return rows + self._litdata_rows(litdata_dir, random_count)

    def _litdata_rows(self, where: Path, random_count: int) -> list[Row]:
        from litdata import StreamingDataset

        check_same_bytes(StreamingDataset(str(where)), self.concat, [0, self.count - 1])
        n, ds = self.count, self.ds
        # A fresh StreamingDataset per run: its setup is part of what a user pays.
        walls, cpus = runs(
            [
                lambda: read_all(StreamingDataset(str(where))),
                lambda: pread_in_order(self.concat, range(n)),
                lambda: read_all(ds),
            ],
            self.repeats,
        )
        (lit, lit_cpu), (base, base_cpu), (own, own_cpu) = (
            (statistics.median(w), min(c)) for w, c in zip(walls, cpus, strict=True)
        )
        paired = statistics.median(b / c for c, b in zip(cpus[2], cpus[0], strict=True))
        sub = self.order[:random_count]
        lit_random = StreamingDataset(str(where))
        read_random(lit_random, sub[:10])  # opens its chunks
        m = len(sub)
        (rnd, rnd_cpu), (rbase, rbase_cpu), (mine, mine_cpu) = timings(
            [
                lambda: read_random(lit_random, sub),
                lambda: pread_in_order(self.concat, sub),
                lambda: read_random(ds, sub),
            ],
            self.repeats,
        )
        note = "LitData: litdata.optimize copy of the same images (64 MB chunks, no compression)"
        return [
            Row("iterate LitData StreamingDataset (peer), wall", "samples/s", n / lit, n / base,
                None, note=f"baseline: pread in file order; median of {self.repeats}; {note}"),
            Row("iterate LitData StreamingDataset (peer), CPU", "samples/s", n / lit_cpu,
                n / base_cpu, None, note=f"best CPU time of {self.repeats}"),
            Row("iterate shardex / LitData, same run, wall", "x", lit / own, target=1.0,
                target_on="value", note="verify=True; median wall of each"),
            Row("iterate shardex / LitData, same run, CPU", "x", lit_cpu / own_cpu,
                target=1.0, target_on="value",
                note=f"verify=True; best CPU of each; paired {paired:.3f}"),
            Row(f"LitData ds[i] random (peer, {m} samples), wall", "samples/s", m / rnd,
                m / rbase, None, note=f"baseline: pread of the same {m} images, same order"),
            Row(f"LitData ds[i] random (peer, {m} samples), CPU", "samples/s", m / rnd_cpu,
                m / rbase_cpu, None, note=f"best CPU time of {self.repeats}"),
            Row("ds[i] random shardex / LitData, same run, wall", "x", rnd / mine,
                note=f"verify=True; CPU {rnd_cpu / mine_cpu:.1f}"),
        ]  # fmt: skip


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--images", type=int, default=20_000, help="number of images")
    p.add_argument("--size-kb", type=int, default=16, help="mean JPEG size in KB")
    p.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR, help="cache folder")
    p.add_argument("--repeats", type=int, default=9, help="repeats per measure")
    p.add_argument(
        "--litdata-random", type=int, default=2000, help="samples of LitData's random ds[i] run"
    )
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
    litdata = litdata_copy(concat, count, out_root)
    print(f"load average before: {os.getloadavg()}")
    new_reads = Reads(export, concat, count, args.repeats, f"format {FORMAT_VERSION}")
    rows = new_reads.rows()
    rows += Reads(old, concat, count, args.repeats, "format 2").rows()
    rows += new_reads.peer_rows(litdata, min(args.litdata_random, count))
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
