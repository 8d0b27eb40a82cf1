"""``shardex verify`` for the array backends: every run's files and checksum, the key
table, and every sample read back (decoded with ``deep``).
"""

from __future__ import annotations

from typing import Any

import xxhash

from shardex.codecs.images import IMAGE_EXTENSIONS
from shardex.contract import ExportConfig, ShardInfo, SplitInfo
from shardex.errors import ShardexError
from shardex.format.tables import shard_checksum
from shardex.storage import Storage
from shardex.verify_report import VerifyReport, verify_key_table


def verify_array_split(
    storage: Storage, config: ExportConfig, name: str, report: VerifyReport, deep: bool, bar: Any
) -> None:
    """Check one split of an array-backend export into ``report``."""
    from shardex.api import open_dataset

    split = config.split(name)
    assert split.keys is not None
    verify_key_table(storage, split.keys, split.num_samples, report)
    results = [_verify_run(storage, config, split, shard, report) for shard in split.shards]
    report.shards += len(split.shards)
    if not all(results):
        return
    before = report.samples
    try:
        ds = open_dataset(storage, split=name, decode=deep, verify=True)
        for sample in ds:
            if deep:
                _check_decoded(sample, report)
            report.samples += 1
            bar.advance(1)
    except ShardexError as exc:
        report.add(name, "sample", f"cannot be read: {exc}")
        return
    if report.samples - before != split.num_samples:
        found = report.samples - before
        report.add(name, "sample", f"read {found} samples, config.yaml says {split.num_samples}")


def _run_files(
    storage: Storage, config: ExportConfig, split: SplitInfo, shard: ShardInfo
) -> list[str]:
    """The files of a run in the order its checksum covers them."""
    listed = [f for f in split.files if f.startswith(f"{shard.path}/") and f != split.keys]
    if listed or storage.exists(shard.path):
        return listed or [shard.path]
    # a folder of per-sample files (numpy): keys, then each sample's fields in field order
    present = set(storage.list(f"{shard.path}/"))
    keys = [f"{shard.path}/__key__.{part}.npy" for part in ("data", "offsets")]
    samples = [
        f"{shard.path}/{i:06d}.{spec.column}.npy"
        for i in range(shard.num_samples)
        for spec in config.fields
    ]
    return keys + [f for f in samples if f in present]


def _verify_run(
    storage: Storage, config: ExportConfig, split: SplitInfo, shard: ShardInfo, report: VerifyReport
) -> bool:
    digest = xxhash.xxh3_64()
    for path in _run_files(storage, config, split, shard):
        try:
            for chunk in storage.iter_chunks(path):
                digest.update(chunk)
                report.bytes += len(chunk)
        except ShardexError as exc:
            report.add(path, "missing", str(exc))
            return False
    if shard_checksum(digest) != shard.checksum:
        report.add(shard.path, "checksum", f"{shard_checksum(digest)} != {shard.checksum}")
        return False
    return True


def _check_decoded(sample: dict[str, Any], report: VerifyReport) -> None:
    for name, value in sample.items():
        if name.rpartition(".")[2] in IMAGE_EXTENSIONS and getattr(value, "ndim", 0) < 2:
            report.add(name, "image", "did not decode", sample["__key__"])
