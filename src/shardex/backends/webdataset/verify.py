"""``shardex verify`` for the ``webdataset`` backend: index files, every shard and
sample, sidecars, DALI indexes and ``index-members.npy``; ``deep`` decodes images."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.parquet as pq
import xxhash

from shardex.codecs.images import IMAGE_EXTENSIONS, check_decode
from shardex.contract import CONFIG_FILE, ExportConfig, ShardInfo
from shardex.errors import FormatError, ShardexError
from shardex.format.dali_index import DaliIndex
from shardex.format.index import (
    MAX_MEMBER_COLUMNS,
    SAMPLE_DTYPE,
    MemberSpans,
    build_members,
    checksum_seeds,
    key_hash,
    member_row,
    members_dtype,
)
from shardex.format.tables import arrow_reader
from shardex.format.tar import END_OF_ARCHIVE, iter_members, parse_sample, split_name
from shardex.storage import Storage
from shardex.verification import check_file_checksum
from shardex.verify_report import VerifyReport, load_npy, verify_key_table


def verify_split(
    storage: Storage, config: ExportConfig, name: str, report: VerifyReport, deep: bool, bar: Any
) -> None:
    """Check split ``name``, advancing ``bar`` by each shard's samples."""
    split = config.split(name)
    if split.index is None:
        report.add(CONFIG_FILE, "index", f"split {name!r} has no index")
        return
    samples = load_npy(storage, split.index.samples, report)
    if samples is None:
        return
    if samples.dtype != SAMPLE_DTYPE or samples.shape != (split.num_samples,):
        report.add(
            split.index.samples,
            "index",
            f"expected {split.num_samples} records of {SAMPLE_DTYPE}, found {samples.dtype} "
            f"{samples.shape}",
        )
        return
    table = verify_key_table(storage, split.index.keys, split.num_samples, report)
    # each sample's key hash as read, to check the key table against
    hashes = np.zeros(split.num_samples, dtype=np.uint64)
    read = np.zeros(split.num_samples, dtype=bool)
    seeded = checksum_seeds(config.format_version)
    first = 0
    members: list[list[tuple[str, int, int]] | None] = [None] * split.num_samples
    for number, shard in enumerate(split.shards):
        records = samples[first : first + shard.num_samples]
        if _check_records(shard, number, records, report):
            keys = _verify_shard(
                storage, shard, records, report, deep, first if seeded else None, members, first
            )
            for k, key in enumerate(keys):
                if key is not None:
                    hashes[first + k], read[first + k] = key_hash(key), True
        first += shard.num_samples
        report.shards += 1
        report.samples += shard.num_samples
        bar.advance(shard.num_samples)
    if table is not None:
        _check_key_hashes(split.index.keys, table, hashes, read, report)
    if split.index.members is not None:
        _verify_members(storage, split.index.members, members, samples["checksum"], report)


def _verify_members(
    storage: Storage,
    path: str,
    members: list[list[tuple[str, int, int]] | None],
    checksums: npt.NDArray[np.uint64],
    report: VerifyReport,
) -> None:
    """``index-members.npy`` holds what the samples' members give, row for row."""
    found = load_npy(storage, path, report)
    if found is None:
        return
    names = found.dtype.names == ("check", "key", "members") and found.dtype["members"].names
    if found.ndim != 1 or not isinstance(names, tuple) or found.dtype != members_dtype(names):
        report.add(path, "index", f"not index-members rows: {found.dtype} {found.shape}")
        return
    if len(found) != len(members):
        report.add(path, "index", f"holds {len(found)} rows for {len(members)} samples")
        return
    read = np.array([m is not None for m in members], bool)
    spans = MemberSpans.of([member_row(m or []) for m in members])
    if spans is None:  # the writer makes no file for these samples
        report.add(path, "index", f"the samples hold more than {MAX_MEMBER_COLUMNS} extensions")
        return
    expected = build_members([spans], checksums)
    if expected.dtype != found.dtype:
        if read.all():
            report.add(
                path,
                "index",
                f"member columns {names} differ from the samples' "
                f"{expected.dtype['members'].names}",
            )
        return
    size = found.dtype.itemsize
    bad = read & np.any(
        found.view(np.uint8).reshape(-1, size) != expected.view(np.uint8).reshape(-1, size), axis=1
    )
    if np.any(bad):
        report.add(
            path,
            "index",
            f"{int(bad.sum())} rows differ from their samples' members (the first: row "
            f"{int(np.argmax(bad))}): reads of those samples fail",
        )


def _check_key_hashes(
    path: str, table: np.ndarray, hashes: np.ndarray, read: np.ndarray, report: VerifyReport
) -> None:
    numbers = table[1].astype(np.int64)
    bad = read[numbers] & (hashes[numbers] != table[0])
    if np.any(bad):
        first = int(np.argmax(bad))
        report.add(
            path,
            "index",
            f"{int(bad.sum())} key table entries do not match their samples' keys (the "
            f"first at position {first} names sample {int(numbers[first])}): "
            "lookups by key would miss",
        )


def _check_records(
    shard: ShardInfo, number: int, records: np.ndarray, report: VerifyReport
) -> bool:
    """A shard's records name it, stay inside it and tile it exactly."""
    offsets = records["offset"].astype(np.int64)
    ends = offsets + records["length"].astype(np.int64)
    problems = []
    if np.any(records["shard"] != number):
        problems.append("records point at another shard")
    if len(records) and np.any(ends > shard.num_bytes):
        problems.append(f"an index entry ends past the shard's {shard.num_bytes} bytes")
    elif len(records) and (
        offsets[0] != 0
        or np.any(offsets[1:] != ends[:-1])
        or ends[-1] + len(END_OF_ARCHIVE) != shard.num_bytes
    ):
        problems.append("index entries do not tile the shard")
    for message in problems:
        report.add(shard.path, "index", message)
    return not problems


def _chunks(storage: Storage, shard: ShardInfo, report: VerifyReport) -> Iterator[bytes] | None:
    try:
        size = storage.size(shard.path)
    except ShardexError as exc:
        report.add(shard.path, "shard", f"missing ({exc})")
        return None
    if size != shard.num_bytes:
        report.add(shard.path, "shard", f"is {size} bytes, config.yaml says {shard.num_bytes}")
        return None
    return storage.iter_chunks(shard.path)


def _verify_shard(
    storage: Storage,
    shard: ShardInfo,
    records: np.ndarray,
    report: VerifyReport,
    deep: bool,
    first: int | None,
    members: list[list[tuple[str, int, int]] | None],
    number: int,
) -> list[str | None]:
    """Check a shard and its samples (``first``: the checksum seed, None in format 1);
    return their keys. ``members[number + k]`` gets sample k's members."""
    chunks = _chunks(storage, shard, report)
    if chunks is None:
        return []
    whole = xxhash.xxh3_64()
    window, base, keys = b"", 0, []
    dali: DaliIndex | None = DaliIndex() if shard.dali_index else None
    for k, (off, length, checksum) in enumerate(
        zip(
            records["offset"].tolist(),
            records["length"].tolist(),
            records["checksum"].tolist(),
            strict=True,
        )
    ):
        while base + len(window) < off + length:
            chunk = next(chunks)
            whole.update(chunk)
            window, base = window[off - base :] + chunk, off
        sample = window[off - base : off - base + length]
        seed = 0 if first is None else first + k
        keys.append(_verify_sample(shard, off, sample, checksum, seed, report, deep))
        found = _members(sample)
        members[number + k] = found
        if found is None:
            dali = None
        elif dali is not None:
            dali.add(off, [(split_name(name)[1], at, size, name) for name, at, size in found])
    for chunk in chunks:
        whole.update(chunk)
    report.bytes += shard.num_bytes
    if f"xxh3_64:{whole.hexdigest()}" != shard.checksum:
        report.add(shard.path, "shard", "whole-file checksum differs from config.yaml")
    _verify_sidecar(storage, shard, keys, report)
    if shard.dali_index and dali is not None:
        try:
            if storage.get(shard.dali_index) != dali.to_bytes():
                report.add(shard.dali_index, "dali-index", "differs from the members of its shard")
        except ShardexError as exc:
            report.add(shard.dali_index, "dali-index", f"cannot be read: {exc}")
    return keys


def _members(sample: bytes) -> list[tuple[str, int, int]] | None:
    """A sample's (name, data offset, size) members; None when damaged."""
    try:
        return [(m.name, m.data_offset, m.size) for m in iter_members(sample, strict=False)]
    except FormatError:
        return None


def _verify_sample(
    shard: ShardInfo,
    offset: int,
    sample: bytes,
    checksum: int,
    seed: int,
    report: VerifyReport,
    deep: bool,
) -> str | None:
    try:
        key, fields = parse_sample(sample, where=f"{shard.path}@{offset}")
    except FormatError as exc:
        report.add(shard.path, "sample", str(exc))
        return None
    if xxhash.xxh3_64_intdigest(sample, seed) != checksum:
        report.add(shard.path, "sample", f"checksum mismatch at byte {offset}", key)
    if deep:
        for ext, data in fields.items():
            if ext.rpartition(".")[2].lower() in IMAGE_EXTENSIONS:
                reason = check_decode(data)
                if reason:
                    report.add(shard.path, "image", f"{ext}: {reason}", key)
    return key


def _verify_sidecar(
    storage: Storage, shard: ShardInfo, keys: list[str | None], report: VerifyReport
) -> None:
    if not shard.metadata:
        return
    try:
        data = storage.get(shard.metadata)
        table = pq.read_table(arrow_reader(data), columns=["key"])
    except (ShardexError, pa.ArrowException, OSError) as exc:
        report.add(shard.metadata, "sidecar", f"cannot be read: {exc}")
        return
    check_file_checksum(shard.metadata, "sidecar", data, shard.metadata_checksum, report)
    if table.column("key").to_pylist() != keys:
        report.add(shard.metadata, "sidecar", "keys differ from the samples in the shard")
