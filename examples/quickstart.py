"""Read an export back: random access, lookup by key, batches, streaming, metadata.

Run after `shardex export-dataset demo -o demo-export --split-fractions ...`:

    python examples/quickstart.py demo-export
"""

from __future__ import annotations

import random
import sys
import time

import shardex


def main(root: str) -> None:
    config = shardex.read_config(root)
    counts = {name: split.num_samples for name, split in config.splits.items()}
    print(f"{root}: {config.num_samples} samples, splits {counts}")

    ds = shardex.open_dataset(root, split="train")  # raw bytes, checksums verified
    sample = ds[0]  # one pread covering every member of the sample
    print(f"ds[0]: key {sample['__key__']!r}, fields {sorted(k for k in sample if k != '__key__')}")

    same = ds.get(sample["__key__"])  # lookup by key through the sorted key-hash table
    assert same == sample

    picks = random.Random(0).sample(range(len(ds)), k=min(64, len(ds)))
    start = time.perf_counter()
    batch = ds.get_many(picks)  # one batch, reads sorted and merged per shard
    took = time.perf_counter() - start
    print(f"get_many: {len(batch)} random samples in {took * 1000:.1f} ms")

    start = time.perf_counter()
    count = sum(1 for _ in ds)  # streaming in shard order, each shard read once
    took = time.perf_counter() - start
    print(f"iterated {count} samples in {took:.2f} s ({count / took:,.0f} samples/s)")

    decoded = shardex.open_dataset(root, split="train", decode=True)[0]
    image = next(v for k, v in decoded.items() if k in ("jpg", "png", "webp"))
    label = decoded["cls"]
    names = config.label_names or ()
    print(
        f"decoded: image {image.shape} {image.dtype}, label {label} ({names[label] if names else '-'})"
    )

    meta = ds.metadata  # pyarrow Table, one row per sample, in sample order
    print(f"metadata: {meta.num_rows} rows, columns {meta.column_names[:8]} ...")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "demo-export")
