"""The consolidated random-access index of one split, written here (read by
:mod:`shardex.format.mapped`): ``index-samples.npy`` (offset, seeded checksum, shard,
length per sample), ``index-keys.npy`` (sorted key hashes, sample numbers) and
``index-members.npy`` (member spans per sample, format 3 on); see docs/format.md.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import xxhash

from shardex.format.mapped import (
    ABSENT,
    KEYS_FILE,
    MAX_MEMBER_COLUMNS,
    MEMBERS_FILE,
    MEMBERS_VERSION,
    RECORD,
    SAMPLES_FILE,
    SEEDED_VERSION,
    MemberIndex,
    SplitIndex,
    check_member_rows,
    checksum_seeds,
    members_dtype,
    sample_dtype,
)
from shardex.format.mapped import key_hash as key_hash
from shardex.format.tar import BLOCK, fits_ustar, split_name

__all__ = [
    "ABSENT",
    "KEYS_FILE",
    "MAX_MEMBER_COLUMNS",
    "MEMBERS_FILE",
    "MEMBERS_VERSION",
    "RECORD",
    "SAMPLES_FILE",
    "SAMPLE_DTYPE",
    "SEEDED_VERSION",
    "MemberIndex",
    "MemberSpans",
    "SplitIndex",
    "build_keys",
    "build_keys_from_hashes",
    "build_members",
    "build_samples",
    "check_member_rows",
    "checksum",
    "checksum_seeds",
    "first_damaged_row",
    "member_columns",
    "member_row",
    "members_dtype",
    "seal_members",
    "spans_of_rows",
    "to_npy_bytes",
]

SAMPLE_DTYPE: Final = sample_dtype()


def checksum(data: bytes | bytearray | memoryview, seed: int = 0) -> int:
    """Per-sample checksum: xxh3-64 seeded with the sample number (0 in format 1), so
    swapped or copied records fail their read, at no cost.
    """
    return int(xxhash.xxh3_64_intdigest(data, seed))


def build_samples(
    shard: npt.NDArray[np.integer],
    offset: npt.NDArray[np.integer],
    length: npt.NDArray[np.integer],
    sample_checksum: npt.NDArray[np.integer],
) -> npt.NDArray[np.void]:
    out = np.empty(len(offset), dtype=SAMPLE_DTYPE)
    out["shard"], out["offset"] = shard, offset
    out["length"], out["checksum"] = length, sample_checksum
    return out


def build_keys(keys: Sequence[str]) -> npt.NDArray[np.uint64]:
    """The sorted (hash, sample) table of a split's keys."""
    return build_keys_from_hashes(np.fromiter(map(key_hash, keys), np.uint64, len(keys)))


def build_keys_from_hashes(hashes: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    order = np.argsort(hashes, kind="stable")
    table = np.empty((2, len(hashes)), dtype=np.uint64)
    table[0] = hashes[order]
    table[1] = order
    return table


def to_npy_bytes(array: npt.NDArray[np.generic]) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


@dataclass(frozen=True, slots=True)
class MemberSpans:
    """Where the members of one shard's consecutive samples lie: ``spans[i]`` is the key's
    (offset, length), then (offset, size) per extension of ``exts`` (size :data:`ABSENT`
    where missing), from the sample's first byte.
    """

    exts: tuple[str, ...]
    spans: npt.NDArray[np.uint32]

    @classmethod
    def of(
        cls, samples: Sequence[tuple[int, int, Sequence[tuple[str, int, int]]]]
    ) -> MemberSpans | None:
        """From ``(key offset, key length, [(ext, data offset, size), ...])`` per sample; an empty
        or repeated extension makes the key length ABSENT (readers parse). None past
        :data:`MAX_MEMBER_COLUMNS` extensions.
        """
        columns: dict[str, int] = {}
        for _, _, members in samples:
            for ext, _, _ in members:
                columns.setdefault(ext, len(columns))
        if len(columns.keys() - {""}) > MAX_MEMBER_COLUMNS:
            return None
        spans = np.full((len(samples), 2 + 2 * len(columns)), ABSENT, np.uint32)
        for i, (key_at, key_len, members) in enumerate(samples):
            row = [key_at, key_len] + [ABSENT] * (2 * len(columns))
            for ext, at, size in members:
                if not ext or row[3 + 2 * columns[ext]] != ABSENT:
                    row[1] = ABSENT
                row[2 + 2 * columns[ext]], row[3 + 2 * columns[ext]] = at, size
            spans[i] = row
        return cls(tuple(columns), spans)


def member_row(
    members: Sequence[tuple[str, int, int]],
) -> tuple[int, int, list[tuple[str, int, int]]]:
    """One sample's row for :meth:`MemberSpans.of`, from its members' (name, data offset, size):
    the key lies in the first member's name field or its GNU long-name record; ABSENT
    (parse) when it is split over ustar's prefix and name or the members hold two keys.
    """
    if not members:
        return 0, ABSENT, []
    key, _ = split_name(members[0][0])
    raw = members[0][0].encode()
    key_at = 0 if len(raw) <= 100 else BLOCK if not fits_ustar(raw) else -1
    named = [(split_name(name), at, size) for name, at, size in members]
    same = key_at >= 0 and all(k == key for (k, _), _, _ in named)
    spans = [(ext, at, size) for (_, ext), at, size in named]
    return max(key_at, 0), len(key.encode()) if same else ABSENT, spans


def member_columns(parts: Sequence[tuple[str, ...]]) -> list[str]:
    """The columns of ``index-members.npy``: extensions in order of first appearance, none empty."""
    exts: dict[str, None] = {}
    for part in parts:
        exts.update((e, None) for e in part if e)
    return list(exts)


def build_members(
    parts: Sequence[MemberSpans],
    checksums: npt.NDArray[np.uint64],
    exts: Sequence[str] | None = None,
) -> npt.NDArray[np.void]:
    """The rows of ``index-members.npy`` from a split's shards' spans in sample order, checks
    seeded with the samples' ``checksums``. ``exts`` (the whole file's columns) builds a file
    part by part.
    """
    if exts is None:
        exts = member_columns([p.exts for p in parts])
    out = np.zeros(sum(len(p.spans) for p in parts), members_dtype(exts))
    members = out["members"]
    at = 0
    for part in parts:
        n = len(part.spans)
        out["key"][at : at + n] = part.spans[:, :2]
        for name in exts:
            members[name][at : at + n] = ABSENT
        for col, ext in enumerate(part.exts):
            if ext:
                members[ext][at : at + n] = part.spans[:, 2 + 2 * col : 4 + 2 * col]
        at += n
    seal_members(out, checksums)
    return out


def seal_members(rows: npt.NDArray[np.void], checksums: npt.NDArray[np.uint64]) -> None:
    """Set each row's ``check``: xxh3 of the rest of the row, seeded with the sample's checksum."""
    rows["check"] = _checks(rows, checksums)


def _checks(
    rows: npt.NDArray[np.void], checksums: npt.NDArray[np.uint64]
) -> npt.NDArray[np.uint64]:
    if not len(rows):
        return np.zeros(0, np.uint64)
    size = rows.dtype.itemsize
    raw: Any = np.ascontiguousarray(rows).view(np.uint8)
    view = memoryview(raw)
    # one map over C functions: no Python frame a row
    starts = range(8, len(rows) * size, size)
    rows_after = map(view.__getitem__, map(slice, starts, range(size, len(rows) * size + 1, size)))
    digests = map(xxhash.xxh3_64_intdigest, rows_after, checksums.tolist())
    return np.fromiter(digests, np.uint64, len(rows))


def first_damaged_row(rows: npt.NDArray[np.void], checksums: npt.NDArray[np.uint64]) -> int | None:
    """The number of the first row whose ``check`` fails, or None."""
    bad = np.flatnonzero(rows["check"] != _checks(rows, checksums))
    return int(bad[0]) if len(bad) else None


def spans_of_rows(rows: npt.NDArray[np.void]) -> MemberSpans:
    """The rows of an ``index-members.npy`` back as spans (an append adds to them)."""
    exts = tuple(rows.dtype["members"].names or ())
    spans = np.empty((len(rows), 2 + 2 * len(exts)), np.uint32)
    spans[:, :2] = rows["key"]
    for col, ext in enumerate(exts):
        spans[:, 2 + 2 * col : 4 + 2 * col] = rows["members"][ext]
    return MemberSpans(exts, spans)
