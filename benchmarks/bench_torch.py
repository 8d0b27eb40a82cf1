"""PyTorch DataLoader throughput with JPEG decoding, against the decode limit of this machine.

Exports the cached image folder of ``bench_format.py`` (N JPEGs of about ``--size-kb`` KB)
with shardex to local disk, then measures DataLoader images/s, batch size 64, every image
decoded and resized (bilinear, Pillow) to 224×224, for ``num_workers`` 0 and 2, against
**the decode limit**: the same JPEG bytes, held in a Python list, decoded and resized to a
(3, 224, 224) float tensor in a loop, in this process (``num_workers=0``) or split across
2 worker processes of a ``multiprocessing`` pool (``num_workers=2``). The limit is
measured twice:

* with Pillow (:func:`decode_224`: ``Image.open``, ``draft``, ``convert``, ``resize``);
* with shardex's decoder (:func:`fast_224`: ``shardex.codecs.images.decode``, which uses
  simplejpeg when installed, then the same resize): what the shardex rows decode with.

Loaders (shardex rows decode with ``decode=True, decode_size=(224, 224)``):

* ``float items``: the transform makes each image a float tensor; the DataLoader's
  default collation stacks 64 of them (38.5 MB per batch);
* ``uint8 items, float per batch``: the transform makes each image a (224, 224, 3) uint8
  tensor (9.6 MB per batch), and the training loop converts each batch to float once,
  into a float batch it reuses (``floats.copy_(images.permute(0, 3, 1, 2)).div_(255)``,
  timed): the same float images in the end;
* shardex ``MapDataset`` + ``ShardexSampler`` (a global shuffle, one ``get_many`` per
  batch) and ``StreamDataset`` (shard order, shuffle buffer), each through its own
  ``dataloader()``: batches packed in place and passed through reused shared memory;
* the stock ``webdataset.WebDataset(urls).map(...)`` loader on the same shards (a peer);
* a DataLoader over the same JPEG bytes held in a Python list (what the DataLoader
  itself costs).

The machine is shared and noisy: every rate is the median of a few repeats, the loaders and
the baselines run interleaved, and each is reported as a ratio to a baseline. Rates are
**steady** rates, the ones a long epoch runs at: timed from the moment every worker has
delivered its first batch (a DataLoader starts its workers anew for every pass, while the
decode limit's pool is started once, untimed; the limit is timed the same way). Each
row's note also gives the ratio of whole passes, worker start included. With
``--profile`` it also prints a cProfile of a ``num_workers=0`` pass of each loader and what
one collation of a 64-image float batch costs.

Usage::

    .venv/bin/python benchmarks/bench_torch.py [--images 5000] [--size-kb 16]
        [--workdir DIR] [--repeats 3] [--json PATH] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import multiprocessing
import pstats
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image
from torch.utils.data import DataLoader, Dataset

import shardex
import torch
from _report import Row, median_time, render, write_json
from bench_format import DEFAULT_WORKDIR, build_folder, tar_urls, warm
from shardex.codecs.images import decode
from shardex.torch import MapDataset, ShardexSampler, StreamDataset

Transform = Callable[[np.ndarray[Any, Any]], torch.Tensor]

SIZE = 224
BATCH = 64
WORKERS = (0, 2)
#: 10 shards for 5000 images: webdataset gives each DataLoader worker whole shards, so an
#: even shard count keeps its 2 workers equally loaded (5 shards would split 3 + 2).
SAMPLES_PER_SHARD = 500
TARGET = 0.9
SEED = 0


# ---------------------------------------------------------------- the decode functions


def decode_224(data: bytes) -> torch.Tensor:
    """JPEG bytes -> a (3, 224, 224) float32 tensor in [0, 1] (Pillow, bilinear resize).

    ``draft()`` asks libjpeg for a reduced-size decode (1/2, 1/4 or 1/8 scale) when the
    image is at least twice the target in both sides; for smaller images, such as the
    ~145×128 ones of this benchmark, it decodes at full size (and the resize enlarges).
    """
    img = Image.open(io.BytesIO(data))
    img.draft("RGB", (SIZE, SIZE))
    img = img.convert("RGB").resize((SIZE, SIZE), Image.Resampling.BILINEAR)
    return torch.from_numpy(np.array(img)).permute(2, 0, 1).float().div_(255)


def resize_uint8(pixels: np.ndarray[Any, Any]) -> torch.Tensor:
    """Decoded (H, W, 3) uint8 pixels -> a (224, 224, 3) uint8 tensor (bilinear resize).

    Channels last, as decoded: 64 of them stack with one contiguous copy each (~12 µs an
    image), where (3, 224, 224) views of the same memory stack byte by byte (~55 µs).
    """
    img = Image.fromarray(pixels).resize((SIZE, SIZE), Image.Resampling.BILINEAR)
    return torch.from_numpy(np.array(img))


def resize_float(pixels: np.ndarray[Any, Any]) -> torch.Tensor:
    """Decoded pixels -> a (3, 224, 224) float32 tensor in [0, 1]: :func:`decode_224`'s."""
    return resize_uint8(pixels).permute(2, 0, 1).float().div_(255)


def fast_224(data: bytes) -> torch.Tensor:
    """:func:`decode_224` with shardex's decoder (simplejpeg where installed)."""
    return resize_float(decode(data, size_hint=(SIZE, SIZE)))


def fast_uint8(data: bytes) -> torch.Tensor:
    return resize_uint8(decode(data, size_hint=(SIZE, SIZE)))


def to_item(raw: dict[str, Any]) -> dict[str, Any]:
    """A raw webdataset sample -> ``{"image": uint8 (224, 224, 3), "label"}``."""
    return {"image": fast_uint8(raw["jpg"]), "label": int(raw["cls"])}


# ---------------------------------------------------------------- passes and their clocks


@dataclass(frozen=True)
class Pass:
    """One timed pass: all of it, and its steady part (after every worker's first batch)."""

    images: int
    seconds: float
    steady_images: int
    steady_seconds: float


def timed_pass(batches: Iterable[int], warm: int) -> Pass:
    """Times a pass whose items are batch sizes; the steady part starts once ``warm``
    batches (one per worker: they start together) have arrived."""
    t0 = time.perf_counter()
    images, after, t_warm = 0, 0, t0
    for k, n in enumerate(batches):
        images += n
        if k + 1 == warm:
            after, t_warm = images, time.perf_counter()
    end = time.perf_counter()
    return Pass(images, end - t0, images - after, end - t_warm)


def median_passes(fns: Sequence[Callable[[], Pass]], repeats: int) -> list[tuple[float, float]]:
    """Median whole-pass and steady rates (images/s) of each of ``fns``, interleaved."""
    rates: list[list[tuple[float, float]]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, out in zip(fns, rates, strict=True):
            gc.collect()
            p = fn()
            out.append((p.images / p.seconds, p.steady_images / p.steady_seconds))
    return [
        (statistics.median(r[0] for r in rs), statistics.median(r[1] for r in rs)) for rs in rates
    ]


# ---------------------------------------------------------------- the decode limit

_JPEGS: list[bytes] = []  # set before the pool forks; its workers read it
_DECODERS: dict[str, Callable[[bytes], torch.Tensor]] = {
    "Pillow": decode_224,
    "shardex decode": fast_224,
    "shardex decode, uint8": fast_uint8,
}
_LIMIT_NOTES = {
    "Pillow": "decode_224 (Pillow) of the JPEG bytes from a Python list",
    "shardex decode": "fast_224 (shardex.codecs.images.decode + the same resize + float)",
    "shardex decode, uint8": "fast_uint8 (as fast_224, stopping at the (224, 224, 3) uint8 tensor)",
}


def _pool_init() -> None:
    torch.set_num_threads(1)  # as in a DataLoader worker


def _decode_range(job: tuple[str, int, int]) -> int:
    fn = _DECODERS[job[0]]
    for data in _JPEGS[job[1] : job[2]]:
        fn(data)
    return job[2] - job[1]


class DecodeLimit:
    """The same JPEG bytes, in a Python list, decoded by one of :data:`_DECODERS`: in this
    process, or in batches of 64 across a pool of worker processes (started once and
    shared by both decoders)."""

    def __init__(self, jpegs: list[bytes], workers: int) -> None:
        self.count, self.workers = len(jpegs), workers
        _JPEGS[:] = jpegs
        self.pool = (
            multiprocessing.get_context("fork").Pool(workers, initializer=_pool_init)
            if workers
            else None
        )
        self.ranges = [(k, min(k + BATCH, self.count)) for k in range(0, self.count, BATCH)]

    def warm(self) -> None:
        """Untimed: the pool's workers up, both decoders' modules loaded."""
        for name in _DECODERS:
            jobs = [(name, a, b) for a, b in self.ranges[: 2 * max(self.workers, 1)]]
            if self.pool is None:
                sum(map(_decode_range, jobs))
            else:
                sum(self.pool.imap_unordered(_decode_range, jobs))

    def timer(self, name: str) -> Callable[[], Pass]:
        jobs = [(name, a, b) for a, b in self.ranges]
        warm = max(1, self.workers)
        if self.pool is None:
            return lambda: timed_pass(map(_decode_range, jobs), warm)
        pool = self.pool
        return lambda: timed_pass(pool.imap_unordered(_decode_range, jobs), warm)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool.join()


class InMemory(Dataset[dict[str, Any]]):
    """The JPEG bytes in a Python list, as a map-style dataset (the loader's own cost)."""

    def __init__(
        self, jpegs: list[bytes], labels: list[int], fn: Callable[[bytes], torch.Tensor]
    ) -> None:
        self.jpegs, self.labels, self.fn = jpegs, labels, fn

    def __len__(self) -> int:
        return len(self.jpegs)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"image": self.fn(self.jpegs[i]), "label": self.labels[i]}


# ---------------------------------------------------------------- loaders under test


def drain(loader: Iterable[Any], *, to_float: bool = True) -> Iterator[int]:
    """The size of each batch of one pass over a loader, each batch made float32 in
    [0, 1] as a training loop would: uint8 (B, 224, 224, 3) batches are converted once per
    batch, here and timed, into a (B, 3, 224, 224) float batch the loop reuses (what a
    pinned staging buffer or the GPU would be), channels last in memory as the decode
    limit's ``permute(2, 0, 1).float()`` tensors are. ``to_float=False``: uint8 batches
    are only checked, as a loop that converts on the GPU would take them.

    The reuse matters on this machine: a fresh 64×3×224×224 float32 batch (38.5 MB) is
    above glibc's largest mmap threshold (32 MiB), so every one is mapped, faulted in and
    zeroed anew: 300+ µs per image against ~45 µs for ``copy_`` + ``div_`` into reused
    memory. The per-image float tensors of the decode limit (600 KB) come from the heap.
    """
    floats = torch.empty(BATCH, 3, SIZE, SIZE, memory_format=torch.channels_last)
    for batch in loader:
        images = batch["image"]
        if images.dtype == torch.uint8:
            images = images.permute(0, 3, 1, 2)
            if to_float:
                images = floats[: len(images)].copy_(images).div_(255)
        if images.shape[1:] != (3, SIZE, SIZE) or images.dtype != (
            torch.float32 if to_float else torch.uint8
        ):
            raise SystemExit(f"unexpected batch {tuple(images.shape)} {images.dtype}")
        yield images.shape[0]


def map_loader(out: Path, workers: int, transform: Transform) -> DataLoader[Any]:
    ds = MapDataset(out, "train", transform=transform, decode_size=(SIZE, SIZE))
    sampler = ShardexSampler(len(ds), rank=0, world_size=1, seed=SEED)
    return ds.dataloader(BATCH, sampler=sampler, num_workers=workers)


def stream_loader(out: Path, workers: int, transform: Transform) -> DataLoader[Any]:
    ds = StreamDataset(
        out,
        "train",
        transform=transform,
        decode_size=(SIZE, SIZE),
        seed=SEED,
        rank=0,
        world_size=1,
    )
    return ds.dataloader(batch_size=BATCH, num_workers=workers)


def webdataset_loader(urls: list[str], workers: int) -> DataLoader[Any]:
    import webdataset as wds

    ds = wds.WebDataset(urls, shardshuffle=False).map(to_item)
    return DataLoader(ds, batch_size=BATCH, num_workers=workers)


def memory_loader(
    jpegs: list[bytes], labels: list[int], workers: int, fn: Callable[[bytes], torch.Tensor]
) -> DataLoader[Any]:
    return DataLoader(
        InMemory(jpegs, labels, fn), batch_size=BATCH, shuffle=True, num_workers=workers
    )


def check_same_images(out: Path, jpegs: list[bytes], picks: Sequence[int]) -> float:
    """Every shardex row decodes the baseline's bytes to the shardex-decode limit's
    tensor; returns the largest difference from Pillow's (:func:`decode_224`)."""
    floats = MapDataset(out, "train", transform=resize_float, decode_size=(SIZE, SIZE))
    uint8 = MapDataset(out, "train", transform=resize_uint8, decode_size=(SIZE, SIZE))
    worst = 0.0
    for i in picks:
        expected = fast_224(jpegs[i])
        if not torch.equal(floats[i]["image"], expected):
            raise SystemExit(f"sample {i}: MapDataset's float image differs from the baseline's")
        if not torch.equal(uint8[i]["image"].permute(2, 0, 1).float().div_(255), expected):
            raise SystemExit(f"sample {i}: MapDataset's uint8 image differs from the baseline's")
        worst = max(worst, float((expected - decode_224(jpegs[i])).abs().max()))
    return worst


# ---------------------------------------------------------------- the benchmark

FLOAT, UINT8, AS_IS = "float items", "uint8 items, float per batch", "uint8 batches as delivered"


@dataclass(frozen=True)
class Case:
    """A loader row: how to make the loader, the limit it is compared with, its target."""

    name: str
    make: Callable[[], DataLoader[Any]]
    limit: str  # a key of _DECODERS
    target: float | None
    note: str
    to_float: bool = True  # the loop converts uint8 batches to float (see drain)


def cases(out: Path, jpegs: list[bytes], labels: list[int], workers: int) -> list[Case]:
    urls = tar_urls(out)
    note = "decode=True, decode_size=(224, 224), transform=resize_"
    shuffle = {"map": "global shuffle", "stream": ".dataloader(), shard shuffle + buffer 1000"}
    make = {"map": map_loader, "stream": stream_loader}
    title = {"map": "shardex MapDataset + ShardexSampler", "stream": "shardex StreamDataset"}
    rows = []
    for kind in ("map", "stream"):
        rows += [
            Case(
                f"{title[kind]}, {FLOAT}",
                partial(make[kind], out, workers, resize_float),
                "shardex decode",
                TARGET,
                f"{note}float; {shuffle[kind]}",
            ),
            Case(
                f"{title[kind]}, {UINT8}",
                partial(make[kind], out, workers, resize_uint8),
                "shardex decode",
                TARGET,
                f"{note}uint8; {shuffle[kind]}",
            ),
            Case(
                f"{title[kind]}, {AS_IS}",
                partial(make[kind], out, workers, resize_uint8),
                "shardex decode, uint8",
                TARGET,
                f"{note}uint8; {shuffle[kind]}; no float conversion",
                to_float=False,
            ),
        ]
    return [
        *rows,
        Case(
            f"webdataset.WebDataset(urls).map(...) (peer), {UINT8}",
            partial(webdataset_loader, urls, workers),
            "shardex decode",
            None,
            f"stock loader, same {len(urls)} shards, .map(shardex decode + resize_uint8)",
        ),
        Case(
            f"DataLoader over in-memory list, {FLOAT}",
            partial(memory_loader, jpegs, labels, workers, fast_224),
            "shardex decode",
            None,
            "same bytes, fast_224 per item: the DataLoader's own cost with float items",
        ),
        Case(
            f"DataLoader over in-memory list, {UINT8}",
            partial(memory_loader, jpegs, labels, workers, fast_uint8),
            "shardex decode",
            None,
            "same bytes, fast_uint8 per item: the DataLoader's own cost with uint8 items",
        ),
    ]


def bench_workers(
    out: Path, jpegs: list[bytes], labels: list[int], workers: int, repeats: int
) -> list[Row]:
    """Every loader with ``workers`` DataLoader workers, interleaved with the decode limits."""
    count = len(jpegs)
    limit = DecodeLimit(jpegs, workers)
    todo = cases(out, jpegs, labels, workers)

    warm = max(1, workers)

    def run(case: Case) -> Callable[[], Pass]:
        def once() -> Pass:
            got = timed_pass(drain(case.make(), to_float=case.to_float), warm)
            if got.images != count:
                raise SystemExit(f"{case.name} gave {got.images} images, expected {count}")
            return got

        return once

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # webdataset's notes about shardshuffle etc.
        limit.warm()
        for case in todo:  # untimed: imports, first opens, Pillow's plugins
            batches = iter(case.make())
            next(batches), next(batches)
            del batches
        timed = [*(limit.timer(name) for name in _DECODERS), *map(run, todo)]
        names = [*_DECODERS, *(case.name for case in todo)]
        rates = dict(zip(names, median_passes(timed, repeats), strict=True))
    limit.close()
    # The steady rate is the one a long epoch runs at: the workers a DataLoader starts
    # for every pass (the decode limit's pool is started once, untimed) are not in it.
    whole = {name: r[0] for name, r in rates.items()}
    rate = {name: r[1] for name, r in rates.items()}
    pillow = rate["Pillow"]
    how = "in one process" if workers == 0 else f"across a pool of {workers} processes"
    rows = [
        Row(
            f"decode limit ({name}), num_workers={workers}",
            "images/s",
            rate[name],
            None if name == "Pillow" else pillow,
            note=f"{_LIMIT_NOTES[name]}, {how}",
        )
        for name in _DECODERS
    ]
    for case in todo:
        value = rate[case.name]
        rows.append(
            Row(
                f"{case.name}, num_workers={workers}",
                "images/s",
                value,
                rate[case.limit],
                case.target,
                note=(
                    f"vs the {case.limit} limit; {case.note}; {value / pillow:.2f}× the "
                    f"Pillow limit; whole passes (worker start included) "
                    f"{whole[case.name] / whole[case.limit]:.3f}× the limit's"
                ),
            )
        )
    return rows


def collation_costs(jpegs: list[bytes], rounds: int = 9) -> None:
    """What one default collation of a 64-image batch costs (float32 and uint8 items),
    against the decode."""
    floats = [fast_224(data) for data in jpegs[:BATCH]]
    uint8 = [fast_uint8(data) for data in jpegs[:BATCH]]
    reused = torch.empty(BATCH, *floats[0].shape)

    def shared(images: list[torch.Tensor]) -> Callable[[], None]:
        def collate() -> None:  # what default_collate does in a DataLoader worker
            numel = BATCH * images[0].numel()
            storage = images[0]._typed_storage()._new_shared(numel, device="cpu")
            out = images[0].new(storage).resize_(BATCH, *images[0].shape)
            torch.stack(images, 0, out=out)

        return collate

    batch = torch.stack(uint8).permute(0, 3, 1, 2)
    reused_last = reused.to(memory_format=torch.channels_last)
    print(f"\n--- one batch of {BATCH} images, median of {rounds} (µs per image) ---")
    for title, fn in (
        ("decode_224 (Pillow) of each JPEG", lambda: [decode_224(d) for d in jpegs[:BATCH]]),
        ("fast_224 (shardex decode) of each JPEG", lambda: [fast_224(d) for d in jpegs[:BATCH]]),
        (
            "fast_uint8 (shardex decode) of each JPEG",
            lambda: [fast_uint8(d) for d in jpegs[:BATCH]],
        ),
        ("float: torch.stack into fresh memory (num_workers=0)", lambda: torch.stack(floats)),
        ("float: torch.stack into fresh shared memory (in a worker)", shared(floats)),
        ("float: torch.stack into reused memory", lambda: torch.stack(floats, out=reused)),
        ("uint8: torch.stack into fresh memory (num_workers=0)", lambda: torch.stack(uint8)),
        ("uint8: torch.stack into fresh shared memory (in a worker)", shared(uint8)),
        ("uint8 batch -> float (fresh memory), / 255", lambda: batch.float().div_(255)),
        ("uint8 batch -> float (reused memory), / 255", lambda: reused_last.copy_(batch).div_(255)),
    ):
        fn()
        print(f"{1e6 * median_time(fn, rounds) / BATCH:8.0f}  {title}")


def profile(out: Path, jpegs: list[bytes], labels: list[int], limit: int = 15) -> None:
    """cProfile (this process, num_workers=0) of one pass of each loader and the baseline."""
    decoder = DecodeLimit(jpegs, 0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for title, fn in (
            ("decode limit (shardex decode), one process", decoder.timer("shardex decode")),
            (
                f"in-memory DataLoader, {UINT8}",
                lambda: sum(drain(memory_loader(jpegs, labels, 0, fast_uint8))),
            ),
            (
                f"MapDataset + ShardexSampler, {UINT8}",
                lambda: sum(drain(map_loader(out, 0, resize_uint8))),
            ),
            (f"StreamDataset, {UINT8}", lambda: sum(drain(stream_loader(out, 0, resize_uint8)))),
        ):
            prof = cProfile.Profile()
            prof.runcall(fn)
            print(f"\n--- cProfile: {title}, num_workers=0 (top {limit} by tottime) ---")
            pstats.Stats(prof).sort_stats("tottime").print_stats(limit)
    collation_costs(jpegs)


def package_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"shardex": shardex.__version__, "torch": torch.__version__}
    for name in ("pillow", "simplejpeg", "webdataset"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "not installed"
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--images", type=int, default=5000, help="number of images")
    p.add_argument("--size-kb", type=int, default=16, help="mean JPEG size in KB")
    p.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR, help="cache folder")
    p.add_argument("--repeats", type=int, default=3, help="timed passes per loader")
    p.add_argument("--json", type=Path, help="also write the results as JSON here")
    p.add_argument("--profile", action="store_true", help="print cProfile of num_workers=0")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    # One intra-op thread, as in every DataLoader worker: with 2 (the default on 2 cores),
    # the float conversions and the collation in this process fight the other tenants'
    # work and the rates of the num_workers=0 rows swing by up to 10×.
    torch.set_num_threads(1)
    count = args.images
    folder = build_folder(args.workdir, count, args.size_kb)
    out = args.workdir / f"torch-n{count}-kb{args.size_kb}" / "export"
    shardex.export(folder, out, workers=2, samples_per_shard=SAMPLES_PER_SHARD, overwrite=True)
    warm(map(Path, tar_urls(out)))
    raw = shardex.open_dataset(out, split="train")
    samples = [raw[i] for i in range(len(raw))]
    jpegs = [s["jpg"] for s in samples]
    labels = [int(s["cls"]) for s in samples]
    del samples
    if len(jpegs) != count:
        raise SystemExit(f"the export has {len(jpegs)} samples, expected {count}")
    worst = check_same_images(out, jpegs, [0, count // 2, count - 1])
    width, height = Image.open(io.BytesIO(jpegs[0])).size
    versions = package_versions()
    print(
        f"{count} JPEGs, {sum(map(len, jpegs)) / count / 1024:.1f} KiB mean, ~{width}×{height} "
        f"px (smaller than {SIZE}: draft() decodes at full size), "
        f"{len(tar_urls(out))} shards; 1 intra-op thread; {versions}"
    )
    print(f"shardex decode vs Pillow, largest pixel difference after resize: {worst:.4f}")
    rows = [r for w in WORKERS for r in bench_workers(out, jpegs, labels, w, args.repeats)]
    print()
    print(render(rows))
    took = time.perf_counter() - started
    print(f"\n{count} images, batch {BATCH}; medians of {args.repeats} interleaved passes")
    print(f"total {took:.0f} s")
    if args.profile:
        profile(out, jpegs, labels)
    if args.json:
        write_json(
            args.json,
            rows,
            versions=versions,
            images=count,
            size_kb=args.size_kb,
            batch_size=BATCH,
            image_size=[width, height],
            seconds=took,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
