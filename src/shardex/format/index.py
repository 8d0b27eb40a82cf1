"""The consolidated random-access index of one split.

Two memory-mappable ``.npy`` files per split:

* ``index-samples.npy``: one 24-byte record per sample, in sample order:
  ``offset`` (u8, byte offset of the sample's first tar header in its shard),
  ``checksum`` (u8, xxh3-64 of the sample's bytes, seeded with the sample number from
  format version 2 on, so a record moved to another position fails its read), ``shard`` (u4, shard number in the
  split), ``length`` (u4, bytes from the first header to the end of the last member's
  padding). One ``pread`` of ``length`` bytes at ``offset`` returns every member.
* ``index-keys.npy``: a (2, N) uint64 array; row 0 holds xxh3-64 hashes of the keys, sorted,
  row 1 the sample number of each. A key is found by binary search in O(log N) page reads,
  then confirmed against the key stored in the sample's tar header (hash collisions are
  handled by checking each candidate).
* ``index-members.npy`` (format version 3 on): one row per sample, in sample order, saying
  where each member lies inside the sample's bytes, so that a read slices its fields
  instead of parsing tar headers. A structured array: ``check`` (u8, xxh3-64 of the rest
  of the row seeded with the sample's checksum in ``index-samples.npy``, itself seeded
  with the sample number: a damaged or moved row, or one written for other samples, fails
  its read),
  ``key`` (u4 x 2: offset and length of the key's bytes in the first member's name) and
  ``members``, one (u4 x 2) column per member extension of the split, named by it: the
  offset of the member's data from the sample's first byte and its size, :data:`ABSENT`
  as size where the sample has no such member. A key length of :data:`ABSENT` means
  "parse this sample's headers" (a key split over ustar's prefix and name fields, an
  empty or repeated extension). The tar shards are unchanged.

Opening maps the files (:mod:`shardex.format.mapped`, the read side, which needs no
numpy): O(1) time and memory whatever the size.
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
from shardex.format.mapped import (
    key_hash as key_hash,
)
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
    """Per-sample checksum: xxh3-64 of the sample's bytes, seeded with its sample number
    (0 in format version 1). The seed binds each index record to its position: two
    swapped records (or a record copied over another) fail the checksum of the read,
    at no cost, as seeded xxh3 is as fast as unseeded."""
    return int(xxhash.xxh3_64_intdigest(data, seed))


def build_samples(
    shard: npt.NDArray[np.integer],
    offset: npt.NDArray[np.integer],
    length: npt.NDArray[np.integer],
    sample_checksum: npt.NDArray[np.integer],
) -> npt.NDArray[np.void]:
    """Pack per-sample columns into the on-disk record array."""
    out = np.empty(len(offset), dtype=SAMPLE_DTYPE)
    out["shard"], out["offset"] = shard, offset
    out["length"], out["checksum"] = length, sample_checksum
    return out


def build_keys(keys: Sequence[str]) -> npt.NDArray[np.uint64]:
    """The sorted (hash, sample) table of a split's keys."""
    hashes = np.fromiter((key_hash(k) for k in keys), dtype=np.uint64, count=len(keys))
    return build_keys_from_hashes(hashes)


def build_keys_from_hashes(hashes: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """The sorted (hash, sample) table from per-sample key hashes."""
    order = np.argsort(hashes, kind="stable")
    table = np.empty((2, len(hashes)), dtype=np.uint64)
    table[0] = hashes[order]
    table[1] = order
    return table


def to_npy_bytes(array: npt.NDArray[np.generic]) -> bytes:
    """Serialise an array as ``.npy`` bytes (no pickle)."""
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


@dataclass(frozen=True, slots=True)
class MemberSpans:
    """Where the members of consecutive samples lie (one shard's, as its writer laid them
    out): ``spans[i]`` is the key's (offset, length), then (offset, size) per extension of
    ``exts`` (size :data:`ABSENT` where missing), counted from the sample's first byte."""

    exts: tuple[str, ...]
    spans: npt.NDArray[np.uint32]

    @classmethod
    def of(
        cls, samples: Sequence[tuple[int, int, Sequence[tuple[str, int, int]]]]
    ) -> MemberSpans | None:
        """From ``(key offset, key length, [(extension, data offset, size), ...])`` per
        sample; a sample with an empty or repeated extension (or a key length of
        :data:`ABSENT`) gets a key length of ABSENT: readers parse it. None when the
        samples hold more than :data:`MAX_MEMBER_COLUMNS` extensions."""
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
    """One sample's ``(key offset, key length, [(extension, data offset, size), ...])``
    for :meth:`MemberSpans.of`, from its members' (name, data offset, size) as a reader
    parsing the headers finds them: ``split_name`` of each name; the key lies in the first
    member's name field, or in the data of its GNU long-name record; ABSENT (parse) when
    it is split over ustar's prefix and name or the members hold more than one key."""
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
    """The columns of ``index-members.npy`` for parts with these extensions: the
    extensions in order of first appearance; an empty one (readers parse those samples)
    gets none."""
    exts: dict[str, None] = {}
    for part in parts:
        exts.update((e, None) for e in part if e)
    return list(exts)


def build_members(
    parts: Sequence[MemberSpans],
    checksums: npt.NDArray[np.uint64],
    exts: Sequence[str] | None = None,
) -> npt.NDArray[np.void]:
    """The rows of ``index-members.npy`` for a split's samples, from its shards' spans in
    sample order (see :func:`member_columns`); ``checksums``: the samples' (their
    ``index-samples.npy`` records'), which seed the rows' checks. ``exts`` (the columns of
    the whole file) builds a file part by part: the parts' rows joined are the whole's."""
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
    """Set each row's ``check``: xxh3-64 of the row after it, seeded with its sample's
    checksum (so that a row passes only beside the bytes it was written for)."""
    rows["check"] = _checks(rows, checksums)


def _checks(
    rows: npt.NDArray[np.void], checksums: npt.NDArray[np.uint64]
) -> npt.NDArray[np.uint64]:
    """What each row's ``check`` should be (``checksums``: the samples')."""
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
    """The number of the first row whose ``check`` fails, or None (``checksums``: the
    samples')."""
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
