"""PyTorch DataLoader throughput with JPEG decoding, against the decode limit of this machine.

Exports the cached image folder of ``bench_format.py`` (N JPEGs of about ``--size-kb`` KB)
with shardex to local disk, then measures DataLoader images/s, batch size 64, every image
decoded with Pillow and resized to a 224×224 float tensor by the same function
(:func:`decode_224`), for ``num_workers`` 0 and 2:

* shardex ``MapDataset`` + ``ShardexSampler`` (a global shuffle, one ``get_many`` per batch);
* shardex ``StreamDataset`` (its own ``dataloader()``: shard order, shuffle buffer);
* the stock ``webdataset.WebDataset(urls).map(...)`` loader on the same shards (a peer);
* a DataLoader over the same JPEG bytes held in a Python list, with the default collation
  and with ``collate_fn=len`` (no batch tensor): what the DataLoader itself costs;

each against **the decode limit**: the same JPEG bytes, held in a Python list, decoded by
the same function in a loop, in this process (``num_workers=0``) or split across 2 worker
processes of a ``multiprocessing`` pool (``num_workers=2``).

The machine is shared and noisy: every rate is the median of a few repeats, the loaders and
the baseline run interleaved, and each is reported as a ratio to that baseline. With
``--profile`` it also prints a cProfile of a ``num_workers=0`` pass of each loader and what
one collation of a 64-image float batch costs.

Usage::

    .venv/bin/python benchmarks/bench_torch.py [--images 5000] [--size-kb 16]
        [--workdir DIR] [--repeats 3] [--json PATH] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import multiprocessing
import pstats
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

import shardex
from _report import Row, median_time, median_times, render, write_json
from bench_format import DEFAULT_WORKDIR, build_folder, tar_urls, warm
from shardex.torch import MapDataset, ShardexSampler, StreamDataset

SIZE = 224
BATCH = 64
WORKERS = (0, 2)
#: 10 shards for 5000 images: webdataset gives each DataLoader worker whole shards, so an
#: even shard count keeps its 2 workers equally loaded (5 shards would split 3 + 2).
SAMPLES_PER_SHARD = 500
TARGET = 0.9
SEED = 0


# ---------------------------------------------------------------- the decode function


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


def to_item(raw: dict[str, Any]) -> dict[str, Any]:
    """A raw sample (shardex ``decode=False`` or webdataset) -> ``{"image", "label"}``."""
    return {"image": decode_224(raw["jpg"]), "label": int(raw["cls"])}


# ---------------------------------------------------------------- the decode limit

_JPEGS: list[bytes] = []  # set before the pool forks; its workers read it


def _pool_init() -> None:
    torch.set_num_threads(1)  # as in a DataLoader worker


def _decode_range(bounds: tuple[int, int]) -> int:
    for data in _JPEGS[bounds[0] : bounds[1]]:
        decode_224(data)
    return bounds[1] - bounds[0]


class DecodeLimit:
    """The same JPEG bytes, in a Python list, decoded by :func:`decode_224`: in this
    process, or in batches of 64 across a pool of worker processes (started once)."""

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
        """Untimed: the pool's workers up, Pillow's plugins loaded."""
        if self.pool is None:
            _decode_range((0, BATCH))
        else:
            sum(self.pool.imap_unordered(_decode_range, self.ranges[: 2 * self.workers]))

    def __call__(self) -> int:
        if self.pool is None:
            for data in _JPEGS:
                decode_224(data)
            return self.count
        return sum(self.pool.imap_unordered(_decode_range, self.ranges))

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool.join()


class InMemory(Dataset[dict[str, Any]]):
    """The JPEG bytes in a Python list, as a map-style dataset (the loader's own cost)."""

    def __init__(self, jpegs: list[bytes], labels: list[int]) -> None:
        self.jpegs, self.labels = jpegs, labels

    def __len__(self) -> int:
        return len(self.jpegs)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"image": decode_224(self.jpegs[i]), "label": self.labels[i]}


# ---------------------------------------------------------------- loaders under test


def count_batch(items: list[Any]) -> int:
    """A ``collate_fn`` that makes no batch tensor: the loader without collation."""
    return len(items)


def drain(loader: Iterable[Any]) -> int:
    """Images in one pass over a loader (checks each batch's shape)."""
    n = 0
    for batch in loader:
        if isinstance(batch, int):  # collate_fn=count_batch
            n += batch
            continue
        images = batch["image"]
        if images.shape[1:] != (3, SIZE, SIZE) or images.dtype != torch.float32:
            raise SystemExit(f"unexpected batch {tuple(images.shape)} {images.dtype}")
        n += images.shape[0]
    return n


def map_loader(out: Path, workers: int) -> DataLoader[Any]:
    ds = MapDataset(out, "train", decode=False, transform=to_item)
    sampler = ShardexSampler(len(ds), rank=0, world_size=1, seed=SEED)
    return DataLoader(ds, batch_size=BATCH, sampler=sampler, num_workers=workers)


def stream_loader(out: Path, workers: int) -> DataLoader[Any]:
    ds = StreamDataset(
        out, "train", decode=False, transform=to_item, seed=SEED, rank=0, world_size=1
    )
    return ds.dataloader(batch_size=BATCH, num_workers=workers)


def webdataset_loader(urls: list[str], workers: int) -> DataLoader[Any]:
    import webdataset as wds

    ds = wds.WebDataset(urls, shardshuffle=False).map(to_item)
    return DataLoader(ds, batch_size=BATCH, num_workers=workers)


def memory_loader(
    jpegs: list[bytes], labels: list[int], workers: int, *, collate: bool = True
) -> DataLoader[Any]:
    return DataLoader(
        InMemory(jpegs, labels),
        batch_size=BATCH,
        shuffle=True,
        num_workers=workers,
        collate_fn=None if collate else count_batch,
    )


def check_same_images(out: Path, jpegs: list[bytes], picks: Sequence[int]) -> None:
    """Every loader decodes the baseline's bytes with the baseline's function."""
    ds = MapDataset(out, "train", decode=False, transform=to_item)
    for i in picks:
        if not torch.equal(ds[i]["image"], decode_224(jpegs[i])):
            raise SystemExit(f"sample {i}: MapDataset's image differs from the baseline's")


# ---------------------------------------------------------------- the benchmark


def bench_workers(
    out: Path, jpegs: list[bytes], labels: list[int], workers: int, repeats: int
) -> list[Row]:
    """Every loader with ``workers`` DataLoader workers, interleaved with the decode limit."""
    count = len(jpegs)
    urls = tar_urls(out)
    limit = DecodeLimit(jpegs, workers)
    memory = "DataLoader over in-memory list"
    loaders: list[tuple[str, Callable[[], DataLoader[Any]], float | None, str]] = [
        (
            "shardex MapDataset + ShardexSampler",
            lambda: map_loader(out, workers),
            TARGET,
            "decode=False, transform=to_item (decode_224 of the jpg); global shuffle",
        ),
        (
            "shardex StreamDataset",
            lambda: stream_loader(out, workers),
            TARGET,
            "decode=False, transform=to_item; .dataloader(), shard shuffle + buffer 1000",
        ),
        (
            "webdataset.WebDataset(urls).map(...) (peer)",
            lambda: webdataset_loader(urls, workers),
            None,
            f"stock loader, same {len(urls)} shards, .map(to_item), no shuffle",
        ),
        (
            memory,
            lambda: memory_loader(jpegs, labels, workers),
            None,
            "same bytes, same decode, map-style list dataset: the DataLoader's own cost",
        ),
        (
            f"{memory}, no collation",
            lambda: memory_loader(jpegs, labels, workers, collate=False),
            None,
            "as above with collate_fn=len: no 64×3×224×224 float batch tensor is made",
        ),
    ]

    def run(make: Callable[[], DataLoader[Any]]) -> Callable[[], None]:
        def once() -> None:
            got = drain(make())
            if got != count:
                raise SystemExit(f"a loader gave {got} images, expected {count}")

        return once

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # webdataset's notes about shardshuffle etc.
        limit.warm()
        for _, make, _, _ in loaders:  # untimed: imports, first opens, Pillow's plugins
            batches = iter(make())
            next(batches), next(batches)
            del batches
        timed = [limit, *(run(make) for _, make, _, _ in loaders)]
        names = ["limit", *(name for name, *_ in loaders)]
        took = dict(zip(names, median_times(timed, repeats), strict=True))
    limit.close()
    base = count / took["limit"]
    how = "in one process" if workers == 0 else f"across a pool of {workers} processes"
    rows = [
        Row(
            f"decode limit, num_workers={workers}",
            "images/s",
            base,
            note=f"decode_224 of the JPEG bytes from a Python list, {how}",
        )
    ]
    memory_rate = count / took[memory]
    for name, _, target, note in loaders:
        rate = count / took[name]
        extra = f"; {rate / memory_rate:.2f}× the in-memory DataLoader" if target else ""
        rows.append(
            Row(f"{name}, num_workers={workers}", "images/s", rate, base, target, note=note + extra)
        )
    return rows


def collation_costs(jpegs: list[bytes], rounds: int = 9) -> None:
    """What one default collation of a 64-image float batch costs, against the decode."""
    images = [decode_224(data) for data in jpegs[:BATCH]]
    numel = BATCH * images[0].numel()
    reused = torch.empty(BATCH, *images[0].shape)

    def shared() -> None:  # what default_collate does in a DataLoader worker
        storage = images[0]._typed_storage()._new_shared(numel, device="cpu")
        out = images[0].new(storage).resize_(BATCH, *images[0].shape)
        torch.stack(images, 0, out=out)

    print(f"\n--- one batch of {BATCH} images, median of {rounds} (µs per image) ---")
    for title, fn in (
        ("decode_224 of each JPEG", lambda: [decode_224(d) for d in jpegs[:BATCH]]),
        ("torch.stack into fresh memory (collation, num_workers=0)", lambda: torch.stack(images)),
        ("torch.stack into fresh shared memory (collation in a worker)", shared),
        ("torch.stack into reused memory", lambda: torch.stack(images, out=reused)),
    ):
        fn()
        print(f"{1e6 * median_time(fn, rounds) / BATCH:8.0f}  {title}")


def profile(out: Path, jpegs: list[bytes], labels: list[int], limit: int = 15) -> None:
    """cProfile (this process, num_workers=0) of one pass of each loader and the baseline."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for title, fn in (
            ("decode limit, one process", DecodeLimit(jpegs, 0)),
            ("in-memory DataLoader", lambda: drain(memory_loader(jpegs, labels, 0))),
            ("MapDataset + ShardexSampler", lambda: drain(map_loader(out, 0))),
            ("StreamDataset", lambda: drain(stream_loader(out, 0))),
        ):
            prof = cProfile.Profile()
            prof.runcall(fn)
            print(f"\n--- cProfile: {title}, num_workers=0 (top {limit} by tottime) ---")
            pstats.Stats(prof).sort_stats("tottime").print_stats(limit)
    collation_costs(jpegs)


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
    check_same_images(out, jpegs, [0, count // 2, count - 1])
    width, height = Image.open(io.BytesIO(jpegs[0])).size
    print(
        f"{count} JPEGs, {sum(map(len, jpegs)) / count / 1024:.1f} KiB mean, ~{width}×{height} "
        f"px (smaller than {SIZE}: draft() decodes at full size), "
        f"{len(tar_urls(out))} shards; torch {torch.__version__}, 1 intra-op thread"
    )
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
            versions={"shardex": shardex.__version__, "torch": torch.__version__},
            images=count,
            size_kb=args.size_kb,
            batch_size=BATCH,
            image_size=[width, height],
            seconds=took,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
