"""A local ``webdataset`` export read again as a source (a re-export): each sample read
once through the split's index and checked against its checksum, its members described as
byte ranges of the source tar (read again only when the new shards are written), so memory
stays bounded whatever the export's size."""

from __future__ import annotations

import os
from collections.abc import Iterator

from shardex.backends.base import StoredSample
from shardex.backends.webdataset.reader import ShardDataset
from shardex.errors import ChecksumError, FormatError
from shardex.format.tar import iter_members, split_name


def stored_samples(ds: ShardDataset, keys: list[str]) -> Iterator[StoredSample] | None:
    """The split's samples in sample order (``keys``: as its metadata lists them, to name
    damaged ones); None when a shard is not a local file."""
    shards = ds.config.split(ds.split).shards
    paths = [ds.storage.local_path(s.path) for s in shards]
    if any(p is None for p in paths):
        return None
    return _samples(ds, keys)


def _samples(ds: ShardDataset, keys: list[str]) -> Iterator[StoredSample]:
    storage, shards = ds.storage, ds.config.split(ds.split).shards
    records = ds.records
    fds: dict[int, int] = {}
    unreadable: dict[int, str] = {}
    try:
        for number, (offset, expected, shard, length) in enumerate(
            zip(
                records["offset"].tolist(),
                records["checksum"].tolist(),
                records["shard"].tolist(),
                records["length"].tolist(),
                strict=True,
            )
        ):
            key = keys[number] if number < len(keys) else ""
            where = f"sample {number} ({key!r})"
            if shard >= len(shards) or offset + length > shards[shard].num_bytes:
                yield StoredSample(
                    key, [], f"source {where}: its index entry is damaged (shardex verify)"
                )
                continue
            path = storage.local_path(shards[shard].path)
            assert path is not None
            tar = storage.join(shards[shard].path)
            if shard not in fds and shard not in unreadable:
                try:
                    fds[shard] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                except OSError as exc:  # its samples are lost, like a damaged run's
                    unreadable[shard] = f"cannot read {tar!r} ({exc.strerror})"
            if shard in unreadable:
                yield StoredSample(key, [], f"source {where}: {unreadable[shard]}")
                continue
            data = os.pread(fds[shard], length, offset)
            if len(data) != length:
                yield StoredSample(
                    key, [], f"source {where} at byte {offset} of {tar!r}: the shard is truncated"
                )
                continue
            try:  # the reader's own check: seeded with the sample number where the format is
                ds.check_sample(data, expected, shard, offset, number)
            except ChecksumError as exc:
                yield StoredSample(key, [], f"source {where}: {exc}")
                continue
            try:
                found = list(iter_members(data, where=f"{tar} at byte {offset}"))
            except FormatError as exc:
                yield StoredSample(key, [], f"source {where}: {exc}")
                continue
            names = {split_name(m.name)[0] for m in found}
            members = [
                {
                    "ext": split_name(m.name)[1],
                    "path": str(path),
                    "offset": offset + m.data_offset,
                    "size": m.size,
                    "data": None,
                }
                for m in found
            ]
            yield StoredSample(names.pop() if len(names) == 1 else "", members)
    finally:
        for fd in fds.values():
            os.close(fd)
