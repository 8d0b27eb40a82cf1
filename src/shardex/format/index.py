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

Opening is ``np.load(mmap_mode="r")``: O(1) time and memory whatever the size.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import xxhash

from shardex.errors import FormatError, ObjectNotFoundError
from shardex.format.tar import BLOCK, fits_ustar, split_name

SAMPLE_DTYPE: Final = np.dtype(
    [("offset", "<u8"), ("checksum", "<u8"), ("shard", "<u4"), ("length", "<u4")]
)
RECORD: Final = struct.Struct("<QQII")
SAMPLES_FILE: Final = "index-samples.npy"
KEYS_FILE: Final = "index-keys.npy"
MEMBERS_FILE: Final = "index-members.npy"
#: The first format version with ``index-members.npy``.
MEMBERS_VERSION: Final = 3
#: The size of a member a sample lacks; as a key length: the sample must be parsed.
ABSENT: Final = 0xFFFFFFFF
#: The most member extensions a split's ``index-members.npy`` has columns for. Every row
#: has a column per extension of the split, so samples that each bring extensions of
#: their own (a hostile source, keys cut at an unexpected dot) would grow the file, and
#: the writer's memory, with samples x extensions; such a split gets no index-members.npy
#: and its reads parse the tar headers, as in format 2.
MAX_MEMBER_COLUMNS: Final = 64


def key_hash(key: str) -> int:
    """The 64-bit hash under which a key is filed in the key table."""
    return int(xxhash.xxh3_64_intdigest(key.encode("utf-8")))


#: The first format version whose per-sample checksums are seeded with the sample number.
SEEDED_VERSION: Final = 2


def checksum(data: bytes | bytearray | memoryview, seed: int = 0) -> int:
    """Per-sample checksum: xxh3-64 of the sample's bytes, seeded with its sample number
    (0 in format version 1). The seed binds each index record to its position: two
    swapped records (or a record copied over another) fail the checksum of the read,
    at no cost, as seeded xxh3 is as fast as unseeded."""
    return int(xxhash.xxh3_64_intdigest(data, seed))


def checksum_seeds(format_version: int) -> bool:
    """Whether an export of this format version seeds its sample checksums."""
    return format_version >= SEEDED_VERSION


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


def _load(path: Path, what: str) -> npt.NDArray[np.generic]:
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except FileNotFoundError as exc:
        raise ObjectNotFoundError(f"{path}: the {what} index file is missing") from exc
    except (ValueError, OSError, EOFError, TypeError) as exc:
        raise FormatError(f"{path}: not a valid {what} index file ({exc})") from exc
    return arr  # type: ignore[no-any-return]


class SplitIndex:
    """Memory-mapped index of one split (see the module docstring for the layout)."""

    def __init__(
        self, samples_path: Path, keys_path: Path | Callable[[], Path], *, num_samples: int
    ) -> None:
        samples = _load(samples_path, "sample")
        if samples.dtype != SAMPLE_DTYPE or samples.ndim != 1:
            raise FormatError(
                f"{samples_path}: expected a 1-d array of {SAMPLE_DTYPE}, found "
                f"{samples.dtype} with shape {samples.shape}"
            )
        if len(samples) != num_samples:
            raise FormatError(
                f"{samples_path}: holds {len(samples)} samples, config.yaml says {num_samples}"
            )
        self._samples = samples
        # struct over the raw mapping is ~5x faster per lookup than numpy scalar access.
        raw: Any = samples.view(np.uint8)
        self._raw = memoryview(raw) if num_samples else memoryview(b"")
        self._keys_path = keys_path
        self._keys: npt.NDArray[np.uint64] | None = None
        self._sorted: bool | None = None
        self.num_samples = num_samples

    def __len__(self) -> int:
        return self.num_samples

    @property
    def raw(self) -> memoryview:
        """The record array's bytes: record ``i`` is :data:`RECORD` at ``24 * i``."""
        return self._raw

    def record(self, i: int) -> tuple[int, int, int, int]:
        """``(offset, checksum, shard, length)`` of sample ``i`` (0 <= i < len)."""
        return RECORD.unpack_from(self._raw, i * 24)

    @property
    def samples(self) -> npt.NDArray[np.void]:
        """The whole record array (memory-mapped)."""
        return self._samples  # type: ignore[return-value]

    def _key_table(self) -> npt.NDArray[np.uint64]:
        if self._keys is None:
            path = self._keys_path if isinstance(self._keys_path, Path) else self._keys_path()
            keys = _load(path, "key")
            if keys.dtype != np.uint64 or keys.shape != (2, self.num_samples):
                raise FormatError(
                    f"{path}: expected uint64 of shape (2, {self.num_samples}), "
                    f"found {keys.dtype} {keys.shape}"
                )
            self._keys = keys  # type: ignore[assignment]
        assert self._keys is not None
        return self._keys

    def keys_sorted(self) -> bool:
        """Whether the key table's hashes are sorted (one pass over them, done once): a
        damaged table can make a binary search miss a key that is there."""
        if self._sorted is None:
            hashes = self._key_table()[0]
            self._sorted = not bool(np.any(hashes[1:] < hashes[:-1]))
        return self._sorted

    def candidates(self, key: str) -> Iterator[int]:
        """Sample numbers whose key hash equals ``key``'s (usually exactly one)."""
        table = self._key_table()
        hashes = table[0]
        h = np.uint64(key_hash(key))
        pos = int(np.searchsorted(hashes, h, side="left"))
        while pos < len(hashes) and hashes[pos] == h:
            yield int(table[1, pos])
            pos += 1


def members_dtype(exts: Sequence[str]) -> np.dtype[np.void]:
    """The row type of ``index-members.npy`` for these member extensions."""
    return np.dtype(
        [("check", "<u8"), ("key", "<u4", (2,)), ("members", [(e, "<u4", (2,)) for e in exts])]
    )


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
    return np.fromiter(
        (
            xxhash.xxh3_64_intdigest(view[i * size + 8 : (i + 1) * size], seed)
            for i, seed in enumerate(checksums.tolist())
        ),
        np.uint64,
        len(rows),
    )


def check_member_rows(rows: Any, where: str, num_samples: int) -> tuple[str, ...]:
    """The member extensions of ``rows`` (an ``index-members.npy`` of a split of
    ``num_samples`` samples, found at ``where``).

    Raises:
        FormatError: it is not a 1-d array of index-members rows, or not one per sample.
    """
    names = rows.dtype.names == ("check", "key", "members") and rows.dtype["members"].names
    if rows.ndim != 1 or names is False or names is None or rows.dtype != members_dtype(names):
        raise FormatError(
            f"{where}: expected a 1-d array of index-members rows, found {rows.dtype} "
            f"with shape {rows.shape}"
        )
    if len(rows) != num_samples:
        raise FormatError(
            f"{where}: holds {len(rows)} rows, config.yaml says {num_samples} samples"
        )
    return tuple(names)


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


class MemberIndex:
    """Memory-mapped ``index-members.npy`` of a split (see the module docstring)."""

    def __init__(self, path: Path, *, num_samples: int) -> None:
        rows: Any = _load(path, "member")
        names = check_member_rows(rows, str(path), num_samples)
        self.path = path
        self.rows = rows
        #: The member extensions, in column order.
        self.names: tuple[str, ...] = tuple(names)
        self.row_size = rows.dtype.itemsize
        #: Unpacks a row: check, key offset, key length, then offset and size per member.
        self.unpack: Callable[[memoryview, int], tuple[int, ...]] = struct.Struct(
            "<Q" + "I" * (2 + 2 * len(names))
        ).unpack_from
        raw: Any = rows.view(np.uint8)
        self.raw = memoryview(raw) if num_samples else memoryview(b"")
