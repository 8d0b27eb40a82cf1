"""Throughput and size of the tar-shard format against the physical limits of this machine.

Builds (once, cached) an image folder of N JPEGs of about ``--size-kb`` KB in 10 class
folders, exports it with shardex and measures, in one run and with a warm page cache:

* export throughput (``workers=1`` and ``2``) against a plain "read every file, write one
  file" copy;
* the same JPEGs as an in-memory source (default options and ``workers=1``), the folder
  source with default options, and MosaicML Streaming's ``MDSWriter`` (a peer), each against
  the write limit: the same bytes written to one file plus an offsets index, fsynced;
* the same, each run followed by a timed ``os.sync()`` so every writer's data is on disk
  (``--synced-only``): the in-memory export against ``MDSWriter`` given the same lists, and
  ``shardex export-dataset DIR`` (process start included) against ``MDSWriter`` reading
  each file;
* random ``ds[i]`` (verify on/off) and ``get_many`` against ``os.pread`` of the same image
  bytes, in the same order, from ONE concatenated file;
* sequential iteration (shardex and stock ``webdataset``) against ``os.pread`` of every
  image in file order from that file;
* ``open_dataset`` time, and bytes on disk relative to the raw image bytes.

The machine is shared and noisy: every throughput is the median of a few repeats, and each
is reported as a ratio to a baseline measured in the same run.

Usage::

    .venv/bin/python benchmarks/bench_format.py [--images 20000] [--size-kb 16]
        [--workdir DIR] [--repeats 3] [--json PATH] [--profile]
        [--write-only | --synced-only | --fresh-only]
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import io
import math
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import shardex
from _report import Row, median_times, minor_faults, render, write_json

DEFAULT_WORKDIR = Path(__file__).resolve().parent / "_data"
CLASSES = 10
HEIGHT = 128
QUALITY = 90
SEED = 1234
BATCH = 64
OPEN_REPEATS = 20
READ_REPEATS = 9  # reads are cheap (~50 ms a run): more repeats, steadier medians


# ---------------------------------------------------------------- the image folder


def encode_image(index: int, width: int) -> bytes:
    """Image ``index``: uniform RGB noise (a stable size), JPEG at quality 90."""
    from PIL import Image

    rng = np.random.default_rng([SEED, index])
    w = max(8, int(width * rng.uniform(0.9, 1.1)))  # sizes vary, as real ones do
    pixels = rng.integers(0, 256, size=(HEIGHT, w, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=QUALITY)
    return out.getvalue()


def calibrate_width(target_bytes: int) -> int:
    """The nominal width at which images average ``target_bytes`` (bisection)."""
    from PIL import Image

    def mean_size(width: int) -> float:
        sizes = []
        for k in range(4):
            rng = np.random.default_rng([SEED + 1, k])
            pixels = rng.integers(0, 256, size=(HEIGHT, width, 3), dtype=np.uint8)
            out = io.BytesIO()
            Image.fromarray(pixels).save(out, format="JPEG", quality=QUALITY)
            sizes.append(len(out.getvalue()))
        return statistics.fmean(sizes)

    lo, hi = 8, 8192
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if mean_size(mid) < target_bytes else (lo, mid)
    return hi


def image_relpath(index: int) -> str:
    return f"class_{index % CLASSES:02d}/img_{index:07d}.jpg"


def _write_images(job: tuple[str, int, int, int]) -> int:
    root, lo, hi, width = job
    total = 0
    for i in range(lo, hi):
        data = encode_image(i, width)
        with open(os.path.join(root, image_relpath(i)), "wb") as f:
            f.write(data)
        total += len(data)
    return total


def build_folder(workdir: Path, count: int, size_kb: int) -> Path:
    """The cached image folder for (count, size); generated atomically when missing."""
    folder = workdir / f"images-n{count}-kb{size_kb}-v1"
    if folder.is_dir():
        print(f"image folder: {folder} (cached)")
        return folder
    workdir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    width = calibrate_width(size_kb * 1024)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.tmp-", dir=workdir))
    try:
        for c in range(CLASSES):
            (tmp / f"class_{c:02d}").mkdir()
        step = 500
        jobs = [(str(tmp), lo, min(lo + step, count), width) for lo in range(0, count, step)]
        with ProcessPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            total = sum(pool.map(_write_images, jobs))
        tmp.rename(folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    took = time.perf_counter() - t0
    print(
        f"image folder: generated {count} images, {total / count / 1024:.1f} KiB mean, "
        f"{HEIGHT}px high, ~{width}px wide, in {took:.1f} s ({count / took:,.0f} images/s)"
    )
    return folder


# ---------------------------------------------------------------- the pread baseline


@dataclass
class Concat:
    """Every image's bytes back to back in one file, in the export's sample order."""

    path: Path
    offsets: list[int]
    lengths: list[int]

    @property
    def raw_bytes(self) -> int:
        return sum(self.lengths)


def build_concat(folder: Path, count: int, target: Path) -> Concat:
    """Concatenate the images in sorted relative-path order (the export's sample order).

    Reading every image here also warms the page cache for the export.
    """
    rels = sorted(image_relpath(i) for i in range(count))
    offsets, lengths, pos = [], [], 0
    with open(target, "wb", buffering=1 << 20) as out:
        for rel in rels:
            data = (folder / rel).read_bytes()
            out.write(data)
            offsets.append(pos)
            lengths.append(len(data))
            pos += len(data)
    return Concat(target, offsets, lengths)


def copy_files(folder: Path, count: int, target: Path) -> None:
    """The export-throughput baseline: open+read every file, write one file, fsync."""
    with open(target, "wb", buffering=1 << 20) as out:
        for i in range(count):
            with open(folder / image_relpath(i), "rb") as f:
                out.write(f.read())
        out.flush()
        os.fsync(out.fileno())


def pread_in_order(concat: Concat, order: Sequence[int]) -> None:
    """``os.pread`` of each image's (offset, length) in ``order``: the physical limit."""
    offs, lens, pread = concat.offsets, concat.lengths, os.pread
    fd = os.open(concat.path, os.O_RDONLY)
    try:
        for i in order:
            pread(fd, lens[i], offs[i])
    finally:
        os.close(fd)


def warm(paths: Iterator[Path]) -> None:
    """Read files once so that the timed runs find them in the page cache."""
    for p in paths:
        with open(p, "rb") as f:
            while f.read(1 << 24):
                pass


# ---------------------------------------------------------------- readers under test


def read_random(ds: Any, order: Sequence[int]) -> None:
    for i in order:
        ds[i]


def read_batches(ds: Any, batches: Sequence[Sequence[int]]) -> None:
    for batch in batches:
        ds.get_many(batch)


def read_all(ds: Any) -> int:
    n = 0
    for _ in ds:
        n += 1
    return n


def webdataset_count(urls: list[str]) -> int:
    import webdataset as wds

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return read_all(wds.WebDataset(urls, shardshuffle=False))


def tar_urls(out: Path) -> list[str]:
    return sorted(str(p) for p in out.rglob("*.tar"))


def disk_bytes(out: Path, pattern: str = "*") -> int:
    return sum(p.stat().st_size for p in out.rglob(pattern) if p.is_file())


def check_same_bytes(ds: Any, concat: Concat, picks: Sequence[int]) -> None:
    """The export's sample order is the baseline's file order (else ratios lie)."""
    with open(concat.path, "rb") as f:
        for i in picks:
            f.seek(concat.offsets[i])
            if ds[i]["jpg"] != f.read(concat.lengths[i]):
                raise SystemExit(f"sample {i} differs from image {i} of the baseline file")


# ---------------------------------------------------------------- the benchmark


def bench_export(
    folder: Path, out_root: Path, count: int, repeats: int
) -> tuple[list[Row], Path, Path]:
    """Export with 1 and 2 workers, each timed against the copy baseline."""
    copy_target = out_root / "copy.bin"
    main = out_root / "export"
    trash = out_root / "trash"
    shutil.rmtree(trash, ignore_errors=True)
    trash.mkdir()
    rows = []
    for workers in (1, 2):

        def run(workers: int = workers) -> None:
            # Each run writes a fresh folder, as a user's export does: replacing files
            # in place makes ext4 flush them at rename (auto_da_alloc), a cost of
            # overwriting, not of exporting.
            if main.exists():
                main.rename(trash / f"{time.monotonic_ns()}")
            shardex.export(folder, main, workers=workers)

        def copy() -> None:
            copy_files(folder, count, copy_target)

        took, base = median_times([run, copy], repeats)
        note = "baseline: read every file + write one file + fsync"
        name = f"export, workers={workers}"
        rate, base_rate = count / took, count / base
        rows.append(Row(name, "images/s", rate, base_rate, 20_000, "value", note=note))
    copy_target.unlink()
    shutil.rmtree(trash)
    nolabels = out_root / "export-nolabels"
    # labels kept in Parquet (and metadata.parquet) only: no .cls member in the tars
    shardex.export(folder, nolabels, workers=1, y_keys=(), overwrite=True)
    return rows, main, nolabels


# ---------------------------------------------------------------- in-memory source, limit, peer

MDS_NOT_INSTALLED = "mosaicml-streaming not installed (pip install 'shardex[bench]')"


@dataclass
class InMemory:
    """The benchmark's JPEGs as an in-memory source: keys, bytes and labels in sample order."""

    keys: list[str]
    jpgs: list[bytes]
    labels: list[int]

    def source(self) -> dict[str, Any]:
        return {"key": self.keys, "jpg": self.jpgs, "label": self.labels}


def load_in_memory(concat: Concat) -> InMemory:
    """Every image's bytes from ``concat.bin``, in its (the folder export's) sample order."""
    rels = sorted(image_relpath(i) for i in range(len(concat.offsets)))
    data = concat.path.read_bytes()
    jpgs = [data[o : o + n] for o, n in zip(concat.offsets, concat.lengths, strict=True)]
    labels = [int(rel.split("/", 1)[0].removeprefix("class_")) for rel in rels]
    return InMemory([f"{i:07d}" for i in range(len(jpgs))], jpgs, labels)


def fresh_target(root: Path, trash: Path, name: str, *, folder: bool = False) -> Path:
    """``root/name`` made free for a run (an earlier one moved to ``trash``): every run
    writes a fresh target, as a user's export does (see bench_export)."""
    path = root / name
    if path.exists():
        path.rename(trash / f"{name}-{time.monotonic_ns()}")
    if folder:
        path.mkdir()
    return path


def write_limit(jpgs: Sequence[bytes], target: Path) -> None:
    """The write limit: every sample's bytes into one file (``writev``, no copy) and their
    offsets as an index file beside it, both fsynced: the least any writer must do.
    """
    chunk = os.sysconf("SC_IOV_MAX")
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for lo in range(0, len(jpgs), chunk):
            bufs = jpgs[lo : lo + chunk]
            written, want = os.writev(fd, bufs), sum(map(len, bufs))
            if written != want:  # a short write: finish it plainly
                os.write(fd, b"".join(bufs)[written:])
        os.fsync(fd)
    finally:
        os.close(fd)
    offsets = np.cumsum([0, *map(len, jpgs)], dtype=np.uint64)
    with open(target.with_suffix(".idx"), "wb") as f:
        f.write(offsets.tobytes())
        f.flush()
        os.fsync(f.fileno())


@functools.cache  # once: a second import would find the stand-in packages made below
def mds_writer() -> Any | None:
    """MosaicML Streaming's ``MDSWriter`` class, or None when mosaicml-streaming is missing.

    ``import streaming`` also imports its dataset, text and vision modules (transformers,
    torchvision). Where those are not installed (the ``bench`` extra installs the writer's
    own needs only, see benchmarks/README.md), the writer's modules are imported without
    running the package ``__init__``: the same writer code, run the same way.
    """
    import importlib
    import importlib.util
    import types

    try:
        return importlib.import_module("streaming").MDSWriter
    except ImportError:
        pass
    spec = importlib.util.find_spec("streaming")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = next(iter(spec.submodule_search_locations))
    for name, sub in (("streaming", ""), ("streaming.base", "/base")):
        if name in sys.modules and getattr(sys.modules[name], "__file__", None):
            continue
        package = types.ModuleType(name)
        package.__path__ = [root + sub]
        sys.modules[name] = package
    try:
        return importlib.import_module("streaming.base.format.mds.writer").MDSWriter
    except ImportError:
        return None


def mds_write(writer: Any, data: InMemory, out: Path) -> None:
    """``MDSWriter`` defaults (no compression, 64 MiB shards): columns jpg bytes + label int."""
    with writer(out=str(out), columns={"jpg": "bytes", "label": "int"}) as w:
        for jpg, label in zip(data.jpgs, data.labels, strict=True):
            w.write({"jpg": jpg, "label": label})


def check_in_memory(out: Path, data: InMemory) -> None:
    """The in-memory export holds the source's bytes in the source's order."""
    ds = shardex.open_dataset(out, split="train")
    n = len(data.jpgs)
    for i in (0, n // 2, n - 1):
        if ds[i]["jpg"] != data.jpgs[i] or ds[i]["__key__"] != data.keys[i]:
            raise SystemExit(f"in-memory export: sample {i} is not source sample {i}")


def bench_in_memory(folder: Path, concat: Concat, out_root: Path, repeats: int) -> list[Row]:
    """In-memory and folder exports and MDSWriter, interleaved with the write limit."""
    data = load_in_memory(concat)
    count = len(data.jpgs)
    trash = out_root / "trash-memory"
    shutil.rmtree(trash, ignore_errors=True)
    trash.mkdir()
    writer = mds_writer()

    def fresh(name: str) -> Path:
        return fresh_target(out_root, trash, name)

    def limit() -> None:
        write_limit(data.jpgs, fresh_target(out_root, trash, "limit", folder=True) / "data.bin")

    def mds() -> None:
        mds_write(writer, data, fresh("mds"))

    def empty_trash() -> None:  # timed with the others, its time unused: keeps the disk free
        shutil.rmtree(trash)
        trash.mkdir()
        # what the kernel still owes (MDSWriter's unsynced files, the deletions) is paid
        # here, not by whichever run comes next
        os.sync()

    runs: dict[str, Callable[[], object]] = {
        "memory": lambda: shardex.export(data.source(), fresh("memory")),
        "memory1": lambda: shardex.export(data.source(), fresh("memory1"), workers=1),
        "folder": lambda: shardex.export(folder, fresh("folder")),
        "limit": limit,
    }
    if writer is not None:
        runs["mds"] = mds
    runs["trash"] = empty_trash
    cpu: dict[str, list[float]] = {name: [] for name in runs}
    timed = [_cpu_counted(fn, cpu[name]) for name, fn in runs.items()]
    times = dict(zip(runs, median_times(timed, repeats), strict=True))
    check_in_memory(out_root / "memory", data)
    shutil.rmtree(trash)
    rows = memory_rows({k: count / t for k, t in times.items()}, writer is not None)
    return rows + cpu_rows({k: statistics.median(v) for k, v in cpu.items()})


def mds_write_files(writer: Any, folder: Path, out: Path) -> None:
    """``MDSWriter`` fed from the image folder: each file read, then written (jpg + label)."""
    with writer(out=str(out), columns={"jpg": "bytes", "label": "int"}) as w:
        for rel in sorted(image_relpath(i) for i in range(_count(folder))):
            label = int(rel.split("/", 1)[0].removeprefix("class_"))
            w.write({"jpg": (folder / rel).read_bytes(), "label": label})


def _count(folder: Path) -> int:
    return sum(1 for _ in folder.glob("class_*/*.jpg"))


def cli_export(folder: Path, out: Path) -> None:
    """``shardex export-dataset DIR -o OUT -q`` as a user runs it (process start included)."""
    cli = Path(sys.executable).with_name("shardex")
    command = [str(cli), "export-dataset", str(folder), "-o", str(out), "-q"]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)


def bench_synced(folder: Path, concat: Concat, out_root: Path, repeats: int) -> list[Row]:
    """Issue 35's measure: each writer given the same inputs in this process, each run
    followed by ``os.sync()`` (its time counted: the data is on disk), interleaved, medians.
    """
    data = load_in_memory(concat)
    count = len(data.jpgs)
    writer = mds_writer()
    trash = out_root / "trash-synced"
    shutil.rmtree(trash, ignore_errors=True)
    trash.mkdir()

    def fresh(name: str) -> Path:
        return fresh_target(out_root, trash, f"synced-{name}")

    def limit() -> None:
        target = fresh_target(out_root, trash, "synced-limit", folder=True)
        write_limit(data.jpgs, target / "data.bin")

    runs: dict[str, Callable[[], object]] = {
        "memory": lambda: shardex.export(data.source(), fresh("memory")),
        "cli": lambda: cli_export(folder, fresh("cli")),
        "limit": limit,
    }
    if writer is not None:
        runs["mds"] = lambda: mds_write(writer, data, fresh("mds"))
        runs["mds_files"] = lambda: mds_write_files(writer, folder, fresh("mds_files"))
    returned: dict[str, list[float]] = {name: [] for name in runs}

    def synced(name: str, fn: Callable[[], object]) -> Callable[[], None]:
        def run() -> None:
            t0 = time.perf_counter()
            fn()
            returned[name].append(time.perf_counter() - t0)
            os.sync()

        return run

    def empty_trash() -> None:  # timed, unused: the deletions are paid outside the rows
        shutil.rmtree(trash)
        trash.mkdir()
        os.sync()

    os.sync()
    fns = [synced(name, fn) for name, fn in runs.items()]
    times = dict(zip(runs, median_times([*fns, empty_trash], repeats), strict=False))
    check_in_memory(out_root / "synced-memory", data)
    shutil.rmtree(trash)
    rate = {k: count / t for k, t in times.items()}
    back = {k: count / statistics.median(v) for k, v in returned.items()}
    note = "each run followed by os.sync(), timed: the data on disk"
    limit = rate["limit"]
    rows = [
        Row("synced: write limit (bare synced write)", "images/s", limit, note=note),
        Row(
            "synced: export in-memory (baseline: write limit)",
            "images/s",
            rate["memory"],
            limit,
            0.6,
            note=note,
        ),
    ]
    if writer is None:
        return [*rows, Row("synced: MDSWriter", "images/s", math.nan, note=MDS_NOT_INSTALLED)]
    return [
        *rows,
        Row("synced: MDSWriter", "images/s", rate["mds"], note=note),
        Row("synced: MDSWriter reading each file", "images/s", rate["mds_files"], note=note),
        Row(
            "synced: export in-memory (baseline: MDSWriter)",
            "images/s",
            rate["memory"],
            rate["mds"],
            1.2,
            note=note,
        ),
        Row(
            "synced: CLI folder export, process start included (baseline: MDSWriter reading "
            "each file)",
            "images/s",
            rate["cli"],
            rate["mds_files"],
            1.0,
            note=note,
        ),
        Row(
            "time to return: export in-memory (baseline: MDSWriter)",
            "images/s",
            back["memory"],
            back["mds"],
            note="the same runs, timed until the call returns",
        ),
    ]


def _cpu_counted(fn: Callable[[], object], into: list[float]) -> Callable[[], None]:
    """``fn`` that also appends the CPU seconds (user + system) this process spent in it."""

    def run() -> None:
        before = os.times()
        fn()
        after = os.times()
        into.append(after.user - before.user + after.system - before.system)

    return run


def cpu_rows(cpu: dict[str, float]) -> list[Row]:
    """CPU seconds (user + system, this process; medians) of the write rows, against the
    write limit's: less noisy than wall time on a shared machine. The folder export's
    worker processes are not counted (only this process's share)."""
    names = {
        "memory": "export in-memory, default options",
        "memory1": "export in-memory, workers=1",
        "folder": "export folder, default options (main process only)",
        "mds": "MDSWriter (peer)",
    }
    note = "baseline: the write limit's CPU seconds; lower is better"
    rows = [Row("write limit, CPU seconds", "CPU s", cpu["limit"], higher=False)]
    rows += [
        Row(f"{label}, CPU seconds", "CPU s", cpu[key], cpu["limit"], higher=False, note=note)
        for key, label in names.items()
        if key in cpu
    ]
    if "mds" in cpu:
        rows.append(
            Row(
                "MDSWriter CPU s / export in-memory CPU s (default options)",
                "x",
                cpu["mds"] / cpu["memory"],
                note="same data, same run; ≥ 2 would match the 2x target in CPU",
            )
        )
    return rows


def memory_rows(rate: dict[str, float], have_mds: bool) -> list[Row]:
    """The rows of :func:`bench_in_memory` from its rates (images/s by run)."""
    limit = rate["limit"]
    note = "baseline: write limit (same bytes to one file + offsets index, fsync)"
    rows = [
        Row("export in-memory, default options", "images/s", rate["memory"], limit, 0.5, note=note),
        Row("export in-memory, workers=1", "images/s", rate["memory1"], limit, note=note),
        Row("export folder, default options", "images/s", rate["folder"], limit, 0.4, note=note),
    ]
    if not have_mds:  # the rows stay, so that a table always shows every target
        rows.append(Row("MDSWriter (peer)", "images/s", math.nan, note=MDS_NOT_INSTALLED))
        ratio = "export in-memory, default options / MDSWriter"
        rows.append(Row(ratio, "x", math.nan, note=f"target x ≥ 2: {MDS_NOT_INSTALLED}"))
        return rows
    rows.append(
        Row(
            "MDSWriter (peer)",
            "images/s",
            rate["mds"],
            limit,
            note=f"{note}; MDSWriter defaults (no compression), no fsync",
        )
    )
    for name, key, target in (
        ("in-memory, default options / MDSWriter", "memory", 2.0),
        ("in-memory, workers=1 / MDSWriter", "memory1", None),
    ):
        rows.append(
            Row(
                f"export {name}",
                "x",
                rate[key] / rate["mds"],
                None,
                target,
                "value",
                note="same data, same run",
            )
        )
    # The ceiling of the 2x row for any writer that fsyncs what it wrote, as shardex does
    # (MDSWriter does not): where the disk's flush is slow, it is below 2.
    rows.append(
        Row(
            "write limit / MDSWriter",
            "x",
            limit / rate["mds"],
            note="same data, same run: the most an exporter that fsyncs can reach",
        )
    )
    return rows


class ReadBench:
    """Read measures of one export, each paired with its pread baseline."""

    RANDOM_NOTE = "baseline: pread, same random order, one file"
    SEQUENTIAL_NOTE = "baseline: pread in file order, one file"

    def __init__(self, out: Path, concat: Concat, count: int, repeats: int) -> None:
        self.out, self.concat, self.count, self.repeats = out, concat, count, repeats
        self.order = np.random.default_rng(SEED).permutation(count).tolist()
        self.sequential = list(range(count))
        self.ds = shardex.open_dataset(out, split="train")
        self.ds_fast = shardex.open_dataset(out, split="train", verify=False)
        check_same_bytes(self.ds, concat, [0, count // 2, count - 1, *self.order[:20]])
        warm(iter([concat.path, *map(Path, tar_urls(out))]))
        read_random(self.ds, self.order)  # faults in the index pages, opens every shard
        read_random(self.ds_fast, self.order)

    def _rates(self, fn: Callable[[], object], order: list[int]) -> tuple[float, float]:
        took, base = median_times([fn, lambda: pread_in_order(self.concat, order)], self.repeats)
        return self.count / took, self.count / base

    def random(self, name: str, fn: Callable[[], object], target: float | None = 0.5) -> Row:
        value, base = self._rates(fn, self.order)
        return Row(name, "samples/s", value, base, target, note=self.RANDOM_NOTE)

    def sequential_row(
        self, name: str, fn: Callable[[], object], target: float | None = 0.5
    ) -> Row:
        value, base = self._rates(fn, self.sequential)
        faults = minor_faults(fn) / self.count
        note = f"{self.SEQUENTIAL_NOTE}; {faults:.2f} page faults/sample"
        return Row(name, "samples/s", value, base, target, note=note)

    def rows(self) -> list[Row]:
        ds, fast, order = self.ds, self.ds_fast, self.order
        batches = [order[k : k + BATCH] for k in range(0, self.count, BATCH)]
        urls = tar_urls(self.out)
        iterate = self.sequential_row("iterate shardex (for s in ds)", lambda: read_all(ds))
        peer = self.sequential_row(
            "iterate webdataset.WebDataset (peer)", lambda: webdataset_count(urls), None
        )
        return [
            self.random("ds[i] random, verify=True", lambda: read_random(ds, order)),
            self.random("ds[i] random, verify=False", lambda: read_random(fast, order)),
            self.random(
                f"get_many({BATCH}) random, verify=True", lambda: read_batches(ds, batches)
            ),
            self.random(
                f"get_many({BATCH}) random, verify=False", lambda: read_batches(fast, batches)
            ),
            iterate,
            self.sequential_row(
                "ds[i] in order (for i in range(n))",
                lambda: read_random(ds, self.sequential),
                None,
            ),
            peer,
            Row(
                "iterate: shardex / webdataset",
                "x",
                iterate.value / peer.value,
                note="how many times faster shardex iterates than stock webdataset",
            ),
        ]


def bench_open(out: Path) -> Row:
    times = []
    for _ in range(OPEN_REPEATS):
        t0 = time.perf_counter()
        shardex.open_dataset(out, split="train")
        times.append(time.perf_counter() - t0)
    return Row(
        "open_dataset", "ms", 1000 * statistics.median(times), note=f"median of {OPEN_REPEATS}"
    )


def bench_sizes(main: Path, nolabels: Path, concat: Concat, count: int) -> list[Row]:
    """Bytes on disk (all files, and tars only) over the raw image bytes."""
    raw = concat.raw_bytes
    rows = []
    for label, out in (("", main), (", label in Parquet only", nolabels)):
        tar = disk_bytes(out, "*.tar")
        extra = f"{(tar - raw) / count:,.0f} tar bytes per sample beyond the image"
        for what, size, note in (
            ("disk", disk_bytes(out), "all files: tars, parquet, index, config"),
            ("tar", tar, extra),
        ):
            name = f"{what} bytes / raw image bytes{label}"
            rows.append(Row(name, "x", size / raw, None, 1.10, "value", higher=False, note=note))
    return rows


def profile(out: Path, folder: Path, count: int, limit: int = 15) -> None:
    """cProfile of random ds[i] and of a one-worker export (top functions by own time)."""
    ds = shardex.open_dataset(out, split="train")
    order = np.random.default_rng(SEED).permutation(count).tolist()
    for title, fn in (
        ("random ds[i], verify=True", lambda: read_random(ds, order)),
        ("export workers=1", lambda: shardex.export(folder, out, workers=1, overwrite=True)),
    ):
        prof = cProfile.Profile()
        prof.runcall(fn)
        print(f"\n--- cProfile: {title} (top {limit} by tottime) ---")
        pstats.Stats(prof).sort_stats("tottime").print_stats(limit)


# ------------------------------------- fresh processes (issue 19): import, open, a worker
FRESH_PROCESSES = 20
#: One fresh interpreter: ``import shardex``, then ``open_dataset``; or (the baseline) a
#: bare ``os.open`` + ``os.pread`` of one sample of the same run's concatenated file.
_FRESH = """
import os, sys, time
if sys.argv[1] == "numpy":
    t0, c0 = time.perf_counter(), time.process_time()
    import numpy
    print(1000 * (time.perf_counter() - t0), 0.0, 1000 * (time.process_time() - c0), 0.0, 1)
elif sys.argv[1] == "pread":
    t0 = time.perf_counter()
    fd = os.open(sys.argv[2], os.O_RDONLY)
    os.pread(fd, 4096, 0)
    os.close(fd)
    print(0.0, 1000 * (time.perf_counter() - t0), 0.0, 0.0, 0)
else:
    t0, c0 = time.perf_counter(), time.process_time()
    import shardex
    t1, c1 = time.perf_counter(), time.process_time()
    shardex.open_dataset(sys.argv[2], split="train")[0]
    t2, c2 = time.perf_counter(), time.process_time()
    numpy = int("numpy" in sys.modules)
    print(1000 * (t1 - t0), 1000 * (t2 - t1), 1000 * (c1 - c0), 1000 * (c2 - c1), numpy)
"""


def _fresh_environment(cache: Path) -> dict[str, str]:
    """As an installed package runs: bytecode cached (in ``cache``, not the source tree)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "PYTHONPYCACHEPREFIX": str(cache)}


def _fresh(kind: str, path: Path, env: dict[str, str]) -> list[float]:
    import subprocess

    out = subprocess.run(
        [sys.executable, "-c", _FRESH, kind, str(path)],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    ).stdout.split()
    # wall import, wall open, CPU import, CPU open (ms), whether numpy got imported
    return [float(x) for x in out]


def bench_fresh_open(out: Path, concat: Concat) -> list[Row]:
    """``import shardex`` and ``open_dataset`` + ``ds[0]`` in fresh processes (medians of
    FRESH_PROCESSES), each beside a fresh process's bare open + pread, interleaved."""
    with tempfile.TemporaryDirectory(prefix="bench-pyc-") as cache:
        env = _fresh_environment(Path(cache))
        _fresh("shardex", out, env)  # writes the bytecode cache, as an install does
        shardex_runs, pread_runs, numpy_runs = [], [], []
        for _ in range(FRESH_PROCESSES):
            shardex_runs.append(_fresh("shardex", out, env))
            pread_runs.append(_fresh("pread", concat.path, env)[1])
            numpy_runs.append(_fresh("numpy", out, env))
    imported, opened, imported_cpu, opened_cpu = (
        statistics.median(r[k] for r in shardex_runs) for k in range(4)
    )
    pread = statistics.median(pread_runs)
    # import numpy alone, read beside import shardex (which no longer needs it to open an
    # export and read a sample): it tells a busy machine from a slow import
    numpy_loaded = "yes" if any(r[4] for r in shardex_runs) else "no"
    numpy_wall, numpy_cpu = (statistics.median(r[k] for r in numpy_runs) for k in (0, 2))
    note = f"fresh process, median of {FRESH_PROCESSES}; baseline: bare os.open + os.pread"
    return [
        Row(
            "import shardex (fresh process)",
            "ms",
            imported,
            pread,
            150,
            "value",
            False,
            f"{note}; {imported_cpu:.1f} ms of CPU; import numpy alone: {numpy_wall:.1f} ms, "
            f"{numpy_cpu:.1f} ms of CPU",
        ),
        Row(
            "open_dataset + ds[0] (fresh process, after import)",
            "ms",
            opened,
            pread,
            5,
            "value",
            False,
            f"{note}; {opened_cpu:.1f} ms of CPU; numpy imported: {numpy_loaded}",
        ),
    ]


class _Timed:
    """A DataLoader dataset whose items are (sample, ms since the worker's init)."""

    started = 0.0

    def __init__(self, out: Path) -> None:
        from shardex.torch import MapDataset

        self.ds = MapDataset(out, "train", decode=False)

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int) -> float:
        self.ds[i]
        return 1000 * (time.perf_counter() - _Timed.started)


def _worker_started(_: int) -> None:
    _Timed.started = time.perf_counter()


def bench_spawned_worker(out: Path) -> Row | None:
    """A spawned DataLoader worker's first sample, from the worker's start (its
    ``worker_init_fn``): opening the split there and reading one sample."""
    try:
        from torch.utils.data import DataLoader
    except ImportError:
        return None
    times = []
    for _ in range(5):
        loader = DataLoader(
            _Timed(out),
            batch_size=None,
            num_workers=1,
            multiprocessing_context="spawn",
            worker_init_fn=_worker_started,
        )
        times.append(float(next(iter(loader))))
    note = "median of 5 spawned workers; from worker_init_fn to its first sample"
    return Row(
        "first sample of a spawned DataLoader worker",
        "ms",
        statistics.median(times),
        None,
        30,
        "value",
        False,
        note,
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--images", type=int, default=20_000, help="number of images")
    p.add_argument("--size-kb", type=int, default=16, help="mean JPEG size in KB")
    p.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR, help="cache folder")
    p.add_argument(
        "--repeats", type=int, default=3, help=f"repeats per export measure (reads: {READ_REPEATS})"
    )
    p.add_argument("--json", type=Path, help="also write the results as JSON here")
    p.add_argument("--profile", action="store_true", help="print cProfile of ds[i] and export")
    p.add_argument(
        "--fresh-only",
        action="store_true",
        help="only the fresh-process rows: import, open + ds[0], a spawned worker's first sample",
    )
    p.add_argument(
        "--write-only",
        action="store_true",
        help="only the write rows: in-memory and folder exports, MDSWriter, the write limit",
    )
    p.add_argument(
        "--synced-only",
        action="store_true",
        help="only the synced write rows: each writer's data on disk, MDSWriter beside",
    )
    return p.parse_args(argv)


def fresh_rows(out_root: Path, folder: Path, concat: Concat) -> list[Row]:
    """The fresh-process rows alone, on the export of an earlier run (made if missing)."""
    out = out_root / "export"
    if not (out / "config.yaml").exists():
        shardex.export(folder, out, workers=1, overwrite=True)
    rows = bench_fresh_open(out, concat)
    worker = bench_spawned_worker(out)
    return rows if worker is None else [*rows, worker]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    count = args.images
    folder = build_folder(args.workdir, count, args.size_kb)
    out_root = args.workdir / f"exports-n{count}-kb{args.size_kb}"
    out_root.mkdir(parents=True, exist_ok=True)
    concat = build_concat(folder, count, out_root / "concat.bin")
    print(f"raw image bytes: {concat.raw_bytes:,} ({concat.raw_bytes / count / 1024:.2f} KiB mean)")
    if args.fresh_only:
        print(render(fresh_rows(out_root, folder, concat)))
        return 0
    if args.synced_only:
        print(render(bench_synced(folder, concat, out_root, args.repeats)))
        return 0
    if args.write_only:
        rows = bench_in_memory(folder, concat, out_root, args.repeats)
        print(render([*rows, *bench_synced(folder, concat, out_root, args.repeats)]))
        return 0
    export_rows, main_out, nolabels = bench_export(folder, out_root, count, args.repeats)
    memory_rows = bench_in_memory(folder, concat, out_root, args.repeats)
    memory_rows += bench_synced(folder, concat, out_root, args.repeats)
    reads = max(args.repeats, READ_REPEATS)
    rows = [
        *export_rows,
        *memory_rows,
        *ReadBench(main_out, concat, count, reads).rows(),
        bench_open(main_out),
        *bench_sizes(main_out, nolabels, concat, count),
        *bench_fresh_open(main_out, concat),
    ]
    worker = bench_spawned_worker(main_out)
    if worker is not None:
        rows.append(worker)
    print()
    print(render(rows))
    took = time.perf_counter() - started
    print(f"\n{count} images; medians of {args.repeats} (export) and {reads} (read) runs")
    print(f"total {took:.0f} s")
    if args.profile:
        profile(main_out, folder, count)
    if args.json:
        write_json(
            args.json,
            rows,
            versions={"shardex": shardex.__version__},
            images=count,
            size_kb=args.size_kb,
            raw_bytes=concat.raw_bytes,
            seconds=took,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
