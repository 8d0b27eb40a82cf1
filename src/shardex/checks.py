"""Checking samples before anything is written: bad images, empty and duplicate keys.

Runs in worker processes over chunks of the scan table and reads only the first and last
KiBs of each image (or decodes it, with ``validate="decode"``). Also renders each sample's
``.json`` member text, so that shard sizes are known exactly before writing.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import pyarrow as pa

from shardex.codecs.images import (
    HEAD_BYTES,
    IMAGE_EXTENSIONS,
    TAIL_BYTES,
    Validate,
    check_decode,
    check_header,
)
from shardex.errors import BadSampleError, DuplicateKeyError
from shardex.format.shard import JSON_COLUMN, MemberReader
from shardex.options import ExportOptions
from shardex.parallel import Runner
from shardex.progress import Progress
from shardex.sources.base import INVALID, MEMBERS

CHUNK: Final = 2000
# Anything that may make a key unsafe: a control character, a backslash, a leading "/",
# or an empty, "." or ".." path part.
_UNSAFE_KEY: Final = re.compile(r"[\x00-\x1f\x7f\\]|^/|(?:^|/)\.{0,2}(?:/|$)")


@dataclass(frozen=True, slots=True)
class _CheckJob:
    rows: pa.Table  # _members and the scalar metadata columns of a chunk
    validate: Validate
    max_pixels: int
    json_columns: tuple[str, ...]


def _check_member_header(member: dict[str, Any], max_pixels: int) -> str | None:
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
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise BadSampleError(
            f"cannot read {path}: {exc.strerror}", path=path, reason=str(exc.strerror)
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
    reader = MemberReader()
    try:
        for members in job.rows.column(MEMBERS).to_pylist():
            reason = None
            for m in members:
                if m["ext"].rpartition(".")[2].lower() not in IMAGE_EXTENSIONS:
                    continue
                try:
                    if job.validate == "decode":
                        reason = check_decode(reader.read(m), max_pixels=job.max_pixels)
                    elif job.validate == "header":
                        reason = _check_member_header(m, job.max_pixels)
                    elif m["size"] == 0:
                        reason = "empty file (0 bytes)"
                except BadSampleError as exc:
                    reason = exc.reason or str(exc)
                if reason:
                    break
            reasons.append(reason)
    finally:
        reader.close()
    texts: list[bytes | None] = [None] * job.rows.num_rows
    if job.json_columns:
        dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=str).encode
        texts = [dumps(row).encode() for row in job.rows.select(job.json_columns).to_pylist()]
    return reasons, texts


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


def _check_keys(
    keys: list[str],
    reasons: list[str | None],
    originals: pa.ChunkedArray,
    taken: frozenset[str] = frozenset(),
) -> None:
    """Mark unsafe keys, duplicates, and keys that differ only by case (which collide on
    case-insensitive file systems when the tars are extracted)."""
    seen: dict[str, int] = {}
    folded: dict[str, int] = {}
    for i, key in enumerate(keys):
        if reasons[i] is not None:
            continue
        reason = unsafe_key(key)
        if reason is None and key in taken:
            reason = f"duplicate key {key!r}: already in the export"
        elif reason is None and key in seen:
            reason = f"duplicate key {key!r} (also used by {originals[seen[key]].as_py()})"
        elif reason is None and key.casefold() in folded:
            other = keys[folded[key.casefold()]]
            reason = f"duplicate key {key!r}: differs only by case from {other!r}"
        if reason is None:
            seen[key] = folded[key.casefold()] = i
        reasons[i] = reason


def check_samples(
    table: pa.Table,
    opts: ExportOptions,
    runner: Runner,
    progress: Progress,
    taken: frozenset[str] = frozenset(),
) -> tuple[pa.Table, list[dict[str, str]]]:
    """Drop (or refuse) bad samples and duplicate keys; add the ``.json`` member text.

    ``taken`` holds keys already exported (when appending): they count as duplicates.
    """
    json_cols = _json_columns(table)
    jobs = (
        _CheckJob(chunk, opts.validate, opts.max_pixels, json_cols)
        for chunk in _chunks(table, [MEMBERS, *json_cols])
    )
    bar = progress.task("checking samples", table.num_rows)
    reasons: list[str | None] = []
    texts: list[bytes | None] = []
    for r, t in runner.imap(_check_chunk, jobs):
        reasons += r
        texts += t
        bar.advance(len(r))
    if INVALID in table.column_names:  # problems the source found while scanning
        for i, found in enumerate(table.column(INVALID).to_pylist()):
            reasons[i] = found or reasons[i]
        table = table.drop_columns([INVALID])
    keys = table.column("key").to_pylist()
    originals = table.column("original_path")
    _check_keys(keys, reasons, originals, taken)
    bad = [i for i, r in enumerate(reasons) if r is not None]
    skipped = [
        {"key": keys[i], "original_path": originals[i].as_py(), "reason": str(reasons[i])}
        for i in bad
    ]
    if skipped and opts.on_error == "error":
        first = skipped[0]
        err = DuplicateKeyError if first["reason"].startswith("duplicate key") else BadSampleError
        more = f" (and {len(skipped) - 1} more)" if len(skipped) > 1 else ""
        raise err(
            f"{first['original_path']}: {first['reason']}{more}; "
            "fix the source or pass --on-error skip"
        )
    if json_cols:
        table = table.append_column(JSON_COLUMN, pa.array(texts, pa.binary()))
    if bad:
        keep = np.ones(table.num_rows, dtype=bool)
        keep[bad] = False
        table = table.filter(pa.array(keep))
    return table, skipped
