"""Checks before anything is written (keys, split names, what the source left out), and
each sample's ``.json`` text, so shard sizes are exact before writing. Images are checked
by the shard writer, in its one pass over their bytes (:mod:`shardex.sample_check`).
"""

from __future__ import annotations

import json
import re
from typing import Final, NoReturn

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from shardex.errors import BadSampleError, DuplicateKeyError
from shardex.names import split_name_problem
from shardex.quoting import quoted
from shardex.refs.scan import INVALID, MEMBERS, LeftOut
from shardex.sample_check import refusal

# A control character, a backslash, a leading "/", or an empty, "." or ".." path part.
_UNSAFE_KEY: Final = re.compile(r"[\x00-\x1f\x7f\\]|^/|(?:^|/)\.{0,2}(?:/|$)")


def _null_non_finite(rows: pa.Table) -> pa.Table:
    """NaN and infinities as nulls: Python would write bare ``NaN`` that strict JSON refuses."""
    for i, f in enumerate(rows.schema):
        if pa.types.is_floating(f.type):
            col = rows.column(i)
            finite = pc.is_finite(col)
            if pc.all(finite).as_py() is False:
                rows = rows.set_column(i, f, pc.if_else(finite, col, pa.scalar(None, f.type)))
    return rows


def json_columns(schema: pa.Schema) -> tuple[str, ...]:
    """Scalar metadata columns: arrays (embeddings) as JSON text would outweigh images."""
    fixed = {MEMBERS, INVALID, "key", "original_path", "split", "label"}
    return tuple(
        f.name
        for f in schema
        if f.name not in fixed
        and not (
            pa.types.is_nested(f.type)
            or pa.types.is_binary(f.type)
            or pa.types.is_large_binary(f.type)
        )
    )


def unsafe_key(key: str) -> str | None:
    """Why a key cannot safely name tar members that other tools extract to disk, or None."""
    if not key:
        return "empty sample key"
    if _UNSAFE_KEY.search(key) is None:  # one regex pass: the common case is a safe key
        return None
    if key.startswith("/") or "\\" in key:
        return f"unsafe key {key!r} (absolute path or backslash)"
    if any(part in ("", ".", "..") for part in key.split("/")):
        return f"unsafe key {key!r} (empty, '.' or '..' path part)"
    return f"unsafe key {key!r} (control character)"


def unsafe_keys(keys: pa.Array | pa.ChunkedArray) -> npt.NDArray[np.bool_]:
    """Which of a string column's keys :func:`unsafe_key` refuses, all at once (Arrow's
    regex; null and empty keys refused too)."""
    if not (pa.types.is_string(keys.type) or pa.types.is_large_string(keys.type)):
        return np.ones(len(keys), bool)  # asked one by one
    bad = pc.or_(pc.match_substring_regex(keys, _UNSAFE_KEY.pattern), pc.equal(keys, ""))
    return pc.fill_null(bad, True).to_numpy(zero_copy_only=False)  # type: ignore[no-any-return]


def key_problem(key: str, taken: frozenset[str] = frozenset()) -> str | None:
    """Why a key alone cannot be exported (unsafe, or already in the export), or None."""
    reason = unsafe_key(key)
    if reason is None and key in taken:
        reason = f"duplicate key {key!r}: already in the export"
    return reason


def folded_hashes(keys: list[str]) -> npt.NDArray[np.uint64]:
    """A 64-bit hash of each key's case-folded form."""
    folded = (k.casefold().encode("utf-8", "surrogatepass") for k in keys)
    return np.fromiter(map(xxhash.xxh3_64_intdigest, folded), np.uint64, len(keys))


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
    """Mark samples whose split cannot name a folder of the export, like an unsafe key."""
    problems: dict[str, str | None] = {}
    for i, split in enumerate(splits):
        if reasons[i] is not None:
            continue
        seen = split if isinstance(split, str) else repr(split)  # a JSON list is unhashable
        if seen not in problems:
            problems[seen] = "no split (null)" if split is None else split_name_problem(split)
        if problems[seen] is not None:
            reasons[i] = f"sample {keys[i]!r}: {problems[seen]}"


def refuse_left_out(left_out: list[LeftOut] | tuple[LeftOut, ...]) -> NoReturn:
    """Refuse the first of what the source left out (the others counted)."""
    out = left_out[0]
    raise out.error(refusal(out.original_path, out.reason, len(left_out) - 1))


def refuse(skipped: list[dict[str, str]]) -> NoReturn:
    """Refuse the first bad sample of ``skipped`` (its records; the others counted)."""
    first = skipped[0]
    err = DuplicateKeyError if first["reason"].startswith("duplicate key") else BadSampleError
    raise err(refusal(first["original_path"], first["reason"], len(skipped) - 1))


def json_texts(rows: pa.Table) -> pa.Array:
    """Each row's ``.json`` member text: its scalar metadata as one JSON object."""
    dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=str).encode
    return pa.array(
        [dumps(row).encode() for row in _null_non_finite(rows).to_pylist()], pa.binary()
    )
