"""Checking samples before anything is written: unsafe, empty and duplicate keys, split
names, what the source found unusable; and renders each sample's ``.json`` member text, so
that shard sizes are known exactly before writing.

Images are checked by the shard writer from the bytes it reads to write them (one pass
over the bytes, see :mod:`shardex.backends.webdataset.writer` and
:mod:`shardex.backends.arrays`), with :func:`~shardex.sample_check.image_problem` and
:class:`~shardex.sample_check.SampleCheck`. A backend that gets a whole split instead
(``writes_shards = False``: no built-in one) gets the separate image pass here, run in
worker processes over chunks of the scan table, reading the first and last KiBs of each
image (or decoding it).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final, NoReturn

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from shardex.codecs.images import (
    HEAD_BYTES,
    IMAGE_EXTENSIONS,
    TAIL_BYTES,
    Validate,
    check_decode,
    check_header,
)
from shardex.errors import BadSampleError, DuplicateKeyError
from shardex.names import split_name_problem
from shardex.options import ExportOptions
from shardex.parallel import Runner
from shardex.progress import Progress
from shardex.quoting import quoted
from shardex.rows import JSON_COLUMN, MemberReader
from shardex.sample_check import refusal
from shardex.sources.base import INVALID, MEMBERS, LeftOut, MemberRow
from shardex.storage.base import Storage
from shardex.storage.fetch.objects import registered

CHUNK: Final = 2000
# Anything that may make a key unsafe: a control character, a backslash, a leading "/",
# or an empty, "." or ".." path part.
_UNSAFE_KEY: Final = re.compile(r"[\x00-\x1f\x7f\\]|^/|(?:^|/)\.{0,2}(?:/|$)")
#: :data:`_UNSAFE_KEY` over keys joined by newlines (see :func:`_all_safe`).
_UNSAFE_KEYS: Final = re.compile(
    r"[\x00-\x09\x0b-\x1f\x7f\\]|^/|(?:^|/)\.{0,2}(?:/|$)", re.MULTILINE
)


@dataclass(frozen=True, slots=True)
class _CheckJob:
    rows: pa.Table  # _members and the scalar metadata columns of a chunk
    validate: Validate
    max_pixels: int
    json_columns: tuple[str, ...]
    #: Stores of members on object storage (registered where the job is made).
    stores: tuple[tuple[str, Storage], ...] = dataclasses.field(default_factory=registered)


def _check_member_header(member: MemberRow, max_pixels: int) -> str | None:
    """check_header on a member, reading only its first and last KiBs (and a few more
    small reads for JPEGs whose metadata pushes the frame header further)."""
    size = member["size"]
    if member["data"] is not None:
        data = member["data"]
        return check_header(
            data[:HEAD_BYTES],
            data[-TAIL_BYTES:],
            size,
            read_at=lambda o, n: data[o : o + n],
            max_pixels=max_pixels,
        )
    base = max(member["offset"], 0)
    path = member["path"]
    assert path is not None  # a member without bytes names where they are
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise BadSampleError(
            f"cannot read {quoted(path)}: {exc.strerror}",
            path=path,
            reason=f"cannot read: {exc.strerror}",
        ) from exc
    try:
        head = os.pread(fd, min(HEAD_BYTES, size), base)
        tail = (
            head
            if size <= HEAD_BYTES
            else os.pread(fd, min(TAIL_BYTES, size), base + max(0, size - TAIL_BYTES))
        )
        return check_header(
            head, tail, size, max_pixels=max_pixels, read_at=lambda o, n: os.pread(fd, n, base + o)
        )
    finally:
        os.close(fd)


def _check_chunk(job: _CheckJob) -> tuple[list[str | None], list[bytes | None]]:
    """Per sample: why it is bad (or None), and its ``.json`` member text (or None)."""
    reasons: list[str | None] = []
    reader = MemberReader(job.stores)
    try:
        samples: list[list[MemberRow]] = job.rows.column(MEMBERS).to_pylist()
        for members in samples:
            reason = None
            for m in members:
                if m["ext"].rpartition(".")[2].lower() not in IMAGE_EXTENSIONS:
                    continue
                try:
                    if job.validate == "decode":
                        reason = check_decode(reader.read(m), max_pixels=job.max_pixels)
                    elif job.validate == "header" and m["data"] is None and "://" in str(m["path"]):
                        # an object: its bytes whole, one GET (ranges would cost more)
                        whole: MemberRow = {**m, "data": reader.read(m)}
                        reason = _check_member_header(whole, job.max_pixels)
                    elif job.validate == "header":
                        reason = _check_member_header(m, job.max_pixels)
                    elif m["size"] == 0:
                        reason = "empty file (0 bytes)"
                    elif m["path"] is not None and "://" not in m["path"]:  # unreadable: skipped
                        # here, not fatal later
                        os.close(os.open(m["path"], os.O_RDONLY | os.O_CLOEXEC))
                except BadSampleError as exc:
                    reason = exc.reason or str(exc)
                except OSError as exc:  # a file that changed since the scan, or unreadable
                    reason = f"cannot read {quoted(str(m['path']))}: {exc.strerror or exc}"
                if reason:
                    break
            reasons.append(reason)
    finally:
        reader.close()
    texts: list[bytes | None] = [None] * job.rows.num_rows
    if job.json_columns:
        dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=str).encode
        rows = _null_non_finite(job.rows.select(job.json_columns))
        texts = [dumps(row).encode() for row in rows.to_pylist()]
    return reasons, texts


def _null_non_finite(rows: pa.Table) -> pa.Table:
    """NaN and infinities as nulls: JSON has no such numbers, and Python would write the
    bare ``NaN``/``Infinity`` that strict parsers refuse (metadata.parquet keeps them)."""
    for i, f in enumerate(rows.schema):
        if pa.types.is_floating(f.type):
            col = rows.column(i)
            finite = pc.is_finite(col)
            if pc.all(finite).as_py() is False:
                rows = rows.set_column(i, f, pc.if_else(finite, col, pa.scalar(None, f.type)))
    return rows


def _json_columns(table: pa.Table) -> tuple[str, ...]:
    """Metadata columns that go into the ``.json`` member: scalars only.

    Array columns (embeddings) stay typed in Parquet: 768 floats as JSON text would be
    larger than many images.
    """
    fixed = {MEMBERS, INVALID, "key", "original_path", "split", "label"}
    return tuple(
        f.name
        for f in table.schema
        if f.name not in fixed
        and not (
            pa.types.is_nested(f.type)
            or pa.types.is_binary(f.type)
            or pa.types.is_large_binary(f.type)
        )
    )


def _chunks(table: pa.Table, columns: list[str], size: int = CHUNK) -> Iterator[pa.Table]:
    narrow = table.select(columns)
    for start in range(0, table.num_rows, size):
        # take() copies the rows: a pickled slice would carry its parent's whole buffers
        yield narrow.take(np.arange(start, min(start + size, table.num_rows)))


def unsafe_key(key: str) -> str | None:
    """Why a key cannot name tar members safely, or None.

    Keys become member names (``KEY.jpg``) that other tools extract to disk, so a key may
    not be absolute, climb out with ``..``, hold empty or ``.`` path parts, backslashes or
    control characters (NUL included).
    """
    if not key:
        return "empty sample key"
    if _UNSAFE_KEY.search(key) is None:  # one regex pass: the common case is a safe key
        return None
    if key.startswith("/") or "\\" in key:
        return f"unsafe key {key!r} (absolute path or backslash)"
    if any(part in ("", ".", "..") for part in key.split("/")):
        return f"unsafe key {key!r} (empty, '.' or '..' path part)"
    return f"unsafe key {key!r} (control character)"


def _all_safe(keys: list[str], taken: frozenset[str]) -> bool:
    """Whether no key has a :func:`key_problem`, found with one regex pass over all of
    them: joined by newlines and searched line by line (``^``/``$`` at each key's ends),
    newline left out of the control characters. A key holding a newline itself is not
    decided here (False)."""
    if not keys:
        return True
    if not taken.isdisjoint(keys):
        return False
    joined = "\n".join(keys)
    if joined.count("\n") != len(keys) - 1:
        return False
    return _UNSAFE_KEYS.search(joined) is None


def key_problem(key: str, taken: frozenset[str] = frozenset()) -> str | None:
    """Why a key alone cannot be exported (unsafe, or already in the export), or None."""
    reason = unsafe_key(key)
    if reason is None and key in taken:
        reason = f"duplicate key {key!r}: already in the export"
    return reason


def _check_keys(
    keys: list[str],
    reasons: list[str | None],
    originals: pa.ChunkedArray,
    taken: frozenset[str] = frozenset(),
) -> None:
    """Mark unsafe keys, duplicates, and keys that differ only by case (which collide on
    case-insensitive file systems when the tars are extracted).

    Keys are first compared by a 64-bit hash of their case-folded form, in one array (a
    dict of every key cost hundreds of bytes per sample); only keys whose hash repeats
    are compared as strings, in sample order."""
    hashes = np.fromiter(
        (xxhash.xxh3_64_intdigest(k.casefold().encode("utf-8", "surrogatepass")) for k in keys),
        np.uint64,
        len(keys),
    )
    order = np.argsort(hashes, kind="stable")
    repeats = np.zeros(len(keys), bool)
    same = hashes[order[1:]] == hashes[order[:-1]]
    repeats[order[1:][same]] = repeats[order[:-1][same]] = True
    if not _all_safe(keys, taken):
        for i, key in enumerate(keys):
            if reasons[i] is None and not repeats[i]:
                reasons[i] = key_problem(key, taken)
    check_repeated(keys, np.flatnonzero(repeats).tolist(), reasons, originals, taken)


def check_repeated(
    keys: list[str],
    rows: list[int],
    reasons: list[str | None],
    originals: pa.ChunkedArray,
    taken: frozenset[str],
) -> None:
    """The rows whose folded keys may be equal, compared as strings in sample order."""
    seen: dict[str, int] = {}
    folded: dict[str, int] = {}
    for i in rows:
        key = keys[i]
        if reasons[i] is not None:
            continue
        reason = key_problem(key, taken)
        if reason is None and key in seen:
            reason = (
                f"duplicate key {key!r} (also used by {quoted(str(originals[seen[key]].as_py()))})"
            )
        elif reason is None and key.casefold() in folded:
            other = keys[folded[key.casefold()]]
            reason = f"duplicate key {key!r}: differs only by case from {other!r}"
        if reason is None:
            seen[key] = folded[key.casefold()] = i
        reasons[i] = reason


def check_splits(splits: list[object], keys: list[str], reasons: list[str | None]) -> None:
    """Mark samples whose split (from a table column or a tar's ``.json``) cannot name a
    folder of the export: like an unsafe key, a bad sample (an error, or a recorded skip
    under ``on_error="skip"``), never a path outside the output."""
    problems: dict[str, str | None] = {}
    for i, split in enumerate(splits):
        if reasons[i] is not None:
            continue
        seen = split if isinstance(split, str) else repr(split)  # a JSON list is unhashable
        if seen not in problems:
            problems[seen] = "no split (null)" if split is None else split_name_problem(split)
        if problems[seen] is not None:
            reasons[i] = f"sample {keys[i]!r}: {problems[seen]}"


def check_samples(
    table: pa.Table,
    opts: ExportOptions,
    runner: Runner,
    progress: Progress,
    taken: frozenset[str] = frozenset(),
    left_out: tuple[LeftOut, ...] = (),
    *,
    images: bool = True,
) -> tuple[pa.Table, list[dict[str, str]]]:
    """Drop (or refuse) bad samples and duplicate keys; add the ``.json`` member text.

    ``taken`` holds keys already exported (when appending): they count as duplicates.
    ``left_out`` is what the source found but cannot export: refused first (before any
    image is read), or recorded first among the skipped. ``images=False`` reads no image
    bytes: the shard writer checks each image as it writes it (one pass over the bytes).
    """
    if left_out and opts.on_error == "error":
        refuse_left_out(left_out)
    json_cols = _json_columns(table)
    reasons: list[str | None] = [None] * table.num_rows
    if images:
        jobs = (
            _CheckJob(chunk, opts.validate, opts.max_pixels, ())
            for chunk in _chunks(table, [MEMBERS])
        )
        bar = progress.task("checking samples", table.num_rows)
        reasons = []
        for r, _ in runner.imap(_check_chunk, jobs):
            reasons += r
            bar.advance(len(r))
    if INVALID in table.column_names:  # problems the source found while scanning
        for i, found in enumerate(table.column(INVALID).to_pylist()):
            reasons[i] = found or reasons[i]
        table = table.drop_columns([INVALID])
    keys = table.column("key").to_pylist()
    originals = table.column("original_path")
    if "split" in table.column_names:
        check_splits(table.column("split").to_pylist(), keys, reasons)
    _check_keys(keys, reasons, originals, taken)
    bad = [i for i, r in enumerate(reasons) if r is not None]
    skipped = [
        {"key": keys[i], "original_path": originals[i].as_py(), "reason": str(reasons[i])}
        for i in bad
    ]
    if skipped and opts.on_error == "error":
        refuse(skipped)
    skipped = [x.record() for x in left_out] + skipped
    if json_cols:
        table = table.append_column(JSON_COLUMN, json_texts(table.select(json_cols)))
    if bad:
        keep = np.ones(table.num_rows, dtype=bool)
        keep[bad] = False
        table = table.filter(pa.array(keep))
    return table, skipped


def refuse_left_out(left_out: list[LeftOut] | tuple[LeftOut, ...]) -> NoReturn:
    """Refuse the first of what the source left out (the others counted)."""
    out = left_out[0]
    raise out.error(refusal(out.original_path, out.reason, len(left_out) - 1))


def refuse(skipped: list[dict[str, str]]) -> NoReturn:
    """Refuse the first bad sample of ``skipped`` (its records; the others counted)."""
    first = skipped[0]
    err = DuplicateKeyError if first["reason"].startswith("duplicate key") else BadSampleError
    raise err(refusal(first["original_path"], first["reason"], len(skipped) - 1))


def json_columns(schema: pa.Schema) -> tuple[str, ...]:
    """The metadata columns of ``schema`` that go into the ``.json`` member."""
    return _json_columns(schema.empty_table())


def json_texts(rows: pa.Table) -> pa.Array:
    """Each row's ``.json`` member text: its scalar metadata as one JSON object."""
    dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=str).encode
    return pa.array(
        [dumps(row).encode() for row in _null_non_finite(rows).to_pylist()], pa.binary()
    )
