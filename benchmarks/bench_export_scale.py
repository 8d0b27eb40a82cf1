"""Export throughput and peak memory of every process as a tar source grows.

Builds (once, cached) WebDataset tar sources of tiny samples, one 16x16 JPEG and a
``.cls`` label each, at a few sizes (default 100k, 1M and 3M samples), exports each with
the CLI (``shardex export-dataset SRC -o OUT --workers 2``) in a subprocess and reports:

* samples/s (wall time of the command, Python start included);
* the peak RSS of every process of the export: the command itself and every descendant
  (the forkserver, the pool's workers that the forkserver forks, the resource tracker),
  from ``VmHWM`` of each one in ``/proc`` sampled while it runs, cross-checked with the
  ``ru_maxrss`` of ``wait4`` (the largest of the process and its waited-for descendants);
* the growth of the largest peak in MB per million samples between the smallest and the
  largest size.

Targets (issue 13): samples/s at the largest size within 20 % of the smallest (ratio >=
0.8), peak RSS of every process <= 400 MB, growth < 30 MB per million samples.

Usage::

    .venv/bin/python benchmarks/bench_export_scale.py [--sizes 100k,1M,3M]
        [--workers 2] [--per-tar 10000] [--repeats 1] [--workdir DIR] [--json PATH]
"""

from __future__ import annotations

import argparse
import io
import os
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import shardex
from _report import Row, render, write_json

DEFAULT_WORKDIR = Path(__file__).resolve().parent / "_data"
BLOCK = 512
KEY_DIGITS = 9  # keys s000000000 ...: fixed width, so every sample has the same layout
CLASSES = 10
SAMPLE_EVERY = 0.1  # seconds between two looks at /proc
MB = 1 << 20
RSS_TARGET_MB = 400.0
GROWTH_TARGET = 30.0
RATE_TARGET = 0.8


# ---------------------------------------------------------------- the tar sources


def parse_size(text: str) -> int:
    """``100k`` / ``1M`` / ``2.5M`` / ``5000``: a number of samples."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kKmM]?)\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"not a sample count: {text!r} (e.g. 100k, 1M)")
    scale = {"": 1, "k": 1_000, "m": 1_000_000}[m.group(2).lower()]
    return round(float(m.group(1)) * scale)


def size_name(n: int) -> str:
    if n % 1_000_000 == 0:
        return f"{n // 1_000_000}M"
    if n % 1_000 == 0:
        return f"{n // 1_000}k"
    return str(n)


def base_jpeg() -> bytes:
    """A 16x16 JPEG (a colour gradient) with a comment segment of KEY_DIGITS zeros right
    after its start marker: each sample writes its number there, so every image differs
    while all have the same size and stay valid JPEGs.
    """
    from PIL import Image

    y, x = np.mgrid[0:16, 0:16]
    pixels = np.stack([x * 16, y * 16, (x + y) * 8], axis=-1).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=90)
    jpeg = out.getvalue()
    comment = b"\xff\xfe" + (2 + KEY_DIGITS).to_bytes(2, "big") + b"0" * KEY_DIGITS
    return jpeg[:2] + comment + jpeg[2:]


def padded(n: int) -> int:
    return -(-n // BLOCK) * BLOCK


@dataclass
class Layout:
    """One sample as fixed bytes (jpg header, jpg, cls header, cls) and where it varies."""

    record: np.ndarray  # uint8, the whole sample with key 0 and label 0
    digit_columns: list[int]  # where the key's digits go (both names and the comment)
    # each header's 6 octal checksum digits: (where they start, the header's checksum
    # with the key's digits all "0"s)
    checksums: list[tuple[int, int]]
    label_column: int


def member_header(name: str, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = size, 0o644, 1_700_000_000
    return info.tobuf(format=tarfile.USTAR_FORMAT)


def sample_layout() -> Layout:
    jpeg = base_jpeg()
    key = "s" + "0" * KEY_DIGITS
    parts = [
        member_header(f"{key}.jpg", len(jpeg)),
        jpeg.ljust(padded(len(jpeg)), b"\0"),
        member_header(f"{key}.cls", 1),
        b"0".ljust(BLOCK, b"\0"),
    ]
    cls_header = len(parts[0]) + len(parts[1])
    name_digits = range(1, 1 + KEY_DIGITS)
    comment = len(parts[0]) + 6  # SOI (2) + COM marker (2) + length (2)
    digits = [
        *name_digits,
        *(comment + k for k in range(KEY_DIGITS)),
        *(cls_header + k for k in name_digits),
    ]
    return Layout(
        record=np.frombuffer(b"".join(parts), dtype=np.uint8).copy(),
        digit_columns=digits,
        checksums=[(at + 148, int(parts[k][148:154], 8)) for at, k in ((0, 0), (cls_header, 2))],
        label_column=cls_header + BLOCK,
    )


def write_tar(path: Path, layout: Layout, first: int, count: int) -> None:
    """Samples ``first .. first+count-1`` as one tar, built as a numpy array of records."""
    index = np.arange(first, first + count, dtype=np.int64)
    powers = 10 ** np.arange(KEY_DIGITS - 1, -1, -1, dtype=np.int64)
    digits = (index[:, None] // powers) % 10  # (count, KEY_DIGITS)
    records = np.tile(layout.record, (count, 1))
    ascii_digits = (digits + ord("0")).astype(np.uint8)
    cols = layout.digit_columns
    for part in range(3):  # jpg name, JPEG comment, cls name
        records[:, cols[part * KEY_DIGITS : (part + 1) * KEY_DIGITS]] = ascii_digits
    records[:, layout.label_column] = (index % CLASSES + ord("0")).astype(np.uint8)
    over_zeros = digits.sum(axis=1)  # what the name's digits add to a header's byte sum
    for start, base in layout.checksums:
        checksum = base + over_zeros
        for k in range(6):
            shift = 3 * (5 - k)
            records[:, start + k] = ((checksum >> shift) & 7) + ord("0")
    with open(path, "wb") as f:
        f.write(records.tobytes())
        f.write(bytes(2 * BLOCK))  # end of archive


def build_tars(workdir: Path, count: int, per_tar: int) -> Path:
    """The cached folder of tars holding ``count`` samples; generated atomically."""
    folder = workdir / f"tars-n{size_name(count)}-per{per_tar}-v1"
    if folder.is_dir():
        print(f"tar source: {folder} (cached)")
        return folder
    workdir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    layout = sample_layout()
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.tmp-", dir=workdir))
    try:
        for k, first in enumerate(range(0, count, per_tar)):
            write_tar(tmp / f"part-{k:06d}.tar", layout, first, min(per_tar, count - first))
        check_tar(next(iter(sorted(tmp.glob("*.tar")))))
        tmp.rename(folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    took = time.perf_counter() - t0
    size = sum(p.stat().st_size for p in folder.iterdir())
    print(
        f"tar source: generated {count:,} samples ({size / MB:,.0f} MB, "
        f"{len(layout.record):,} bytes a sample) in {took:.1f} s"
    )
    return folder


def check_tar(path: Path) -> None:
    """The generated bytes are a tar that tarfile reads, with valid JPEGs (else stop)."""
    from PIL import Image

    with tarfile.open(path) as tar:
        members = tar.getmembers()[:4]
        for m in members:
            data = tar.extractfile(m).read()  # type: ignore[union-attr]
            if m.name.endswith(".jpg"):
                Image.open(io.BytesIO(data)).load()
    names = [m.name for m in members]
    if names[:2] != [f"s{0:0{KEY_DIGITS}d}.jpg", f"s{0:0{KEY_DIGITS}d}.cls"]:
        raise SystemExit(f"generated tar {path} holds {names!r}")


# ---------------------------------------------------------------- memory of a process tree


def children(pid: int) -> list[int]:
    """The children of ``pid`` (every thread's: a child belongs to the thread that made it)."""
    kids: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                kids.extend(int(k) for k in f.read().split())
    except (FileNotFoundError, ProcessLookupError):
        pass  # it has just exited
    return kids


def status(pid: int) -> tuple[str, int] | None:
    """(name, VmHWM in bytes) of ``pid``, or None once it has gone."""
    name, hwm = "?", 0
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Name:"):
                    name = line.split(None, 1)[1].strip()
                elif line.startswith("VmHWM:"):
                    hwm = int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        return None
    return (name, hwm) if hwm else None  # no VmHWM: a zombie, its memory already gone


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


@dataclass
class Proc:
    pid: int
    parent: int
    role: str
    peak: int = 0  # bytes: the largest VmHWM seen since ``command`` began
    command: str = ""


@dataclass
class TreeWatch:
    """Samples the peak RSS (VmHWM) of a process and all its descendants until stopped."""

    root: int
    procs: dict[int, Proc] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self._run, daemon=True)
        thread.start()
        return thread

    def stop(self, thread: threading.Thread) -> None:
        self._stop.set()
        thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.look()
            self._stop.wait(SAMPLE_EVERY)

    def look(self) -> None:
        todo = [(self.root, 0)]
        while todo:
            pid, parent = todo.pop()
            got = status(pid)
            if got is None:
                continue
            proc = self.procs.setdefault(pid, Proc(pid, parent, "?"))
            # A new process runs its parent's command line, sharing its pages, until it
            # execs (the forkserver does): role and peak start again when it changes.
            # Parents are looked at first, so a child sees its parent's current role.
            line = cmdline(pid)
            if line and line != proc.command:  # empty: it has just exited
                proc.command, proc.peak = line, 0
            above = self.procs[parent].role if parent in self.procs else None
            proc.role = role_of(line, got[0], above)
            proc.peak = max(proc.peak, got[1])
            todo.extend((kid, pid) for kid in children(pid))


def role_of(line: str, name: str, parent_role: str | None) -> str:
    """What a process of the export is: the command (main), the forkserver, one of the
    pool's workers (forked by the forkserver: same command line), the resource tracker.
    """
    if parent_role is None:
        return "main"
    if parent_role == "forkserver":
        return "worker"
    if "forkserver" in line:
        return "forkserver"
    if "resource_tracker" in line:
        return "resource tracker"
    return "worker" if "python" in name or "python" in line else name


# ---------------------------------------------------------------- one export


@dataclass
class Run:
    samples: int
    seconds: float
    procs: list[Proc]
    wait4_maxrss: int  # bytes: ru_maxrss of wait4 (largest of the tree's waited processes)

    @property
    def rate(self) -> float:
        return self.samples / self.seconds

    @property
    def peak(self) -> int:
        return max([p.peak for p in self.procs] + [self.wait4_maxrss])

    def describe(self) -> str:
        by_role: dict[str, list[int]] = {}
        for p in self.procs:
            by_role.setdefault(p.role, []).append(p.peak)
        parts = [
            f"{role} {'/'.join(f'{v / MB:.0f}' for v in sorted(peaks, reverse=True))}"
            for role, peaks in sorted(by_role.items())
        ]
        return f"{len(self.procs)} processes, MB: " + ", ".join(parts)


def export_command(source: Path, out: Path, workers: int) -> list[str]:
    code = "import sys; from shardex.cli import main; sys.exit(main())"
    args = ["export-dataset", str(source), "-o", str(out), "--workers", str(workers)]
    return [sys.executable, "-c", code, *args]


def run_export(source: Path, out: Path, samples: int, workers: int) -> Run:
    """Export ``source`` in a subprocess, watching the memory of its whole process tree."""
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    proc = subprocess.Popen(export_command(source, out, workers), stdout=subprocess.DEVNULL)
    watch = TreeWatch(proc.pid)
    thread = watch.start()
    _, wstatus, usage = os.wait4(proc.pid, 0)
    took = time.perf_counter() - t0
    watch.stop(thread)
    proc.returncode = os.waitstatus_to_exitcode(wstatus)  # reaped here, not by Popen
    if proc.returncode != 0:
        raise SystemExit(f"export of {source} failed: exit status {proc.returncode}")
    exported = shardex.open_dataset(out, split="train")
    if len(exported) != samples:
        raise SystemExit(f"export of {source} holds {len(exported):,} samples, not {samples:,}")
    shutil.rmtree(out)
    return Run(samples, took, list(watch.procs.values()), usage.ru_maxrss * 1024)


def merge(runs: list[Run]) -> Run:
    """Repeats of one size: the median time, and the largest peak of each role's process."""
    seconds = statistics.median(r.seconds for r in runs)
    worst = max(runs, key=lambda r: r.peak)
    return Run(runs[0].samples, seconds, worst.procs, max(r.wait4_maxrss for r in runs))


# ---------------------------------------------------------------- the report


def rows_for(runs: list[Run], workers: int) -> list[Row]:
    rows = []
    for r in runs:
        n = size_name(r.samples)
        rows.append(
            Row(
                f"export {n} samples, --workers {workers}",
                "samples/s",
                r.rate,
                note=f"{r.seconds:.1f} s wall, Python start included",
            )
        )
        rows.append(
            Row(
                f"peak RSS of any process, {n} samples",
                "MB",
                r.peak / MB,
                None,
                RSS_TARGET_MB,
                "value",
                higher=False,
                note=f"{r.describe()}; wait4 maxrss {r.wait4_maxrss / MB:.0f}",
            )
        )
    if len(runs) >= 2:
        small, large = runs[0], runs[-1]
        span = f"{size_name(large.samples)} / {size_name(small.samples)}"
        millions = (large.samples - small.samples) / 1e6
        growth = (large.peak - small.peak) / MB / millions
        rows.append(
            Row(
                f"samples/s {span}",
                "x",
                large.rate / small.rate,
                None,
                RATE_TARGET,
                "value",
                note="within 20 %: the larger export at >= 0.8 of the smaller's rate",
            )
        )
        rows.append(
            Row(
                f"peak RSS growth {span}",
                "MB/M",
                growth,
                None,
                GROWTH_TARGET,
                "value",
                higher=False,
                note="largest process peak, per million samples (target < 30)",
            )
        )
    return rows


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument(
        "--sizes",
        type=lambda s: sorted(parse_size(x) for x in s.split(",")),
        default=[100_000, 1_000_000, 3_000_000],
        help="sample counts, comma-separated (default 100k,1M,3M)",
    )
    p.add_argument("--workers", type=int, default=2, help="--workers of the export")
    p.add_argument("--per-tar", type=int, default=10_000, help="samples per source tar")
    p.add_argument("--repeats", type=int, default=1, help="exports per size (median rate)")
    p.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR, help="cache folder")
    p.add_argument("--json", type=Path, help="also write the results as JSON here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    runs = []
    for count in args.sizes:
        source = build_tars(args.workdir, count, args.per_tar)
        out = args.workdir / f"scale-export-n{size_name(count)}"
        repeats = [run_export(source, out, count, args.workers) for _ in range(args.repeats)]
        run = merge(repeats)
        print(
            f"{size_name(count)}: {run.rate:,.0f} samples/s, peak {run.peak / MB:,.0f} MB "
            f"({run.describe()})",
            flush=True,
        )
        runs.append(run)
    rows = rows_for(runs, args.workers)
    print()
    print(render(rows))
    took = time.perf_counter() - started
    print(f"\nsizes {', '.join(map(size_name, args.sizes))}; total {took:.0f} s")
    if args.json:
        write_json(
            args.json,
            rows,
            versions={"shardex": shardex.__version__},
            sizes=args.sizes,
            workers=args.workers,
            per_tar=args.per_tar,
            seconds=took,
            processes={
                str(r.samples): [
                    {"pid": p.pid, "parent": p.parent, "role": p.role, "peak_mb": p.peak / MB}
                    for p in r.procs
                ]
                for r in runs
            },
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
